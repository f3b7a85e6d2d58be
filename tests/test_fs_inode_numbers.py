"""Inode numbers stay the same across a restart (docs/architecture.md, "Inode numbers").

git's index keys each file on its stat data, st_ino included: a number that changes at every
mount made `git status` after a remount read and hash every file again. The daemon's request
counts (`MemfsOperations.requests`) show how many files a command opened.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from memfs.control import call

pytestmark = pytest.mark.mount

GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@memfs.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@memfs.invalid"}


def numbers(paths: list[Path]) -> dict[Path, int]:
    return {p: os.lstat(p).st_ino for p in paths}


def restart(m) -> None:
    m.umount()
    m.start()


def test_numbers_survive_a_restart(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    (w / "d" / "e").mkdir(parents=True)
    files = [w / "a.txt", w / "d" / "b.txt", w / "d" / "e" / "c.txt"]
    for f in files:
        f.write_bytes(b"x\n")
    os.symlink("a.txt", w / "link")
    paths = [w, w / "d", w / "d" / "e", w / "link", *files]
    before = numbers(paths)
    assert len(set(before.values())) == len(paths)
    restart(mounted)
    assert numbers(paths) == before
    # A name removed and made again while the kernel may still hold the old inode gets
    # another number (its cached attributes and pages must not show for the new file).
    (w / "a.txt").unlink()
    (w / "a.txt").write_bytes(b"new\n")
    assert (w / "a.txt").read_bytes() == b"new\n"


def test_hard_links_keep_one_number_across_restarts(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    (w / "sub").mkdir()
    (w / "f").write_bytes(b"linked\n")
    os.link(w / "f", w / "sub" / "g")
    assert os.lstat(w / "f").st_ino == os.lstat(w / "sub" / "g").st_ino
    restart(mounted)
    first = os.lstat(w / "sub" / "g").st_ino  # from its inode-table key from now on
    assert os.lstat(w / "f").st_ino == first
    restart(mounted)
    assert os.lstat(w / "f").st_ino == os.lstat(w / "sub" / "g").st_ino == first


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args],
                          cwd=cwd, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout


def opens(m) -> int:
    counts = call(m.root, "requests")
    assert isinstance(counts, dict)
    return int(counts.get("open", 0))


def test_git_status_after_a_remount_reads_no_file(mounted) -> None:
    mounted.require_real()
    repo = mounted.work / "repo"
    for i in range(200):
        sub = repo / f"pkg{i // 50}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"m{i}.py").write_text(f"x = {i}\n")
        # Older than the index git is about to write: a file changed in the index's own second
        # is "racily clean" and read again by every git status, remount or not.
        os.utime(sub / f"m{i}.py", (time.time() - 60, time.time() - 60))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "files")
    assert git(repo, "status", "--porcelain") == ""  # the index is fresh now
    restart(mounted)
    before = opens(mounted)
    assert git(repo, "status", "--porcelain") == ""
    opened = opens(mounted) - before
    assert opened < 50, f"git status opened {opened} files after a remount (the index is stale)"
