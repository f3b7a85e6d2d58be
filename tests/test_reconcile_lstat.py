"""memfs.reconcile.lstat: the native helper (or its fallback) against os.stat, name by name."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from helpers.require import require_tool

from memfs.reconcile import lstat


def test_native_helper_is_built():
    """CI builds the extension (scripts/test sets MEMFS_REQUIRE_TOOLS): without it the walk
    is correct but several times slower, and the benchmark's figure would not be ours."""
    require_tool(None if lstat.NATIVE else "memfs.reconcile._lstat is not built here (a source "
                 "tree on PYTHONPATH): `pip install -e .` builds it")


def _odd_dir(d: Path) -> list[str]:
    (d / "file").write_bytes(b"x" * 5)
    (d / "dir").mkdir()
    (d / "link").symlink_to("file")
    (d / "dangling").symlink_to("nowhere")
    os.mkfifo(d / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))
    raw = os.fsdecode(b"caf\xe9")  # not UTF-8: a surrogate-escaped name
    (d / raw).write_bytes(b"")
    (d / "\u00e9t\u00e9").write_bytes(b"summer")
    for i in range(100):  # enough names for the helper to split the list between two threads
        (d / f"n{i:03d}").write_bytes(b"y" * i)
    return sorted(os.listdir(d)) + ["missing"]


def test_records_match_os_stat(tmp_path: Path):
    names = _odd_dir(tmp_path)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        native = lstat.records(fd, names)
        assert native == lstat.python_records(fd, names)
        got = list(lstat.unpack(native))
        for name, rec in zip(names, got, strict=True):
            if name == "missing":
                assert rec == 2  # ENOENT
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            assert rec == (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                           st.st_dev), name
        assert lstat.records(fd, []) == b""
    finally:
        os.close(fd)


@pytest.mark.parametrize("bad", ["a/b", "", "x\0y", "..//etc"])
def test_records_refuse_anything_but_one_component(tmp_path: Path, bad: str):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for fn in (lstat.records, lstat.python_records):
            with pytest.raises(ValueError):
                fn(fd, ["ok", bad])
    finally:
        os.close(fd)


def test_times_past_2262_are_packed_exactly(tmp_path: Path):
    """A time past 2262 does not fit int64 nanoseconds (ext4 and tmpfs keep such times): the
    records carry seconds and nanoseconds, so the helper and the fallback agree and are exact."""
    f = tmp_path / "future"
    f.write_bytes(b"x")
    ns = 10_000_000_000 * 10**9 + 5  # 1e10 s after the epoch: the year 2286
    os.utime(f, ns=(ns, ns))
    if os.stat(f).st_mtime_ns != ns:
        require_tool("the test directory's filesystem clamps times past 2262 (ext4 and tmpfs do not)")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        native = lstat.records(fd, ["future"])
        assert native == lstat.python_records(fd, ["future"])
    finally:
        os.close(fd)
    (rec,) = lstat.unpack(native)
    assert rec.st_mtime_ns == ns
