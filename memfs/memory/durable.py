"""The file operations a commit is made of, in one small class so a test can record them.

`FsOps` does the real thing (each write fsynced, each directory fsynced by name). A test may
subclass it to log every call and replay only what was synced, modelling a power cut; the store
never calls os directly for a step of a commit.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memfs.durable import fsync_dir, write_all
from memfs.testing import CRASH_ENV, crash_point  # noqa: F401 - the memory code's points


class FsOps:
    """Durable primitives. Every method either completes or raises; none is partial on return."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path, 0o755)

    def makedirs(self, path: Path) -> None:
        """Create missing parents, fsyncing each parent that gained an entry."""
        missing: list[Path] = []
        p = path
        while not p.exists():
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                continue
            self.fsync_dir(d.parent)

    def write_file(self, path: Path, data: bytes) -> None:
        """Create (never overwrite) a read-only file with `data`, fsynced before returning."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o444)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync_dir(self, path: Path) -> None:
        fsync_dir(path)

    def symlink(self, target: str, path: Path) -> None:
        os.symlink(target, path)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def remove_tree(self, path: Path) -> None:
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def shared_if_free(lock_path: Path) -> Iterator[bool]:
    """Take flock(LOCK_SH) only if no one holds it exclusively now; yields whether it did.
    For readers that must not wait (the FUSE loop): they read without it then."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


@contextmanager
def flocked(lock_path: Path, exclusive: bool) -> Iterator[None]:
    """Hold flock on `lock_path`; it serialises threads (own fd each) and processes alike."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
