"""Review findings on the backing-directory work, each proved through a real mount first.

Every test here failed before its fix (noted per test) and passes with it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.png import make_png
from test_backing_mount import ACCESS


def test_disk_only_file_rewritten_in_place_with_its_mtime_kept_reads_new_bytes(
        mounted, tmp_path: Path):
    """A disk-only file is disk's truth, read through a contained fd at each read. A same-size
    rewrite whose mtime is put back (`touch -r`, a tool keeping timestamps) leaves the node in
    place, so the kernel's page cache must not survive the next open. Failed with
    keep_cache=True for every open (the old bytes came back from the cache)."""
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    old = make_png(8, 8)
    (disk / "pic.png").write_bytes(old)
    m.cli("attach", "work", str(disk), "--watch", "off")
    assert (m.work / "pic.png").read_bytes() == old  # the kernel now holds its pages
    st = os.stat(disk / "pic.png")
    new = bytearray(old)
    new[-20] ^= 0xFF  # same size, other bytes
    (disk / "pic.png").write_bytes(bytes(new))
    os.utime(disk / "pic.png", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (m.work / "pic.png").read_bytes() == bytes(new)
    # An on-access mount (the open observes first) reads them too.
    m.cli("detach", "work")
    m.cli("attach", "work", str(disk))
    assert (m.work / "pic.png").read_bytes() == bytes(new)
    (disk / "pic.png").write_bytes(old)
    os.utime(disk / "pic.png", ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(ACCESS)  # past the attach pass's once-a-second window
    assert (m.work / "pic.png").read_bytes() == old
