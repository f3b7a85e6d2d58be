"""The embedded store's records beside the commits, as SQL: operations, marks, checkpoints,
reflog rows and the history queries (memfs.store.backend.Records lists them).

Mixed into Store (reads through its reader, any thread) and Transaction (writes on the
writer connection, inside the caller's transaction), so memfs.store.history and fsck speak to
either backend through the same methods and no SQL leaves the backend that owns it. Their
tables are in memfs.store.schema with every other table of store.db.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memfs.store.backend import DroppedCommit
    from memfs.store.store import Commit

def _marks(n: int) -> str:
    return ",".join("?" * n)


class SqliteRecords:
    """Store's side (reads). Uses Store._query."""

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # Store's

    def _has_table(self, name: str) -> bool:
        """A table, once there, stays: remembered (history walks ask at every gap step)."""
        seen = self.__dict__.setdefault("_tables_seen", set())
        if name not in seen and self._query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)):
            seen.add(name)
        return name in seen

    def has_commit(self, cid: str) -> bool:
        return bool(self._query("SELECT 1 FROM commits WHERE id = ?", (cid,)))

    def commit_chain(self, start: str, limit: int) -> list[Commit]:
        """`start` and up to `limit - 1` first parents, newest first (one query)."""
        from memfs.store.store import _commit_from_row

        return [_commit_from_row(row) for row in self._query(
            "WITH RECURSIVE chain(id, n) AS (SELECT ?, 0 UNION ALL "
            "SELECT c.parent, chain.n + 1 FROM commits c JOIN chain ON c.id = chain.id "
            "WHERE c.parent IS NOT NULL AND chain.n + 1 < ?) "
            "SELECT c.id, c.seq, c.parent, c.tree, c.branch, c.time_ns, c.message, c.processes "
            "FROM chain JOIN commits c ON c.id = chain.id ORDER BY chain.n", (start, limit))]

    def dropped_commit(self, cid: str) -> DroppedCommit | None:
        """The tombstone retention left for `cid` (None: never dropped, or a store opened
        read-only that predates retention)."""
        from memfs.store.backend import DroppedCommit

        if not self._has_table("dropped_commits"):
            return None
        rows = self._query("SELECT parent, time_ns, dropped_ns, reason FROM dropped_commits "
                           "WHERE id = ?", (cid,))
        return DroppedCommit(cid, *rows[0]) if rows else None

    def branch_head(self, name: str) -> str | None:
        rows = self._query("SELECT head FROM branches WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    def commits_with_prefix(self, prefix: str) -> list[str]:
        return [r[0] for r in self._query("SELECT id FROM commits WHERE substr(id, 1, ?) = ?",
                                          (len(prefix), prefix))]

    def dropped_with_prefix(self, base: str) -> list[str]:
        """Ids of dropped commits that start with `base` (a revision naming one is refused
        by name, not as unknown)."""
        if not self._has_table("dropped_commits"):
            return []
        return [r[0] for r in self._query("SELECT id FROM dropped_commits "
                                          "WHERE substr(id, 1, ?) = ?", (len(base), base))]

    def commit_ops(self, ids: list[str]) -> dict[str, str]:
        if not ids or not self._has_table("commit_ops"):
            return {}
        return dict(self._query(f"SELECT commit_id, data FROM commit_ops WHERE commit_id IN "
                                f"({_marks(len(ids))})", tuple(ids)))

    def marks_of(self, ids: list[str]) -> list[tuple[str, str]]:
        """(commit, mark name) for these commits, oldest mark first."""
        if not ids or not self._has_table("marks"):
            return []
        return self._query(f"SELECT commit_id, name FROM marks WHERE commit_id IN "
                           f"({_marks(len(ids))}) ORDER BY seq", tuple(ids))

    def mark_commit(self, name: str, branch: str | None = None) -> str | None:
        if not self._has_table("marks"):
            return None
        sql, args = "SELECT commit_id FROM marks WHERE name = ?", (name,)
        if branch is not None:
            sql, args = sql + " AND branch = ?", (name, branch)
        rows = self._query(sql + " ORDER BY seq DESC LIMIT 1", args)
        return rows[0][0] if rows else None

    def checkpoint_rows(self) -> list[tuple[str, str, str, int]]:
        return self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                           "ORDER BY time_ns, name")

    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None:
        rows = self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                           "WHERE name = ?", (name,))
        return rows[0] if rows else None

    def commit_ids(self) -> list[str]:
        """Every commit, oldest first (fsck)."""
        return [r[0] for r in self._query("SELECT id FROM commits ORDER BY seq")]

    def commits_by_time(self, start_ns: int, end_ns: int) -> list[tuple[str, int]]:
        return self._query("SELECT id, time_ns FROM commits WHERE time_ns >= ? AND time_ns < ? "
                           "ORDER BY time_ns, seq", (start_ns, end_ns))

    def commit_times(self) -> tuple[int, int | None, int | None]:
        """(how many commits, oldest time, newest time)."""
        return tuple(self._query("SELECT COUNT(*), MIN(time_ns), MAX(time_ns) FROM commits")[0])

    def newest_time_before(self, end_ns: int) -> int | None:
        return self._query("SELECT MAX(time_ns) FROM commits WHERE time_ns < ?", (end_ns,))[0][0]

    def oldest_time_from(self, start_ns: int) -> int | None:
        return self._query("SELECT MIN(time_ns) FROM commits WHERE time_ns >= ?",
                           (start_ns,))[0][0]

    def data_version(self) -> int:
        """Changes when any connection (this process's or another's) commits: memos of
        history listings compare it."""
        return self._query("PRAGMA data_version")[0][0]


class SqliteTxRecords:
    """Transaction's side (writes, on the writer connection inside its transaction)."""

    conn: sqlite3.Connection

    def put_ops(self, commit_id: str, data: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO commit_ops VALUES (?, ?)", (commit_id, data))

    def ref_exists(self, table: str, name: str) -> bool:
        """A branch (table "branches") or checkpoint ("checkpoints") of that name."""
        assert table in ("branches", "checkpoints")
        return self.conn.execute(f"SELECT 1 FROM {table} WHERE name = ?",
                                 (name,)).fetchone() is not None

    def add_mark(self, name: str, commit_id: str, branch: str, time_ns: int, label: str) -> None:
        self.conn.execute("INSERT INTO marks (name, commit_id, branch, time_ns, label) "
                          "VALUES (?, ?, ?, ?, ?)", (name, commit_id, branch, time_ns, label))

    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None:
        return self.conn.execute("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                                 "WHERE name = ?", (name,)).fetchone()

    def set_checkpoint(self, name: str, commit_id: str, branch: str, time_ns: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)",
                          (name, commit_id, branch, time_ns))

    def delete_checkpoint(self, name: str) -> None:
        self.conn.execute("DELETE FROM checkpoints WHERE name = ?", (name,))

    def add_reflog(self, ref: str, old: str | None, new: str, reason: str, time_ns: int) -> None:
        self.conn.execute(
            "INSERT INTO reflog (branch, old, new, reason, time_ns) VALUES (?, ?, ?, ?, ?)",
            (ref, old, new, reason, time_ns))
