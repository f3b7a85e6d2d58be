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


def _chunks_query(root: Path, sql: str) -> int:
    """One number about the chunks of `root`'s store, from its database (either backend)."""
    from memfs.store.backend import read_location

    loc = read_location(root)
    if loc is None:
        conn = sqlite3.connect(f"file:{root / 'store.db'}?mode=ro", uri=True)
        try:
            return conn.execute(sql.replace("octet_length(data)", "len")).fetchone()[0] or 0
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(loc.url) as conn:
        return conn.execute(sql).fetchone()[0] or 0


def chunk_bytes(root: Path) -> int:
    """The bytes the store of `root` keeps for chunks: its packs (the embedded store, dead
    ranges included), or its chunk rows' bytes (PostgreSQL)."""
    from memfs.store.backend import read_location

    if read_location(root) is None:
        return sum(p.stat().st_size for p in (root / "packs").glob("*.pack"))
    return _chunks_query(root, "SELECT SUM(octet_length(data)) FROM chunks")


def patch_rows(root: Path) -> int:
    """How many chunks the store of `root` keeps as patches (memfs.store.delta)."""
    return _chunks_query(root, "SELECT COUNT(*) FROM chunks WHERE over IS NOT NULL")
