"""Consolidation receipts: the durable intent and audit summary of one review.

A receipt is a Markdown file `<root>/receipts/<review_id>.md`. People read its summary;
memfs reads only its fenced ```json memfs-receipt/1``` block, which round-trips exactly
(`parse_receipt(render_receipt(r)) == r`). The summary is derived from the block and
never parsed, so it cannot drift into a second truth.

A receipt holds identities, never bodies: revisions, the proposal hash and per-change
(op, name, content hash). Proposal and memory bodies stay in the worker Session and in
the memory generations; duplicating them here would copy model output into an audit log.

Writes are atomic and durable: a temp file in the same directory, fsync, rename over the
final name, fsync the directory. A crash leaves either the old receipt or the new one,
plus at worst an orphaned temp file that recovery removes under the review lock.

A root whose store is in PostgreSQL keeps the same Markdown as rows of that database
instead (memfs.consolidate.shared_receipts), so every host lists and recovers every
receipt; `write_receipt`, `read_receipt` and `scan_receipts` choose by the root.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from memfs.durable import fsync_dir, mkdir_durable, write_all
from memfs.errors import MemfsError
from memfs.memory.durable import crash_point
from memfs.rootdir import receipts_dir

FORMAT = "memfs-receipt/1"
COMMITTING = "committing"
COMMITTED = "committed"
NO_CHANGE = "no-change"
TARGET_CONFLICT = "target-conflict"
SOURCE_CHANGED = "source-changed"
STATES = (COMMITTING, COMMITTED, NO_CHANGE, TARGET_CONFLICT, SOURCE_CHANGED)
FINAL_STATES = frozenset(STATES) - {COMMITTING}
SCOPES = ("workspace", "global")  # also the order in which a commit swaps them

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TEMP_PREFIX = ".tmp-"


class ReceiptError(MemfsError):
    """A receipt that cannot be read back, or a field that cannot be written."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_review_id() -> str:
    """Sortable by start time, unique without coordination."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(6)


def check_review_id(review_id: str) -> str:
    if not _ID_RE.match(review_id):
        raise ReceiptError(
            f"review id {review_id!r} is not a safe file name",
            "use letters, digits, '.', '_' or '-' (at most 128), not starting with '.'",
        )
    return review_id


@dataclass(frozen=True)
class SourceSnapshot:
    """The frozen source Session as the review saw it."""

    session_id: str
    turn_count: int
    content_hash: str


@dataclass(frozen=True)
class ScopeRevisions:
    """One memory scope's revision before the review and the one it plans to produce.

    `planned_after` is None when the review never got as far as planning (a recheck
    refusal); equal to `before` when the proposal changes nothing in that scope.
    """

    before: str
    planned_after: str | None

    @property
    def touched(self) -> bool:
        return self.planned_after is not None and self.planned_after != self.before


@dataclass(frozen=True)
class ChangeHash:
    """A change reduced to its identity: op, record name, content hash (None for delete)."""

    op: str
    name: str
    content_hash: str | None


@dataclass(frozen=True)
class HistoryEntry:
    at: str
    state: str
    by: str  # "commit" or "recover"
    detail: str = ""


@dataclass(frozen=True)
class Receipt:
    review_id: str
    state: str
    workspace: str
    source: SourceSnapshot
    scopes: dict[str, ScopeRevisions]
    proposal_hash: str
    changes: tuple[ChangeHash, ...]
    worker_attempt: str
    consolidator_version: str
    created_at: str
    updated_at: str
    detail: str = ""
    observed: dict[str, str] = field(default_factory=dict)
    history: tuple[HistoryEntry, ...] = ()

    @property
    def touched_scopes(self) -> tuple[str, ...]:
        return tuple(s for s in SCOPES if s in self.scopes and self.scopes[s].touched)

    def finished(
        self, state: str, by: str, detail: str = "", observed: dict[str, str] | None = None
    ) -> Receipt:
        """This receipt moved to `state`, with the move appended to its history."""
        at = now()
        return replace(
            self, state=state, updated_at=at, detail=detail,
            observed=dict(observed if observed is not None else self.observed),
            history=(*self.history, HistoryEntry(at, state, by, detail)),
        )

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "review_id": self.review_id,
            "state": self.state,
            "workspace": self.workspace,
            "source": self.source.__dict__,
            "scopes": {k: v.__dict__ for k, v in sorted(self.scopes.items())},
            "proposal_hash": self.proposal_hash,
            "changes": [c.__dict__ for c in self.changes],
            "worker_attempt": self.worker_attempt,
            "consolidator_version": self.consolidator_version,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "detail": self.detail,
            "observed": dict(sorted(self.observed.items())),
            "history": [h.__dict__ for h in self.history],
        }

    @classmethod
    def from_json(cls, data: object) -> Receipt:
        try:
            return _from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReceiptError(
                f"receipt block is malformed: {exc}",
                "restore the receipt from a backup or move it out of receipts/ and re-run",
            ) from exc


def _from_json(data: object) -> Receipt:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} block")
    expected = set(Receipt.__dataclass_fields__) | {"format"}
    if set(data) != expected:
        raise ValueError(f"fields differ from {FORMAT}: {sorted(set(data) ^ expected)}")
    state = _str(data["state"])
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}")
    scopes = {}
    for name, rev in dict(data["scopes"]).items():
        if name not in SCOPES:
            raise ValueError(f"unknown scope {name!r}")
        planned = rev["planned_after"]
        scopes[name] = ScopeRevisions(_str(rev["before"]), None if planned is None else _str(planned))
    src = data["source"]
    turns = src["turn_count"]
    if not isinstance(turns, int) or isinstance(turns, bool):
        raise ValueError("source.turn_count is not an integer")
    return Receipt(
        review_id=check_review_id(_str(data["review_id"])),
        state=state,
        workspace=_str(data["workspace"]),
        source=SourceSnapshot(_str(src["session_id"]), turns, _str(src["content_hash"])),
        scopes=scopes,
        proposal_hash=_str(data["proposal_hash"]),
        changes=tuple(
            ChangeHash(
                _str(c["op"]),
                _str(c["name"]),
                None if c["content_hash"] is None else _str(c["content_hash"]),
            )
            for c in data["changes"]
        ),
        worker_attempt=_str(data["worker_attempt"]),
        consolidator_version=_str(data["consolidator_version"]),
        created_at=_str(data["created_at"]),
        updated_at=_str(data["updated_at"]),
        detail=_str(data["detail"]),
        observed={_str(k): _str(v) for k, v in dict(data["observed"]).items()},
        history=tuple(
            HistoryEntry(_str(h["at"]), _str(h["state"]), _str(h["by"]), _str(h["detail"]))
            for h in data["history"]
        ),
    )


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


# --- Markdown ----------------------------------------------------------------------------


def render_receipt(receipt: Receipt) -> str:
    """The receipt as Markdown: a summary for people, then the exact JSON block."""
    q = json.dumps
    lines = [
        f"# Consolidation receipt {receipt.review_id}",
        "",
        f"- state: **{receipt.state}**" + (f" — {receipt.detail}" if receipt.detail else ""),
        f"- workspace: {q(receipt.workspace)}",
        f"- source session: {q(receipt.source.session_id)}, "
        f"{receipt.source.turn_count} turns, hash `{receipt.source.content_hash}`",
    ]
    for name in SCOPES:
        if name in receipt.scopes:
            rev = receipt.scopes[name]
            lines.append(f"- {name} revision: `{rev.before}` → `{rev.planned_after or '(not planned)'}`")
    for name, value in sorted(receipt.observed.items()):
        lines.append(f"- observed {name}: `{value}`")
    lines += [
        f"- proposal hash: `{receipt.proposal_hash}`",
        f"- worker attempt: {q(receipt.worker_attempt)}; "
        f"consolidator {q(receipt.consolidator_version)}",
        f"- created {receipt.created_at}, updated {receipt.updated_at}",
        "",
        "| op | name | content hash |",
        "|---|---|---|",
    ]
    lines += [f"| {c.op} | {q(c.name)} | `{c.content_hash or '-'}` |" for c in receipt.changes]
    if not receipt.changes:
        lines.append("| (none) | | |")
    lines += ["", f"```json {FORMAT}", json.dumps(receipt.to_json(), indent=2, sort_keys=True)]
    lines += ["```", ""]
    return "\n".join(lines)


def parse_receipt(text: str) -> Receipt:
    """Read back the JSON block of a rendered receipt; the summary is ignored."""
    opener = f"```json {FORMAT}"
    lines = text.split("\n")
    try:
        start = lines.index(opener) + 1
        end = lines.index("```", start)
    except ValueError:
        raise ReceiptError(
            f"no ```json {FORMAT} block found",
            "the file is not a memfs receipt or was cut short; move it out of receipts/",
        ) from None
    try:
        data = json.loads("\n".join(lines[start:end]))
    except json.JSONDecodeError as exc:
        raise ReceiptError(
            f"receipt block is not valid JSON: {exc}",
            "restore the receipt from a backup or move it out of receipts/ and re-run",
        ) from exc
    return Receipt.from_json(data)


# --- Where: the root's files, or its shared store's rows ------------------------------------


def _shared(root: Path):
    from memfs.consolidate.shared_receipts import open_shared_receipts

    return open_shared_receipts(root)


def receipt_location(root: Path, review_id: str) -> str:
    """Where the receipt of `review_id` is kept, in words (a path, or a store's row)."""
    shared = _shared(root)
    return shared.location(review_id) if shared else str(receipt_path(root, review_id))


def write_receipt(root: Path, receipt: Receipt) -> str:
    """Persist `receipt` atomically and durably (on disk, or committed in the shared store)
    before returning; returns where it is."""
    shared = _shared(root)
    if shared is not None:
        return shared.write(receipt)
    return str(write_receipt_file(root, receipt))


def read_receipt(root: Path, review_id: str) -> Receipt | None:
    shared = _shared(root)
    if shared is not None:
        return shared.read(review_id)
    return read_receipt_file(root, review_id)


# --- Files -------------------------------------------------------------------------------


def receipt_path(root: Path, review_id: str) -> Path:
    return receipts_dir(root) / f"{check_review_id(review_id)}.md"


def write_receipt_file(root: Path, receipt: Receipt) -> Path:
    """Persist `receipt` atomically and durably under the root; returns its path."""
    directory = receipts_dir(root)
    _ensure_dir(directory)
    final = receipt_path(root, receipt.review_id)
    tmp = directory / f"{_TEMP_PREFIX}{receipt.review_id}-{os.getpid()}-{secrets.token_hex(4)}"
    data = render_receipt(receipt).encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    crash_point("receipt-before-rename")
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def read_receipt_file(root: Path, review_id: str) -> Receipt | None:
    path = receipt_path(root, review_id)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return parse_receipt(text)


@dataclass(frozen=True)
class ReceiptScan:
    receipts: list[Receipt]
    damaged: list[tuple[Path | str, str]]  # receipts that could not be read (file or row), why
    temp_files: list[Path]  # leftovers of writes cut short before their rename (files only)


def scan_receipts(root: Path) -> ReceiptScan:
    """Every receipt of the root, oldest first; damaged ones are reported, not skipped."""
    shared = _shared(root)
    if shared is not None:
        return shared.scan()
    directory = receipts_dir(root)
    receipts: list[Receipt] = []
    damaged: list[tuple[Path | str, str]] = []
    temps: list[Path] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return ReceiptScan([], [], [])
    for name in names:
        path = directory / name
        if name.startswith(_TEMP_PREFIX):
            temps.append(path)
        elif name.endswith(".md"):
            try:
                receipt = parse_receipt(path.read_text(encoding="utf-8"))
            except (ReceiptError, UnicodeDecodeError) as exc:
                damaged.append((path, str(exc)))
                continue
            if f"{receipt.review_id}.md" != name:
                damaged.append((path, f"holds review {receipt.review_id!r}, not its file name"))
                continue
            receipts.append(receipt)
    receipts.sort(key=lambda r: (r.created_at, r.review_id))
    return ReceiptScan(receipts, damaged, temps)


def remove_temp_files(root: Path, temps: list[Path]) -> None:
    """Drop orphaned temp files; call only under the review lock (no writer is mid-write)."""
    for path in temps:
        path.unlink(missing_ok=True)
    if temps:
        fsync_dir(receipts_dir(root))


def _ensure_dir(directory: Path) -> None:
    mkdir_durable(directory, 0o755)
