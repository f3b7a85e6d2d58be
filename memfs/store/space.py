"""The store filesystem's space as memfs counts it, and the reserve that makes a full disk
recoverable.

Why a reserve: at zero bytes free SQLite cannot even write the WAL frames of a transaction
that deletes, so neither the GC that reclaims space nor the commit that records an `rm` could
run, and a disk that filled would stay full. The daemon keeps a small preallocated file
(`<root>/reserve`); a GC that finds the disk full gives it back before its first write (and
what it leaves over lets the next commit through); the daemon takes it again once there is
room. It is real, allocated space: statfs counts it as used.

On a store in PostgreSQL the database's disk is the server's, but this host's root holds
`host.db`, whose backing journal must append (SQLite cannot write a WAL frame at zero bytes
free either, and a failed append poisons the journal until `memfs sync --reopen`). The same
file is kept there for it: the journal gives it back before a write once less than it is
left (`for_write`), and takes it again once there is clearly room.

Headroom: what a write may take stops short of the filesystem's last bytes by `headroom()`,
so the store's own metadata (tree objects, chunk rows, the WAL) always has room to commit
what the writes were allowed to leave pending.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20
RESERVE_NAME = "reserve"


@dataclass(frozen=True)
class Space:
    """One statvfs of the store's filesystem, in bytes and inodes."""

    size: int
    free: int  # f_bfree: free blocks
    avail: int  # f_bavail: what an unprivileged writer may still use
    files: int
    ffree: int
    favail: int

    @classmethod
    def of(cls, path: Path) -> Space:
        st = os.statvfs(path)
        return cls(st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize,
                   st.f_bavail * st.f_frsize, st.f_files, st.f_ffree, st.f_favail)

    def to_json(self) -> dict:
        return {"size": self.size, "free": self.free, "avail": self.avail, "files": self.files,
                "ffree": self.ffree}


def size_text(n: float) -> str:
    """Bytes for people: 512 B, 3.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def headroom(size: int) -> int:
    """Bytes writes leave free for the commits that store them: 1% of the filesystem,
    at least 2 MiB and at most 64 MiB."""
    return max(2 * MiB, min(64 * MiB, size // 100))


def writable(space: Space, waiting: int) -> int:
    """What new data may still take: free space less the headroom and less the bytes
    already waiting in memory for a commit (the room's rule, and what a refusal says)."""
    return max(0, space.avail - waiting - headroom(space.size))


def reserve_size(size: int) -> int:
    """1/64 of the filesystem, at least 1 MiB and at most 16 MiB."""
    return max(MiB, min(16 * MiB, size // 64))


class Reserve:
    """The preallocated reserve file. Released by the commit thread, taken again by the GC
    thread or the daemon's start: a lock serializes them."""

    def __init__(self, root: Path) -> None:
        self.path = root / RESERVE_NAME
        self._lock = threading.Lock()

    def held(self) -> int:
        try:
            return os.stat(self.path).st_blocks * 512
        except FileNotFoundError:
            return 0

    def ensure(self) -> bool:
        """Take the reserve if it is not held and there is clearly room for it (twice its
        size and the headroom besides); True if it is held afterwards."""
        with self._lock:
            space = Space.of(self.path.parent)
            want = reserve_size(space.size)
            have = self.held()
            if have >= want:
                return True
            if space.avail < 2 * (want - have) + headroom(space.size):
                return False
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, want)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, 0)
                return False
            finally:
                os.close(fd)
            return True

    def for_write(self) -> int:
        """Before a write that a full disk must not fail (host.db's journal on a store in
        PostgreSQL; its thread): give the reserve back once less than its size is free,
        else take it (again) if there is clearly room. The bytes given back."""
        space = Space.of(self.path.parent)
        if space.avail < reserve_size(space.size):
            return self.release()
        if not self.held():
            self.ensure()
        return 0

    def release(self) -> int:
        """Give the reserve back to the filesystem; the bytes released (0 if none was held)."""
        with self._lock:
            have = self.held()
            if have:
                os.truncate(self.path, 0)
            return have
