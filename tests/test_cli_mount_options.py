"""`memfs mount` options as a user meets them (from a user trial): a typo is refused before
anything starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.mount import REPO, force_unmount, memfs_cmd

pytestmark = pytest.mark.mount


def test_mount_refuses_a_negative_commit_interval(tmp_path: Path) -> None:
    """`memfs mount MNT --commit-interval -5` mounted, taking the delay as 0 without a
    word: a typo is refused before anything starts, and nothing is mounted."""
    root, mnt = tmp_path / "root", tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(memfs_cmd(root, "mount", str(mnt), "--commit-interval", "-5"),
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    try:
        assert res.returncode == 2, res
        assert "--commit-interval: -5 is negative" in res.stderr, res.stderr
        assert "0 commits at once" in res.stderr, res.stderr
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)
