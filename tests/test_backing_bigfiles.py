"""What a listing reads (issue 15, items 4 and 10), through a real mount and a real directory.

A file over --max-file-size that the store does not hold is classified by its first 8 KiB and
shown disk-only. Its evidence is then agreed absence, which used to make it "tracked": every
later listing hashed it whole (a 4 GiB file read at each `ls --states`, 16 GiB when it was
still inside its racy window). `bytes_read` in each listing's reply counts what the daemon
read of file contents.
"""

from __future__ import annotations

import os
import time

from test_backing_mount import backed, sh  # noqa: F401 - the fixture

HEAD = 8192
BIG = 64 << 20


def _listing(m, path: str = "work") -> dict:
    (mount,) = m.cli_json("ls", "--states", path)["mounts"]
    return mount


def test_a_big_untracked_file_is_read_by_its_head_only_at_every_listing(mounted, tmp_path):
    if mounted.native:
        return
    m = mounted
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "small.txt").write_text("s\n")
    m.cli("attach", "work", str(disk), "--watch", "off", "--max-file-size", str(1 << 20))
    big = disk / "big.bin"
    with open(big, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(BIG)  # sparse: 64 MiB of zeros after the header
    for _ in range(3):  # inside its racy window and after
        got = _listing(m)
        assert got["bytes_read"] <= HEAD + 64, got["bytes_read"]  # the head, and small.txt
        (entry,) = [e for e in got["entries"] if e["path"] == "big.bin"]
        assert entry["state"] == "disk-only"
    time.sleep(2.1)
    assert _listing(m)["bytes_read"] <= HEAD + 64
    assert os.stat(m.work / "big.bin").st_size == BIG
