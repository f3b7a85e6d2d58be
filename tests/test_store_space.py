"""Store-level space handling: a transaction that fails gives its pack tail back, a full disk's
error is not hidden by a second ROLLBACK, and a write's growth is what its commit stores."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.require import require_tool

from memfs.store import Store
from memfs.store.chunks import CHUNK_SIZE
from memfs.workspace.nodes import FileData

MiB = 1 << 20


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "tiny"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        require_tool(f"cannot mount a small tmpfs (needs root): {res.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def pack_sizes(store: Store) -> int:
    return sum(p.stat().st_size for p in store.chunks.dir.glob("*.pack"))


def test_a_failed_transaction_gives_its_pack_tail_back(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "root")
    with store.transaction() as tx:
        tx.put_chunks([os.urandom(1000)])
    before = pack_sizes(store)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.put_chunks([os.urandom(5000), os.urandom(7000)])
        assert pack_sizes(store) == before + 12000
        raise RuntimeError("the commit fails after its chunks were appended")
    assert pack_sizes(store) == before
    with store.transaction() as tx:  # the next commit appends where the last good one ended
        (cid,) = tx.put_chunks([b"after"])
    assert store.read_chunk(cid) == b"after" and pack_sizes(store) == before + 5
    assert store.fsck() == []


def test_sqlite_full_disk_error_is_the_one_raised(tiny_fs: Path) -> None:
    """SQLite rolls back by itself on SQLITE_FULL; the store's ROLLBACK must not then raise
    'cannot rollback' over it (fsync would answer EIO instead of ENOSPC)."""
    store = Store.open(tiny_fs / "root")
    with pytest.raises(sqlite3.OperationalError) as exc:
        for _ in range(100):
            with store.transaction() as tx:
                tx.put_object(os.urandom(200_000))
    assert exc.value.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL, exc.value
    assert not store._writer.in_transaction  # the next commit can begin
    store.close()


def test_growth_counts_what_the_commit_stores() -> None:
    fd = FileData(3 * CHUNK_SIZE, {0: "a", 1: "b", 2: "c"})
    assert fd.growth(0, CHUNK_SIZE) == CHUNK_SIZE  # a whole piece, stored anew
    assert fd.growth(10, 5) == CHUNK_SIZE  # a committed piece is loaded whole, then changed
    fd.dirty = {0: bytearray(100)}  # a piece partly written
    assert fd.growth(50, 10) == 0  # inside what is already changed
    assert fd.growth(90, 20) == 10
    empty = FileData()
    assert empty.growth(5 * CHUNK_SIZE + 10, 5) == 15  # a hole before it takes nothing
