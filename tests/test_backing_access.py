"""What a FUSE request reaches when disk and the mount change under each other: a disk-only
file read from disk at each open, a descriptor held for writing across a pass's adoption.

Each test failed before its fix (noted per test) and passes with it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.backing_mount import ACCESS, states
from helpers.png import make_png


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


def test_a_write_through_a_descriptor_held_across_a_disk_adoption_is_not_lost(
        mounted, tmp_path: Path):
    """An agent holds a file open for writing; the user edits the same file on disk; a pass
    takes disk's bytes in (a new node, so the kernel shows them); then the agent writes. Its
    write lands on the replaced (unlinked) node: nothing in the tree, no draft, no conflict,
    and the write returned success. Both sides changed the file, so the rule's answer is a
    conflict with both kept: a pass leaves a node open for writing in place. Failed before
    (the tree showed only disk's bytes, no conflict)."""
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("one\n")
    m.cli("attach", "work", str(disk), "--watch", "off")
    with open(m.work / "a.txt", "r+") as held:
        (disk / "a.txt").write_text("two, from the user on disk\n")
        m.cli("sync")  # the pass takes disk's edit in
        held.seek(0, os.SEEK_END)
        held.write("agent's line\n")
        held.flush()
        os.fsync(held.fileno())
    m.cli("sync")
    # Both sides changed the file: the agent's bytes in the tree, disk's on disk, a conflict.
    assert (m.work / "a.txt").read_text() == "one\nagent's line\n"
    assert (disk / "a.txt").read_text() == "two, from the user on disk\n"
    assert states(m, "work/a.txt")["work/a.txt"][0] == "conflict"
    # Closed again (opened, and made by create, both released): disk's next edit is taken.
    with open(m.work / "a.txt", "a"), open(m.work / "n.txt", "w") as n:
        n.write("new\n")
    m.cli("sync", "work/a.txt")  # the conflict resolved toward disk
    (disk / "a.txt").write_text("three\n")
    m.cli("sync")
    assert (m.work / "a.txt").read_text() == "three\n"
