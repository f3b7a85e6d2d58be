"""The work agents do all day (issue 16): generate a tree, git add/commit/status, unpack a real
virtualenv, grep -r, cp -a, rm -rf.

Inputs that must not be timed (the virtualenv tarball) are made once in the shared scratch
directory. Workloads run in order on one side's directory and build on each other: gen-tree
makes `agent/src`, git-add and git-commit make a repository of it, cp-a copies it, rm-rf
removes the copy.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from benchmarks.fs_workloads import git, make_source_tree
from benchmarks.registry import Context, Measure, timed, workload

TREE_FILES = 5_000


def _src(ctx: Context) -> Path:
    return ctx.dir / "agent" / "src"


def _ensure_tree(ctx: Context) -> Path:
    src = _src(ctx)
    if not src.exists():
        make_source_tree(src, ctx.n(TREE_FILES))
    return src


def _ensure_repo(ctx: Context) -> Path:
    src = _ensure_tree(ctx)
    if not (src / ".git").exists():
        git(src, "init", "-q")
        git(src, "add", "-A")
    return src


@workload("gen-tree", "agent", "files/s", min_ratio=1 / 3)
def gen_tree(ctx: Context) -> Measure:
    """generate a 5k-file source tree (mkdir -p + write, 0.2-12 KiB files)"""
    n = ctx.n(TREE_FILES)
    return Measure(n, timed(lambda: make_source_tree(_src(ctx), n)))


@workload("git-add", "agent", "files/s", min_ratio=1 / 3)
def git_add(ctx: Context) -> Measure:
    """git init + git add -A of the 5k-file tree"""
    src = _ensure_tree(ctx)

    def run() -> None:
        git(src, "init", "-q")
        git(src, "add", "-A")

    return Measure(ctx.n(TREE_FILES), timed(run))


@workload("git-commit", "agent", "files/s")
def git_commit(ctx: Context) -> Measure:
    """git commit of the 5k staged files"""
    src = _ensure_repo(ctx)
    return Measure(ctx.n(TREE_FILES), timed(lambda: git(src, "commit", "-q", "-m", "bench")))


@workload("git-status-cold", "agent", "files/s")
def git_status_cold(ctx: Context) -> Measure:
    """git status with the kernel's caches dropped first (root; else warm)"""
    src = _ensure_repo(ctx)
    git(src, "status", "--porcelain")  # the index is refreshed once, untimed
    ctx.cold()
    return Measure(ctx.n(TREE_FILES), timed(lambda: git(src, "status", "--porcelain")))


def venv_tarball(scratch: Path) -> tuple[Path, int]:
    """A tarball of this interpreter's site-packages: a real many-file tree of Python
    packages (the benchmark's own venv), made once per run."""
    tarball = scratch / "site-packages.tar"
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    if not tarball.exists():
        with tarfile.open(tarball, "w") as tf:
            tf.add(site, arcname="site-packages")
    with tarfile.open(tarball) as tf:
        return tarball, len(tf.getmembers())


@workload("tar-x-venv", "agent", "entries/s", min_ratio=1 / 3)
def tar_x_venv(ctx: Context) -> Measure:
    """tar -x of a real virtualenv's site-packages"""
    tarball, entries = venv_tarball(ctx.scratch)
    dest = ctx.dir / "agent" / "venv"
    dest.mkdir(parents=True)
    return Measure(entries, timed(lambda: subprocess.run(
        ["tar", "-xf", str(tarball), "-C", str(dest)], check=True)))


@workload("grep-r", "agent", "files/s")
def grep_r(ctx: Context) -> Measure:
    """grep -r over the unpacked virtualenv, caches dropped first (root; else warm)"""
    dest = ctx.dir / "agent" / "venv"
    if not dest.exists():
        tar_x_venv(ctx)
    _, entries = venv_tarball(ctx.scratch)
    ctx.cold()
    return Measure(entries, timed(lambda: subprocess.run(
        ["grep", "-r", "-c", "memfs-no-such-string", str(dest)], stdout=subprocess.DEVNULL)))


@workload("cp-a", "agent", "files/s")
def cp_a(ctx: Context) -> Measure:
    """cp -a of the 5k-file tree (with its .git) inside the directory"""
    src = _ensure_repo(ctx)
    files = sum(1 for p in src.rglob("*") if p.is_file())
    dest = ctx.dir / "agent" / "copy"
    return Measure(files, timed(lambda: subprocess.run(["cp", "-a", str(src), str(dest)],
                                                       check=True)))


@workload("rm-rf", "agent", "files/s")
def rm_rf(ctx: Context) -> Measure:
    """rm -rf of that copy"""
    dest = ctx.dir / "agent" / "copy"
    if not dest.exists():
        cp_a(ctx)
    files = sum(1 for p in dest.rglob("*") if p.is_file())
    return Measure(files, timed(lambda: subprocess.run(["rm", "-rf", str(dest)], check=True)))
