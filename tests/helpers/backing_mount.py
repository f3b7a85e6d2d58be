"""Backing directories through a real mount: the shell helpers and the `backed` fixture
(conftest.py registers it) the backing tests share."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

ACCESS = 1.1  # > memfs.backing.onaccess.ACCESS_INTERVAL: the on-access window passed


def sh(cmd: str, cwd: Path | None = None) -> str:
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=cwd,
                         timeout=60)
    assert out.returncode == 0, f"{cmd}: {out.stderr}"
    return out.stdout


def states(m, path: str | None = None) -> dict[str, tuple[str, str | None]]:
    res = m.cli_json("ls", "--states", *([path] if path else []))
    out = {}
    for mount in res["mounts"]:
        for e in mount["entries"]:
            out[f"{mount['mount']}/{e['path']}"] = (e["state"], e["conflict"])
    return out


def xattr(p: Path, name: str = "user.memfs.state") -> str | None:
    try:
        return os.getxattr(p, name).decode()
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        raise


@pytest.fixture
def backed(mounted, tmp_path: Path):
    """A mount with `work` bound to a backing directory holding a.txt, b.txt, sub/c.txt."""
    mounted.require_real()
    disk = tmp_path / "disk"
    (disk / "sub").mkdir(parents=True)
    (disk / "a.txt").write_text("a1\n")
    (disk / "b.txt").write_text("b1\n")
    (disk / "sub" / "c.txt").write_text("c1\n")
    res = mounted.cli_json("attach", "work", str(disk))
    assert sorted(res["pass"]["taken"]) == ["a.txt", "b.txt", "sub/c.txt"]
    return mounted, disk
