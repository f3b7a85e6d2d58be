"""Append-only agent sessions, their frozen snapshots and the evidence projection.

A session is one JSONL file under the sessions root: a header line, then one line per turn.
Turns are numbered from 1 in append order and never change, so a frozen snapshot (id, turn
count, content hash) names an exact prefix that later appends cannot disturb.

The evidence projection decides which turns a model sees and may cite: user and assistant
turns with non-blank text. Tool output, system prompts and empty assistant turns (tool calls
only) are hidden; a citation that touches one is refused. Projected turns keep their session
numbers, so a gap shows where hidden turns were.
"""

from __future__ import annotations

import builtins  # `list` below is a method: annotations after it name the type this way
import fcntl
import json
import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from memfs.durable import fsync_dir
from memfs.memory.errors import InvalidRecord, SessionError
from memfs.memory.generation import blake2b_hex, canonical_json
from memfs.memory.records import validate_workspace

ROLES = ("user", "assistant", "tool", "system")
APPEND_ROLES = ("user", "assistant", "tool")
VISIBLE_ROLES = ("user", "assistant")
MAX_TURN_BYTES = 1024 * 1024
HEADER_KIND = "memfs.session/1"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Turn:
    index: int  # from 1
    role: str
    text: str


@dataclass(frozen=True)
class ProjectedTurn:
    index: int
    role: str
    text: str


@dataclass(frozen=True)
class FrozenSession:
    """A snapshot: the first `turn_count` turns of session `id`, hashing to `content_hash`.

    `visible_turns` are the projection's turn numbers, derived from that content; equality and
    hashing use only (id, turn_count, content_hash).
    """

    id: str
    turn_count: int
    content_hash: str
    visible_turns: frozenset[int] = frozenset()
    workspace: str | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrozenSession) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.id, self.turn_count, self.content_hash)


def is_visible(turn: Turn) -> bool:
    return turn.role in VISIBLE_ROLES and bool(turn.text.strip())


def turns_hash(turns: list[Turn]) -> str:
    return blake2b_hex(canonical_json({"kind": HEADER_KIND,
                                       "turns": [[t.role, t.text] for t in turns]}))


def validate_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not _ID_RE.match(session_id):
        raise SessionError(f"{session_id!r} is not a session id",
                           "use the id `memfs session new` printed")
    return session_id


def check_turn(role: object, text: object, roles: tuple[str, ...] = APPEND_ROLES) -> None:
    if role not in roles:
        raise SessionError(f"role {role!r} is not one of {', '.join(roles)}",
                           "give a role from that list")
    if not isinstance(text, str):
        raise SessionError("turn text must be a string", "give the text as a string")
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise SessionError("turn text is not valid Unicode", "send UTF-8 text") from exc
    if size > MAX_TURN_BYTES:
        raise SessionError(f"turn text is {size} bytes, over {MAX_TURN_BYTES}",
                           "split it into several turns")


@dataclass(frozen=True)
class SessionInfo:
    """One line of `memfs session list`."""

    id: str
    workspace: str | None
    created: str | None
    turn_count: int
    damaged: str | None  # why it could not be read, or None


def session_workspace(workspace: str | None) -> str | None:
    """A new session's workspace, checked (None: a session of no workspace)."""
    if workspace is None:
        return None
    try:
        return validate_workspace(workspace)
    except InvalidRecord as exc:
        raise SessionError(exc.message, exc.remedy) from None


def new_session_id() -> str:
    """Time-sortable, with a random suffix: unique without coordination (either store)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


class SessionStore:
    """Sessions as files under one root (memfs.rootdir.sessions_dir); a root whose store is in
    PostgreSQL keeps them as rows there instead (memfs.memory.shared_sessions)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.where = str(self.root)  # where the sessions are, in words

    def _path(self, session_id: str) -> Path:
        return self.root / f"{validate_session_id(session_id)}.jsonl"

    def new(self, workspace: str | None = None) -> str:
        """Create an empty session; return its id (time-sortable, random suffix)."""
        workspace = session_workspace(workspace)
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            sid = new_session_id()
            header = {"kind": HEADER_KIND, "id": sid, "workspace": workspace,
                      "created": datetime.now(UTC).isoformat(timespec="seconds")}
            try:
                fd = os.open(self._path(sid), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o644)
            except FileExistsError:
                continue
            try:
                os.write(fd, json.dumps(header, sort_keys=True).encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.root)
            return sid

    def append(self, session_id: str, role: str, text: str) -> int:
        """Append one turn durably; return its number (from 1)."""
        return self.append_many(session_id, [(role, text)], APPEND_ROLES)[0]

    def append_many(self, session_id: str, turns: list[tuple[str, str]],
                    roles: tuple[str, ...] = ROLES) -> list[int]:
        for role, text in turns:
            check_turn(role, text, roles)
        path = self._path(session_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SessionError(f"no session {session_id!r}",
                               "create one with `memfs session new`") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = _read_all(fd)
            good = data.rfind(b"\n") + 1  # a torn final line never returned: drop it
            if good != len(data):
                os.ftruncate(fd, good)
            first = data[:good].count(b"\n")  # header line + turns so far
            lines = b"".join(
                json.dumps({"role": r, "text": t}, ensure_ascii=False).encode() + b"\n"
                for r, t in turns)
            os.lseek(fd, good, os.SEEK_SET)
            view = memoryview(lines)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            return list(range(first, first + len(turns)))
        finally:
            os.close(fd)

    def import_turns(self, turns: list[tuple[str, str]], workspace: str | None = None) -> str:
        """A new session holding `turns` (validated before anything is created)."""
        for role, text in turns:
            check_turn(role, text, ROLES)
        sid = self.new(workspace)
        if turns:
            self.append_many(sid, turns)
        return sid

    def import_jsonl(self, path: Path, workspace: str | None = None) -> str:
        """Import a memfs JSONL turn file or an OpenAI chat `messages` export as a new session."""
        from memfs.memory.session_import import parse_turn_file

        return self.import_turns(parse_turn_file(Path(path)), workspace)

    def _load(self, session_id: str) -> tuple[dict, list[Turn]]:
        try:
            data = self._path(session_id).read_bytes()
        except FileNotFoundError:
            raise SessionError(f"no session {session_id!r} in {self.root}",
                               "`memfs session list` shows the sessions there") from None
        lines = data[: data.rfind(b"\n") + 1].splitlines()
        try:
            header = json.loads(lines[0])
            turns = [Turn(i, d["role"], d["text"])
                     for i, d in enumerate((json.loads(x) for x in lines[1:]), start=1)]
        except (IndexError, ValueError, KeyError, TypeError) as exc:
            raise SessionError(f"session {session_id!r} is damaged",
                               "restore sessions/ from a backup") from exc
        return header, turns

    def turns(self, session_id: str) -> list[Turn]:
        return self._load(session_id)[1]

    def list(self) -> list[SessionInfo]:
        """Every session here, oldest first (ids sort by time); a damaged one is listed as
        such rather than hidden. Worker sessions (workers/) are not sessions to review."""
        infos = []
        for path in sorted(self.root.glob("*.jsonl")) if self.root.is_dir() else []:
            sid = path.name.removesuffix(".jsonl")
            try:
                header, turns = self._load(sid)
            except SessionError as exc:
                infos.append(SessionInfo(sid, None, None, 0, exc.message))
                continue
            infos.append(SessionInfo(sid, header.get("workspace"), header.get("created"),
                                     len(turns), None))
        return infos

    def workspace(self, session_id: str) -> str | None:
        return self._load(session_id)[0].get("workspace")

    def freeze(self, session_id: str) -> FrozenSession:
        header, turns = self._load(session_id)
        return FrozenSession(id=session_id, turn_count=len(turns), content_hash=turns_hash(turns),
                             visible_turns=frozenset(t.index for t in turns if is_visible(t)),
                             workspace=header.get("workspace"))

    def projection(self, frozen: FrozenSession) -> builtins.list[ProjectedTurn]:
        """The model-visible turns of the frozen prefix, with their session numbers."""
        turns = self.turns(frozen.id)[: frozen.turn_count]
        if len(turns) != frozen.turn_count or turns_hash(turns) != frozen.content_hash:
            raise SessionError(f"session {frozen.id!r} no longer matches its frozen snapshot",
                               "freeze the session again")
        return [ProjectedTurn(t.index, t.role, t.text) for t in turns if is_visible(t)]


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)



