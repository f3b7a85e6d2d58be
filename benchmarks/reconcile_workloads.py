"""Reconcile an unchanged backing directory, next to `git status` on the same tree.

The tree (default 100k files in 1,000 directories) is generated once in the shared scratch
directory and committed to git there, untimed. The native side times a warm `git status`; the
memfs side attaches the tree to a fresh store (untimed: the first take-in), runs one pass to
warm the fingerprint cache, then times further passes over the unchanged tree — the work an
on-access or `memfs sync` pass does when nothing changed. It runs the daemon's own code
(memfs.backing) in-process, with no mount in the way.

Each side is timed REPEAT times after its warm-up and the fastest run counts, on both sides
alike: the machine is shared, and a slow outlier says more about the neighbours than the code.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from benchmarks.registry import Context, Measure, workload

REPEAT = 3


def _tree(ctx: Context) -> tuple[Path, int]:
    files = ctx.n(100_000)
    tree = ctx.scratch / f"reconcile-tree-{files}"
    if not (tree / ".git").exists():
        per_dir = 100
        for i in range(files):
            d = tree / f"d{i // per_dir:04d}"
            if i % per_dir == 0:
                d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i % per_dir:03d}.txt").write_text(f"file {i}\n")
        for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@e", "-c", "user.name=b",
                                                    "commit", "-qm", "tree"]):
            subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    return tree, files


def _git_status(tree: Path) -> None:
    subprocess.run(["git", "status", "--porcelain"], cwd=tree, check=True, capture_output=True)


def _edit(tree: Path, i: int) -> None:
    """Append a line to one file of the tree (a different one each round)."""
    with open(tree / f"d{i:04d}" / "f005.txt", "a") as f:
        f.write("edited\n")


def _memfs_pass(ctx: Context, tree: Path, edit: bool = False) -> float:
    """The best of REPEAT timings: one quiet pass, or (edit) the two passes after an edit."""
    import trio

    from memfs.backing import Backing, Binding
    from memfs.workspace.workspace import Workspace

    root = ctx.scratch / "reconcile-root"
    shutil.rmtree(root, ignore_errors=True)

    async def run() -> float:
        ws = Workspace.open(root, 0.1)
        backing = Backing(ws)
        try:
            await backing.attach(Binding(mount="proj", dir=str(tree)))
            await ws.commit("take-in")
            await backing.run_pass("proj")  # warms the fingerprint cache
            best = float("inf")
            for i in range(REPEAT):
                if edit:
                    await backing.run_pass("proj")  # quiet before the edit
                    _edit(tree, i)
                start = time.perf_counter()
                await backing.run_pass("proj")
                if edit:
                    await backing.run_pass("proj")
                best = min(best, time.perf_counter() - start)
            return best
        finally:
            backing.close()
            ws.store.close()
            if edit:
                subprocess.run(["git", "checkout", "-q", "."], cwd=tree, check=True)

    return trio.run(run)


@workload("reconcile-unchanged", "reconcile", "files/s", min_ratio=0.5)
def reconcile_unchanged(ctx: Context) -> Measure:
    """Unchanged 100k-file tree: memfs pass vs git status (warm, best of 3 each)"""
    tree, files = _tree(ctx)
    if ctx.side == "native":
        _git_status(tree)
        best = float("inf")
        for _ in range(REPEAT):
            start = time.perf_counter()
            _git_status(tree)
            best = min(best, time.perf_counter() - start)
        return Measure(files, best)
    from memfs.reconcile import lstat

    print("  memfs walk stats names with", "the native helper (memfs/reconcile/_lstat.c)"
          if lstat.NATIVE else "the Python fallback: _lstat is not built (pip install -e .)")
    return Measure(files, _memfs_pass(ctx, tree))


@workload("reconcile-after-edit", "reconcile", "files/s")
def reconcile_after_edit(ctx: Context) -> Measure:
    """One file edited on disk: memfs's next two passes vs two git status (best of 3 each)"""
    tree, files = _tree(ctx)
    if ctx.side == "native":
        _git_status(tree)
        best = float("inf")
        try:
            for i in range(REPEAT):
                _edit(tree, i)
                start = time.perf_counter()
                _git_status(tree)
                _git_status(tree)
                best = min(best, time.perf_counter() - start)
        finally:
            subprocess.run(["git", "checkout", "-q", "."], cwd=tree, check=True)
        return Measure(files, best)
    return Measure(files, _memfs_pass(ctx, tree, edit=True))
