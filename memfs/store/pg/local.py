"""What one host keeps for itself beside a shared PostgreSQL store: `<root>/host.db`.

The selected branch and the backing-directory bindings are this host's, not the store's: a
backing directory is on one machine, and two hosts work on two branches. The backing journal
(memfs.store.journal: evidence P, write-ahead intents) lives in the same SQLite file, for the
same reason: what a disk last agreed with is a fact about this machine's disk. SQLite WAL with
synchronous=FULL, as the embedded store, so the write-ahead order is the embedded one.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from memfs.durable import fsync_dir

BINDING_KEY = "backing:"

SCHEMA = "CREATE TABLE IF NOT EXISTS host_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"


class LocalState:
    """Thread-safe (one lock, one connection)."""

    def __init__(self, root: Path, *, readonly: bool = False) -> None:
        self.path = root / "host.db"
        new = not self.path.exists()
        if readonly and new:
            self._conn = sqlite3.connect(":memory:", check_same_thread=False,
                                         isolation_level=None)
        else:
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False,
                                         isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 10000")
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        if not readonly or new:
            self._conn.executescript(SCHEMA)
        if new and not readonly:
            fsync_dir(root)
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM host_meta WHERE key = ?",
                                     (key,)).fetchone()
        return row[0] if row else None

    def set(self, key: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._conn.execute("DELETE FROM host_meta WHERE key = ?", (key,))
            else:
                self._conn.execute("INSERT OR REPLACE INTO host_meta VALUES (?, ?)",
                                   (key, value))

    def bindings(self) -> dict[str, dict]:
        with self._lock:
            rows = self._conn.execute("SELECT key, value FROM host_meta WHERE key LIKE ?",
                                      (BINDING_KEY + "%",)).fetchall()
        return {k[len(BINDING_KEY):]: json.loads(v) for k, v in rows}

    def set_binding(self, mount: str, doc: dict | None) -> None:
        self.set(BINDING_KEY + mount, None if doc is None else json.dumps(doc, sort_keys=True))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
