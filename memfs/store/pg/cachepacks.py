"""The host chunk cache's packs: copies of chunks over SMALL_MAX bytes, appended to a few
large files under `cache/packs/` instead of a file each.

A file per 1 MiB chunk cost a create, a rename and a close to write and an open, an fstat and
a close at every 128 KiB read (after the kernel's inode cache was dropped, each open also
read the inode back): a 256 MiB rewrite spent its cache thread creating files, and reading
512 MiB back spent half its loop in `open` (docs/performance.md, "The host cache's packs").
A pack is appended to by one process only (its name is new to each: never one a crash left
half written) and read with `pread` on a descriptor held open. Where each copy lies is the
caller's index (memfs.store.pg.cache): written after the bytes, so a copy cut off by a kill
is never indexed, and a copy lost in a power cut is caught by the check against its name.
A pack is only ever deleted whole (the unit of the cache's bound).

Thread-safe: appends under one lock (one writer at a time), reads and deletions under
another; a read holds it through its `pread`, so a descriptor is never closed (and its
number reused by another file) under a reader.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from memfs.durable import mkdir_durable

SUFFIX = ".pack"


class Appended(NamedTuple):
    pack: str  # the file's name under the packs directory
    off: int  # where the copy starts (-1: not written whole)
    size: int  # the pack's size after it


class CachePacks:
    def __init__(self, directory: Path, pack_max: int) -> None:
        self.dir = directory
        mkdir_durable(self.dir)
        self.pack_max = pack_max
        self._write_lock = threading.Lock()
        self._out: tuple[str, int, int] | None = None  # (name, descriptor, size) appended to
        self._read_lock = threading.Lock()
        self._fds: dict[str, int] = {}  # pack -> descriptor held open for reads

    def found(self) -> list[tuple[str, int]]:
        """The packs on disk, (name, size), least recently written first."""
        out = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(SUFFIX):
                st = entry.stat()
                out.append((st.st_mtime_ns, entry.name, st.st_size))
        return [(name, size) for _, name, size in sorted(out)]

    def append(self, data: bytes) -> Appended | None:
        """Append one copy to this process's current pack (a new one past pack_max). A copy
        not written whole (a full disk) has `off` -1, and the size says what the pack holds
        now; None if no pack could be opened. The next copy then goes to a new pack."""
        with self._write_lock:
            try:
                name, fd, size = self._current(len(data))
            except OSError:
                return None
            try:
                written = os.write(fd, data)
            except OSError:
                written = -1
            if written == len(data):  # only this process appends: the size is its own count
                self._out = (name, fd, size + written)
                return Appended(name, size, size + written)
            try:
                size = os.fstat(fd).st_size  # what a short write left
            except OSError:
                pass
            self._give_up_current()
            return Appended(name, -1, size)

    def _current(self, n: int) -> tuple[str, int, int]:
        if self._out is not None:
            name, fd, size = self._out
            if size == 0 or size + n <= self.pack_max:
                return self._out
            self._out = None
            os.close(fd)
        name = f"{time.time_ns():016x}-{os.getpid()}{SUFFIX}"
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                     | os.O_CLOEXEC, 0o600)
        self._out = (name, fd, 0)
        return self._out

    def _give_up_current(self) -> None:
        """After a failed write: the next copy goes to a new pack."""
        if self._out is not None:
            os.close(self._out[1])
            self._out = None

    def read(self, pack: str, off: int, n: int) -> bytes | None:
        """n bytes at `off`; None if the pack is gone or shorter (cut short behind the
        cache's back: never a short read)."""
        if n <= 0:
            return b""
        with self._read_lock:
            fd = self._fds.get(pack)
            try:
                if fd is None:
                    fd = os.open(self.dir / pack, os.O_RDONLY | os.O_CLOEXEC)
                    self._fds[pack] = fd
                data = os.pread(fd, n, off)
            except OSError:
                return None
        return data if len(data) == n else None

    def delete(self, pack: str) -> None:
        """Close and unlink a pack (a reader holding it finishes first)."""
        with self._write_lock:
            if self._out is not None and self._out[0] == pack:
                self._give_up_current()
        with self._read_lock:
            fd = self._fds.pop(pack, None)
            if fd is not None:
                os.close(fd)
        try:
            os.unlink(self.dir / pack)
        except OSError:
            pass

    def close(self) -> None:
        with self._write_lock:
            self._give_up_current()
        with self._read_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
