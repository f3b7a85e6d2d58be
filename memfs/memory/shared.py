"""Memory shared by many hosts: the MemoryStore interface over PostgreSQL rows.

A root whose store is in PostgreSQL (memfs.store.backend) keeps Global and workspace memory
in the same database, so every host reads and writes one truth. A generation is a row
(scope, workspace, seq) with its canonical content; the current one is named by a head row.
Which generations stay is the store's retention policy (memfs.memory.retention), applied by
`prune` in one transaction that holds the head row (tombstones into `memory_dropped`, the
rows gone), so a prune killed at any point leaves all of it or none.

A commit is one transaction: lock the head row, compare its revision with the expected one
(the compare-and-swap), insert the next generation, move the head. Two hosts committing
against one revision: one moves the head, the other is told StaleRevision, exactly as two
processes on one host are by the file store's lock. The generation algorithm is the same
pure one (memfs.memory.preview), so revisions match the file store's bit for bit.

`open_memory_store(root)` gives a root the store it should use: these rows for a PostgreSQL
root, the files under `<root>/memory` (memfs.memory.store) otherwise.

Threads: any; one connection under its lock (the caller's thread blocks on the database).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from memfs.memory.durable import crash_point
from memfs.memory.generation import (
    GlobalGeneration,
    WorkspaceGeneration,
    empty_global,
    empty_workspace,
    global_revision,
    render_index,
    workspace_revision,
)
from memfs.memory.preview import (
    Change,
    Delete,
    Put,
    WorkspacePreview,
    preview_global_change,
    preview_workspace_changes,
)
from memfs.memory.records import validate_name, validate_workspace
from memfs.memory.retention import Dropped, GenRow, NoSuchRevision, now_iso
from memfs.memory.store import GenerationInfo, MemoryStore, _absent, check_revision_text

GLOBAL = ""  # the workspace column of Global memory's rows

DDL = """
CREATE TABLE IF NOT EXISTS memory_generations (
    workspace TEXT NOT NULL, seq BIGINT NOT NULL, revision TEXT NOT NULL, parent TEXT NOT NULL,
    created TEXT NOT NULL, content TEXT NOT NULL, PRIMARY KEY (workspace, seq));
CREATE TABLE IF NOT EXISTS memory_heads (
    workspace TEXT PRIMARY KEY, seq BIGINT NOT NULL, revision TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memory_dropped (
    workspace TEXT NOT NULL, seq BIGINT NOT NULL, revision TEXT NOT NULL,
    created TEXT NOT NULL, dropped_at TEXT NOT NULL, why TEXT NOT NULL,
    PRIMARY KEY (workspace, seq));
"""


def open_memory_store(root: Path):
    """The memory store of the memfs root `root` (shared rows or the root's files)."""
    from memfs.rootdir import memory_dir
    from memfs.store.backend import read_location

    loc = read_location(root)
    if loc is None:
        return MemoryStore(memory_dir(root))
    from memfs.store.pg.conn import Conn

    with _opened_lock:
        got = _opened.get(loc.url)
        if got is None:  # one connection per store and process, its tables made once
            got = _opened[loc.url] = SharedMemoryStore(Conn(loc.url, autocommit=False), root)
        return got


_opened: dict[str, SharedMemoryStore] = {}
_opened_lock = threading.Lock()


class SharedMemoryStore:
    def __init__(self, conn, root: Path) -> None:  # conn: memfs.store.pg.conn.Conn
        self.conn = conn
        self.root = root
        with conn.lock:
            c = conn.get()
            c.execute(DDL)
            c.commit()

    def _rollback(self, c) -> None:
        import psycopg

        try:
            c.rollback()
        except psycopg.Error:
            self.conn.drop()

    def _told(self, exc: BaseException) -> BaseException:
        """A commit's failure: the server's (out of reach, or its disk full) in words with
        the errno a close through the mount answers (memfs.store.pg.conn), else `exc`."""
        import psycopg

        return self.conn.failed(exc) if isinstance(exc, psycopg.OperationalError) else exc

    def _read(self, sql: str, args: tuple) -> list[tuple]:
        """Rows of one read, once more on a new connection if this one broke (Conn.rows)."""
        return self.conn.rows(sql, args)

    # ---- reads -------------------------------------------------------------------------
    def global_generation(self) -> GlobalGeneration:
        row = self._head_row(GLOBAL)
        if row is None:
            return empty_global()
        seq, content = row
        return GlobalGeneration(content=content, revision=global_revision(content), seq=seq)

    def workspace_generation(self, workspace: str) -> WorkspaceGeneration:
        ws = validate_workspace(workspace)
        row = self._head_row(ws)
        if row is None:
            return empty_workspace(ws)
        return _workspace_gen(ws, *row)

    def _head_row(self, ws: str) -> tuple[int, str] | None:
        rows = self._read("SELECT g.seq, g.content FROM memory_heads h JOIN memory_generations g "
                          "ON g.workspace = h.workspace AND g.seq = h.seq WHERE h.workspace = %s",
                          (ws,))
        return rows[0] if rows else None

    def read_record(self, workspace: str, name: str) -> str:
        return MemoryStore._record(self.workspace_generation(workspace), name)

    def workspaces(self) -> list[str]:
        return [r[0] for r in self._read("SELECT workspace FROM memory_heads WHERE workspace "
                                         "<> %s AND seq > 0 ORDER BY workspace", (GLOBAL,))]

    def history(self, workspace: str | None) -> list[GenerationInfo]:
        ws = GLOBAL if workspace is None else validate_workspace(workspace)
        head = self._read("SELECT seq FROM memory_heads WHERE workspace = %s", (ws,))
        if not head:
            return []
        rows = self._read("SELECT seq, revision, parent, created, content FROM "
                          "memory_generations WHERE workspace = %s AND seq <= %s ORDER BY seq "
                          "DESC", (ws, head[0][0]))
        return [GenerationInfo(
            scope="global" if workspace is None else "workspace", workspace=workspace and ws,
            seq=seq, revision=rev, parent_revision=parent, created=created,
            current=seq == head[0][0],
            names=() if workspace is None else tuple(sorted(json.loads(content))))
            for seq, rev, parent, created, content in rows]

    # ---- commits -----------------------------------------------------------------------
    def commit_workspace(self, workspace: str, preview: WorkspacePreview,
                         expected_revision: str) -> str:
        ws = MemoryStore._preview_target(workspace, preview)
        return self._commit_ws(
            ws, lambda current: MemoryStore._checked(current, preview, expected_revision))

    def commit_global(self, content: str, expected_revision: str) -> str:
        def plan(current: GlobalGeneration) -> str:
            MemoryStore._check_expected("Global memory", current.revision, expected_revision)
            return content

        return self._commit_global(plan)

    def put_record(self, workspace: str, name: str, content: str) -> str:
        return self._apply(workspace, [Put(name, content)])

    def delete_record(self, workspace: str, name: str) -> str:
        ws, norm = validate_workspace(workspace), validate_name(name)

        def plan(current: WorkspaceGeneration) -> WorkspacePreview:
            MemoryStore._record(current, norm)  # NoSuchRecord unless it is there
            return preview_workspace_changes(current, [Delete(norm)])

        return self._commit_ws(ws, plan)

    def rename_record(self, workspace: str, old: str, new: str) -> str:
        ws, src, dst = validate_workspace(workspace), validate_name(old), validate_name(new)

        def plan(current: WorkspaceGeneration) -> WorkspacePreview:
            MemoryStore._record(current, src)  # NoSuchRecord unless it is there
            if src == dst:
                return preview_workspace_changes(current, [])
            return preview_workspace_changes(current, [Delete(src), Put(dst, current.records[src])])

        return self._commit_ws(ws, plan)

    def replace_global(self, content: str) -> str:
        return self._commit_global(lambda current: content)

    def _apply(self, workspace: str, changes: Sequence[Change]) -> str:
        ws = validate_workspace(workspace)
        return self._commit_ws(ws, lambda current: preview_workspace_changes(current, changes))

    # ---- the compare-and-swap --------------------------------------------------------------
    def _commit_ws(self, ws: str, plan) -> str:
        with self.conn.lock:
            c = self.conn.get()
            try:
                row = self._lock_head(c, ws)
                current = _workspace_gen(ws, *row) if row else empty_workspace(ws)
                preview = plan(current)
                if preview.no_change:
                    c.rollback()
                    return current.revision
                self._insert(c, ws, current.seq, current.revision, preview.revision,
                             json.dumps(preview.records, sort_keys=True))
                c.commit()
            except BaseException as exc:
                self._rollback(c)
                raise self._told(exc) from exc
        return preview.revision

    def _commit_global(self, plan) -> str:
        with self.conn.lock:
            c = self.conn.get()
            try:
                row = self._lock_head(c, GLOBAL)
                current = (GlobalGeneration(content=row[1], revision=global_revision(row[1]),
                                            seq=row[0]) if row else empty_global())
                planned = preview_global_change(current, plan(current))
                if planned.no_change:
                    c.rollback()
                    return current.revision
                self._insert(c, GLOBAL, current.seq, current.revision, planned.revision,
                             planned.content)
                c.commit()
            except BaseException as exc:
                self._rollback(c)
                raise self._told(exc) from exc
        return planned.revision

    @staticmethod
    def _lock_head(c, ws: str) -> tuple[int, str] | None:
        """The current generation, its head row locked until this transaction ends (a head
        row is made first, under ON CONFLICT, so two first commits also serialize)."""
        c.execute("INSERT INTO memory_heads VALUES (%s, 0, '') ON CONFLICT DO NOTHING", (ws,))
        rows = c.execute("SELECT h.seq, g.content FROM memory_heads h LEFT JOIN "
                         "memory_generations g ON g.workspace = h.workspace AND g.seq = h.seq "
                         "WHERE h.workspace = %s FOR UPDATE OF h", (ws,)).fetchall()
        seq, content = rows[0]
        return None if seq == 0 else (seq, content)

    @staticmethod
    def _insert(c, ws: str, seq: int, parent: str, revision: str, content: str) -> None:
        c.execute("INSERT INTO memory_generations VALUES (%s, %s, %s, %s, %s, %s)",
                  (ws, seq + 1, revision, parent,
                   datetime.now(UTC).isoformat(timespec="seconds"), content))
        c.execute("UPDATE memory_heads SET seq = %s, revision = %s WHERE workspace = %s",
                  (seq + 1, revision, ws))


    # ---- retention (memfs.memory.retention; applied by memfs gc) ---------------------------
    def prune(self, workspace: str | None, keep, why: str, now_ns: int,
              dry_run: bool = False) -> list[Dropped]:
        """The file store's prune, as one transaction holding the scope's head row."""
        ws = GLOBAL if workspace is None else validate_workspace(workspace)
        with self.conn.lock:
            c = self.conn.get()
            try:
                head = c.execute("SELECT seq FROM memory_heads WHERE workspace = %s FOR UPDATE",
                                 (ws,)).fetchall()
                if not head or head[0][0] == 0:
                    c.rollback()
                    return []
                cur = head[0][0]
                rows = [GenRow(seq, rev, created) for seq, rev, created in c.execute(
                    "SELECT seq, revision, created FROM memory_generations WHERE workspace = %s "
                    "AND seq <= %s ORDER BY seq", (ws, cur)).fetchall()]
                kept = keep(rows, cur)
                at = now_iso(now_ns)
                drop = [Dropped(r.seq, r.revision, r.created, at, why) for r in rows
                        if r.seq not in kept and r.seq != cur]
                if dry_run or not drop:
                    c.rollback()
                    return drop
                with c.cursor() as cur_:
                    cur_.executemany("INSERT INTO memory_dropped VALUES (%s, %s, %s, %s, %s, %s) "
                                     "ON CONFLICT DO NOTHING",
                                     [(ws, d.seq, d.revision, d.created, d.dropped_at, d.why)
                                      for d in drop])
                c.execute("DELETE FROM memory_generations WHERE workspace = %s AND seq = "
                          "ANY(%s)", (ws, [d.seq for d in drop]))
                crash_point("prune-in-transaction")
                c.commit()
            except BaseException as exc:
                self._rollback(c)
                raise self._told(exc) from exc
        return drop

    def dropped(self, workspace: str | None) -> list[Dropped]:
        ws = GLOBAL if workspace is None else validate_workspace(workspace)
        return [Dropped(*row) for row in self._read(
            "SELECT seq, revision, created, dropped_at, why FROM memory_dropped WHERE "
            "workspace = %s ORDER BY dropped_at, seq", (ws,))]

    def generation_at(self, workspace: str | None, revision: str
                      ) -> GlobalGeneration | WorkspaceGeneration:
        ws = None if workspace is None else validate_workspace(workspace)
        rev = check_revision_text(revision)
        empty = empty_global() if ws is None else empty_workspace(ws)
        if empty.revision.startswith(rev):
            return empty
        key = GLOBAL if ws is None else ws
        rows = self._read("SELECT DISTINCT ON (revision) revision, seq, content FROM "
                          "memory_generations WHERE workspace = %s AND revision LIKE %s AND "
                          "seq <= (SELECT seq FROM memory_heads WHERE workspace = %s) "
                          "ORDER BY revision, seq DESC", (key, rev + "%", key))
        scope = "Global" if ws is None else f"workspace {ws!r}"
        if len(rows) > 1:
            raise NoSuchRevision(f"{rev} names {len(rows)} revisions of {scope} memory",
                                 "give more of the revision (`memfs memory log` lists them)")
        if rows:
            _, seq, content = rows[0]
            if ws is None:
                return GlobalGeneration(content=content, revision=global_revision(content),
                                        seq=seq)
            return _workspace_gen(ws, seq, content)
        return _absent(scope, rev, self.dropped(ws))

    def check(self) -> list[str]:
        """fsck of memory rows: each head names a row, each row's content hashes to its
        revision."""
        problems = []
        for ws, _head, seq, rev, content in self._read(
                "SELECT h.workspace, h.seq, g.seq, g.revision, g.content FROM memory_heads h "
                "LEFT JOIN memory_generations g ON g.workspace = h.workspace AND g.seq <= h.seq "
                "WHERE h.seq > 0 ORDER BY 1, 3", ()):
            scope = "Global" if ws == GLOBAL else f"workspace {ws!r}"
            if seq is None:
                continue  # no row at all: the query below names the missing head
            got = (global_revision(content) if ws == GLOBAL
                   else workspace_revision(json.loads(content)))
            if got != rev:
                problems.append(f"{scope} memory: generation {seq} does not match its revision")
        missing = self._read("SELECT h.workspace, h.seq FROM memory_heads h WHERE h.seq > 0 AND "
                             "NOT EXISTS (SELECT 1 FROM memory_generations g WHERE "
                             "g.workspace = h.workspace AND g.seq = h.seq)", ())
        problems += [f"{'Global' if ws == GLOBAL else f'workspace {ws!r}'} memory: the current "
                     f"generation {seq} is missing" for ws, seq in missing]
        return sorted(set(problems))


def _workspace_gen(ws: str, seq: int, content: str) -> WorkspaceGeneration:
    records = json.loads(content)
    return WorkspaceGeneration(workspace=ws, records=records, index=render_index(records),
                               revision=workspace_revision(records), seq=seq)
