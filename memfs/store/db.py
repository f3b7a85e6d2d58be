"""The store's SQLite database: connection settings and schema.

WAL with synchronous=FULL: a transaction that returned is on disk. Two connections per
process: one writer (used only by the group-commit thread) and one reader (used by the
event loop), so a long commit never blocks a lookup; WAL lets them run side by side.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = 1
WAL_SIZE_LIMIT = 16 << 20

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Content chunks: (pack file, offset, length). Packs are append-only files under packs/.
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, pack INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL);
-- Tree objects: directory listings and file manifests, keyed by a BLAKE2b digest.
CREATE TABLE IF NOT EXISTS objects (id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, parent TEXT, tree TEXT NOT NULL,
    branch TEXT NOT NULL, time_ns INTEGER NOT NULL, message TEXT NOT NULL,
    processes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS branches (name TEXT PRIMARY KEY, head TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY, commit_id TEXT NOT NULL, branch TEXT NOT NULL, time_ns INTEGER NOT NULL);
-- Every move of a branch head that is not a plain commit (undo, reset), so nothing is lost.
CREATE TABLE IF NOT EXISTS reflog (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, branch TEXT NOT NULL, old TEXT, new TEXT NOT NULL,
    reason TEXT NOT NULL, time_ns INTEGER NOT NULL);
"""


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


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
    )
