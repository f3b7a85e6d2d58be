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
