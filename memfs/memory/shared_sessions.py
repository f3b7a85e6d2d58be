"""Agent sessions shared by many hosts: the SessionStore interface over PostgreSQL rows.

A root whose store is in PostgreSQL keeps its sessions in that database (tables `sessions`
and `session_turns`, memfs.store.pg.schema version 3), so a session recorded through one
host is listed, frozen and reviewed by every host, and a review a dead host left
`committing` can be replayed elsewhere: recovery re-freezes the source prefix the receipt
names. A turn is a row holding the JSON line the file store appends; numbering, the frozen
snapshot's hash and the evidence projection are the file store's own code (the subclass
replaces only where the bytes live), so a session hashes alike in both stores.

An append is one transaction that locks the session's row, numbers the turns after the last
one and commits (synchronous_commit on): a turn that was answered is durable, and two hosts
appending to one session get consecutive numbers, as two processes do under the file's flock.

`open_session_store(root)` gives a root the store it should use.

Threads: any; the process's one connection for these rows (memfs.store.pg.conn), under its
lock.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from memfs.memory.errors import SessionError
from memfs.memory.sessions import (
    HEADER_KIND,
    ROLES,
    SessionInfo,
    SessionStore,
    Turn,
    check_turn,
    new_session_id,
    session_workspace,
    validate_session_id,
)


def open_session_store(root: Path) -> SessionStore:
    """The sessions of the memfs root `root`: shared rows, or files under `<root>/sessions`."""
    from memfs.rootdir import sessions_dir
    from memfs.store.backend import read_location

    loc = read_location(Path(root))
    if loc is None:
        return SessionStore(sessions_dir(root))
    return SharedSessionStore(loc.url, loc.host)


class SharedSessionStore(SessionStore):
    """Sessions as rows of one PostgreSQL store, created as this host (`host`)."""

    def __init__(self, url: str, host: str) -> None:  # no files: SessionStore.root unset
        from memfs.store.backend import redact
        from memfs.store.pg.conn import process_conn

        self.conn = process_conn(url)
        self.host = host
        self.where = f"the PostgreSQL store at {redact(url)}"

    def new(self, workspace: str | None = None) -> str:
        workspace = session_workspace(workspace)
        while True:
            sid = new_session_id()
            with self.conn.write() as c:
                made = c.execute("INSERT INTO sessions VALUES (%s, %s, %s, %s) ON CONFLICT "
                                 "DO NOTHING RETURNING id",
                                 (sid, workspace, datetime.now(UTC).isoformat(timespec="seconds"),
                                  self.host)).fetchall()
            if made:
                return sid

    def append_many(self, session_id: str, turns: list[tuple[str, str]],
                    roles: tuple[str, ...] = ROLES) -> list[int]:
        for role, text in turns:
            check_turn(role, text, roles)
        sid = validate_session_id(session_id)
        with self.conn.write() as c:
            if not c.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE",
                             (sid,)).fetchall():
                raise SessionError(f"no session {sid!r} in {self.where}",
                                   "create one with `memfs session new`")
            (last,) = c.execute("SELECT coalesce(max(idx), 0) FROM session_turns WHERE "
                                "session = %s", (sid,)).fetchone() or (0,)
            numbers = list(range(last + 1, last + 1 + len(turns)))
            with c.cursor() as cur:
                cur.executemany("INSERT INTO session_turns VALUES (%s, %s, %s)", [
                    (sid, n, json.dumps({"role": r, "text": t}, ensure_ascii=False))
                    for n, (r, t) in zip(numbers, turns, strict=True)])
        return numbers

    def _load(self, session_id: str) -> tuple[dict, list[Turn]]:
        sid = validate_session_id(session_id)
        head = self.conn.rows("SELECT workspace, created FROM sessions WHERE id = %s", (sid,))
        if not head:
            raise SessionError(f"no session {sid!r} in {self.where}",
                               "`memfs session list` shows the sessions there")
        lines = self.conn.rows("SELECT idx, line FROM session_turns WHERE session = %s "
                               "ORDER BY idx", (sid,))
        try:
            turns = [Turn(i, d["role"], d["text"])
                     for i, d in ((i, json.loads(line)) for i, line in lines)]
        except (ValueError, KeyError, TypeError) as exc:
            raise SessionError(f"session {sid!r} is damaged in {self.where}",
                               "restore the session_turns table from a backup") from exc
        if [t.index for t in turns] != list(range(1, len(turns) + 1)):
            raise SessionError(f"session {sid!r} in {self.where} misses turns",
                               "restore the session_turns table from a backup")
        header = {"kind": HEADER_KIND, "id": sid, "workspace": head[0][0],
                  "created": head[0][1]}
        return header, turns

    def list(self) -> list[SessionInfo]:
        rows = self.conn.rows("SELECT s.id, s.workspace, s.created, count(t.idx) FROM sessions "
                              "s LEFT JOIN session_turns t ON t.session = s.id GROUP BY s.id "
                              "ORDER BY s.id")
        return [SessionInfo(sid, ws, created, n, None) for sid, ws, created, n in rows]
