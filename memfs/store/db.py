"""The store's SQLite database: connection settings (the tables are memfs.store.schema's).

WAL with synchronous=FULL: a transaction that returned is on disk. Two connections per
process: one writer (used only by the group-commit thread) and one reader (used by the
event loop), so a long commit never blocks a lookup; WAL lets them run side by side.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

WAL_SIZE_LIMIT = 16 << 20

def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the database with the durability settings the contract rests on."""
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
    else:
        new = not path.exists() or path.stat().st_size == 0
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    if not readonly:
        if new:
            # Before WAL, and only on a new database (on an old one it is a write, which a
            # full disk refuses). Pages GC frees go back to the filesystem (memfs.store.gc
            # runs incremental_vacuum); an older store keeps them for later commits instead.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        # After a big transaction the WAL is cut back to this once checkpointed, instead of
        # keeping its largest size on the disk forever.
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def create_schema(conn: sqlite3.Connection, where: object = "store.db") -> None:
    """The store's tables at today's version (memfs.store.schema, where they are defined)."""
    from memfs.store import schema

    schema.migrate(conn, where)
