"""Bad input gets the right errno: long names, files at the mount root, no space."""

from __future__ import annotations

import errno
import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.store import store_check
from helpers.tree import file_digest, read_all

pytestmark = pytest.mark.mount

LONG = "n" * 256
LONG_UTF8 = "é" * 128  # 256 bytes, 128 characters: the limit counts bytes
MAX = "m" * 255


def errno_of(fn: Callable[[], object]) -> int | None:
    try:
        fn()
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.parametrize("name", [LONG, LONG_UTF8], ids=["ascii", "utf8"])
def test_name_over_255_bytes_is_enametoolong(mounted, native_dir: Path, name: str) -> None:
    for d in (native_dir, mounted.work):
        (d / "exists").write_text("x")
        ops: dict[str, Callable[[], object]] = {
            "create": lambda d=d: open(d / name, "w"),
            "mkdir": lambda d=d: os.mkdir(d / name),
            "symlink": lambda d=d: os.symlink("exists", d / name),
            "rename": lambda d=d: os.rename(d / "exists", d / name),
            "stat": lambda d=d: os.stat(d / name),
        }
        for op, fn in ops.items():
            assert errno_of(fn) == errno.ENAMETOOLONG, f"{op} in {d}"
        assert sorted(os.listdir(d)) == ["exists"]


def test_name_of_255_bytes_works(mounted) -> None:
    (mounted.work / MAX).write_bytes(b"ok")
    os.mkdir(mounted.work / ("d" * 255))
    assert (mounted.work / MAX).read_bytes() == b"ok"
    assert sorted(os.listdir(mounted.work)) == sorted([MAX, "d" * 255])


def test_statfs_reports_namemax_and_store_space(mounted) -> None:
    mounted.require_real()
    sv = os.statvfs(mounted.mnt)
    assert sv.f_namemax == 255
    store = os.statvfs(mounted.root)
    free, store_free = sv.f_bavail * sv.f_frsize, store.f_bavail * store.f_frsize
    assert abs(free - store_free) < max(64 << 20, store_free // 50), (free, store_free)


def test_files_at_mount_root_are_refused(mounted) -> None:
    mounted.require_real()
    assert errno_of(lambda: open(mounted.mnt / "stray.txt", "w")) == errno.EPERM
    assert errno_of(lambda: os.symlink("work", mounted.mnt / "stray")) == errno.EPERM
    os.mkdir(mounted.mnt / "notes")  # a directory at the root is a new store mount
    (mounted.mnt / "notes" / "n.md").write_text("# n\n")
    assert "notes" in mounted.status()["mounts"]


def test_user_xattrs_round_trip(mounted) -> None:
    p = mounted.work / "x"
    p.write_text("x")
    os.setxattr(p, "user.color", b"blue")
    os.setxattr(p, "user.bin", bytes(range(256)))
    assert os.getxattr(p, "user.color") == b"blue"
    assert os.getxattr(p, "user.bin") == bytes(range(256))
    assert {"user.color", "user.bin"} <= set(os.listxattr(p))
    os.removexattr(p, "user.color")
    assert errno_of(lambda: os.getxattr(p, "user.color")) == errno.ENODATA
    assert errno_of(lambda: os.setxattr(p, "user.bin", b"z", os.XATTR_CREATE)) == errno.EEXIST
    assert errno_of(lambda: os.setxattr(p, "user.none", b"z", os.XATTR_REPLACE)) == errno.ENODATA


def test_memfs_dir_is_reachable_but_not_listed(mounted) -> None:
    mounted.require_real()
    assert ".memfs" not in os.listdir(mounted.mnt)
    assert os.path.isdir(mounted.mnt / ".memfs")
    status = mounted.status()
    for key in ("root", "branch", "head", "pending", "mounts"):
        assert key in status, f".memfs/status lacks {key}: {status}"
    assert Path(status["root"]).resolve() == mounted.root.resolve()
    assert "work" in status["mounts"]


def test_write_beyond_free_space_is_enospc_and_store_survives(small_fs, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    keep = random.Random(5).randbytes(2 << 20)
    with open(m.work / "keep.bin", "wb") as f:
        f.write(keep)
        f.flush()
        os.fsync(f.fileno())

    sv = os.statvfs(m.mnt)
    free = sv.f_bavail * sv.f_frsize
    assert free <= 32 << 20, f"statfs reports {free} bytes free, not the 32 MiB store's space"
    # Distinct pieces: identical ones would share one stored chunk, and the store would then
    # really have room for them (content addressing), so nothing would be refused.
    rng = random.Random(6)
    failure = None
    written = 0
    try:
        with open(m.work / "huge.bin", "wb") as f:
            while written < free + (8 << 20):
                f.write(rng.randbytes(1 << 20))
                written += 1 << 20
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        failure = exc
    assert failure is not None, f"wrote {written} bytes with only {free} free and no error"
    assert failure.errno == errno.ENOSPC, f"expected ENOSPC, got {failure!r}"
    assert m.proc.poll() is None, "the daemon died on ENOSPC"

    os.unlink(m.work / "huge.bin")
    assert file_digest(m.work / "keep.bin") == hashlib.sha256(keep).hexdigest()
    m.kill()
    store_check(m.root)
    m.remount()
    read_all(m.work)
    assert file_digest(m.work / "keep.bin") == hashlib.sha256(keep).hexdigest()


# Linux's VFS refuses an xattr name above 255 bytes (XATTR_NAME_MAX: ERANGE) and a value above
# 65536 bytes (XATTR_SIZE_MAX: E2BIG) before any filesystem sees it. ext4 with 4 KiB blocks keeps
# all of a file's xattrs in one block: one value of at most 4040 bytes under a short name, and
# ENOSPC beyond (measured on 6.18); tmpfs takes 65536. memfs takes a value up to 4096 bytes and a
# file's names and values up to 65536 bytes together, and refuses more with E2BIG, changing nothing.
XATTR_VALUE_MAX = 4096
XATTR_NODE_TOTAL_MAX = 65536


def test_xattr_limits_refuse_with_e2big_and_change_nothing(mounted, native_dir: Path) -> None:
    for d in (native_dir, mounted.work):  # the kernel's own limits, the same on both
        p = d / "vfs"
        p.write_text("x")
        assert errno_of(lambda p=p: os.setxattr(p, "user." + "n" * 251, b"v")) == errno.ERANGE
        os.setxattr(p, "user." + "n" * 250, b"v")  # 255 bytes: taken
        assert errno_of(lambda p=p: os.setxattr(p, "user.big", b"v" * 65537)) == errno.E2BIG
    mounted.require_real()
    p = mounted.work / "x"
    p.write_text("x")
    os.setxattr(p, "user.keep", b"old")
    os.setxattr(p, "user.full", b"f" * XATTR_VALUE_MAX)
    assert os.getxattr(p, "user.full") == b"f" * XATTR_VALUE_MAX
    before = os.stat(p)
    for size in (XATTR_VALUE_MAX + 1, 65536):  # 65536: the most the kernel passes on
        assert errno_of(lambda s=size: os.setxattr(p, "user.keep", b"n" * s)) == errno.E2BIG
        assert errno_of(lambda s=size: os.setxattr(p, "user.new", b"n" * s)) == errno.E2BIG
    assert os.getxattr(p, "user.keep") == b"old"
    assert sorted(os.listxattr(p)) == ["user.full", "user.keep"]
    assert os.stat(p).st_ctime_ns == before.st_ctime_ns  # not even a ctime change

    # The whole set is bounded too: values of 4096 under 9-byte names fill 65536 bytes at 15
    # and a sixteenth is refused, while replacing one of them (same size) still works.
    q = mounted.work / "many"
    q.write_text("x")
    names = [f"user.n{i:03d}" for i in range(16)]
    for name in names[:15]:
        os.setxattr(q, name, b"v" * XATTR_VALUE_MAX)
    assert 15 * (9 + XATTR_VALUE_MAX) <= XATTR_NODE_TOTAL_MAX < 16 * (9 + XATTR_VALUE_MAX)
    assert errno_of(lambda: os.setxattr(q, names[15], b"v" * XATTR_VALUE_MAX)) == errno.E2BIG
    os.setxattr(q, names[0], b"w" * XATTR_VALUE_MAX)
    assert os.getxattr(q, names[0]) == b"w" * XATTR_VALUE_MAX
    assert sorted(os.listxattr(q)) == names[:15]
    mounted.remount()  # what was taken is kept, and only that
    assert os.getxattr(p, "user.keep") == b"old"
    assert sorted(os.listxattr(q)) == names[:15]
