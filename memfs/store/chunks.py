"""Content-addressed chunks in append-only pack files.

A file's content is cut into fixed CHUNK_SIZE pieces; each piece is stored once, named by
its xxh3-128 digest. Before two different writes share a name, their bytes are compared: a
digest collision gets a suffixed name, so it can never alias content.

Why packs and not one file per chunk: a group commit of 10k small files would otherwise
need 10k fsyncs. A commit appends its new chunks to the current pack and syncs it once;
only then does the SQLite transaction that references them run. Bytes past what SQLite
references (a crash between append and transaction) are dead space, never read.

A chunk that replaces another (the same piece of the same file, changed a little) may be kept
as a patch over it (memfs.store.delta): its row's `over` names a full base and the patches
between (each a committed row, so durable before the patch is appended), and a read takes
them and the patch. GC keeps what a live row is read through (memfs.store.gc).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import xxhash

from memfs.durable import fsync_dir, mkdir_durable
from memfs.store import delta
from memfs.store.delta import split_over

CHUNK_SIZE = 1 << 20
PACK_ROLLOVER = 256 << 20


def chunk_digest(data: bytes | memoryview) -> str:
    return xxhash.xxh3_128_hexdigest(data)


LOCATIONS_KEPT = 65536  # chunk locations cached (most recently used; a miss is one SELECT)
FULL_KEPT = 8  # recent chunks' full bytes the commit thread keeps (the next patch's "before")


class Loc(NamedTuple):
    """Where a chunk's stored bytes are: whole, or (`over` set) a patch over those chunks
    (a full base, then patches, oldest first)."""

    pack: int
    off: int
    len: int
    over: tuple[str, ...] = ()


Row = tuple[str, int, int, int, str | None]  # a chunks row: id, pack, off, len, over


class ChunkStore:
    """Reads from any thread; writes only from the commit thread (one at a time)."""

    def __init__(self, root: Path, *, deltas: bool = True) -> None:
        self.dir = root / "packs"
        mkdir_durable(self.dir)
        self._read_fds: dict[int, int] = {}
        self._locations: OrderedDict[str, Loc] = OrderedDict()
        self._lock = threading.Lock()
        # The chunks table has the `over` column (schema 3): False only for a read-only open
        # of an older store, which holds no patches.
        self._deltas = deltas
        self._select = ("SELECT pack, off, len, over FROM chunks WHERE id = ?" if deltas else
                        "SELECT pack, off, len, NULL FROM chunks WHERE id = ?")
        self._full: OrderedDict[str, bytes] = OrderedDict()  # commit thread: recent chunks
        self._write_pack: int | None = None
        self._write_fd: int | None = None
        self._write_end = 0
        self._txn_start = 0  # where the running transaction's appends began
        self._txn_ids: list[str] = []  # chunks it appended (their cached locations)
        # Bumped when chunks move or go (GC): a location read from SQLite before the bump is
        # not cached after it, so no stale location outlives a pack rewrite.
        self._generation = 0
        self._retired: dict[int, int] = {}  # removed packs' read fds, closed at the next GC
        self._retired_at = 0.0  # monotonic time of the last retirement

    # -- reading ---------------------------------------------------------------
    def locate(self, conn: sqlite3.Connection, chunk_id: str) -> Loc:
        with self._lock:
            loc = self._locations.get(chunk_id)
            if loc is not None:
                self._locations.move_to_end(chunk_id)
                return loc
            generation = self._generation
        row = conn.execute(self._select, (chunk_id,)).fetchone()
        if row is None:
            raise KeyError(f"chunk {chunk_id} is missing from the store")
        loc = Loc(row[0], row[1], row[2], split_over(row[3]))
        with self._lock:
            if generation != self._generation:
                return loc
            self._locations[chunk_id] = loc
            if len(self._locations) > LOCATIONS_KEPT:
                self._locations.popitem(last=False)
        return loc

    def locate_all(self, conn: sqlite3.Connection, chunk_id: str) -> tuple[Loc, list[Loc]]:
        """A chunk's location and those of what it is read through (under the caller's lock)."""
        loc = self.locate(conn, chunk_id)
        try:
            return loc, [self.locate(conn, dep) for dep in loc.over]
        except KeyError as exc:
            raise KeyError(f"chunk {chunk_id} is stored as a patch over chunks the store "
                           f"lacks ({exc.args[0]})") from None

    def read(self, conn: sqlite3.Connection, chunk_id: str) -> bytes:
        return self.read_at(*self.locate_all(conn, chunk_id), chunk_id)

    def read_at(self, loc: Loc, over: list[Loc], chunk_id: str) -> bytes:
        data = self._pread(loc, 0, loc.len, chunk_id)
        if not loc.over:
            return data
        return self.rebuild(loc, over, data)

    def rebuild(self, loc: Loc, over: list[Loc], own: bytes) -> bytes:
        """A patch's chunk: its base, each patch between, then `own` (its stored bytes)."""
        base, *between = over
        patches = [self._pread(p, 0, p.len, dep)
                   for p, dep in zip(between, loc.over[1:], strict=True)]
        return delta.rebuild(self._pread(base, 0, base.len, loc.over[0]), [*patches, own])

    def read_range(self, loc: Loc, over: list[Loc], start: int, length: int) -> bytes:
        """Bytes [start, start+length) of a chunk, clipped to the chunk: no read amplification
        (a patch's own bytes and those between, and only the asked-for part of its base)."""
        if not loc.over:
            return self._pread(loc, start, max(0, min(length, loc.len - start)), "")
        base, *between = over
        patches = [self._pread(p, 0, p.len, "") for p in [*between, loc]]
        return delta.read_range(
            patches, start, length,
            lambda s, n: self._pread(base, s, max(0, min(n, base.len - s)), ""))

    def _pread(self, loc: Loc, start: int, length: int, chunk_id: str) -> bytes:
        if length <= 0:
            return b""
        data = os.pread(self._pack_fd(loc.pack), length, loc.off + start)
        if len(data) != length:  # never a silent short read (a pack GC moved, read late)
            what = f" (chunk {chunk_id})" if chunk_id else ""
            raise OSError(f"pack {loc.pack} is shorter than the store says{what}")
        return data

    def _pack_fd(self, pack: int) -> int:
        with self._lock:
            fd = self._read_fds.get(pack)
            if fd is None:
                fd = self._retired.get(pack)
                if fd is None:
                    fd = os.open(self.pack_path(pack), os.O_RDONLY | os.O_CLOEXEC)
                    self._read_fds[pack] = fd
            return fd

    # -- writing (commit thread) -----------------------------------------------
    def put_many(
        self, conn: sqlite3.Connection, pieces: list[bytes],
        replacing: list[str | None] | None = None,
    ) -> tuple[list[str], list[Row]]:
        """Store pieces; return their ids and the rows the caller must insert.

        `replacing[i]`, when given, is the committed chunk piece i replaces (the same piece
        of the same file): a piece close to it is stored as a patch over it.
        The pack is fdatasync'ed before this returns, so the caller's transaction may
        reference the rows. New rows are inserted by the caller inside its transaction.
        """
        ids: list[str] = []
        rows: list[Row] = []
        pending: dict[str, bytes] = {}
        stored: dict[str, tuple[bytes, str | None]] = {}
        for i, data in enumerate(pieces):
            cid = self._name_for(conn, data, pending)
            ids.append(cid)
            if cid in pending or self._known(conn, cid):
                continue
            pending[cid] = data
            old = replacing[i] if replacing else None
            stored[cid] = self._stored_form(conn, data, old)
            if old is not None and delta.worth_trying(len(data)):
                self._keep_full(cid, data)  # the "before" of the next change to this piece
        if stored:
            fd, pack = self._writer()
            buf = []
            off = self._write_end
            for cid, (blob, over) in stored.items():
                rows.append((cid, pack, off, len(blob), over))
                buf.append(blob)
                off += len(blob)
            view = memoryview(b"".join(buf))
            pos = self._write_end
            while view:  # a short write is retried, so a full disk raises ENOSPC itself
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            os.fdatasync(fd)
            self._write_end = off
            with self._lock:
                for cid, p, o, n, over in rows:
                    self._locations[cid] = Loc(p, o, n, split_over(over))
                while len(self._locations) > LOCATIONS_KEPT:  # a take-in of 1M files
                    self._locations.popitem(last=False)
                self._txn_ids += [r[0] for r in rows]
        return ids, rows

    def _stored_form(self, conn: sqlite3.Connection, data: bytes,
                     old: str | None) -> tuple[bytes, str | None]:
        """(bytes to append, `over`): delta.encode's choice (a patch over `old` and what it is
        read through, over its base alone, or whole). Everything named is a committed row:
        its pack was synced before the transaction that made it, so a patch is only ever
        named after what it needs is durable."""
        if old is None or not self._deltas or not delta.worth_trying(len(data)):
            return data, None
        row = conn.execute("SELECT over FROM chunks WHERE id = ?", (old,)).fetchone()
        if row is None:  # gone (GC dropped what the file no longer names): whole
            return data, None
        old_over = split_over(row[0])

        def patched() -> int:  # the patches a read of `old` applies: its own and those between
            between = (*old_over[1:], old)
            return conn.execute(
                f"SELECT COALESCE(SUM(len), 0) FROM chunks WHERE id IN "
                f"({','.join('?' * len(between))})", between).fetchone()[0]

        blob, over = delta.encode(data, old, old_over, patched,
                                  lambda cid: self._full_of(conn, cid))
        return blob, delta.join_over(over)

    def _full_of(self, conn: sqlite3.Connection, cid: str) -> bytes:
        data = self._full.get(cid)
        if data is None:
            data = self.read(conn, cid)
        self._keep_full(cid, data)
        return data

    def _keep_full(self, cid: str, data: bytes) -> None:
        """Remember a chunk's full bytes (the commit thread: the next patch's "before")."""
        self._full[cid] = data
        self._full.move_to_end(cid)
        while len(self._full) > FULL_KEPT:
            self._full.popitem(last=False)

    # -- the writer's transaction (Store.transaction calls these, under its lock) -----------
    def begin(self) -> None:
        self._txn_start = self._write_end
        self._txn_ids = []

    def rollback(self) -> None:
        """The transaction surely did not commit: give back what it appended. Those bytes are
        named by no committed row, so cutting them is safe, and on a full disk it returns
        the space at once instead of leaving a dead tail per failed commit."""
        with self._lock:
            for cid in self._txn_ids:
                self._locations.pop(cid, None)
        self._txn_ids = []
        self._full.clear()  # ids this transaction named may go to other bytes next time
        self._write_end = self._txn_start
        if self._write_fd is not None and os.fstat(self._write_fd).st_size > self._txn_start:
            os.ftruncate(self._write_fd, self._txn_start)

    @property
    def write_end(self) -> int:
        return self._write_end

    def seal(self) -> None:
        """The next commit starts a new pack; this one may then be rewritten (GC, under the
        writer lock)."""
        if self._write_fd is not None:
            os.close(self._write_fd)
        self._write_fd = self._write_pack = None
        self._write_end = self._txn_start = 0

    def remove_pack(self, pack: int) -> None:
        """Unlink a pack no row names (GC, under the writer lock; the caller syncs the dir)."""
        with self._lock:
            fd = self._read_fds.pop(pack, None)
            if fd is not None:
                os.close(fd)
        try:
            os.unlink(self.pack_path(pack))
        except FileNotFoundError:
            pass

    @property
    def write_pack(self) -> int | None:
        """The pack group commits append to (GC never rewrites or removes it)."""
        return self._write_pack

    def _known(self, conn: sqlite3.Connection, cid: str) -> bool:
        return conn.execute("SELECT 1 FROM chunks WHERE id = ?", (cid,)).fetchone() is not None

    def _name_for(self, conn: sqlite3.Connection, data: bytes, pending: dict[str, bytes]) -> str:
        """The digest, suffixed past any stored chunk with that digest but other bytes."""
        base = chunk_digest(data)
        n = 0
        while True:
            cid = base if n == 0 else f"{base}.{n}"
            if cid in pending:
                if pending[cid] == data:
                    return cid
            elif self._known(conn, cid):
                if self.read(conn, cid) == data:
                    return cid
            else:
                return cid
            n += 1

    def _writer(self) -> tuple[int, int]:
        if self._write_fd is not None and self._write_end < PACK_ROLLOVER:
            return self._write_fd, self._write_pack  # type: ignore[return-value]
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        fd, pack = self.new_pack()
        self._write_fd, self._write_pack, self._write_end = fd, pack, 0
        self._txn_start = 0
        return fd, pack

    def new_pack(self) -> tuple[int, int]:
        """Create the next numbered pack (its name synced); the commit thread and a GC's pack
        rewrite both take numbers here, so two never share one."""
        with self._lock:
            while True:
                pack = max(self.pack_numbers(), default=0) + 1
                try:
                    fd = os.open(self.pack_path(pack),
                                 os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                    break
                except FileExistsError:
                    continue
        fsync_dir(self.dir)
        return fd, pack

    def pack_numbers(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.pack") if p.stem.isdigit())

    def pack_path(self, pack: int) -> Path:
        return self.dir / f"{pack:08d}.pack"

    # -- GC: moved and removed chunks (memfs.store.gc) ----------------------------------------
    def forget_locations(self, retire: list[int] = ()) -> None:
        """Chunks moved or went: drop every cached location. Packs in `retire` are about to be
        removed: their read fds stay open (a read that located a chunk there a moment ago still
        gets its bytes) until the next call closes them."""
        with self._lock:
            self._generation += 1
            self._locations.clear()
            for fd in self._retired.values():
                os.close(fd)
            self._retired = {}
            for pack in retire:
                fd = self._read_fds.pop(pack, None)
                if fd is None:
                    try:
                        fd = os.open(self.pack_path(pack), os.O_RDONLY | os.O_CLOEXEC)
                    except FileNotFoundError:
                        continue
                self._retired[pack] = fd
            if retire:
                self._retired_at = time.monotonic()

    def release_retired(self, grace: float) -> None:
        """Give the removed packs' space back to the filesystem once `grace` seconds have passed
        since they were retired (GC's thread, at the end of its run). Each retired fd is pointed
        at /dev/null in place (dup2) rather than closed: its number is not reused until the next
        GC closes it, so a read still in flight with a location from before the move gets a
        short read (an error), never another file's bytes."""
        with self._lock:
            if not self._retired:
                return
            wait = self._retired_at + grace - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with self._lock:
                for fd in self._retired.values():
                    os.dup2(null, fd)
        finally:
            os.close(null)

    def close(self) -> None:
        with self._lock:
            for fd in [*self._read_fds.values(), *self._retired.values()]:
                os.close(fd)
            self._read_fds.clear()
            self._retired.clear()
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
