"""`memfs mount --bind NAME=DIR`: the mount comes up already bound, with disk's files in."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.mount


def test_mount_with_bind_takes_the_directory_in(mount_factory, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "a.txt").write_text("hello\n")
    m = mount_factory(extra_args=("--bind", f"code={proj}"))
    m.require_real()
    a = m.mnt / "code" / "src" / "a.txt"
    assert a.read_text() == "hello\n"
    deadline = time.monotonic() + 10  # the daemon's first pass runs after the mount is up
    while time.monotonic() < deadline:
        try:
            if os.getxattr(a, "user.memfs.state") == b"synced":
                break
        except OSError:
            pass
        time.sleep(0.1)
    assert os.getxattr(a, "user.memfs.state") == b"synced"
    st = m.cli_json("status")
    assert st["backing"]["code"]["dir"] == str(proj)
    assert "backed   code ->" in m.cli("status").stdout


def test_bind_needs_name_and_dir(mount_factory, tmp_path: Path) -> None:
    m = mount_factory()
    m.require_real()
    res = m.cli("mount", str(tmp_path / "elsewhere"), "--bind", "nodir", check=False)
    assert res.returncode == 1
    assert "NAME=DIR" in res.stderr


def test_the_same_mount_with_bind_comes_back_after_a_sigkill(mount_factory,
                                                              tmp_path: Path) -> None:
    """The command a user ran is the one they run again after a crash. The dead daemon's record
    in daemon.lock still names its mountpoint, which is a plain directory again once the dead
    mount is cleaned: on the same filesystem as the backing directory, it used to be refused
    as 'inside the memfs mount', so the mount never came back with its --bind."""
    proj = tmp_path / "proj"  # the same filesystem as the mountpoint, as ~/proj and ~/m
    proj.mkdir()
    (proj / "a.txt").write_text("hello\n")
    m = mount_factory(extra_args=("--bind", f"code={proj}"))
    m.require_real()
    assert (m.mnt / "code" / "a.txt").read_text() == "hello\n"
    m.kill()
    (proj / "b.txt").write_text("made while memfs was down\n")
    m.start()  # the same `memfs mount MNT --bind code=DIR`
    assert (m.mnt / "code" / "b.txt").read_text() == "made while memfs was down\n"
    assert m.cli_json("status")["backing"]["code"]["dir"] == str(proj)
    # A directory really inside the running mount is still refused.
    inside = m.mnt / "inside"
    inside.mkdir()
    res = m.cli("attach", "other", str(inside), check=False)
    assert res.returncode == 1 and "inside the memfs mount" in res.stderr, res.stderr
