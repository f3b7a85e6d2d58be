"""The store's own consistency check (`memfs fsck`), run while no daemon serves the root."""

from __future__ import annotations

import functools
import sqlite3
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


def stored_chunks(root: Path) -> int:
    """How many content chunks the store of `root` holds, on either backend."""
    from memfs.store.backend import read_location

    loc = read_location(root)
    if loc is None:
        conn = sqlite3.connect(root / "store.db")
        try:
            return conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(loc.url) as conn:
        return conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
