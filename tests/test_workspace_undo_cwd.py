"""A shell standing in a directory that an undo removes, and the way back through the reflog.

The directory keeps its inode while it survives; when it does not, it reads empty and takes
no new entries (ENOENT, as after `rm -r` of a shell's cwd) — nothing written there could
ever be committed, so accepting it would lose it silently.
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.helpers.mount import REPO, memfs_cmd

pytestmark = pytest.mark.mount


def _sh(cwd, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True)


def test_cwd_removed_by_restore_reads_empty_and_refuses_new_files(mounted) -> None:
    mounted.require_real()
    mounted.cli("checkpoint", "before")
    sub = mounted.work / "sub"
    sub.mkdir()
    (sub / "f").write_text("x\n")
    fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)  # a process standing in `sub`
    try:
        mounted.cli("restore", "before")
        assert os.listdir(f"/proc/self/fd/{fd}") == []
        with pytest.raises(OSError) as err:
            os.open("g", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        assert err.value.errno == errno.ENOENT
    finally:
        os.close(fd)
    assert not sub.exists()

    moves = mounted.cli_json("reflog")
    assert moves[0]["reason"] == "restore before"
    mounted.cli("restore", moves[0]["old"])
    assert (sub / "f").read_text() == "x\n"


def test_cwd_that_survives_an_undo_keeps_working(mounted) -> None:
    mounted.require_real()
    sub = mounted.work / "keep"
    sub.mkdir()
    (sub / "a").write_text("one\n")
    mounted.cli("checkpoint", "one")
    (sub / "a").write_text("two\n")
    cli = " ".join(memfs_cmd(mounted.root, "restore", "one"))
    res = _sh(sub, f"PYTHONPATH={REPO} {cli} >/dev/null && cat a && ls")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["one", "a"]
