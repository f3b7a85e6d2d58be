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


def test_disk_only_entries_carry_size_and_mime(backed):  # noqa: F811
    """Issue 15, item 10: the seed lists a disk-only entry with its size and MIME type; they
    were missing from ls --states --json. The MIME type stays once the hash is cached (a
    cached fact used to read application/octet-stream)."""
    from helpers.png import make_png

    m, disk = backed
    png = make_png(16, 16)
    (disk / "shot.png").write_bytes(png)
    for _ in range(2):  # sniffed, then from the fingerprint cache
        (entry,) = [e for e in _listing(m)["entries"] if e["path"] == "shot.png"]
        assert entry == {"path": "shot.png", "state": "disk-only", "conflict": None,
                         "size": len(png), "mime": "image/png"}
        time.sleep(2.1)  # past the racy window: the next listing vouches from the cache
    out = m.cli("ls", "--states").stdout
    assert f"work/shot.png ({len(png)} bytes, image/png)" in out


def test_a_scan_deadline_or_size_limit_of_zero_is_not_silently_the_default(mounted, tmp_path):
    if mounted.native:
        return
    m = mounted
    disk = tmp_path / "disk"
    disk.mkdir()
    out = m.cli("attach", "work", str(disk), "--watch", "on-agent-action", "--scan-deadline",
                "0", check=False)
    assert out.returncode == 1 and "not positive" in out.stderr
    assert "work" not in (m.status().get("backing") or {})
    out = m.cli("attach", "work", str(disk), "--max-file-size", "-1", check=False)
    assert out.returncode == 1 and "negative" in out.stderr
    (disk / "a.txt").write_text("a\n")
    m.cli("attach", "work", str(disk), "--max-file-size", "0")
    assert _listing(m)["entries"][0]["state"] == "disk-only"  # 0 means 0
    assert m.status()["backing"]["work"]["watch"] == "on-access"


def test_a_disk_only_file_that_grew_reads_whole_right_after_a_listing(backed):  # noqa: F811
    m, disk = backed
    log = disk / "run.bin"
    log.write_bytes(b"\0first\n")
    assert [e["state"] for e in _listing(m)["entries"] if e["path"] == "run.bin"] == [
        "disk-only"]
    assert (m.work / "run.bin").read_bytes() == b"\0first\n"
    time.sleep(1.1)  # (a second open of the file within a second of this one is not observed)
    _listing(m)  # a listing, then at once (inside its on-access window) the file grows
    with open(log, "ab") as f:
        f.write(b"second\n")
    assert (m.work / "run.bin").read_bytes() == b"\0first\nsecond\n"
