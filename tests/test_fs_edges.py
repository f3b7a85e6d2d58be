"""Edges a shell, git and editors hit: big directories, rm -rf while listing, mmap, O_DIRECT,
huge sparse truncates. Each has broken a Python FUSE filesystem before (PYFUSE3-NOTES.md)."""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.mount

N = 3000


def fill(d: Path, n: int = N) -> set[str]:
    d.mkdir()
    names = {f"entry-{i:05d}-{'x' * (i % 40)}" for i in range(n)}
    for name in names:
        os.close(os.open(d / name, os.O_WRONLY | os.O_CREAT, 0o644))
    return names


def test_big_directory_lists_every_name_once(mounted) -> None:
    d = mounted.work / "big"
    names = fill(d)
    listed = os.listdir(d)
    assert len(listed) == len(set(listed)), "readdir returned a name twice"
    assert set(listed) == names
    out = subprocess.run(["find", str(d), "-type", "f"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert len(out) == N


def test_deleting_while_listing_misses_nothing(mounted) -> None:
    """rm -r unlinks entries while it reads the directory; offsets must stay stable."""
    d = mounted.work / "doomed"
    fill(d)
    with os.scandir(d) as it:
        for e in it:
            os.unlink(e.path)
    assert os.listdir(d) == [], "entries skipped by readdir while others were unlinked"
    fill(d / "again")
    subprocess.run(["rm", "-rf", str(d)], check=True)
    assert not d.exists()


def test_mmap_writes_reach_the_file(mounted) -> None:
    p = mounted.work / "mapped"
    p.write_bytes(b"\0" * 65536)
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 65536) as m:
        m[100:105] = b"hello"
        m[65531:] = b"world"
        m.flush()
    data = subprocess.run(["cat", str(p)], capture_output=True, check=True).stdout
    assert data[100:105] == b"hello" and data[65531:] == b"world" and len(data) == 65536


def test_odirect_does_not_kill_the_mount(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "direct"
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError as exc:
        assert exc.errno == errno.EINVAL
    else:
        buf = mmap.mmap(-1, 4096)  # page-aligned
        buf.write(b"d" * 4096)
        try:
            os.write(fd, buf)
        except OSError as exc:
            assert exc.errno == errno.EINVAL
        finally:
            os.close(fd)
    (mounted.work / "alive").write_text("still here")
    assert (mounted.work / "alive").read_text() == "still here"
    assert mounted.proc.poll() is None


def test_huge_truncate_is_sparse(mounted) -> None:
    """A 64 GiB truncate must cost neither memory nor disk; the hole reads as zeros."""
    mounted.require_real()
    p = mounted.work / "sparse"
    with open(p, "wb") as f:
        f.truncate(64 << 30)
        f.seek((64 << 30) - 3)
        f.write(b"end")
    assert os.stat(p).st_size == 64 << 30
    with open(p, "rb") as f:
        f.seek(32 << 30)
        assert f.read(4096) == b"\0" * 4096
        f.seek((64 << 30) - 3)
        assert f.read() == b"end"
    mounted.umount()
    mounted.remount()
    assert os.stat(p).st_size == 64 << 30
    du = subprocess.run(["du", "-sk", str(mounted.root)], capture_output=True, text=True,
                        check=True).stdout.split()[0]
    assert int(du) < 100 * 1024, f"the store grew to {du} KiB for a sparse file"
