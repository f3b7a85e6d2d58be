"""Patches on the PostgreSQL store (memfs.store.delta, schema 6): a chunk row kept as a patch
is read back through its base on a host that never saw it, its full bytes are what the host
caches, and `memfs fsck` rebuilds each patch and checks it against its name, so a damaged
patch or a lost base is named. (Growth: tests/test_lifecycle_small_changes.py on both
backends; round trips: tests/test_pg_commit.py; GC: tests/test_pg_gc.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import trio
from helpers import gcstore
from helpers.mount import REPO, memfs_cmd
from helpers.pg import host_root

from memfs.store.backend import open_store
from memfs.store.trees import DIR, FILE
from memfs.workspace.workspace import Workspace


def build_log(root: Path, lines: int) -> tuple[str, bytes, list[str]]:
    """A 512 KiB log and `lines` commits each appending a line; (head, the log's bytes, its
    chunk at each commit, first to last)."""
    store = open_store(root)
    assert store.claim("main").writable
    ws = Workspace(store, commit_interval=10)
    body = bytearray(os.urandom(512 << 10))
    chunks: list[str] = []

    async def main() -> None:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        log = ws.create(work, b"log", FILE, 0o644, 0, 0)
        ws.write(log, 0, bytes(body))
        for i in range(lines + 1):
            if i:
                line = b"line %d %s\n" % (i, os.urandom(20).hex().encode())
                ws.write(log, log.size(), line)
                body.extend(line)
            head = await ws.commit()
            (chunk,) = store.file_chunks(gcstore.entry_ref(store, head, "work/log")).values()
            chunks.append(chunk)

    try:
        trio.run(main)
        return store.head(), bytes(body), chunks
    finally:
        store.release("main")
        store.close()


def fsck(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(memfs_cmd(root, "fsck"), capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_a_patched_log_reads_on_another_host_and_fsck_names_a_bad_patch_or_a_lost_base(
        tmp_path: Path, pg_url: str) -> None:
    head, body, chunks = build_log(host_root(tmp_path, "writer", pg_url), 3)
    base, *patches = chunks
    with psycopg.connect(pg_url, autocommit=True) as conn:
        over = dict(conn.execute("SELECT id, over FROM chunks WHERE over IS NOT NULL"))
        assert over == {p: " ".join(chunks[:i + 1]) for i, p in enumerate(patches)}, over
    reader_root = host_root(tmp_path, "reader", pg_url)
    reader = open_store(reader_root, create=False)
    try:
        assert gcstore.files_at(reader, head) == {"work/log": body}
        reader.cache.flush()
        assert reader.cache.get(chunks[-1]) == body, "the cache keeps the chunk's full bytes"
    finally:
        reader.close()
    res = fsck(reader_root)
    assert res.returncode == 0, res.stdout + res.stderr

    with psycopg.connect(pg_url, autocommit=True) as conn:  # one byte of the middle patch
        conn.execute("UPDATE chunks SET data = set_byte(data, octet_length(data) - 1, "
                     "(get_byte(data, octet_length(data) - 1) + 1) %% 256) WHERE id = %s",
                     (patches[1],))
    res = fsck(host_root(tmp_path, "after-damage", pg_url))
    assert res.returncode != 0, res.stdout
    for damaged in patches[1:]:  # it, and the patch read through it
        assert f"chunk {damaged} in the database does not match its digest" in res.stdout, \
            res.stdout
    assert f"chunk {patches[0]}" not in res.stdout, res.stdout

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM chunks WHERE id = %s", (base,))
    res = fsck(host_root(tmp_path, "after-loss", pg_url))
    assert res.returncode != 0, res.stdout
    assert f"stored as a patch over chunks the store lacks ({base})" in res.stdout, res.stdout


def test_fsck_fetches_a_base_once_for_all_the_patches_read_through_it(
        tmp_path: Path, pg_url: str) -> None:
    """fsck rebuilds each of a log's 8 patches from the database; the 512 KiB base they are
    read through is fetched once (one statement per chunk fetched it again each time: 8 patches
    over one base pulled ~4.5 MiB)."""
    build_log(host_root(tmp_path, "writer", pg_url), 8)
    store = open_store(host_root(tmp_path, "checker", pg_url), create=False)
    fetched = [0]
    query = store._reader.query

    def counting(sql: str, args: tuple | list = ()) -> list[tuple]:
        rows = query(sql, args)
        fetched[0] += sum(len(v) for r in rows for v in r if isinstance(v, bytes | memoryview))
        return rows

    store._reader.query = counting  # type: ignore[method-assign]
    try:
        assert store.fsck() == []
    finally:
        store.close()
    assert fetched[0] < 2 * (512 << 10), f"fsck fetched {fetched[0] >> 10} KiB of chunk rows"
