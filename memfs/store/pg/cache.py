"""This host's copies of what it read from or wrote to the shared store: `<root>/cache/`.

Objects and chunks never change once named, so a copy is never stale; each is checked
against its name when read (xxh3-128 for a chunk, BLAKE2b for an object; a chunk in a pack
once per process, at its first read), so a torn or damaged copy is a miss, never wrong
bytes. Only committed rows are copied in, so a copy also says the database has the row.
Chunks of at most SMALL_MAX bytes are rows of `cache/small-chunks.db` (a git commit stores
thousands of pieces of a few KiB, and a file each cost more of the kernel's time than the
server spent storing them); the others are appended to packs under `cache/packs/`
(memfs.store.pg.cachepacks: a file per 1 MiB chunk cost the kernel a file to create at each
write and an open at each read), indexed by rows of the same database written after the
bytes. All are bounded together: the least recently used rows and packs (a pack goes whole)
go first past `limit` bytes, and before a copy would take what writes need of the
filesystem, `keep_free`: the host's writes are measured against what is free there, so a
cache that filled it would have every write refused with the server far from full.
Objects are rows of `cache/objects.db`. Deleting the folder, even under a running daemon,
costs only reads from the database.

Thread-safe: one lock around the bookkeeping; file reads and writes run outside it, and the
small chunks' database has a lock of its own. Copies of committed chunks are written by the
cache's own thread (`keep`), in batches, so a commit does not wait for them: until written they
are served from memory, at most PENDING_MAX bytes of them.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from memfs.durable import mkdir_durable
from memfs.store.chunks import chunk_digest
from memfs.store.pg.cachepacks import CachePacks
from memfs.store.space import headroom
from memfs.store.trees import object_id

log = logging.getLogger("memfs.pg")
DEFAULT_LIMIT = 1 << 30
LIMIT_ENV = "MEMFS_CACHE_BYTES"


WRITE_ROOM = 64 << 20  # what writes may still take beside the commits' headroom
PENDING_MAX = 64 << 20  # copies handed to the writer thread, not yet written: `keep` waits past it
SMALL_MAX = 64 << 10  # a chunk up to this size is a row of the small chunks' database
BATCH_MAX = 8 << 20  # pending bytes the writer thread takes at once (one database transaction)
PACK_MAX = 64 << 20  # a pack of copies grows to this, then the next one starts


def pack_max(limit: int) -> int:
    """A pack's size: PACK_MAX, or a sixteenth of a small bound (a pack goes whole)."""
    return max(SMALL_MAX, min(PACK_MAX, limit // 16))


def keep_free(size: int) -> int:
    """Bytes of its filesystem (of `size`) the chunk cache leaves free: the commits' headroom
    (memfs.store.space) and room for writes beside it, or a quarter of a small filesystem."""
    return min(size // 4, headroom(size) + WRITE_ROOM)


def cache_limit() -> int:
    text = os.environ.get(LIMIT_ENV)
    return int(text) if text and text.isdigit() else DEFAULT_LIMIT


class Loc(NamedTuple):
    """Where a packed copy lies."""

    pack: str
    off: int
    len: int


class ChunkCache:
    def __init__(self, root: Path, limit: int | None = None) -> None:
        self.limit = cache_limit() if limit is None else limit
        shutil.rmtree(root / "cache" / "chunks", ignore_errors=True)  # a file each, before packs
        self._packs = CachePacks(root / "cache" / "packs", pack_max(self.limit))
        self.dir = self._packs.dir
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # rows and packs, least recently
        # used first: a pack goes whole, so a read of one of its copies keeps it all
        self._verified: set[str] = set()  # packed copies checked whole in this process
        self._pending: dict[str, bytes] = {}  # kept, not yet written (the writer thread's)
        self._pending_bytes = 0
        self._moved = threading.Condition(self._lock)  # pending taken or added; closing
        self._writer: threading.Thread | None = None
        self._closing = False
        self.total = 0
        self._small: set[str] = set()  # kept as rows of the small chunks' database
        self._packed: dict[str, Loc] = {}  # kept in a pack
        self._members: dict[str, set[str]] = {}  # pack -> the copies indexed in it
        self._db_lock = threading.Lock()
        self._db: sqlite3.Connection | None = _small_db(root / "cache" / "small-chunks.db")
        for cid, size in self._db.execute("SELECT id, length(data) FROM chunks ORDER BY rowid"):
            self._sizes[cid] = size  # oldest first: rows are numbered as they are written
            self._small.add(cid)
            self.total += size
        self._load_packs()

    def _load_packs(self) -> None:
        """The packs on disk and the copies indexed in them; index rows past a pack's end
        or of a pack gone are deleted (a pack deleted behind the cache's back)."""
        assert self._db is not None
        for name, size in self._packs.found():
            self._sizes[name] = size
            self._members[name] = set()
            self.total += size
        stale = []
        for cid, pack, off, n in self._db.execute("SELECT id, pack, off, len FROM packed"):
            if pack in self._members and off + n <= self._sizes[pack]:
                self._packed[cid] = Loc(pack, off, n)
                self._members[pack].add(cid)
            else:
                stale.append((cid,))
        if stale:
            _in_one_transaction(self._db, "DELETE FROM packed WHERE id = ?", stale)

    def _known(self, cid: str) -> bool:
        """Under the lock: kept on disk."""
        return cid in self._small or cid in self._packed

    def has(self, cid: str) -> bool:
        """Kept here (a copy on disk, or one waiting for the writer)? A copy deleted behind
        the cache's back is a miss at `get`, as before."""
        with self._lock:
            return cid in self._pending or self._known(cid)

    def get(self, cid: str) -> bytes | None:
        """The copy, checked; None if there is none (a chunk this cache never kept costs no
        file system call: a commit asks about each of its new pieces)."""
        with self._lock:
            data = self._pending.get(cid)
            small = cid in self._small
            loc = self._packed.get(cid)
        if data is not None:
            return data
        if small:
            data = self._read_small(cid)
        elif loc is not None:
            data = self._packs.read(loc.pack, loc.off, loc.len)
        else:
            return None
        if data is None or chunk_digest(data) != cid.split(".")[0]:
            self._drop(cid)
            return None
        with self._lock:
            if loc is not None and self._packed.get(cid) == loc:
                self._verified.add(cid)
            self._touch(loc.pack if loc is not None else cid)
        return data

    def _touch(self, key: str) -> None:
        """Under the lock: a row or pack just used."""
        if key in self._sizes:
            self._sizes.move_to_end(key)

    def get_range(self, cid: str, start: int, length: int) -> bytes | None:
        """Bytes [start, start+length) of a cached chunk (checked whole once per process, at
        its first read). A copy cut short since (under a running daemon) is a miss: a range
        read short of the chunk would be taken for the end of the file."""
        with self._lock:
            pending = self._pending.get(cid)
            loc = self._packed.get(cid)
            checked = cid in self._verified
            if checked and loc is not None:
                self._touch(loc.pack)
        if pending is None and not checked:
            pending = self.get(cid)  # a row (a few KiB, checked at each read) or a first read
            if pending is None:
                return None
        if pending is not None:
            return pending[start:start + max(0, length)]
        assert loc is not None
        length = max(0, min(length, loc.len - start))
        data = self._packs.read(loc.pack, loc.off + start, length)
        if data is None:
            self._drop(cid)
        return data

    def keep(self, chunks: dict[str, bytes], *, wait: bool = True) -> None:
        """Copy committed chunks in from the cache's writer thread, so the caller (the commit
        thread after its COMMIT: an fsync waits for it) does not wait for the files (measured:
        256 MiB of copies took 0.47 s of a commit thread that sent them to the server in
        about 2 s). Past PENDING_MAX bytes not yet written the caller waits for room, or with
        `wait=False` (a reader that missed) that copy is not kept."""
        with self._moved:
            for cid, data in chunks.items():
                if len(data) > self.limit or self._known(cid) or cid in self._pending:
                    continue
                while self._pending_bytes >= PENDING_MAX and not self._closing and wait:
                    self._moved.wait()
                if self._closing or self._pending_bytes >= PENDING_MAX:
                    continue
                self._pending[cid] = data
                self._pending_bytes += len(data)
                self._moved.notify_all()
            if self._writer is None and self._pending and not self._closing:
                self._writer = threading.Thread(target=self._write_pending, daemon=True,
                                                name="memfs-cache")
                self._writer.start()

    def _write_pending(self) -> None:
        """The writer thread: the oldest pending copies (up to BATCH_MAX bytes) to their rows
        and files, until closed and drained. They stay pending, served from memory, until
        written."""
        while True:
            with self._moved:
                while not self._pending and not self._closing:
                    self._moved.wait()
                if not self._pending:
                    return
                batch: dict[str, bytes] = {}
                size = 0
                for cid, data in self._pending.items():
                    if batch and size + len(data) > BATCH_MAX:
                        break
                    batch[cid] = data
                    size += len(data)
            try:
                self.put_many(batch)
            except Exception:  # noqa: BLE001 - a copy not kept is a miss; the thread goes on
                log.exception("chunk cache: %d copies (the first %s) were not kept", len(batch),
                              next(iter(batch)))
            finally:
                with self._moved:
                    for cid in batch:
                        del self._pending[cid]
                    self._pending_bytes -= size
                    self._moved.notify_all()

    def flush(self) -> None:
        """Wait until every copy handed to `keep` is written (or given up)."""
        with self._moved:
            while self._pending:
                self._moved.wait()

    def close(self) -> None:
        """Write what is pending, then stop the writer thread."""
        with self._moved:
            self._closing = True
            self._moved.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join()
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None
        self._packs.close()


    def put(self, cid: str, data: bytes) -> None:
        """Keep one committed chunk, now."""
        self.put_many({cid: data})

    def put_many(self, chunks: dict[str, bytes]) -> None:
        """Keep committed chunks, now (no fsync: a lost copy is a miss): the small ones as rows
        in one transaction, the others appended to this process's pack and indexed after."""
        with self._lock:
            todo = {c: d for c, d in chunks.items()
                    if len(d) <= self.limit and not self._known(c)}
        if not todo or not self._room_for(sum(len(d) for d in todo.values())):
            return
        small = {c: d for c, d in todo.items() if len(d) <= SMALL_MAX}
        if small and self._insert_small(small):
            with self._lock:
                for cid, data in small.items():
                    self._sizes[cid] = len(data)
                    self._small.add(cid)
                    self.total += len(data)
        self._put_packed({c: d for c, d in todo.items() if c not in small})
        with self._lock:
            victims = []
            while self.total > self.limit and self._sizes:
                victims.append(self._pop_oldest())
        self._remove(victims)

    def _put_packed(self, chunks: dict[str, bytes]) -> None:
        """Append each copy to the pack, then index them all (one transaction): a copy a kill
        cut off is never indexed."""
        placed: dict[str, Loc] = {}
        for cid, data in chunks.items():
            got = self._packs.append(data)
            if got is None:
                continue
            with self._lock:
                self._grown(got.pack, got.size)
            if got.off >= 0:
                placed[cid] = Loc(got.pack, got.off, len(data))
        if not placed:
            return
        self._index(placed)
        with self._lock:
            for cid, loc in placed.items():
                members = self._members.get(loc.pack)
                if members is None:  # the pack went (the bound) before it was indexed
                    continue
                members.add(cid)
                self._packed[cid] = loc
                self._verified.add(cid)  # the bytes just written

    def _grown(self, pack: str, size: int) -> None:
        """Under the lock: a pack's size after an append (most recently used)."""
        self.total += size - self._sizes.get(pack, 0)
        self._sizes[pack] = size
        self._sizes.move_to_end(pack)
        self._members.setdefault(pack, set())

    def _index(self, placed: dict[str, Loc]) -> None:
        rows = [(cid, *loc) for cid, loc in placed.items()]
        with self._db_lock:
            if self._db is None:
                return
            try:
                _in_one_transaction(self._db, "INSERT OR REPLACE INTO packed VALUES (?, ?, ?, ?)",
                                    rows)
            except sqlite3.Error as exc:  # known to this process only: a miss after a restart
                log.warning("chunk cache: %d packed copies not indexed: %s", len(rows), exc)

    def _insert_small(self, chunks: dict[str, bytes]) -> bool:
        with self._db_lock:
            if self._db is None:
                return False
            try:
                _in_one_transaction(self._db, "INSERT OR REPLACE INTO chunks VALUES (?, ?)",
                                    list(chunks.items()))
            except sqlite3.Error as exc:
                log.warning("chunk cache: %d small copies not kept: %s", len(chunks), exc)
                return False
        return True

    def _read_small(self, cid: str) -> bytes | None:
        with self._db_lock:
            if self._db is None:
                return None
            try:
                row = self._db.execute("SELECT data FROM chunks WHERE id = ?", (cid,)).fetchone()
            except sqlite3.Error:
                return None
        return bytes(row[0]) if row else None

    def _pop_oldest(self) -> tuple[str, bool]:
        """Under the lock: the least recently used row or pack, forgotten with its copies;
        (its name, a pack?)."""
        old, size = self._sizes.popitem(last=False)
        self.total -= size
        members = self._members.pop(old, None)
        if members is None:
            self._small.discard(old)
            return old, False
        for cid in members:
            self._packed.pop(cid, None)
            self._verified.discard(cid)
        return old, True

    def _remove(self, victims: list[tuple[str, bool]]) -> None:
        """Delete forgotten rows and packs, with the packs' index rows (one transaction)."""
        rows = [(cid,) for cid, pack in victims if not pack]
        packs = [(name,) for name, pack in victims if pack]
        with self._db_lock:
            if self._db is not None:
                try:
                    if rows:
                        _in_one_transaction(self._db, "DELETE FROM chunks WHERE id = ?", rows)
                    if packs:
                        _in_one_transaction(self._db, "DELETE FROM packed WHERE pack = ?",
                                            packs)
                except sqlite3.Error as exc:  # a row left over is read, checked, dropped
                    log.warning("chunk cache: %d copies not deleted: %s", len(victims), exc)
        for (name,) in packs:
            self._packs.delete(name)

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
                short -= self._sizes[next(iter(self._sizes))]
                victims.append(self._pop_oldest())
        self._remove(victims)
        return short <= 0

    def _drop(self, cid: str) -> None:
        """Forget a copy found damaged or gone, and delete its row (a packed copy's bytes
        stay in its pack, counted, until the pack goes)."""
        with self._lock:
            self._verified.discard(cid)
            loc = self._packed.pop(cid, None)
            if loc is not None:
                self._members.get(loc.pack, set()).discard(cid)
            small = cid in self._small
            if small:
                self._small.discard(cid)
                self.total -= self._sizes.pop(cid, 0)
        if small:
            self._remove([(cid, False)])
        elif loc is not None:
            with self._db_lock:
                if self._db is not None:
                    try:
                        self._db.execute("DELETE FROM packed WHERE id = ?", (cid,))
                    except sqlite3.Error:
                        pass


def _in_one_transaction(conn: sqlite3.Connection, sql: str, rows: list[tuple]) -> None:
    conn.execute("BEGIN")
    try:
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _small_db(path: Path) -> sqlite3.Connection:
    """The small chunks' database (no fsync: a copy lost in a crash is a miss)."""
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("CREATE TABLE IF NOT EXISTS chunks (id TEXT PRIMARY KEY, data BLOB NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS packed (id TEXT PRIMARY KEY, pack TEXT NOT NULL, "
                 "off INTEGER NOT NULL, len INTEGER NOT NULL)")
    conn.execute("CREATE INDEX IF NOT EXISTS packed_pack ON packed (pack)")
    return conn


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
