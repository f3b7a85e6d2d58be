"""A pass's journal writes are a handful whatever the number of files it adopts.

Each journal write is a transaction synced to disk, and patches the journal's remembered
snapshots (copies of maps with one entry a file of the mount). A pass that wrote each
adoption's intent and its completion as a transaction of its own made two synced
transactions and two map copies a file: 20,000 files edited on disk under a 100k-file bound
mount took over twelve minutes to take in, the daemon copying 100k-entry maps 40,000 times.
Intents are now begun for a batch and completed for a pass in one transaction each.

Driven on a real store and a real backing directory inside trio, with no FUSE (as
tests/helpers/backing.py); the journal's statements are counted with SQLite's own trace
hook on its connection.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
import xxhash
from helpers.backing import attached, close, open_backing
from helpers.space import MiB, fill

from memfs.backing import Binding

FILES = 300
HOLD_S = 5  # how long the store's writer holds SQLite's write lock; the pass needs none


@pytest.mark.trio
async def test_adopting_many_edits_takes_a_few_journal_transactions(tmp_path: Path):
    ws, b, disk = await attached(tmp_path, {f"f{i:03d}.txt": f"v1 {i}\n"
                                            for i in range(FILES)})
    try:
        await ws.commit()
        await b.run_pass("work")  # P recorded for every file
        for i in range(FILES):
            (disk / f"f{i:03d}.txt").write_text(f"v2 {i}, edited on disk\n")
        commits: list[str] = []
        b.journal._conn.set_trace_callback(
            lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
        res = await b.run_pass("work")
        b.journal._conn.set_trace_callback(None)
        assert len(res.taken) == FILES
        assert len(commits) <= 10, f"{len(commits)} journal transactions for {FILES} files"
        work = ws.children(ws.root)[b"work"]
        assert ws.read(ws.children(work)[b"f007.txt"], 0, 100) == b"v2 7, edited on disk\n"
        assert not b.journal.pending_intents("work")
        ev = b.journal.evidence("work", "f007.txt")
        assert ev is not None and ev.digest is not None
    finally:
        close(ws, b)


CHILD = textwrap.dedent("""
    import pathlib, sys, trio
    from memfs.store import Store
    from memfs.backing import Backing
    from memfs.workspace.workspace import Workspace
    ws = Workspace(Store.open(pathlib.Path(sys.argv[1])), 0.0)
    b = Backing(ws)
    trio.run(b.run_pass, "work")
""")


@pytest.mark.parametrize("point", ["backing:after-adopt-intent", "backing:after-commit"])
@pytest.mark.trio
async def test_a_kill_around_a_batch_of_adoptions_leaves_every_one_to_resolve(
        tmp_path: Path, point: str):
    """A batch's intents are begun in one transaction and the pass's completed in one: a
    SIGKILL after the batch's begin (tree unchanged) or after the tree's commit (completions
    not written) leaves every adoption of the batch pending, and the next pass resolves each
    (not done: taken again; done: completed) with no conflict, P the disk's bytes."""
    ws, b, disk = await attached(tmp_path, {f"f{i:03d}.txt": f"v1 {i}\n"
                                            for i in range(FILES)}, watch="off")
    await ws.commit()
    close(ws, b)
    for i in range(FILES):
        (disk / f"f{i:03d}.txt").write_text(f"v2 {i}, edited on disk\n")
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "root")],
                           capture_output=True, env=dict(os.environ, MEMFS_CRASH_AT=point),
                           timeout=120)
    assert child.returncode == -9, child.stderr.decode()
    ws, b = open_backing(tmp_path / "root")
    try:
        pending = b.journal.pending_intents("work")
        assert sorted(i.path for i in pending) == [f"f{i:03d}.txt" for i in range(FILES)]
        assert {i.op for i in pending} == {"adopt"}
        res = await b.run_pass("work")
        assert res.conflicts == [], res.conflicts
        assert not b.journal.pending_intents("work")
        work = ws.children(ws.root)[b"work"]
        for i in (0, 7, FILES - 1):
            name = f"f{i:03d}.txt"
            data = f"v2 {i}, edited on disk\n".encode()
            assert ws.read(ws.children(work)[name.encode()], 0, 100) == data
            ev = b.journal.evidence("work", name)
            assert ev is not None and ev.digest == xxhash.xxh3_128_hexdigest(data)
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_takes_the_full_store_refuses_are_abandoned_in_a_few_transactions(
        tmp_path: Path, small_fs: Path):
    """A take the store has no room for is skipped, and its adoption intent abandoned: one
    synced transaction a file (~2 ms each here, so 20k refused takes spent ~40 s abandoning)
    while the completions beside them were batched. The store's filesystem is filled by
    another program, leaving less than one take (but the journal's headroom) free."""
    n, big = 40, b"a line of text edited on disk\n" * ((1536 << 10) // 30)  # 1.5 MiB each
    disk = tmp_path / "disk"
    disk.mkdir()
    for i in range(n):
        (disk / f"f{i:03d}.txt").write_text(f"v1 {i}\n")
    ws, b = open_backing(small_fs / "root")
    try:
        await b.attach(Binding("work", str(disk), watch="off"))
        await ws.commit()
        for i in range(n):
            (disk / f"f{i:03d}.txt").write_bytes(big)
        filler = fill(small_fs, "other-program")
        os.truncate(filler, filler.stat().st_size - 3 * MiB)  # headroom (2 MiB) + 1 MiB
        commits: list[str] = []
        b.journal._conn.set_trace_callback(
            lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
        res = await b.run_pass("work")
        b.journal._conn.set_trace_callback(None)
        assert res.error is not None and "full" in res.error, res
        assert len(res.skipped) == n and not res.taken
        assert not b.journal.pending_intents("work")  # each abandoned
        assert len(commits) <= 10, f"{len(commits)} journal transactions for {n} refused takes"
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_a_pass_with_nothing_to_record_does_not_wait_for_the_stores_writer(
        tmp_path: Path):
    """A pass that adopted nothing and vouches for nothing new (the steady state of
    on-access, one per directory looked at) writes nothing to the journal, so it does not
    wait for SQLite's write lock, which the store's own commits hold on the same file
    (store.db) for as long as a large commit takes. Completing an empty batch still opened
    a write transaction (BEGIN IMMEDIATE): the pass waited for the lock, and failed with
    'database is locked' once the journal's busy timeout passed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    for name in ("a.txt", "b.txt"):
        (disk / name).write_text(f"{name}\n")
    time.sleep(2.1)  # past the racy window (observe.py): hashed once, then trusted
    ws, b = open_backing(tmp_path / "root")
    try:
        await b.attach(Binding("work", str(disk), watch="off"))
        await ws.commit()
        await b.run_pass("work")  # P and fingerprints recorded: nothing new from here on
        db = sqlite3.connect(tmp_path / "root" / "store.db", timeout=0, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")  # the write lock, as a store commit holds it
        try:
            start = time.monotonic()
            with trio.fail_after(HOLD_S):
                res = await b.run_pass("work")
            took = time.monotonic() - start
        finally:
            db.execute("ROLLBACK")
            db.close()
        assert not res.taken and res.error is None, res
        assert took < HOLD_S, f"the pass waited {took:.1f} s for the store's writer"
    finally:
        close(ws, b)
