"""The host chunk cache's packs (memfs.store.pg.cachepacks): big chunks' copies appended to a
few files, bounded pack by pack, never read wrong after a kill or damage."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.mount import REPO
from test_pg_store import packed_at, pg_root

from memfs.store.backend import open_store
from memfs.store.pg import cache as cache_mod
from memfs.store.pg.cache import ChunkCache, chunk_digest
from memfs.store.pg.cachepacks import CachePacks

PIECE = 256 << 10


def piece(i: int, size: int = PIECE) -> bytes:
    """The i-th test chunk: the same bytes in every process."""
    return random.Random(i).randbytes(size)


def pack_files(root: Path) -> list[Path]:
    return sorted((root / "cache" / "packs").glob("*.pack"))


def files_under(root: Path) -> list[Path]:
    return [p for p in (root / "cache").rglob("*") if p.is_file()]


def test_big_chunks_go_to_a_few_packs_and_a_reopened_cache_reads_them(tmp_path: Path) -> None:
    """40 chunks of 256 KiB are appends to three packs (4 MiB each at this bound), not 40 files (a file each cost the
    kernel a create at each write and an open at each read); a reopened cache finds them
    through the index and reads them, whole and in ranges."""
    root = tmp_path / "root"
    chunks = {chunk_digest(piece(i)): piece(i) for i in range(40)}
    cache = ChunkCache(root, limit=64 << 20)
    cache.keep(chunks)
    cache.flush()
    cache.close()
    assert cache_mod.pack_max(64 << 20) == 4 << 20
    assert len(pack_files(root)) == 3
    assert len(files_under(root)) < 6, files_under(root)  # the pack and the SQLite files
    cache = ChunkCache(root, limit=64 << 20)
    try:
        assert cache.total == sum(p.stat().st_size for p in pack_files(root)) == 40 * PIECE
        for cid, data in chunks.items():
            assert cache.get_range(cid, 1000, 5000) == data[1000:6000]  # checked whole first
            assert cache.get_range(cid, PIECE - 10, 4096) == data[-10:]  # clipped to the chunk
            assert cache.get(cid) == data
    finally:
        cache.close()


def test_the_bound_holds_on_disk_and_a_pack_goes_whole_least_recently_used(
        tmp_path: Path) -> None:
    """The bound counts the packs' bytes on disk; past it the least recently used pack goes
    whole (its copies misses after), and a read keeps a pack."""
    root = tmp_path / "root"
    limit = 4 << 20
    assert cache_mod.pack_max(limit) == PIECE  # one copy a pack here: each goes alone
    cache = ChunkCache(root, limit=limit)
    try:
        ids = []
        for i in range(16):  # 4 MiB: just at the bound
            ids.append(chunk_digest(piece(i)))
            cache.put(ids[-1], piece(i))
        assert cache.get(ids[0]) == piece(0)  # the oldest, used: kept past the next one
        for i in range(16, 24):
            ids.append(chunk_digest(piece(i)))
            cache.put(ids[-1], piece(i))
            on_disk = sum(p.stat().st_size for p in pack_files(root))
            assert on_disk == cache.total <= limit
        assert cache.get(ids[0]) == piece(0)
        assert [cache.get(c) is None for c in ids[1:9]] == [True] * 8
        assert all(cache.get(c) == piece(i) for i, c in enumerate(ids) if i >= 9)
    finally:
        cache.close()


WRITER = """
import random, sys
from pathlib import Path
from memfs.store.pg.cache import ChunkCache, chunk_digest
from memfs.store.pg.cachepacks import CachePacks
cache = ChunkCache(Path(sys.argv[1]), limit=1 << 30)
i = 0
while True:
    data = random.Random(i).randbytes(300_000)
    cache.put(chunk_digest(data), data)
    i += 1
    if i == 5:
        print("writing", flush=True)
"""


def test_a_copy_cut_off_by_a_kill_or_damaged_later_is_never_read(tmp_path: Path) -> None:
    """SIGKILL a process appending copies: every copy a reopened cache names reads back as
    its bytes (a copy is indexed only after it is written), and one damaged after (a power
    cut's lost page) is a miss, forgotten, never wrong bytes."""
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], cwd=REPO,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    cache = ChunkCache(root, limit=1 << 30)
    try:
        size = 300_000
        n = 0
        while cache.has(chunk_digest(piece(n, size))):
            n += 1
        known = range(n)  # written one after the other, each indexed before the next
        assert n >= 5 and not any(cache.has(chunk_digest(piece(i, size)))
                                  for i in range(n, n + 20))
        assert all(cache.get(chunk_digest(piece(i, size))) == piece(i, size) for i in known)
        cache.close()
        victim = chunk_digest(piece(2, size))
        at = packed_at(root, victim)
        assert at is not None
        with open(root / "cache" / "packs" / at[0], "r+b") as f:
            f.seek(at[1] + 4096)
            f.write(b"\0" * 4096)
        cache = ChunkCache(root, limit=1 << 30)
        assert cache.get_range(victim, 0, 100) is None  # its first read checks it whole
        assert not cache.has(victim) and packed_at(root, victim) is None
        assert cache.get(chunk_digest(piece(3, size))) == piece(3, size)
    finally:
        cache.close()


def test_a_damaged_or_deleted_pack_is_read_from_the_database(tmp_path: Path,
                                                             pg_url: str) -> None:
    """Through the store: a pack damaged while the daemon was down, then the whole cache
    folder deleted under the running store: each read is the chunk's bytes, from the rows."""
    root = pg_root(tmp_path, "a", pg_url)
    store = open_store(root)
    pieces = [piece(i, 1 << 20) for i in range(3)]
    with store.transaction() as tx:
        ids = tx.put_chunks(pieces)
    store.close()
    at = packed_at(root, ids[0])
    assert at is not None
    with open(root / "cache" / "packs" / at[0], "r+b") as f:
        f.seek(at[1] + 1000)
        f.write(b"x")
    store = open_store(root)
    try:
        assert store.read_chunk_range(ids[0], 0, 4096) == pieces[0][:4096]
        assert store.read_chunk(ids[1]) == pieces[1]
        store.cache.flush()
        shutil.rmtree(root / "cache")
        assert store.read_chunk_range(ids[2], 5, 10) == pieces[2][5:15]
        assert store.read_chunk(ids[0]) == pieces[0]
        with store.transaction() as tx:  # new copies after: not kept, or kept right
            (more,) = tx.put_chunks([piece(9, 1 << 20)])
        store.cache.flush()
        assert store.read_chunk(more) == piece(9, 1 << 20)
        assert store.fsck() == []
    finally:
        store.close()


def test_a_copy_a_full_disk_cut_short_is_counted_and_not_named(small_fs: Path) -> None:
    """An append the disk could not hold whole is no copy (never indexed), its bytes are
    counted in the bound until its pack goes, and the next copy starts a new pack."""
    packs = CachePacks(small_fs / "packs", pack_max=64 << 20)
    try:
        first = packs.append(piece(0))
        assert first is not None and first.off == 0
        with open(small_fs / "filler", "wb") as f:  # all but ~100 KiB of the filesystem
            free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
            f.write(b"\0" * (free - (100 << 10)))
        cut = packs.append(piece(1, 1 << 20))
        assert cut is not None and cut.off == -1 and cut.pack == first.pack
        assert cut.size == (small_fs / "packs" / first.pack).stat().st_size > PIECE
        (small_fs / "filler").unlink()
        after = packs.append(piece(2))
        assert after is not None and after.pack != first.pack and after.off == 0
        assert packs.read(first.pack, 0, PIECE) == piece(0)
        assert packs.read(after.pack, 0, PIECE) == piece(2)
    finally:
        packs.close()
