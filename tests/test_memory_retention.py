"""Memory generations follow the store's retention policy (memfs.memory.retention), on both
backends: the current one and what a live receipt names are kept whatever their age; what
any other receipt names is kept for `keep-receipts`; the rest is thinned like commits. A
read of a dropped revision is refused by name; a prune killed at any step loses nothing
kept and leaves memory that passes fsck."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.memory import run_python

from memfs.consolidate.lock import review_lock
from memfs.consolidate.memory_retention import collect_memory, memory_fsck
from memfs.consolidate.receipts import (
    COMMITTED,
    COMMITTING,
    Receipt,
    ScopeRevisions,
    SourceSnapshot,
    write_receipt,
)
from memfs.memory.prune import PRUNE_CRASH_POINTS
from memfs.memory.retention import NoSuchRevision, RevisionDropped, iso_ns, now_iso
from memfs.memory.shared import open_memory_store
from memfs.rootdir import memory_dir
from memfs.store.retention import DAY, HOUR, Policy

WS = "work"
WINDOW = Policy().receipts  # 30 days, the default
LATER = time.time_ns() + int(60 * DAY * 1e9)  # every generation made now is past the windows


def make_root(tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> Path:
    if backend == "files":
        r = tmp_path / "root"
        r.mkdir()
        return r
    from helpers.pg import host_root

    return host_root(tmp_path, "a", request.getfixturevalue("pg_url"))


@pytest.fixture(params=["files", "postgresql"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_root(tmp_path, request, request.param)


def receipt(review_id: str, state: str, before: str, after: str, age: float,
            glob: tuple[str, str] | None = None, now_ns: int = LATER) -> Receipt:
    """A receipt last written `age` seconds before `now_ns`."""
    at = now_iso(now_ns - int(age * 1e9))
    scopes = {"workspace": ScopeRevisions(before, after)}
    if glob:
        scopes["global"] = ScopeRevisions(*glob)
    return Receipt(review_id=review_id, state=state, workspace=WS,
                   source=SourceSnapshot("s1", 2, "ab" * 32), scopes=scopes,
                   proposal_hash="cc" * 32, changes=(), worker_attempt="a1",
                   consolidator_version="v1", created_at=at, updated_at=at)


def versions(root: Path, n: int) -> list[str]:
    store = open_memory_store(root)
    return [store.put_record(WS, "notes", f"# Notes\nversion {i}\n") for i in range(1, n + 1)]


def kept_seqs(root: Path) -> list[int]:
    return [g.seq for g in open_memory_store(root).history(WS)]


def test_receipts_at_the_window_boundary_and_a_live_one_older_than_it(root: Path) -> None:
    revs = versions(root, 6)  # generations 1..6
    write_receipt(root, receipt("r-inside", COMMITTED, revs[0], revs[1], WINDOW - HOUR))
    write_receipt(root, receipt("r-outside", COMMITTED, revs[2], revs[3], WINDOW + HOUR))
    write_receipt(root, receipt("r-live", COMMITTING, revs[4], revs[4], 3 * WINDOW))
    dry = collect_memory(root, Policy(), dry_run=True, now_ns=LATER)
    assert (dry.generations, dry.dropped) == (6, 2) and kept_seqs(root) == [6, 5, 4, 3, 2, 1]
    done = collect_memory(root, Policy(), now_ns=LATER)
    assert done.dropped == 2 and not done.problems
    # Inside the window: both of r-inside's; r-live's whatever its age; the current one.
    assert kept_seqs(root) == [6, 5, 2, 1]
    store = open_memory_store(root)
    assert store.generation_at(WS, revs[1][:12]).records == {"notes": "# Notes\nversion 2\n"}
    assert store.generation_at(WS, revs[4]).seq == 5
    for gone in (revs[2], revs[3]):  # r-outside's revisions went, and are refused by name
        with pytest.raises(RevisionDropped) as err:
            store.generation_at(WS, gone)
        assert "dropped by the retention policy" in err.value.message
        assert "keep-receipts" in err.value.remedy
    with pytest.raises(NoSuchRevision):
        store.generation_at(WS, "0123456789abcdef")
    assert memory_fsck(root) == []
    # The next run finds nothing more to drop: what it keeps it keeps.
    assert collect_memory(root, Policy(), now_ns=LATER).dropped == 0


def test_a_receipt_keeps_its_revision_past_the_old_32_generation_rule(root: Path) -> None:
    """Before, a commit pruned all but the last 32 generations: the revision a receipt
    named 40 commits ago was gone. Now only gc prunes, and the receipt keeps it."""
    revs = versions(root, 40)
    write_receipt(root, receipt("r-old", COMMITTED, revs[0], revs[0], DAY))
    assert kept_seqs(root)[-1] == 1
    collect_memory(root, Policy(), now_ns=LATER)
    assert kept_seqs(root) == [40, 1]
    assert open_memory_store(root).generation_at(WS, revs[0]).records == {
        "notes": "# Notes\nversion 1\n"}


def test_global_revisions_a_receipt_names_are_kept_too(root: Path) -> None:
    store = open_memory_store(root)
    g = [store.replace_global(f"# Prefs\nv{i}\n") for i in range(1, 5)]
    w = versions(root, 1)
    write_receipt(root, receipt("r-g", COMMITTED, w[0], w[0], HOUR, glob=(g[0], g[1])))
    collect_memory(root, Policy(), now_ns=LATER)
    assert [x.seq for x in store.history(None)] == [4, 2, 1]
    with pytest.raises(RevisionDropped):
        store.generation_at(None, g[2])


def test_young_generations_follow_the_windows(root: Path) -> None:
    """Without receipts, generations are thinned like commits: all kept inside keep-all,
    then the newest of each hour."""
    versions(root, 5)
    collect_memory(root, Policy(), now_ns=time.time_ns())
    assert kept_seqs(root) == [5, 4, 3, 2, 1]
    newest: dict[int, int] = {}  # hour -> its newest generation (one hour, unless they
    for g in open_memory_store(root).history(WS):  # straddle its end)
        hour = iso_ns(g.created) // int(HOUR * 1e9)
        newest[hour] = max(newest.get(hour, 0), g.seq)
    collect_memory(root, Policy(), now_ns=time.time_ns() + int(2 * DAY * 1e9))
    assert kept_seqs(root) == sorted(newest.values(), reverse=True) and 5 in newest.values()


def test_a_damaged_receipt_stops_the_prune(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    versions(root, 3)
    (root / "receipts").mkdir()
    (root / "receipts" / "broken.md").write_text("not a receipt\n")
    report = collect_memory(root, Policy(), now_ns=LATER)
    assert report.dropped == 0 and kept_seqs(root) == [3, 2, 1]
    assert "do not read" in report.problems[0]


CRASHES = [("files", p) for p in PRUNE_CRASH_POINTS] + [("postgresql", "prune-in-transaction")]


@pytest.mark.parametrize(("backend", "point"), CRASHES)
def test_a_prune_killed_at_any_step_loses_nothing_kept(tmp_path: Path,
                                                      request: pytest.FixtureRequest,
                                                      backend: str, point: str) -> None:
    root = make_root(tmp_path, request, backend)
    revs = versions(root, 5)
    write_receipt(root, receipt("r-in", COMMITTED, revs[1], revs[1], HOUR))
    store = open_memory_store(root)
    before = {g.seq: store.generation_at(WS, g.revision).records for g in store.history(WS)}
    out = run_python(f"""
        from pathlib import Path
        from memfs.consolidate.memory_retention import collect_memory
        from memfs.store.retention import Policy
        collect_memory(Path({str(root)!r}), Policy(), now_ns={LATER})
    """, env={"MEMFS_CRASH_AT": point})
    assert out.returncode == -signal.SIGKILL, out.stderr
    store = open_memory_store(root)
    assert memory_fsck(root) == []
    kept = {g.seq: g for g in store.history(WS)}
    assert {5, 2} <= set(kept) <= {1, 2, 3, 4, 5}
    for seq, g in kept.items():  # whatever is still listed reads whole
        assert store.generation_at(WS, g.revision).records == before[seq]
    assert store.read_record(WS, "notes") == "# Notes\nversion 5\n"
    assert collect_memory(root, Policy(), now_ns=LATER).problems == []
    assert kept_seqs(root) == [5, 2] and memory_fsck(root) == []
    assert not list(memory_dir(root).rglob(".rm-*")), "the rerun removes what was hidden"
    with pytest.raises(RevisionDropped):
        store.generation_at(WS, revs[0])


@pytest.mark.mount
def test_gc_through_the_daemon_prunes_memory_and_refuses_a_dropped_revision(mounted) -> None:
    """As a user meets it: records written through the mount, a review's receipt, the
    windows set to 0, `memfs gc` (the daemon's run), then `memfs memory show --revision`."""
    mounted.require_real()
    ws = mounted.mnt / ".memfs" / "memory" / "workspaces" / WS
    for i in range(1, 5):
        subprocess.run(["sh", "-c", f"printf '# Notes\\nversion {i}\\n' > '{ws}/notes.md'"],
                       check=True)
    store = open_memory_store(mounted.root)
    revs = [g.revision for g in reversed(store.history(WS))]
    assert len(revs) == 4, revs
    write_receipt(mounted.root, receipt("r-review", COMMITTED, revs[1], revs[2], 60,
                                        now_ns=time.time_ns()))
    for key in ("keep-all", "keep-hourly", "keep-daily"):
        mounted.cli("config", key, "0")
    assert mounted.cli_json("gc", "--dry-run")["memory"]["dropped"] == 1
    assert kept_seqs(mounted.root) == [4, 3, 2, 1], "the dry run changed memory"
    out = mounted.cli("gc").stdout
    assert "1 memory generation(s)" in out, out
    assert kept_seqs(mounted.root) == [4, 3, 2]
    refused = mounted.cli("memory", "show", "--workspace", WS, "--revision", revs[0][:12],
                          check=False)
    assert refused.returncode != 0, refused.stdout
    assert "dropped by the retention policy" in refused.stderr, refused.stderr
    assert "keep-receipts" in refused.stderr, refused.stderr
    shown = mounted.cli("memory", "show", "--workspace", WS, "--revision", revs[1][:12]).stdout
    assert "version 2" in shown, shown
    assert (ws / "notes.md").read_text() == "# Notes\nversion 4\n"
    assert "consistent" in mounted.cli("fsck").stdout


def test_du_and_a_dry_run_do_not_wait_out_a_review_that_holds_the_lock(mounted) -> None:
    """`memfs du` and `memfs gc --dry-run` while a review holds the review lock answer within
    seconds; the dry run says memory was not counted and why. Both waited out the lock's
    120 s (the CLI gave up first)."""
    mounted.require_real()
    with review_lock(mounted.root):
        for argv in (("du", "--json"), ("gc", "--dry-run", "--json")):
            t0 = time.monotonic()
            res = mounted.cli(*argv, check=False, timeout=150)
            took = time.monotonic() - t0
            assert res.returncode == 0, (argv, res.stderr)
            assert took < 30, f"{argv} waited {took:.0f} s for the review lock"
        problems = json.loads(res.stdout)["memory"]["problems"]
        assert any("another review holds" in p for p in problems), problems
