"""Restart: a clean unmount keeps everything; one daemon per root."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.mount import REPO, is_mounted, memfs_cmd
from helpers.png import make_png
from helpers.tree import diff_snapshots, snapshot

pytestmark = pytest.mark.mount


def populate(d: Path) -> None:
    (d / "dir" / "sub").mkdir(parents=True)
    (d / "dir" / "sub" / "pic.png").write_bytes(make_png())
    (d / "text.txt").write_text("hello\n" * 1000)
    (d / "empty").touch()
    with open(d / "sparse", "wb") as f:
        f.truncate(10 << 20)
        f.seek(5 << 20)
        f.write(b"middle")
    os.symlink("dir/sub/pic.png", d / "link")
    os.chmod(d / "text.txt", 0o640)
    os.utime(d / "empty", ns=(1_000_000_123, 2_000_000_456))
    os.setxattr(d / "text.txt", "user.tag", b"kept")


def test_umount_then_mount_keeps_everything(mounted) -> None:
    mounted.require_real()
    populate(mounted.work)  # no fsync: umount must flush and commit
    before = snapshot(mounted.mnt, mtimes=True)
    res = mounted.umount()
    assert res.returncode == 0
    assert mounted.proc.returncode == 0, "daemon did not exit cleanly after umount"
    assert not is_mounted(mounted.mnt)
    mounted.remount()
    after = snapshot(mounted.mnt, mtimes=True)
    assert after == before, "\n".join(diff_snapshots(after, before))
    assert os.getxattr(mounted.work / "text.txt", "user.tag") == b"kept"


def test_sigterm_unmounts_and_keeps_writes(mounted) -> None:
    mounted.require_real()
    (mounted.work / "late.txt").write_text("written just before SIGTERM\n")
    mounted.proc.send_signal(signal.SIGTERM)
    assert mounted.proc.wait(timeout=30) == 0
    assert not is_mounted(mounted.mnt), "SIGTERM left the mount behind"
    mounted.remount()
    assert (mounted.work / "late.txt").read_text() == "written just before SIGTERM\n"


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "daemonized"])
def test_second_mount_on_same_root_is_refused(mounted, tmp_path: Path, foreground: bool) -> None:
    mounted.require_real()
    other = tmp_path / "second"
    other.mkdir()
    cmd = memfs_cmd(mounted.root, "mount", str(other), *(["--foreground"] if foreground else []))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30)
    finally:
        if is_mounted(other):
            subprocess.run(["fusermount3", "-uz", str(other)])
    assert res.returncode == 1, f"second mount: rc={res.returncode} {res.stdout}{res.stderr}"
    message = (res.stderr + res.stdout).lower()
    assert str(mounted.root).lower() in message or "already" in message, message
    assert not is_mounted(other)
    (mounted.work / "still.txt").write_text("first mount unharmed\n")
    assert (mounted.work / "still.txt").read_text() == "first mount unharmed\n"
