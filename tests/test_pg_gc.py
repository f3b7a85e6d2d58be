"""Retention and GC on a store in PostgreSQL (memfs.store.pg.gc), with the real server the
suite starts: GC reclaims dropped history and keeps every kept file byte for byte; the server
killed and restarted in the middle of `memfs gc` leaves a store that opens, passes fsck and
keeps what the policy keeps (SIGKILL of `memfs gc` at every step: tests/test_gc_crash.py, on
both backends); the windows' boundaries are the
embedded store's; and a GC racing another host's writer loop (which keeps writing again
the very bytes GC is collecting) never leaves a commit naming a missing row."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest
import trio
from helpers import gcstore
from helpers.files import write_durably
from helpers.mount import REPO, memfs_cmd
from helpers.pg import PgCluster, host_root

from memfs.store.backend import open_store
from memfs.store.pg import gc as pg_gc
from memfs.store.pg.gc import STOP_ENV, PgCollector
from memfs.store.retention import DAY, Policy
from memfs.store.store import CommitDropped
from memfs.store.trees import DIR, FILE
from memfs.workspace.workspace import Workspace

MiB = 1 << 20


def gc(root: Path, *args: str, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(memfs_cmd(root, "gc", "--json", *args), capture_output=True,
                          text=True, cwd=REPO, timeout=120, env=dict(os.environ, **(env or {})))


def rows(root: Path, table: str) -> int:
    store = open_store(root, create=False)
    try:
        return store._query(f"SELECT COUNT(*) FROM {table}")[0][0]
    finally:
        store.close()


@pytest.fixture
def built(tmp_path: Path, pg_url: str) -> tuple[Path, gcstore.Expected]:
    root = host_root(tmp_path, "gc", pg_url)
    return root, gcstore.build(root, pg_url)


# -- reclaim and keep -------------------------------------------------------------------------
def test_gc_reclaims_dropped_history_and_keeps_every_kept_file(built) -> None:
    root, expected = built
    chunks = rows(root, "chunks")
    dry = gc(root, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["backend"] == "postgresql" and doc["commits_dropped"] >= 3, doc
    assert doc["reclaimable_bytes"] >= 4 * MiB, doc
    assert rows(root, "chunks") == chunks, "a dry run deleted rows"
    res = gc(root)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["chunks_freed"] >= 4 and doc["chunk_bytes_freed"] >= 4 * MiB, doc
    assert rows(root, "chunks") == chunks - doc["chunks_freed"]
    assert gcstore.check(root, expected) == []
    store = open_store(root, create=False)
    try:
        head = store.head()
        dropped = [c for c in store.commit_ids() if c not in expected.files]
        assert dropped == [], dropped  # only the checkpoint and the head are kept
        with pytest.raises(CommitDropped, match="dropped by the retention policy"):
            store.resolve(f"{head}~1")
        assert [c.id for c in store.log()] == [head, store.resolve("cp")], \
            "log walks over the gaps"
    finally:
        store.close()
    text = subprocess.run(memfs_cmd(root, "gc"), capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert text.returncode == 0 and "deleted from the database" in text.stdout, text
    st = subprocess.run(memfs_cmd(root, "status"), capture_output=True, text=True, cwd=REPO,
                        timeout=60)
    assert "no space floor on PostgreSQL" in st.stdout and "gc       last run" in st.stdout, \
        st.stdout


# -- crashes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("point", ["dropping", "sweeping", "swept-batch"])
def test_the_server_killed_and_restarted_mid_gc(built, pg_cluster: PgCluster,
                                                point: str) -> None:
    root, expected = built
    proc = subprocess.Popen(memfs_cmd(root, "gc", "--json"), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **{STOP_ENV: point}))
    try:
        deadline = time.monotonic() + 60
        while _state(proc.pid) != "T":
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"gc never reached {point}"
            time.sleep(0.05)
        pg_cluster.kill()  # inside the step's transaction, or just after its COMMIT
        pg_cluster.start()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "garbage collection stopped: the PostgreSQL store" in out \
        and "nothing is left half done" in out, (out, err)  # its session died with the server
    assert gcstore.check(root, expected) == []
    assert gc(root).returncode == 0
    assert gcstore.check(root, expected) == []


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# -- the policy's boundaries, as on the embedded store ------------------------------------------
class PgHistory:
    """A workspace on a PostgreSQL store, driven through commits."""

    def __init__(self, root: Path, url: str) -> None:
        store = open_store(root, url=url)
        assert store.claim("main").writable
        self.ws = Workspace(store, commit_interval=0.05)
        self.work = self.ws.create(self.ws.root, b"work", DIR, 0o755, 0, 0)
        self.files: dict[str, dict[str, bytes]] = {}

    @property
    def store(self):
        return self.ws.store

    def put(self, name: str, data: bytes) -> str:
        f = self.ws.children(self.work).get(name.encode()) or self.ws.create(
            self.work, name.encode(), FILE, 0o644, 0, 0)
        self.ws.truncate(f, 0)
        self.ws.write(f, 0, data)
        cid = trio.run(self.ws.commit)
        self.files[cid] = gcstore.files_at(self.store, cid)
        return cid

    def append(self, name: str, data: bytes) -> str:
        f = self.ws.children(self.work)[name.encode()]
        self.ws.write(f, f.size(), data)
        cid = trio.run(self.ws.commit)
        self.files[cid] = gcstore.files_at(self.store, cid)
        return cid

    def close(self) -> None:
        self.store.release("main")
        self.store.close()


@pytest.fixture
def hist(tmp_path: Path, pg_url: str):
    h = PgHistory(host_root(tmp_path, "h", pg_url), pg_url)
    yield h
    h.close()


def test_a_commit_just_inside_keep_all_stays_and_one_just_outside_goes(hist) -> None:
    h = hist
    h.store.set_policy(Policy(keep_all=3600, hourly=0, daily=0, reflog=0))
    old = h.put("f", os.urandom(MiB))
    young = h.put("f", os.urandom(MiB))
    h.put("f", b"head")
    t_old, t_young = h.store.commit(old).time_ns, h.store.commit(young).time_ns
    assert t_old < t_young
    # old is a nanosecond past the hour, young (made after it) still inside
    r = PgCollector(h.store, now_ns=t_old + 3600 * 10**9 + 1).run()
    assert h.store.has_commit(young) and not h.store.has_commit(old), r
    assert gcstore.files_at(h.store, young) == h.files[young]
    r = PgCollector(h.store, now_ns=t_young + 3600 * 10**9 - 1).run()
    assert h.store.has_commit(young), "a commit a nanosecond inside the window went"
    r = PgCollector(h.store, now_ns=t_young + 3600 * 10**9).run()
    assert not h.store.has_commit(young)
    with pytest.raises(CommitDropped):
        h.store.commit(young)
    assert h.store.fsck() == []


def test_a_checkpoint_and_a_branch_head_outlive_every_window(hist) -> None:
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=0))
    first = h.put("f", os.urandom(MiB))
    h.store.checkpoint("before", first)
    side = h.put("f", os.urandom(MiB))
    h.store.create_branch("side", side)
    h.put("f", os.urandom(MiB))
    head = h.put("f", b"head")
    r = PgCollector(h.store, now_ns=time.time_ns() + int(40 * DAY * 1e9)).run()
    assert r.commits_dropped >= 2 and r.chunks_freed >= 1, r
    for cid in (first, side, head):
        assert gcstore.files_at(h.store, cid) == h.files[cid]
    assert h.store.fsck() == []


def test_reflog_moves_keep_both_ends_within_their_window(hist) -> None:
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=DAY))
    before = h.put("f", os.urandom(MiB))
    h.put("f", os.urandom(MiB))
    h.store.reset_head("main", before, "restore")  # a move the reflog keeps for a day
    now = time.time_ns()
    PgCollector(h.store, now_ns=now + int(3600 * 1e9)).run()
    assert h.store.has_commit(before)
    moved_from = h.store.reflog(1)[0]["old"]
    assert h.store.has_commit(moved_from), "the reflog's other end went inside its window"
    PgCollector(h.store, now_ns=now + int(2 * DAY * 1e9)).run()
    assert not h.store.has_commit(moved_from) and h.store.has_commit(before)
    assert h.store.fsck() == []


def test_a_restore_to_a_commit_gc_dropped_is_refused_by_name(hist) -> None:
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=0))
    old = h.put("f", os.urandom(MiB))
    h.put("f", b"head")
    PgCollector(h.store, now_ns=time.time_ns() + 10**9).run()
    with pytest.raises(CommitDropped):
        h.store.reset_head("main", old, "restore")
    with pytest.raises(CommitDropped):
        h.store.checkpoint("late", old)


# -- GC on one host racing a writer on another ---------------------------------------------------
@pytest.mark.mount
def test_gc_on_one_host_racing_a_writer_on_another_loses_nothing(mount_factory, pg_url: str,
                                                                  tmp_path: Path) -> None:
    """Host a writes `f` over and over with five payloads in turn (each written again a few
    commits after GC, run by host b's daemon with every window at 0, made it garbage: a's
    cache still holds it, and a commit deduping against it must not trust that), and an
    fsynced marker per round. After it: fsck clean, read from the database itself; every
    marker and the last payload there, byte for byte."""
    env = {"MEMFS_LEASE_SECONDS": "5"}
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=env)
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=env)
    a.require_real()
    for key in ("keep-all", "keep-hourly", "keep-daily", "keep-reflog"):
        a.cli("config", key, "0")
    payloads = [os.urandom(MiB + 4096 * k) for k in range(5)]  # two chunks each
    stop = False
    runs: list[str] = []

    def collect() -> None:
        while not stop:
            res = b.cli("gc", "--json", check=False)
            runs.append(res.stdout if res.returncode == 0 else f"failed: {res.returncode} {res.stdout} {res.stderr}")

    t = threading.Thread(target=collect)
    t.start()
    try:
        deadline = time.monotonic() + 25
        i = 0
        while time.monotonic() < deadline or len(runs) < 5:
            write_durably(a.work / "f", payloads[i % 5])
            write_durably(a.work / f"done-{i}", f"round {i}\n".encode())
            i += 1
    finally:
        stop = True
        t.join(timeout=120)
    assert i >= 20 and len(runs) >= 5, (i, runs)
    failed = [r for r in runs if r.startswith("failed")]
    assert not failed, failed[:3]
    freed = sum(json.loads(r)["chunks_freed"] for r in runs)
    assert freed >= 4, "the GC runs never collected a payload: the race was not exercised"
    a.cli("sync")
    checker = host_root(tmp_path, "c", pg_url)  # a third host: no cache, the database alone
    store = open_store(checker, create=False)
    try:
        assert store.fsck() == []
        store.read_chunk = store._db_chunk
        files = gcstore.files_at(store, store.head("main"))
    finally:
        store.close()
    assert files["work/f"] == payloads[(i - 1) % 5]
    for n in range(i):
        assert files[f"work/done-{n}"] == f"round {n}\n".encode(), n


def test_a_delete_waits_for_a_commit_in_flight_that_dedups_against_its_garbage(hist) -> None:
    """A transaction puts again the bytes (chunk and objects) of a commit GC is about to drop
    and sweep, the rows still there, so nothing is sent: its INSERTs dedup. GC started then
    must not delete them before that transaction ends; once it commits, they are named."""
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=0))
    data = os.urandom(300_000)
    old = h.put("f", data)
    head = h.put("f", b"head")
    tree = h.store.commit(old).tree
    chunk_ids: list[str] = []
    done: list[object] = []
    with h.store.transaction() as tx:
        for oid in _objects_of(h.store, tree):
            assert tx.put_object(h.store.read_object(oid)) == oid
        tx.flush_objects()
        chunk_ids += tx.put_chunks([data])
        gc_thread = threading.Thread(target=lambda: done.append(PgCollector(h.store).run()))
        gc_thread.start()
        time.sleep(1.5)  # GC has had every chance to delete the rows named below
        assert _row_exists(h.store.url, chunk_ids[0]), "GC deleted a chunk a commit names"
        made = tx.add_commit(head, tree, "main", "the old tree again", [])
    gc_thread.join(timeout=60)
    assert done, "the collector never finished"
    assert h.store.fsck() == []
    h.store.forget_history()
    assert gcstore.files_at(h.store, made.id) == h.files[old]


def _objects_of(store, tree: str) -> list[str]:
    from memfs.store.trees import decode_dir

    out, stack = [], [tree]
    while stack:
        oid = stack.pop()
        out.append(oid)
        stack += [e.ref for e in decode_dir(store.read_object(oid)) if e.kind == DIR]
    return out


def _row_exists(url: str, chunk_id: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM chunks WHERE id = %s", (chunk_id,)).fetchone() \
            is not None


def test_a_commit_that_waited_for_a_sweep_reads_the_epoch_the_sweep_left(hist) -> None:
    """Found in a full run on a loaded machine (the racing test above: fsck named a missing
    manifest). A commit whose first statement waited on SWEEP_KEY for a deleting GC step read
    the GC epoch from before that step: lock and epoch were one statement, whose snapshot is
    taken before the lock is granted. It then trusted its cache for the rows the step had
    deleted and sent none of them. A step is played by hand here: it deletes a chunk this
    host caches and bumps the epoch while the commit waits; the commit must send it again."""
    import psycopg

    from memfs.store.chunks import chunk_digest
    from memfs.store.pg import schema

    h = hist
    data = os.urandom(300_000)
    h.put("f", data)
    cid = chunk_digest(data)
    deadline = time.monotonic() + 30
    while h.store.cache.get(cid) != data:  # the cache is written by its own thread
        assert time.monotonic() < deadline, "the chunk never reached this host's cache"
        time.sleep(0.02)
    sent: list[str] = []
    with psycopg.connect(h.store.url) as sweep:
        sweep.execute("SELECT pg_advisory_xact_lock(%s)", (schema.SWEEP_KEY,))
        sweep.execute("DELETE FROM chunks WHERE id = %s", (cid,))
        sweep.execute("UPDATE memfs_meta SET value = (value::bigint + 1)::text WHERE key = %s",
                      (schema.EPOCH_KEY,))

        def commit() -> None:
            with h.store.transaction() as tx:
                sent.extend(tx.put_chunks([data]))

        writer = threading.Thread(target=commit)
        writer.start()
        while not sweep.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                                "granted").fetchone():  # its BEGIN waits for the step
            assert writer.is_alive() and time.monotonic() < deadline, "the commit did not wait"
            time.sleep(0.02)
        sweep.commit()
    writer.join(timeout=60)
    assert sent == [cid]
    assert _row_exists(h.store.url, cid), "a commit trusted a cache the sweep had emptied"


# -- patches (memfs.store.delta): what a live patch is read through stays -----------------------
def test_gc_keeps_the_base_and_patches_a_live_patch_is_read_through(hist, tmp_path: Path,
                                                                    pg_url: str) -> None:
    """A log appended at every commit: its head chunk is a patch read through a base and two
    patches that only dropped commits name. GC drops those commits and must keep all three
    rows (it follows `over`); without that, the head's log no longer reads."""
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=0))
    first = h.put("log", os.urandom(512 << 10))
    h.put("junk", os.urandom(MiB))
    between = [h.append("log", f"line {i} {os.urandom(20).hex()}\n".encode()) for i in range(2)]
    h.put("junk", b"small now")  # the 1 MiB of junk is named only by dropped commits
    head = h.append("log", b"the last line\n")
    over = dict(h.store._query("SELECT id, over FROM chunks WHERE over IS NOT NULL"))
    (log_chunk,) = h.store.file_chunks(gcstore.entry_ref(h.store, head, "work/log")).values()
    base, *patches = over[log_chunk].split()
    assert (base, *patches) == (
        *h.store.file_chunks(gcstore.entry_ref(h.store, first, "work/log")).values(),
        *(c for cid in between
          for c in h.store.file_chunks(gcstore.entry_ref(h.store, cid, "work/log")).values())
    ), "the head's log chunk is not a patch through the first version and each between"
    r = PgCollector(h.store).run()
    assert r.commits_dropped >= 4 and not h.store.has_commit(first), r
    assert r.chunks_freed >= 1 and r.chunk_bytes_freed >= MiB, r  # the junk went
    left = {row[0] for row in h.store._query("SELECT id FROM chunks")}
    assert {log_chunk, base, *patches} <= left, "GC deleted what a live patch reads through"
    reader = open_store(host_root(tmp_path, "reader", pg_url))  # no cache: the database alone
    try:
        assert gcstore.files_at(reader, head) == h.files[head]
        assert reader.fsck() == []
    finally:
        reader.close()


def orphan_patches(url: str) -> list[str]:
    """Patch rows that name a row the database no longer has."""
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT c.id FROM chunks c, unnest(string_to_array(c.over, ' ')) AS dep "
            "WHERE NOT EXISTS (SELECT 1 FROM chunks p WHERE p.id = dep)")]


def test_gc_deletes_a_dead_patch_no_later_than_what_it_is_read_through(
        hist, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deleted log's base and patches, swept one row per transaction: between any two, no
    row is left reading through one already gone (a commit in between may name it again,
    by dedup, and would then name bytes that cannot be read)."""
    h = hist
    h.store.set_policy(Policy(keep_all=0, hourly=0, daily=0, reflog=0))
    h.put("log", os.urandom(512 << 10))
    for i in range(3):
        h.append("log", f"line {i} {os.urandom(20).hex()}\n".encode())
    h.ws.unlink(h.work, b"log")
    trio.run(h.ws.commit)
    h.put("f", b"head")
    assert len(h.store._query("SELECT id FROM chunks WHERE over IS NOT NULL")) == 3
    monkeypatch.setattr(pg_gc, "BATCH", 1)
    seen: list[list[str]] = []
    catch_up = PgCollector._catch_up

    def checked(self: PgCollector, conn: psycopg.Connection) -> None:
        seen.append(orphan_patches(pg_url))  # what the last batch's COMMIT left
        catch_up(self, conn)

    monkeypatch.setattr(PgCollector, "_catch_up", checked)
    r = PgCollector(h.store).run()
    assert r.chunks_freed >= 4, r
    assert len(seen) >= 4 and all(s == [] for s in seen), seen
    assert orphan_patches(pg_url) == [] and h.store.fsck() == []
