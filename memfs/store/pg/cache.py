"""This host's copies of what it read from or wrote to the shared store: `<root>/cache/`.

Objects and chunks never change once named, so a copy is never stale; each is checked
against its name when read (xxh3-128 for a chunk, BLAKE2b for an object), so a torn or
damaged copy is a miss, never wrong bytes. Only committed rows are copied in, so a copy
also says the database has the row. Chunks are files under `cache/chunks/` (bounded: the
least recently used go first past `limit` bytes, and before a copy would take what writes
need of the filesystem, `keep_free`: the host's writes are measured against what is free
there, so a cache that filled it would have every write refused with the server far from
full); objects are rows of `cache/objects.db`.
Deleting the folder, even under a running daemon, costs only reads from the database.

Thread-safe: one lock around the bookkeeping; file reads and writes run outside it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

from memfs.durable import mkdir_durable
from memfs.store.chunks import chunk_digest
from memfs.store.space import headroom
from memfs.store.trees import object_id

log = logging.getLogger("memfs.pg")
DEFAULT_LIMIT = 1 << 30
LIMIT_ENV = "MEMFS_CACHE_BYTES"


WRITE_ROOM = 64 << 20  # what writes may still take beside the commits' headroom


def keep_free(size: int) -> int:
    """Bytes of its filesystem (of `size`) the chunk cache leaves free: the commits' headroom
    (memfs.store.space) and room for writes beside it, or a quarter of a small filesystem."""
    return min(size // 4, headroom(size) + WRITE_ROOM)


def cache_limit() -> int:
    text = os.environ.get(LIMIT_ENV)
    return int(text) if text and text.isdigit() else DEFAULT_LIMIT


class ChunkCache:
    def __init__(self, root: Path, limit: int | None = None) -> None:
        self.dir = root / "cache" / "chunks"
        mkdir_durable(self.dir)
        self.limit = cache_limit() if limit is None else limit
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._verified: dict[str, int] = {}  # checked whole in this process: its size
        self.total = 0
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                continue
            st = entry.stat()
            found.append((st.st_mtime_ns, entry.name, st.st_size))
        for _, name, size in sorted(found):
            self._sizes[name] = size
            self.total += size

    def _path(self, cid: str) -> Path:
        return self.dir / cid

    def get(self, cid: str) -> bytes | None:
        try:
            data = self._path(cid).read_bytes()
        except OSError:
            self._forget(cid)
            return None
        if chunk_digest(data) != cid.split(".")[0]:
            self._drop(cid)
            return None
        with self._lock:
            self._verified[cid] = len(data)
            if cid in self._sizes:
                self._sizes.move_to_end(cid)
        return data

    def get_range(self, cid: str, start: int, length: int) -> bytes | None:
        """Bytes [start, start+length) of a cached chunk (checked whole once per process). A
        copy whose size changed since (cut short under a running daemon) is a miss: a range
        read short of the chunk would be taken for the end of the file."""
        if cid not in self._verified and self.get(cid) is None:
            return None
        want = self._verified.get(cid)
        try:
            fd = os.open(self._path(cid), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._forget(cid)
            return None
        try:
            size = os.fstat(fd).st_size
            if size != want:
                self._drop(cid)
                return None
            length = max(0, min(length, size - start))
            data = os.pread(fd, length, start) if length else b""
            if len(data) != length:  # cut short between the fstat and the read
                self._drop(cid)
                return None
            return data
        finally:
            os.close(fd)

    def put(self, cid: str, data: bytes) -> None:
        """Keep a committed chunk (no fsync: a lost copy is a miss)."""
        if len(data) > self.limit:
            return
        with self._lock:
            if cid in self._sizes:
                return
        if not self._room_for(len(data)):
            return
        tmp = self._path(f"{cid}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self._path(cid))
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        with self._lock:
            self._sizes[cid] = len(data)
            self._verified[cid] = len(data)
            self.total += len(data)
            victims = []
            while self.total > self.limit and self._sizes:
                old, size = self._sizes.popitem(last=False)
                self.total -= size
                self._verified.pop(old, None)
                victims.append(old)
        for old in victims:
            self._path(old).unlink(missing_ok=True)

    def _room_for(self, n: int) -> bool:
        """Room for n more bytes that leaves the filesystem's `keep_free`: the least recently
        used copies go first; False (the copy is not kept) when even that is not enough."""
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        short = n + keep_free(st.f_blocks * st.f_frsize) - st.f_bavail * st.f_frsize
        if short <= 0:
            return True
        victims = []
        with self._lock:
            while short > 0 and self._sizes:
                old, size = self._sizes.popitem(last=False)
                self.total -= size
                self._verified.pop(old, None)
                victims.append(old)
                short -= size
        for old in victims:
            self._path(old).unlink(missing_ok=True)
        return short <= 0

    def _forget(self, cid: str) -> None:
        with self._lock:
            size = self._sizes.pop(cid, None)
            if size is not None:
                self.total -= size
            self._verified.pop(cid, None)

    def _drop(self, cid: str) -> None:
        self._forget(cid)
        self._path(cid).unlink(missing_ok=True)


class ObjectCache:
    """Tree objects, manifests, inode tables and intents this host has seen."""

    def __init__(self, root: Path) -> None:
        d = root / "cache"
        mkdir_durable(d)
        self._conn = sqlite3.connect(str(d / "objects.db"), check_same_thread=False,
                                     isolation_level=None)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = OFF")
        self._conn.execute("CREATE TABLE IF NOT EXISTS objects (id TEXT PRIMARY KEY, "
                           "data BLOB NOT NULL)")
        self._lock = threading.Lock()

    def get(self, oid: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT data FROM objects WHERE id = ?", (oid,)).fetchone()
        if row is None:
            return None
        data = bytes(row[0])
        if object_id(data) != oid:
            with self._lock:
                self._conn.execute("DELETE FROM objects WHERE id = ?", (oid,))
            return None
        return data

    def has(self, oids: list[str]) -> set[str]:
        out: set[str] = set()
        with self._lock:
            for i in range(0, len(oids), 500):
                part = oids[i:i + 500]
                q = ",".join("?" * len(part))
                out.update(r[0] for r in self._conn.execute(
                    f"SELECT id FROM objects WHERE id IN ({q})", part))
        return out

    def put_many(self, items: dict[str, bytes]) -> None:
        """Keep committed objects. A copy not kept (a full disk here) is a miss later: never
        an error, since this runs after the commit landed in the database."""
        if not items:
            return
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                self._conn.executemany("INSERT OR IGNORE INTO objects VALUES (?, ?)",
                                       items.items())
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                log.warning("object cache: %d object(s) not kept: %s", len(items), exc)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
