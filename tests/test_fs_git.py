"""git works inside the mount as in any folder: the same history, the same trees, fsck clean."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.tree import diff_snapshots, snapshot

pytestmark = pytest.mark.mount

GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "memfs test",
    "GIT_AUTHOR_EMAIL": "test@memfs.invalid",
    "GIT_COMMITTER_NAME": "memfs test",
    "GIT_COMMITTER_EMAIL": "test@memfs.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args],
                         cwd=cwd, env=GIT_ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"git {' '.join(args)} in {cwd}: {out.stderr}{out.stdout}"
    return out.stdout


def populate(d: Path) -> None:
    for i in range(40):
        sub = d / "src" / f"pkg{i % 5}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}\n" * (i + 1))
    (d / "bin.dat").write_bytes(bytes(range(256)) * 64)
    (d / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(d / "run.sh", 0o755)
    os.symlink("src/pkg0/mod0.py", d / "link.py")


def session(d: Path) -> dict[str, str]:
    """A whole git session; returns what must match between memfs and native."""
    git(d, "init", "-q")
    populate(d)
    git(d, "add", "-A")
    git(d, "commit", "-q", "-m", "first")
    git(d, "branch", "feature")
    git(d, "checkout", "-q", "feature")
    (d / "src" / "pkg1" / "mod1.py").write_text("changed on feature\n")
    (d / "src" / "pkg2" / "mod2.py").unlink()
    (d / "new.txt").write_text("feature file\n")
    git(d, "add", "-A")
    git(d, "commit", "-q", "-m", "feature work")
    git(d, "checkout", "-q", "main")
    assert not (d / "new.txt").exists(), "checkout main left feature's file behind"
    assert (d / "src" / "pkg2" / "mod2.py").exists(), "checkout main did not restore a file"
    git(d, "merge", "-q", "--no-edit", "feature")
    status = git(d, "status", "--porcelain")
    git(d, "gc", "-q", "--aggressive", "--prune=now")
    fsck = subprocess.run(["git", "fsck", "--full", "--strict"], cwd=d, env=GIT_ENV,
                          capture_output=True, text=True, timeout=120)
    return {
        "status": status,
        "head": git(d, "rev-parse", "HEAD"),
        "tree": git(d, "rev-parse", "HEAD^{tree}"),
        "log": git(d, "log", "--format=%H %s", "--all"),
        "ls": git(d, "ls-files", "-s"),
        "fsck": f"rc={fsck.returncode} {fsck.stdout}{fsck.stderr}".strip(),
    }


def test_git_session_in_mount_matches_native(mounted, native_dir: Path) -> None:
    repo = mounted.work / "repo"
    repo.mkdir()
    want = session(native_dir)
    got = session(repo)
    assert got["fsck"] == "rc=0", got["fsck"]
    assert got["status"] == "", f"git status not clean in the mount:\n{got['status']}"
    assert got == want
    # The work tree itself (not .git, whose pack layout may differ) is identical.
    w, g = snapshot(native_dir, skip=[".git"]), snapshot(repo, skip=[".git"])
    assert g == w, "\n".join(diff_snapshots(g, w))


def committed_repo(repo: Path) -> Path:
    """A new repository at `repo` with the populated tree added and committed."""
    repo.mkdir()
    git(repo, "init", "-q")
    populate(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_git_status_clean_after_remount(mounted) -> None:
    """git's index stat cache stays valid across a daemon restart (stable mtimes, sizes)."""
    mounted.require_real()
    repo = committed_repo(mounted.work / "repo")
    mounted.umount()
    mounted.remount()
    assert git(repo, "status", "--porcelain") == ""
    fsck = subprocess.run(["git", "fsck", "--full", "--strict"], cwd=repo, env=GIT_ENV,
                          capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stderr


def test_git_objects_keep_no_inode_table(mounted) -> None:
    """git writes each object as a temporary file, links it to its name and unlinks the
    temporary one: down to one name, the object's inode leaves the inode table (which every
    commit changing any row stored whole: most of a big git add's stored bytes). After an
    add and a commit of a tree, the last commit has no table, every object is a plain row,
    and git reads them all back after a remount."""
    mounted.require_real()
    from memfs.store.backend import open_store
    from memfs.store.trees import HARD, decode_dir

    repo = committed_repo(mounted.work / "repo")
    objects = [p for p in (repo / ".git" / "objects").rglob("*") if p.is_file()]
    assert len(objects) > 40 and all(os.stat(p).st_nlink == 1 for p in objects)
    mounted.umount()
    store = open_store(mounted.root, create=False)
    try:
        head = store.head()
        assert store.inode_table(head) is None
        hard, work = [], [store.commit(head).tree]
        while work:
            for e in decode_dir(store.read_object(work.pop())):
                if e.kind == HARD:
                    hard.append(e.name)
                elif e.kind == "d":
                    work.append(e.ref)
        assert hard == []
    finally:
        store.close()
    mounted.remount()
    fsck = subprocess.run(["git", "fsck", "--full", "--strict"], cwd=repo, env=GIT_ENV,
                          capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stderr
    assert git(repo, "status", "--porcelain") == ""
