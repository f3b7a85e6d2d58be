"""Model-based test: random POSIX call sequences on memfs and on a native dir, side by side.

The native directory is the model. After every call, both sides must have returned the same
thing (value or errno) and show the same tree (types, modes, sizes, bytes, link targets), the
same link counts, and the same names sharing one inode (hard links).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.tree import diff_snapshots, snapshot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

pytestmark = pytest.mark.mount

NAMES = ["x", "y", "z"]
PATHS = NAMES + [f"{a}/{b}" for a in NAMES for b in NAMES]
# Top-level names come up more often: deep paths mostly fail with ENOENT until a dir exists.
paths = st.one_of(st.sampled_from(NAMES), st.sampled_from(NAMES), st.sampled_from(PATHS))
modes = st.sampled_from([0o644, 0o600, 0o755, 0o700, 0o444, 0o000, 0o777, 0o640])
data = st.binary(max_size=3000)
offsets = st.integers(min_value=0, max_value=12000)
link_targets = st.sampled_from(["x", "y/z", "missing", "z/x", ".", "x/y"])

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(src: str, dst: str, flags: int) -> None:
    """renameat2(2) through glibc (Python's os has no flags argument)."""
    rc = _libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src)


def outcome(fn: Callable[[], object]) -> tuple[str, object]:
    try:
        return ("ok", fn())
    except OSError as exc:
        return ("err", errno.errorcode.get(exc.errno or 0, exc.errno))


def write_at(path: str, offset: int, payload: bytes, flags: int, trunc_on_open: bool) -> int:
    """Write at `offset` (-1: at the fd's position); O_TRUNC either in open or as ftruncate."""
    open_flags = flags if trunc_on_open else flags & ~os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | open_flags)
    try:
        if flags & os.O_TRUNC and not trunc_on_open:
            os.ftruncate(fd, 0)
        return os.pwrite(fd, payload, offset) if offset >= 0 else os.write(fd, payload)
    finally:
        os.close(fd)


def create(path: str, mode: int) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CREAT | os.O_EXCL, mode))


def fsync_path(path: str) -> None:
    """fsync a file or a directory: forces a commit in memfs, between the other operations."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def links(root: Path) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Each path's st_nlink and the paths sharing its inode (hard links), for comparison."""
    stats = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            stats[os.path.relpath(p, root)] = os.lstat(p)
    stats["."] = os.lstat(root)
    by_ino: dict[int, list[str]] = {}
    for rel, s in stats.items():
        by_ino.setdefault(s.st_ino, []).append(rel)
    return {rel: (s.st_nlink, tuple(sorted(by_ino[s.st_ino]))) for rel, s in stats.items()}


def read_file(path: str) -> bytes:
    """A file's bytes (a FIFO: opens, reads nothing). A directory's fd is closed here: open()
    refuses it without closing it, and the fd left open kept the mount busy at teardown (the
    unmount fell back to a lazy one and the daemon served on until it was killed, 10 s)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        f = open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read()


def run_model(mount_base: Path, native_base: Path, max_examples: int) -> None:
    counter = itertools.count()

    class SideBySide(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            n = next(counter)
            self.m = mount_base / f"case{n}"
            self.n = native_base / f"case{n}"
            self.m.mkdir()
            self.n.mkdir()

        def both(self, op: Callable[[Path], object]) -> None:
            want = outcome(lambda: op(self.n))
            got = outcome(lambda: op(self.m))
            assert got == want, f"memfs returned {got}, native {want}"

        @rule(p=paths, mode=modes)
        def create(self, p: str, mode: int) -> None:
            self.both(lambda r: create(str(r / p), mode))

        @rule(p=paths, payload=data, on_open=st.booleans())
        def write_truncating(self, p: str, payload: bytes, on_open: bool) -> None:
            self.both(lambda r: write_at(str(r / p), -1, payload, os.O_TRUNC | os.O_CREAT,
                                          on_open))

        @rule(p=paths, payload=data)
        def append(self, p: str, payload: bytes) -> None:
            self.both(lambda r: write_at(str(r / p), -1, payload, os.O_APPEND | os.O_CREAT, True))

        @rule(p=paths, off=offsets, payload=data)
        def pwrite(self, p: str, off: int, payload: bytes) -> None:
            self.both(lambda r: write_at(str(r / p), off, payload, os.O_CREAT, True))

        @rule(p=paths, size=offsets)
        def truncate(self, p: str, size: int) -> None:
            self.both(lambda r: os.truncate(r / p, size))

        @rule(src=paths, dst=paths)
        def rename(self, src: str, dst: str) -> None:
            self.both(lambda r: os.rename(r / src, r / dst))

        @rule(src=paths, dst=paths)
        def rename_noreplace(self, src: str, dst: str) -> None:
            self.both(lambda r: renameat2(str(r / src), str(r / dst), RENAME_NOREPLACE))

        @rule(src=paths, dst=paths)
        def rename_exchange(self, src: str, dst: str) -> None:
            self.both(lambda r: renameat2(str(r / src), str(r / dst), RENAME_EXCHANGE))

        @rule(p=paths)
        def unlink(self, p: str) -> None:
            self.both(lambda r: os.unlink(r / p))

        @rule(p=paths, mode=modes)
        def mkdir(self, p: str, mode: int) -> None:
            self.both(lambda r: os.mkdir(r / p, mode))

        @rule(p=paths)
        def rmdir(self, p: str) -> None:
            self.both(lambda r: os.rmdir(r / p))

        @rule(p=paths, link=link_targets)
        def symlink(self, p: str, link: str) -> None:
            self.both(lambda r: os.symlink(link, r / p))

        @rule(src=paths, dst=paths)
        def link(self, src: str, dst: str) -> None:
            self.both(lambda r: os.link(r / src, r / dst, follow_symlinks=False))

        @rule(p=paths, mode=modes)
        def mkfifo(self, p: str, mode: int) -> None:
            self.both(lambda r: os.mkfifo(r / p, mode))

        # No devices here: memfs is mounted nodev (as FUSE mounts are), so opening one is EACCES
        # where the native directory would open it (test_fs_links covers devices).
        @rule(p=paths, mode=modes, kind=st.sampled_from([stat.S_IFREG, stat.S_IFSOCK]))
        def mknod(self, p: str, mode: int, kind: int) -> None:
            self.both(lambda r: os.mknod(r / p, mode | kind, os.makedev(1, 7)))

        @rule(p=paths, mode=modes)
        def chmod(self, p: str, mode: int) -> None:
            self.both(lambda r: os.chmod(r / p, mode))

        @rule(p=paths)
        def read(self, p: str) -> None:
            self.both(lambda r: read_file(str(r / p)))

        @rule(p=st.one_of(st.just("."), paths))
        def fsync(self, p: str) -> None:
            self.both(lambda r: fsync_path(str(r / p)))

        @rule(p=paths)
        def listdir(self, p: str) -> None:
            self.both(lambda r: sorted(os.listdir(r / p)))

        @rule(p=paths)
        def stat(self, p: str) -> None:
            self.both(lambda r: (lambda s: (s.st_mode, s.st_nlink, s.st_size, s.st_rdev))(
                os.lstat(r / p)))

        @invariant()
        def same_tree(self) -> None:
            got, want = snapshot(self.m), snapshot(self.n)
            assert got == want, "\n".join(diff_snapshots(got, want))
            got_links, want_links = links(self.m), links(self.n)
            assert got_links == want_links, "\n".join(diff_snapshots(got_links, want_links))

    run_state_machine_as_test(
        SideBySide,
        settings=settings(max_examples=max_examples, stateful_step_count=40, deadline=None,
                          database=None, suppress_health_check=list(HealthCheck)),
    )


def test_random_posix_sequences_match_native(mounted, native_dir: Path) -> None:
    base = mounted.work / "model"
    base.mkdir()
    run_model(base, native_dir, int(os.environ.get("MEMFS_MODEL_EXAMPLES", "50")))
