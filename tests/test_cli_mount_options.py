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


def test_mounting_over_files_says_they_are_hidden(tmp_path: Path) -> None:
    """From a user trial: `memfs mount DIR` over a directory with files in it hid them
    without a word (as any mount does), and a newcomer who mounted over a project took them
    for gone. It says so on stderr, and the files are there again after the unmount."""
    root, mnt = tmp_path / "root", tmp_path / "project"
    mnt.mkdir()
    (mnt / "README.md").write_text("mine\n")
    assert subprocess.run(memfs_cmd(root, "init"), capture_output=True, cwd=REPO,
                          timeout=60).returncode == 0
    res = subprocess.run(memfs_cmd(root, "mount", str(mnt)), capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    try:
        assert res.returncode == 0, res.stderr
        assert f"{mnt} is not empty: its 1 entry (README.md) is hidden" in res.stderr, res
        assert f"`memfs umount {mnt}` shows it again" in res.stderr, res.stderr
        assert not (mnt / "README.md").exists()
    finally:
        subprocess.run(memfs_cmd(root, "umount", str(mnt)), capture_output=True, cwd=REPO,
                       timeout=60)
        force_unmount(mnt)
    assert (mnt / "README.md").read_text() == "mine\n"
