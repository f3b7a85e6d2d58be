"""Lifecycle (issue 13) beside the backend interface (issue 17): retention, GC and du work on
a PostgreSQL root too, with the policy kept in the database (every host's), and a daemon there
collects and keeps no reserve file; on the embedded store, history and undo over a gap GC left
read the tombstones through the interface alone (memfs.store.pg.gc: tests/test_pg_gc.py)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.mount import REPO

from memfs.store import history
from memfs.store.backend import Records, StoreBackend, StoreTx
from memfs.store.gc import Collector
from memfs.store.history import History
from memfs.store.retention import Policy
from memfs.store.space import Space
from memfs.store.store import CommitDropped, Store
from memfs.store.undo import plan_operations
from memfs.workspace.health import explain


def memfs(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


# -- on a PostgreSQL root: the same commands, the policy kept in the database ---------------------
def test_gc_du_and_config_work_on_a_postgresql_root_and_the_policy_is_the_stores(
        tmp_path: Path, pg_url: str) -> None:
    root, other = tmp_path / "root", tmp_path / "other"
    assert memfs(root, "init", "--store", pg_url).returncode == 0
    res = memfs(root, "config", "keep-all", "2d")
    assert res.returncode == 0 and "keep-all: 1d -> 2d" in res.stdout, res.stderr
    assert memfs(other, "init", "--store", pg_url).returncode == 0
    assert memfs(other, "config", "keep-all").stdout.strip() == "2d", \
        "the policy is the store's, every host's"
    du = memfs(root, "du", "--json")
    assert du.returncode == 0 and '"live"' in du.stdout, du.stderr
    res = memfs(root, "gc")
    assert res.returncode == 0 and "deleted from the database" in res.stdout, res.stderr
    assert not (root / "store.db").exists() and not (root / "gc.lock").exists()
    st = memfs(root, "status", "--json")
    assert st.returncode == 0, st.stderr
    assert "no space floor on PostgreSQL" in st.stdout and '"gc"' in st.stdout


def test_init_with_retention_flags_and_a_postgresql_store_sets_the_policy_there(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "new"
    res = memfs(root, "init", "--store", pg_url, "--keep-all", "2d")
    assert res.returncode == 0, res.stderr
    assert memfs(root, "config", "keep-all").stdout.strip() == "2d"
    # a bad value is still the first thing said, on either backend, before anything is made
    bad = tmp_path / "bad"
    res = memfs(bad, "init", "--store", pg_url, "--keep-all", "soon")
    assert res.returncode != 0 and "'soon' is not a duration" in res.stderr
    assert not (bad / "store.json").exists()
    # the embedded store takes them as before
    emb = tmp_path / "embedded"
    assert memfs(emb, "init", "--keep-all", "2d").returncode == 0
    assert memfs(emb, "config", "keep-all").stdout.strip() == "2d"


@pytest.mark.mount
@pytest.mark.parametrize("store_backend", ["postgresql"], indirect=True)
def test_a_daemon_on_a_postgresql_root_collects_and_keeps_no_reserve_file(mounted) -> None:
    mounted.require_real()
    from memfs.control import call

    (mounted.work / "f").write_text("one\n")
    mounted.cli("sync")
    for key in ("keep-all", "keep-hourly", "keep-daily"):
        mounted.cli("config", key, "0")
    (mounted.work / "f").write_text("two\n")
    mounted.cli("sync")
    res = mounted.cli("gc")
    assert "deleted from the database" in res.stdout, res.stdout
    assert call(mounted.root, "du", dry_run=True)["backend"] == "postgresql"
    st = mounted.status()
    assert "no space floor on PostgreSQL" in st["retention"]["summary"], st["retention"]
    assert st["gc"]["last"]["trigger"] == "manual", st["gc"]
    # no backing directory bound: no reserve for host.db's journal either (test_pg_hostdb_reserve)
    assert st["space"]["reserve"] == 0 and not (mounted.root / "reserve").exists()
    text = mounted.cli("status").stdout
    assert "gc       last run" in text, text
    assert (mounted.work / "f").read_text() == "two\n"
    assert mounted.cli("fsck").returncode == 0


@pytest.mark.mount
@pytest.mark.parametrize("store_backend", ["sqlite", "postgresql"], indirect=True)
def test_status_names_whose_filesystem_its_space_line_measures(mounted,
                                                               store_backend: str) -> None:
    """On PostgreSQL the space line's figures are this host's root (caches, host.db), not
    the store's disk, which is the server's: it said "the store's filesystem" on both."""
    mounted.require_real()
    line = next(x for x in mounted.cli("status").stdout.splitlines() if x.startswith("space"))
    if store_backend == "postgresql":
        assert "this host's root filesystem (the store is the server's)" in line, line
        assert "the store's filesystem" not in line, line
        assert mounted.status()["space"]["of"] == "host"
    else:
        assert "the store's filesystem" in line, line
        assert mounted.status()["space"]["of"] == "store"


# -- the embedded store's gaps, through the interface alone ------------------------------------
def _interface_names() -> frozenset[str]:
    names: set[str] = set()
    for proto in (StoreBackend, Records):
        for klass in proto.__mro__:
            if klass.__module__ == "memfs.store.backend":
                names |= {n for n in vars(klass) if not n.startswith("_")}
                names |= set(getattr(klass, "__annotations__", {}))
    return frozenset(names)


class InterfaceOnly:
    """A store seen only through StoreBackend: reaching anything else (its SQL, `_query`) is
    an AttributeError, so a caller that passes here needs nothing of the embedded store's."""

    NAMES = _interface_names()

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str):
        if name not in self.NAMES:
            raise AttributeError(f"{name!r} is not part of the StoreBackend interface")
        return getattr(self._store, name)


def test_the_interface_lists_what_the_gap_walk_needs() -> None:
    assert {"dropped_commit", "has_commit", "commit_chain", "commit_ops",
            "commit_refs"} <= InterfaceOnly.NAMES
    assert "_query" not in InterfaceOnly.NAMES and "gap_parent" not in InterfaceOnly.NAMES
    assert {"put_ops", "add_mark"} <= {n for n in vars(StoreTx) if not n.startswith("_")}


def _store_with_a_gap(root: Path) -> tuple[Store, list[str], history.OpRecord]:
    """start (checkpointed) <- x1 <- x2 <- x3 (head), x1..x3 one operation; GC with every
    window at 0 drops x1 and x2 (and the first commit, below start) to tombstones."""
    import trio

    from memfs.store.trees import DIR, FILE
    from memfs.workspace.workspace import Workspace

    ws = Workspace(Store.open(root), commit_interval=0.05)
    store = ws.store
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    ids = []
    for name in (b"start", b"x1", b"x2", b"x3"):
        ws.write(ws.create(work, name, FILE, 0o644, 0, 0), 0, name)
        ids.append(trio.run(ws.commit))
    install = history.made_by_memfs("npm install")
    with store.transaction() as tx:
        history.put_ops(tx, ids[0], [history.made_by_memfs("setup")])
        for cid in ids[1:]:
            history.put_ops(tx, cid, [install])
    store.checkpoint("start", ids[0])
    store.set_policy(Policy(keep_all=0, hourly=0, daily=0))
    report = Collector(store).run()
    assert report.commits_dropped == 3 and not report.problems, report  # the init commit too
    return store, ids, install


def test_history_and_undo_over_a_gap_read_tombstones_through_the_interface(
        tmp_path: Path) -> None:
    store, (start, x1, x2, head), install = _store_with_a_gap(tmp_path / "root")
    try:
        seen = InterfaceOnly(store)
        gap = History(seen, head).gap_below(head)
        assert gap is not None and gap.commits == (x2, x1) and gap.below == start, gap
        assert gap.ops == (install, install) and gap.unrecorded == 0
        assert gap.newest_ns >= gap.oldest_ns and gap.reason
        assert [c.commit.id for c in History(seen, head)][:2] == [head, start]
        gone = seen.dropped_commit(x1)
        assert gone is not None and gone.parent == start and gone.id == x1
        assert seen.dropped_commit(head) is None

        plan = plan_operations(seen, head)  # the operation goes back whole, over its gap
        assert plan.target == start and plan.commits == 3, plan
        assert plan == plan_operations(store, head)  # the same answer as with everything

        with pytest.raises(CommitDropped, match="dropped by the retention policy"):
            history.resolve(seen, x1[:10])  # a prefix of a dropped commit: refused by name
        assert history.logged(seen, head).commit.id == head
    finally:
        store.close()


def test_a_postgresql_store_has_no_tombstones_and_walks_no_gap(tmp_path: Path,
                                                                pg_url: str) -> None:
    from memfs.store.backend import Location, open_store, record_location

    root = tmp_path / "pg"
    root.mkdir()
    record_location(root, Location("postgresql", pg_url, "host-a"))
    store = open_store(root)
    try:
        head = store.head()
        assert store.dropped_commit(head) is None and store.dropped_commit("0" * 40) is None
        hist = History(InterfaceOnly(store), head)
        assert hist.gap_below(head) is None and hist.get(0).commit.id == head
        refs = store.commit_refs(store.commit(head))  # fsck's graph, as on the embedded store
        assert refs.tree == store.commit(head).tree and refs.inodes is None
        assert store.fsck() == []
    finally:
        store.close()


def test_a_full_host_root_is_told_without_memfs_gc_on_a_shared_store() -> None:
    """A commit failing for space on a root whose store is in PostgreSQL: the full filesystem
    is this host's root and the remedy frees it (its caches); `memfs gc` is refused there, so
    it is never the advice. The embedded store's words are unchanged."""
    space = Space(size=32 << 20, free=1 << 20, avail=1 << 20, files=100, ffree=50, favail=50)
    exc = OSError(errno.ENOSPC, "No space left on device")
    shared = explain(exc, space, "/r", shared=True)
    assert "this host's root is full" in shared.reason and "PostgreSQL" in shared.reason
    assert "/r/cache" in shared.remedy and "memfs gc" not in shared.remedy
    # No count: the words outlive the retry that made them; status's `pending` is live.
    assert "what is pending stays in memory" in shared.remedy
    assert "`pending` in `memfs status`" in shared.remedy
    embedded = explain(exc, space, "/r")
    assert "the store's filesystem is full" in embedded.reason
    assert "memfs gc" in embedded.remedy


def test_config_on_a_postgresql_root_says_no_space_floor_applies(tmp_path: Path,
                                                                 pg_url: str) -> None:
    """`memfs status` says "no space floor on PostgreSQL"; `memfs config` said "below 5% free,
    older history goes first" and called space-floor the percent of the disk GC keeps free."""
    root = tmp_path / "root"
    assert memfs(root, "init", "--store", pg_url).returncode == 0
    shown = memfs(root, "config")
    assert shown.returncode == 0, shown.stderr
    assert "no space floor on PostgreSQL" in shown.stdout, shown.stdout
    assert "free, older history goes first" not in shown.stdout, shown.stdout
    floor = next(line for line in shown.stdout.splitlines() if line.startswith("space-floor"))
    assert "not on PostgreSQL" in floor, floor
    res = memfs(root, "config", "space-floor", "10%")
    assert res.returncode == 0 and "space-floor: 5% -> 10%" in res.stdout, res.stderr
    assert "no space floor applies on PostgreSQL" in res.stdout, res.stdout
    assert "free, older history goes first" not in res.stdout, res.stdout
    # the embedded store's words are as before
    emb = tmp_path / "embedded"
    assert memfs(emb, "init").returncode == 0
    shown = memfs(emb, "config").stdout
    assert "below 5% free, older history goes first" in shown and "PostgreSQL" not in shown
