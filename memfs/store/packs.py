"""Giving pack space back after a sweep (GC step 4, memfs.store.gc).

Chunk rows are gone; their bytes are still in the packs. Three ways to return them:

- A pack no row names is removed.
- A pack mostly dead (live bytes under REWRITE_BELOW of its size) is rewritten: its live
  chunks are copied, each checked against its digest, into a new pack that is fdatasynced
  and whose name is synced (ChunkStore.new_pack) before one transaction points the rows at
  it; only then is the old pack removed. A crash before the transaction leaves an extra pack
  no row names (the next run removes it), a crash after it an old pack no row names (the
  same): both copies exist at every moment a row could name either.
- Dead ranges of the other packs are punched out (fallocate PUNCH_HOLE): the filesystem
  frees the blocks and the file keeps its size and every live byte in place. Nothing to copy,
  so it works on a full disk; where the filesystem cannot punch, the rewrite remains.

The pack group commits append to is first sealed (the next commit starts a new one) when it
holds enough dead bytes, so it is treated like any other. Removal and the row moves happen
under the store's writer lock: no commit can be appending to a pack it removes.

Thread: the GC thread, one run at a time (gc.lock).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

from memfs.durable import fsync_dir
from memfs.store.chunks import chunk_digest
from memfs.store.space import MiB, Space, headroom

REWRITE_BELOW = 0.5  # live fraction under which a pack is rewritten
PUNCH_MIN = 64 << 10  # dead ranges shorter than this are not worth a punch
SEAL_DEAD = 0.25  # the write pack is sealed when this much of it is dead (and >= 1 MiB)
COPY_BUFFER = 8 << 20
PAGE = 4096

_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, off: int, length: int) -> bool:
    """Free the blocks of [off, off+length); False where the filesystem cannot."""
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, off, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def _blocks(paths) -> int:
    total = 0
    for p in paths:
        try:
            total += os.stat(p).st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def pack_usage(root: Path) -> int:
    """Bytes the packs take on the store's filesystem (holes not counted)."""
    return _blocks((root / "packs").glob("*.pack"))


def store_usage(root: Path) -> int:
    """Bytes the store takes on its filesystem: store.db, its WAL and -shm, the packs."""
    return _blocks([root / "store.db", root / "store.db-wal", root / "store.db-shm"]) + \
        pack_usage(root)


class PackWork:
    def __init__(self, store, report, progress, *, punch: bool, pressure: bool,
                 crash: Callable[[str], None]) -> None:
        self.store = store
        self.chunks = store.chunks
        self.report = report
        self.progress = progress
        self.punch = punch
        self.pressure = pressure
        self.crash = crash

    def run(self) -> None:
        live = self._seal_and_remove()
        space = Space.of(self.store.root)
        budget = space.avail - headroom(space.size)
        work = []
        for pack, (_, live_bytes) in sorted(live.items()):
            if pack == self.chunks.write_pack:
                continue
            try:
                st = os.stat(self.chunks.pack_path(pack))
            except FileNotFoundError:
                self.report.problems.append(f"pack {pack} is named by chunks but missing")
                continue
            work.append((pack, live_bytes, st.st_size, st.st_blocks * 512))
        self.progress.total = len(work)
        for pack, live_bytes, size, allocated in work:
            if size and live_bytes / size < REWRITE_BELOW and live_bytes <= budget:
                budget -= live_bytes
                self._rewrite(pack)
            elif self.punch and allocated > live_bytes + PUNCH_MIN:
                self._punch(pack)
            self.progress.done += 1

    # -- under the writer lock ------------------------------------------------------------------
    def _seal_and_remove(self) -> dict[int, tuple[int, int]]:
        """Seal the write pack if it is worth it; remove packs no row names. Returns
        pack -> (rows, live bytes)."""
        with self.store.transaction() as tx:
            live = {p: (n, b) for p, n, b in tx.conn.execute(
                "SELECT pack, COUNT(*), SUM(len) FROM chunks GROUP BY pack")}
            write = self.chunks.write_pack
            if write is not None:
                dead = self.chunks.write_end - live.get(write, (0, 0))[1]
                if (dead >= MiB and dead >= SEAL_DEAD * self.chunks.write_end) or (
                        self.pressure and dead > 0):
                    self.chunks.seal()
            write = self.chunks.write_pack
            empty = [p for p in self.chunks.pack_numbers() if p not in live and p != write]
            for pack in empty:
                self.chunks.remove_pack(pack)
            if empty:
                fsync_dir(self.chunks.dir)
                self.report.packs_removed += len(empty)
        if empty:
            self.crash("pack-removed")
        return live

    # -- rewrite ----------------------------------------------------------------------------------
    def _rewrite(self, old: int) -> None:
        rows = self.store._query(
            "SELECT id, off, len, over FROM chunks WHERE pack = ? ORDER BY off", (old,))
        fd, new = self.chunks.new_pack()
        moves: list[tuple[int, int, str, int, int]] = []
        src = os.open(self.chunks.pack_path(old), os.O_RDONLY | os.O_CLOEXEC)
        try:
            pos, buf = 0, bytearray()
            for cid, off, n, over in rows:
                data = os.pread(src, n, off)
                if len(data) != n or not self._matches(cid, data, over):
                    self.report.problems.append(f"chunk {cid} in pack {old} does not match its "
                                                "digest: left where it is")
                    continue
                moves.append((new, pos + len(buf), cid, old, off))
                buf += data
                if len(buf) >= COPY_BUFFER:
                    _pwrite_all(fd, buf, pos)
                    pos, buf = pos + len(buf), bytearray()
            if buf:
                _pwrite_all(fd, buf, pos)
            os.fdatasync(fd)
        finally:
            os.close(src)
            os.close(fd)
        self.crash("pack-written")
        with self.store.transaction() as tx:
            tx.conn.executemany(
                "UPDATE chunks SET pack = ?, off = ? WHERE id = ? AND pack = ? AND off = ?", moves)
            left = tx.conn.execute("SELECT COUNT(*) FROM chunks WHERE pack = ?",
                                   (old,)).fetchone()[0]
        self.crash("pack-moved")
        self.chunks.forget_locations(retire=[old])
        if not left:
            os.unlink(self.chunks.pack_path(old))
            fsync_dir(self.chunks.dir)
            self.report.packs_removed += 1
        self.report.packs_rewritten += 1
        self.crash("pack-removed")

    def _matches(self, cid: str, data: bytes, over: str | None) -> bool:
        """Do a chunk's stored bytes give back its digest (a patch: rebuilt over what it is
        read through)?"""
        if over:
            try:
                data = self.store.rebuild_chunk(cid, data)
            except (KeyError, OSError, ValueError):
                return False
        return chunk_digest(data) == cid.split(".")[0]

    # -- punch ------------------------------------------------------------------------------------
    def _punch(self, pack: int) -> None:
        path = self.chunks.pack_path(pack)
        rows = self.store._query("SELECT off, len FROM chunks WHERE pack = ? ORDER BY off",
                                 (pack,))
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            before = os.fstat(fd).st_blocks * 512
            end = 0
            gaps = []
            for off, n in rows:
                if off > end:
                    gaps.append((end, off))
                end = max(end, off + n)
            gaps.append((end, size))
            for a, b in gaps:
                a, b = -(-a // PAGE) * PAGE, (b // PAGE) * PAGE  # whole pages inside the gap
                if b - a >= PUNCH_MIN and not punch_hole(fd, a, b - a):
                    self.punch = False  # this filesystem cannot: leave it to rewrites
                    return
            self.report.bytes_punched += max(0, before - os.fstat(fd).st_blocks * 512)
        finally:
            os.close(fd)
        self.crash("punched")


def _pwrite_all(fd: int, data: bytes | bytearray, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
