"""Retention and GC on a store in PostgreSQL (memfs.store.pg.gc), with the real server the
suite starts: GC reclaims dropped history and keeps every kept file byte for byte; `memfs
gc` SIGKILLed at every step, or the server killed and restarted in the middle, leaves a store
that opens, passes fsck and keeps what the policy keeps; the windows' boundaries are the
embedded store's; and a GC racing another host's writer loop (which keeps writing again
the very bytes GC is collecting) never leaves a commit naming a missing row."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio
from helpers import gcstore
from helpers.mount import REPO, memfs_cmd
from helpers.pg import PgCluster, host_root

from memfs.store.backend import open_store
from memfs.store.gc import CRASH_ENV
from memfs.store.pg.gc import PG_CRASH_POINTS, STOP_ENV, PgCollector
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
    import json

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
@pytest.mark.parametrize("point", PG_CRASH_POINTS)
def test_sigkill_of_gc_at_every_step(built, point: str) -> None:
    root, expected = built
    chunks = rows(root, "chunks")
    res = gc(root, env={CRASH_ENV: point})
    assert res.returncode == -signal.SIGKILL, f"never reached {point}: {res.stdout}{res.stderr}"
    assert gcstore.check(root, expected) == []
    res = gc(root)  # the next run finishes what the killed one began
    assert res.returncode == 0, res.stderr
    assert gcstore.check(root, expected) == []
    assert rows(root, "chunks") <= chunks - 4, "the dead chunks were not deleted"
    assert gc(root).returncode == 0 and gcstore.check(root, expected) == []


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
    assert proc.returncode != 0 or point == "swept-batch" or '"chunks_freed"' in out, err
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
