"""The PostgreSQL store's records beside the commits: the same methods as the embedded
store's (memfs.store.sqlite_records; memfs.store.backend.Records), in PostgreSQL's SQL.

PgRecords reads through the store's reader connection (any thread); PgTxRecords writes on
the writer connection inside the caller's transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfs.store.store import CommitDropped, StoreError, _commit_from_row

if TYPE_CHECKING:
    from memfs.store.backend import DroppedCommit
    from memfs.store.store import Commit

COMMIT_COLUMNS = "id, seq, parent, tree, branch, time_ns, message, processes"


class PgRecords:
    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]: ...  # PgStore's

    def has_commit(self, cid: str) -> bool:
        return bool(self._query("SELECT 1 FROM commits WHERE id = %s", (cid,)))

    def commit_chain(self, start: str, limit: int) -> list[Commit]:
        rows = self._query(
            "WITH RECURSIVE chain(id, n) AS (SELECT %s::text, 0 UNION ALL "
            "SELECT c.parent, chain.n + 1 FROM commits c JOIN chain ON c.id = chain.id "
            "WHERE c.parent IS NOT NULL AND chain.n + 1 < %s) "
            "SELECT c.id, c.seq, c.parent, c.tree, c.branch, c.time_ns, c.message, c.processes "
            "FROM chain JOIN commits c ON c.id = chain.id ORDER BY chain.n", (start, limit))
        return [_commit_from_row(r) for r in rows]

    def dropped_commit(self, cid: str) -> DroppedCommit | None:
        """The tombstone GC left for `cid` (memfs.store.pg.gc), if it dropped it."""
        from memfs.store.backend import DroppedCommit

        rows = self._query("SELECT parent, time_ns, dropped_ns, reason FROM dropped_commits "
                           "WHERE id = %s", (cid,))
        return DroppedCommit(cid, *rows[0]) if rows else None

    def dropped_with_prefix(self, base: str) -> list[str]:
        return [r[0] for r in self._query("SELECT id FROM dropped_commits WHERE "
                                          "substr(id, 1, %s) = %s LIMIT 2", (len(base), base))]

    def branch_head(self, name: str) -> str | None:
        rows = self._query("SELECT head FROM branches WHERE name = %s", (name,))
        return rows[0][0] if rows else None

    def commits_with_prefix(self, prefix: str) -> list[str]:
        """Two at the most (the caller asks whether one is alone); LIKE's wildcards are
        dropped from the prefix (commit ids are hex)."""
        pattern = prefix.replace("\\", "").replace("%", "").replace("_", "") + "%"
        return [r[0] for r in self._query("SELECT id FROM commits WHERE id LIKE %s LIMIT 2",
                                          (pattern,))]

    def commit_ops(self, ids: list[str]) -> dict[str, str]:
        if not ids:
            return {}
        return dict(self._query("SELECT commit_id, data FROM commit_ops WHERE commit_id = "
                                "ANY(%s)", (list(ids),)))

    def marks_of(self, ids: list[str]) -> list[tuple[str, str]]:
        if not ids:
            return []
        return self._query("SELECT commit_id, name FROM marks WHERE commit_id = ANY(%s) "
                           "ORDER BY seq", (list(ids),))

    def mark_commit(self, name: str, branch: str | None = None) -> str | None:
        if branch is None:
            rows = self._query("SELECT commit_id FROM marks WHERE name = %s ORDER BY seq DESC "
                               "LIMIT 1", (name,))
        else:
            rows = self._query("SELECT commit_id FROM marks WHERE name = %s AND branch = %s "
                               "ORDER BY seq DESC LIMIT 1", (name, branch))
        return rows[0][0] if rows else None

    def checkpoint_rows(self) -> list[tuple[str, str, str, int]]:
        return self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                           "ORDER BY time_ns, name")

    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None:
        rows = self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                           "WHERE name = %s", (name,))
        return rows[0] if rows else None

    def commit_ids(self) -> list[str]:
        return [r[0] for r in self._query("SELECT id FROM commits ORDER BY seq")]

    def commits_by_time(self, start_ns: int, end_ns: int) -> list[tuple[str, int]]:
        return self._query("SELECT id, time_ns FROM commits WHERE time_ns >= %s AND "
                           "time_ns < %s ORDER BY time_ns, seq", (start_ns, end_ns))

    def commit_times(self) -> tuple[int, int | None, int | None]:
        return tuple(self._query("SELECT COUNT(*), MIN(time_ns), MAX(time_ns) FROM commits")[0])

    def newest_time_before(self, end_ns: int) -> int | None:
        return self._query("SELECT MAX(time_ns) FROM commits WHERE time_ns < %s",
                           (end_ns,))[0][0]

    def oldest_time_from(self, start_ns: int) -> int | None:
        return self._query("SELECT MIN(time_ns) FROM commits WHERE time_ns >= %s",
                           (start_ns,))[0][0]


class PgTxRecords:
    conn: object  # psycopg.Connection, inside the writer's transaction

    def put_ops(self, commit_id: str, data: str) -> None:
        self.conn.execute("INSERT INTO commit_ops VALUES (%s, %s) ON CONFLICT (commit_id) "
                          "DO UPDATE SET data = excluded.data", (commit_id, data))

    def ref_exists(self, table: str, name: str) -> bool:
        assert table in ("branches", "checkpoints")
        return self.conn.execute(f"SELECT 1 FROM {table} WHERE name = %s",
                                 (name,)).fetchone() is not None

    def add_mark(self, name: str, commit_id: str, branch: str, time_ns: int, label: str) -> None:
        self.conn.execute("INSERT INTO marks (name, commit_id, branch, time_ns, label) "
                          "VALUES (%s, %s, %s, %s, %s)", (name, commit_id, branch, time_ns, label))
        self.notify("*", "-")

    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None:
        return self.conn.execute("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                                 "WHERE name = %s FOR UPDATE", (name,)).fetchone()

    def require_commit(self, cid: str) -> None:
        """A head or name about to point at `cid`: the commit must still be there. Under the
        transaction's GC lock (memfs.store.pg.gc), so a GC cannot drop it before this ends."""
        if self.conn.execute("SELECT 1 FROM commits WHERE id = %s", (cid,)).fetchone():
            return
        gone = self.conn.execute("SELECT parent, time_ns, dropped_ns, reason FROM "
                                 "dropped_commits WHERE id = %s", (cid,)).fetchone()
        if gone is not None:
            raise CommitDropped(cid, gone[1], gone[2], gone[3])
        raise StoreError(f"no commit {cid}", "see `memfs log` for commit ids")

    def set_checkpoint(self, name: str, commit_id: str, branch: str, time_ns: int) -> None:
        self.require_commit(commit_id)
        self.conn.execute("INSERT INTO checkpoints VALUES (%s, %s, %s, %s) ON CONFLICT (name) "
                          "DO UPDATE SET commit_id = excluded.commit_id, branch = "
                          "excluded.branch, time_ns = excluded.time_ns",
                          (name, commit_id, branch, time_ns))
        self.notify("*", "-")

    def delete_checkpoint(self, name: str) -> None:
        self.conn.execute("DELETE FROM checkpoints WHERE name = %s", (name,))
        self.notify("*", "-")

    def add_reflog(self, ref: str, old: str | None, new: str, reason: str, time_ns: int) -> None:
        self.conn.execute("INSERT INTO reflog (branch, old, new, reason, time_ns) VALUES "
                          "(%s, %s, %s, %s, %s)", (ref, old, new, reason, time_ns))

    def notify(self, branch: str, head: str) -> None: ...  # PgTx's
