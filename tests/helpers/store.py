"""The store's own consistency check (`memfs fsck`), run while no daemon serves the root."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from helpers.mount import REPO, memfs_cmd


@functools.cache
def has_fsck() -> bool:
    helptext = subprocess.run(memfs_cmd(Path("/nonexistent"), "--help"), capture_output=True,
                              text=True, cwd=REPO).stdout
    return "fsck" in helptext


def store_check(root: Path) -> None:
    """Fail the test if `memfs fsck` finds the store inconsistent (no-op if memfs has none)."""
    if not has_fsck():
        return
    res = subprocess.run(memfs_cmd(root, "fsck"), capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert res.returncode == 0, f"memfs fsck: {res.stdout}{res.stderr}"
