"""History over a gap GC left (issue 13 with issue 14): a dropped commit keeps who made it
(its commit_ops stay with its tombstone), so `memfs log` shows the gap and what it held, and
`memfs undo` takes an operation back over its own dropped commits but refuses one whose gap
holds another operation's changes; marks, show and views of a dropped commit are refused by
name, and what is kept still reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gcstore import keep_nothing_by_age
from helpers.space import fsync_path


def _run_own_group(cwd: Path, code: str) -> None:
    """A program in its own process group (one operation, as a command typed in a shell)."""
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, start_new_session=True)


def _head(m) -> str:
    return m.cli_json("log", "-n", "1")[0]["id"]


@pytest.mark.mount
def test_log_and_undo_over_a_gap_gc_left(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    _run_own_group(w, "open('f', 'w').write('one\\n')")
    mounted.cli("checkpoint", "create", "start")
    start = _head(mounted)
    _run_own_group(w, "open('f', 'w').write('two\\n')")
    mounted.cli("mark", "after-two")
    _run_own_group(w, "open('f', 'w').write('three\\n')")
    _run_own_group(w, "open('g', 'w').write('four\\n')")
    head = _head(mounted)
    keep_nothing_by_age(mounted)
    res = mounted.cli_json("gc")
    assert res["commits_dropped"] >= 2 and not res["problems"], res

    # log walks over the gap and says what it held.
    log = mounted.cli_json("log")
    assert [c["id"] for c in log[:2]] == [head, start], [c["id"] for c in log]
    gap = log[0]["dropped_below"]
    assert gap["count"] >= 2 and gap["below"] == start, gap
    assert any("three" in op for op in gap["operations"]), gap
    text = mounted.cli("log").stdout
    assert "dropped by the retention policy" in text and "three" in text, text
    stat_text = mounted.cli("log", "--stat", "-n", "1").stdout  # the gap's changes with it
    assert "work/g" in stat_text and "work/f" in stat_text, stat_text

    # The last operation's commit before was dropped and held another operation: refused.
    refused = mounted.cli("undo", check=False)
    assert refused.returncode == 1 and "dropped by the retention policy" in refused.stderr, \
        refused.stderr
    assert (w / "g").read_text() == "four\n" and _head(mounted) == head, "a refused undo moved"
    # So is undo by commits into the gap (it said 'goes past the first commit — use a
    # smaller N', as if there were no history there).
    refused = mounted.cli("undo", "--commits", "1", check=False)
    assert refused.returncode == 1 and "dropped by the retention policy" in refused.stderr, \
        refused.stderr
    assert _head(mounted) == head
    # A mark on a dropped commit is refused by name, and so is the dropped commit itself.
    refused = mounted.cli("undo", "--to", "after-two", check=False)
    assert refused.returncode == 1 and "dropped by the retention policy" in refused.stderr, \
        refused.stderr
    dropped_id = gap["commits"][0]
    shown = mounted.cli("show", dropped_id, check=False)
    assert shown.returncode == 1 and "dropped by the retention policy" in shown.stderr
    assert not (mounted.mnt / ".memfs" / "history" / dropped_id).exists()
    # What is kept still reads: the checkpoint's view, a diff across the gap.
    assert (mounted.mnt / ".memfs" / "checkpoints" / "start" / "work" / "f").read_text() == "one\n"
    diff = mounted.cli("diff", "start", head).stdout
    assert "-one" in diff and "+three" in diff and "+four" in diff, diff
    # Undo to the kept commit below the gap works, and restore goes back.
    mounted.cli("undo", "--to", "start")
    assert (w / "f").read_text() == "one\n" and not (w / "g").exists()
    mounted.cli("restore", head)
    assert (w / "g").read_text() == "four\n"
    assert mounted.cli_json("fsck")["ok"]


@pytest.mark.mount
def test_undo_takes_an_operation_back_over_its_own_dropped_commits(mounted) -> None:
    """One program makes several commits; GC drops all but its last. Its tombstones still
    say they were its changes, so `memfs undo` goes back to the kept commit before it."""
    mounted.require_real()
    w = mounted.work
    (w / "p").write_text("before\n")
    fsync_path(w)
    mounted.cli("checkpoint", "create", "before")
    before = _head(mounted)
    _run_own_group(w, "import os, time\n"
                      "for i in range(4):\n"
                      "    with open('p', 'w') as f:\n"
                      "        f.write(f'step {i}\\n'); f.flush(); os.fsync(f.fileno())\n"
                      "    time.sleep(0.3)\n")
    head = _head(mounted)
    keep_nothing_by_age(mounted)
    res = mounted.cli_json("gc")
    assert res["commits_dropped"] >= 3, res
    log = mounted.cli_json("log")
    assert [c["id"] for c in log[:2]] == [head, before], [c["id"] for c in log]
    assert log[0]["dropped_below"]["count"] >= 3

    done = mounted.cli_json("undo")
    assert done["head"] == before, done
    assert done["commits"] >= 4, done  # the kept commit and the dropped ones under it
    assert (w / "p").read_text() == "before\n"
    mounted.cli("restore", head)
    assert (w / "p").read_text() == "step 3\n"


def test_tombstones_keep_who_made_them_for_the_reflog_window(tmp_path: Path) -> None:
    """What a dropped commit keeps besides its tombstone (its operations, its marks) goes
    once the reflog window has passed, so tombstones stay small; the tombstone stays."""
    import time

    import trio

    from memfs.store import Store, history
    from memfs.store.gc import Collector
    from memfs.store.history import History
    from memfs.store.retention import DAY, Policy
    from memfs.store.store import CommitDropped
    from memfs.store.trees import DIR, FILE
    from memfs.workspace.workspace import Workspace

    ws = Workspace(Store.open(tmp_path / "root"), commit_interval=0.05)
    store = ws.store
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    ids = []
    for name in (b"a", b"b", b"c"):
        ws.write(ws.create(work, name, FILE, 0o644, 0, 0), 0, name)
        ids.append(trio.run(ws.commit))
    first, middle, head = ids
    with store.transaction() as tx:  # made in-process, so no request named who made it
        history.put_ops(tx, middle, [history.made_by_memfs("write b")])
    history.add_mark(store, "after-b", middle, "main", "after-b")
    store.checkpoint("start", first)
    store.set_policy(Policy(keep_all=0, hourly=0, daily=0))  # the reflog: 30 days

    Collector(store).run()
    gap = History(store, head).gap_below(head)
    assert gap is not None and gap.commits == (middle,) and gap.below == first
    assert gap.labels == ["write b"] and gap.unrecorded == 0
    assert history.mark_commit(store, "after-b") == middle

    Collector(store, now_ns=time.time_ns() + int(31 * DAY * 1e9)).run()
    gap = History(store, head).gap_below(head)
    assert gap is not None and gap.commits == (middle,) and gap.ops == ()
    assert gap.unrecorded == 1
    assert history.mark_commit(store, "after-b") is None
    try:
        store.commit(middle)
        raise AssertionError("a dropped commit was read")
    except CommitDropped:
        pass  # the tombstone still says what happened to it
    store.close()
