"""The PostgreSQL store in-process: fencing, the local caches, and what `init --store` says."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.mount import REPO

from memfs.store.backend import Location, open_store, read_location, record_location
from memfs.store.pg import cache as cache_mod
from memfs.store.pg.lease import Fenced, Leases
from memfs.store.pg.store import PgStore
from memfs.store.trees import encode_dir


def pg_root(tmp_path: Path, name: str, url: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    record_location(root, Location("postgresql", url, f"host-{name}"))
    return root


def memfs(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def cached_row(root: Path, cid: str) -> bytes | None:
    """A small chunk's copy in the host's cache (a row of cache/small-chunks.db)."""
    conn = sqlite3.connect(root / "cache" / "small-chunks.db")
    try:
        row = conn.execute("SELECT data FROM chunks WHERE id = ?", (cid,)).fetchone()
    finally:
        conn.close()
    return bytes(row[0]) if row else None


def packed_at(root: Path, cid: str) -> tuple[str, int, int] | None:
    """Where a big chunk's copy lies in the host's cache: (pack, offset, length), from the
    packs' index in cache/small-chunks.db."""
    conn = sqlite3.connect(root / "cache" / "small-chunks.db")
    try:
        row = conn.execute("SELECT pack, off, len FROM packed WHERE id = ?", (cid,)).fetchone()
    finally:
        conn.close()
    return (row[0], row[1], row[2]) if row else None


def packed_copy(root: Path, cid: str) -> bytes | None:
    """A big chunk's copy in the host's cache, read from its pack under cache/packs/."""
    at = packed_at(root, cid)
    if at is None:
        return None
    pack, off, n = at
    with open(root / "cache" / "packs" / pack, "rb") as f:
        f.seek(off)
        return f.read(n)


def damage_row(root: Path, cid: str, data: bytes) -> None:
    conn = sqlite3.connect(root / "cache" / "small-chunks.db")
    with conn:
        assert conn.execute("UPDATE chunks SET data = ? WHERE id = ?", (data, cid)).rowcount == 1
    conn.close()


def commit_empty(store: PgStore, message: str) -> str:
    with store.transaction() as tx:
        tree = tx.put_object(encode_dir([]))
        return tx.add_commit(store.head("main"), tree, "main", message, []).id


def test_a_host_whose_lease_was_taken_over_is_fenced(tmp_path: Path, pg_url: str) -> None:
    a = open_store(pg_root(tmp_path, "a", pg_url))
    b = open_store(pg_root(tmp_path, "b", pg_url))
    try:
        a.leases.close()
        a.leases = Leases(pg_url, a.host, ttl=1.0)  # a short lease, renewed by nobody: a pause
        a.leases._start = lambda: None
        assert a.claim("main").writable
        first = commit_empty(a, "a writes")
        assert not b.claim("main").writable
        with pytest.raises(Fenced):
            commit_empty(b, "b without the lease")
        deadline = time.monotonic() + 10
        while b.lease_state("main").expires_in > 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert b.takeover("main").writable
        second = commit_empty(b, "b after the takeover")
        # a still holds its old token and believes it writes main: refused, nothing moves.
        assert a.leases.token("main") is not None
        with pytest.raises(Fenced, match="holds no lease"):
            commit_empty(a, "a, stale")
        assert b.head("main") == second and b.commit(second).parent == first
        a.leases.renew_all()  # its next renewal finds the token gone
        assert a.leases.token("main") is None
    finally:
        a.close()
        b.close()


def test_the_cache_may_be_deleted_or_damaged_under_a_running_store(tmp_path: Path,
                                                                   pg_url: str) -> None:
    root = pg_root(tmp_path, "a", pg_url)
    store = open_store(root)
    try:
        pieces = [os.urandom(1 << 20), b"small piece"]
        with store.transaction() as tx:
            ids = tx.put_chunks(pieces)
        store.cache.flush()  # the copies are written by the cache's thread
        assert packed_copy(root, ids[0]) == pieces[0]
        damage_row(root, ids[1], b"other bytes")  # a small piece's copy damaged: a miss
        assert store.read_chunk(ids[1]) == pieces[1]
        assert store.read_chunk_range(ids[1], 2, 3) == pieces[1][2:5]
        store.cache.flush()  # its copy, rewritten by the cache's thread, would race rmtree's walk
        shutil.rmtree(root / "cache")
        assert store.read_chunk(ids[0]) == pieces[0]
        assert store.read_chunk_range(ids[0], 10, 20) == pieces[0][10:30]
        assert store.fsck() == []
    finally:
        store.close()


def test_chunks_are_stored_once_whoever_writes_them(tmp_path: Path, pg_url: str) -> None:
    a = open_store(pg_root(tmp_path, "a", pg_url))
    b = open_store(pg_root(tmp_path, "b", pg_url))
    try:
        data = os.urandom(100_000)
        with a.transaction() as tx:
            (one,) = tx.put_chunks([data])
        with b.transaction() as tx:  # b's cache lacks it: the database compares the bytes
            assert tx.put_chunks([data, data]) == [one, one]
        rows = a._query("SELECT COUNT(*) FROM chunks")[0][0]
        assert rows == 1
    finally:
        a.close()
        b.close()


def test_init_store_says_what_is_wrong_and_changes_nothing(tmp_path: Path, pg_url: str) -> None:
    bad = memfs(tmp_path / "r1", "init", "--store", "mysql://x/y")
    assert bad.returncode == 1 and "PostgreSQL URL" in bad.stderr
    assert not (tmp_path / "r1" / "store.json").exists()
    down = memfs(tmp_path / "r2", "init", "--store", "postgresql://memfs@127.0.0.1:1/none")
    assert down.returncode == 1 and "unreachable" in down.stderr
    assert not (tmp_path / "r2" / "store.json").exists()
    assert memfs(tmp_path / "emb", "init").returncode == 0
    moved = memfs(tmp_path / "emb", "init", "--store", pg_url)
    assert moved.returncode == 1 and "embedded store" in moved.stderr
    ok = memfs(tmp_path / "pg", "init", "--store", pg_url)
    assert ok.returncode == 0, ok.stderr
    assert read_location(tmp_path / "pg").url == pg_url
    assert (tmp_path / "pg" / "store.json").stat().st_mode & 0o077 == 0
    other = memfs(tmp_path / "pg", "init", "--store", pg_url + "x")
    assert other.returncode == 1 and "uses the store at" in other.stderr
    again = memfs(tmp_path / "pg", "init")  # later commands find the store by the root
    assert again.returncode == 0 and "postgresql://" in again.stdout


def _fill(directory: Path) -> None:
    """Take every free byte of the filesystem holding `directory`."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def test_a_commit_lands_whole_when_this_hosts_disk_is_full(small_fs: Path, pg_url: str) -> None:
    """The database holds the commit; this host's disk holds only caches. A full local disk
    is a cache miss later, never a commit reported failed after it landed (its retry would
    then build on a head that moved and be fenced)."""
    store = open_store(pg_root(small_fs, "full", pg_url))
    try:
        assert store.claim("main").writable
        _fill(small_fs)
        blob = os.urandom(1 << 18)  # a new object: the object cache would have to grow
        with store.transaction() as tx:
            oid = tx.put_object(blob)
            (chunk,) = tx.put_chunks([os.urandom(1 << 18)])
            tree = tx.put_object(encode_dir([]))
            made = tx.add_commit(store.head("main"), tree, "main", "on a full disk", [])
        assert store.head("main") == made.id
        assert store.read_object(oid) == blob and len(store.read_chunk(chunk)) == 1 << 18
        assert store.fsck() == []
    finally:
        store.close()


def test_fsck_names_a_checkpoint_whose_commit_is_missing(tmp_path: Path, pg_url: str) -> None:
    """As on the embedded store (Store.fsck): a checkpoint is a name history is reached by."""
    import psycopg

    store = open_store(pg_root(tmp_path, "a", pg_url))
    try:
        assert store.fsck() == []
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO checkpoints VALUES ('lost', %s, 'main', 1)", ("f" * 40,))
        assert store.fsck() == [f"checkpoint lost points at missing commit {'f' * 40}"]
    finally:
        store.close()


def test_a_cached_chunk_cut_short_under_a_running_store_is_a_miss(tmp_path: Path,
                                                                  pg_url: str) -> None:
    """A ranged read never returns fewer bytes than the chunk holds there (a reader takes a
    short read for the end of the file): a cached copy cut short after it was checked is read
    from the database instead (the embedded store's pack read refuses the same way)."""
    root = pg_root(tmp_path, "a", pg_url)
    store = open_store(root)
    try:
        piece = os.urandom(1 << 20)
        with store.transaction() as tx:
            (cid,) = tx.put_chunks([piece])
        store.cache.flush()
        assert store.read_chunk_range(cid, 0, 10) == piece[:10]  # the copy, checked whole
        at = packed_at(root, cid)
        assert at is not None
        os.truncate(root / "cache/packs" / at[0], at[1] + 1000)
        assert store.read_chunk_range(cid, 500, 4096) == piece[500:4596]
        assert store.read_chunk_range(cid, (1 << 20) - 100, 4096) == piece[-100:]
        assert store.read_chunk(cid) == piece
    finally:
        store.close()


def test_a_commit_does_not_wait_for_its_cache_copies(tmp_path: Path, pg_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies of a commit's chunks are written by the cache's thread: with that thread
    held up, the commit still returns, its chunks read from memory until written; past
    PENDING_MAX waiting bytes a reader's copy is not kept, and close writes what waits."""
    root = pg_root(tmp_path, "a", pg_url)
    store = open_store(root)
    closed = False
    try:
        release = threading.Event()
        put_many = store.cache.put_many
        monkeypatch.setattr(store.cache, "put_many",
                            lambda chunks: (release.wait(), put_many(chunks)))
        monkeypatch.setattr(cache_mod, "PENDING_MAX", 2 << 20)
        pieces = [os.urandom(1 << 20), os.urandom(1 << 20)]
        done: list[list[str]] = []

        def commit() -> None:
            with store.transaction() as tx:
                ids = tx.put_chunks(pieces)
            done.append(ids)

        t = threading.Thread(target=commit)
        t.start()
        t.join(10)
        assert done, "the commit waited for its cache copies"
        ids = done[0]
        assert packed_copy(root, ids[0]) is None
        assert store.read_chunk(ids[1]) == pieces[1]
        assert store.read_chunk_range(ids[0], 5, 10) == pieces[0][5:15]
        store.cache.keep({"x" * 32: b"read after a miss"}, wait=False)  # over the bound
        release.set()
        store.close()
        closed = True
        assert [packed_copy(root, i) for i in ids] == pieces
        assert packed_copy(root, "x" * 32) is None and cached_row(root, "x" * 32) is None
    finally:
        release.set()
        if not closed:
            store.close()


def test_the_cache_thread_goes_on_after_a_copy_fails(tmp_path: Path, pg_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that fails in an unforeseen way is a miss, and the next ones are still written
    (a dead writer thread would leave commits waiting for room forever)."""
    root = pg_root(tmp_path, "a", pg_url)
    store = open_store(root)
    try:
        put_many = store.cache.put_many
        failed: list[str] = []

        def flaky(chunks: dict[str, bytes]) -> None:
            if not failed:
                failed.extend(chunks)
                raise RuntimeError("unforeseen")
            put_many(chunks)

        monkeypatch.setattr(store.cache, "put_many", flaky)
        pieces = [os.urandom(1000), os.urandom(1000)]
        def flushed() -> None:
            done = threading.Thread(target=store.cache.flush, daemon=True)
            done.start()
            done.join(10)
            assert not done.is_alive(), "the cache's thread stopped"

        with store.transaction() as tx:
            first = tx.put_chunks(pieces[:1])
        # The first copy a batch of its own (the thread took both in one batch when the
        # second commit came before it woke: CI saw both ids fail).
        flushed()
        with store.transaction() as tx:
            second = tx.put_chunks(pieces[1:])
        flushed()
        assert failed == first
        assert cached_row(root, second[0]) == pieces[1]
        assert cached_row(root, first[0]) is None
        assert store.read_chunk(first[0]) == pieces[0]  # the miss: from the database
    finally:
        store.close()


def test_small_chunks_are_cached_as_rows_and_bounded_with_the_packs(tmp_path: Path) -> None:
    """A git commit stores thousands of pieces of a few KiB: their copies are rows of one
    database written in one transaction, not a file each (the kernel's work creating those
    files was more than the server's storing them). Rows and packs share one bound, oldest
    first, and a reopened cache knows both."""
    root = tmp_path / "root"
    pieces = [os.urandom(3000) for _ in range(50)]
    small = {cache_mod.chunk_digest(d): d for d in pieces}
    big = os.urandom(cache_mod.SMALL_MAX + 1)
    big_id = cache_mod.chunk_digest(big)
    bound = 50 * 3000 + len(big)
    cache = cache_mod.ChunkCache(root, limit=bound)
    cache.keep(small)
    cache.keep({big_id: big})
    cache.flush()
    assert packed_copy(root, big_id) == big and cached_row(root, big_id) is None
    assert all(cached_row(root, c) == d for c, d in small.items())
    cache.close()
    cache = cache_mod.ChunkCache(root, limit=bound)  # reopened: rows and packs known
    try:
        assert cache.total == bound
        assert all(cache.get(c) == d for c, d in small.items())
        assert cache.get_range(big_id, 10, 5) == big[10:15]
        more = os.urandom(3000)
        cache.put(cache_mod.chunk_digest(more), more)  # past the bound: the oldest go
        assert cache.total <= bound
        gone = [c for c in small if cached_row(root, c) is None]
        assert gone and gone == list(small)[:len(gone)]
        assert all(cache.get(c) is None for c in gone)
        assert cache.get(cache_mod.chunk_digest(more)) == more
    finally:
        cache.close()


def test_a_pack_cut_short_is_an_error_on_the_embedded_store(tmp_path: Path) -> None:
    """The embedded store's side of the test above: its packs are the only copy, so a ranged
    read past what a pack holds is an error, never a short read."""
    root = tmp_path / "e"
    root.mkdir()
    store = open_store(root)
    try:
        piece = os.urandom(1 << 20)
        with store.transaction() as tx:
            (cid,) = tx.put_chunks([piece])
        assert store.read_chunk_range(cid, 0, 10) == piece[:10]
        loc = store.chunks.locate(store._reader, cid)
        os.truncate(store.chunks.pack_path(loc.pack), loc.off + 1000)
        with pytest.raises(OSError, match="shorter than the store says"):
            store.read_chunk_range(cid, 500, 4096)
    finally:
        store.close()
