"""The state xattrs tell the truth (issue 15, item 8), through a real mount and a real directory.

`user.memfs.state` used to be the last listing's answer: `synced` for a draft made since (until
a listing ran), and `workspace-draft` with no `user.memfs.conflict` once disk had changed the
same file. Reading them now observes the file's path first, in every watch mode, as `memfs ls
--states PATH` does. They are answered by name but not listed, so `cp -a` out of a bound mount
no longer stamps the user's native files with `user.memfs.state="synced"`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.backing_mount import xattr


@pytest.mark.parametrize("watch", ["on-access", "off", "on-agent-action", "fs-events"])
def test_state_xattrs_follow_the_edits_at_once(mounted, tmp_path: Path, watch: str):
    mounted.require_real()
    m = mounted
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    (disk / "b.txt").write_text("b1\n")
    m.cli("attach", "work", str(disk), "--watch", watch)
    a = m.work / "a.txt"
    assert xattr(a) == "synced"
    with open(a, "w") as f:  # an edit through the mount: a draft, no listing since
        f.write("a-draft\n")
    assert xattr(a) == "workspace-draft"
    assert xattr(a, "user.memfs.conflict") is None
    (disk / "a.txt").write_text("a-disk\n")  # disk changes it too: both changed
    assert xattr(a) == "conflict"
    assert xattr(a, "user.memfs.conflict") == "both-changed"
    assert a.read_text() == "a-draft\n"  # the draft is kept
    assert xattr(m.work / "b.txt") == "synced"


def test_state_xattrs_are_not_listed_so_cp_a_does_not_copy_them(mounted, tmp_path: Path):
    mounted.require_real()
    m = mounted
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk))
    a = m.work / "a.txt"
    os.setxattr(a, "user.color", b"blue")
    assert xattr(a) == "synced"  # still answered by name
    assert os.listxattr(a) == ["user.color"]
    native = tmp_path / "native"
    native.mkdir()
    out = subprocess.run(["cp", "-a", str(m.work), str(native)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    copied = native / "work" / "a.txt"
    assert copied.read_text() == "a1\n"
    assert os.listxattr(copied) == ["user.color"]
