"""The kill matrix through a real daemon (issue 4): SIGKILL after the intent and after the effect.

Each cell starts a real daemon with MEMFS_CRASH_AT=<point> in its environment, binds `work` to
a backing directory holding f.txt, makes a branch `side` there, then drives one write-ahead step
with the real CLI or a real shell edit until the daemon kills itself at the point. While it is
down the test reads the journal (the intent is pending: the kill landed where the cell says) and,
in the `neither` variant, rewrites the disk file to bytes matching neither outcome. Then it
restarts the daemon, selects `side` and `main` again (each switch runs a pass on that branch),
and checks: nothing lost (the draft still in the store, disk's edit still on disk or adopted),
no draft overwritten, no deletion resurrected, disk matching neither outcome an interrupted
conflict; and that the retry (or, for a conflict, the remedy it names) completes.

For the shell-edit ingest the intent is an adoption, whose outcome is on the tree side (the old
or the new store content), which a test cannot change while the daemon is down. Its `neither`
variant edits disk again instead: that is a newer edit by disk alone, so it must be adopted,
never read as a conflict and never lost.

Kills prove ordering only; that each step is durable when the next begins rests on fsync and
SQLite's synchronous=FULL, which a SIGKILL does not test.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.backing_mount import sh, states
from helpers.killmatrix import (
    NEW,
    OLD,
    OTHER,
    SHELL,
    evidence,
    first_pass_done,
    h,
    killed,
    pending,
    read,
    start_crashing,
    state_of,
    switch,
)
from helpers.wait import wait_for

from memfs.store.journal import EvidenceRecord


@dataclass(frozen=True)
class Op:
    """One write-ahead step: how to arrange and trigger it, and what each outcome looks like.

    `path` is the backed file; `intent` the op of the pending write-ahead intent; `before` and
    `after` the disk bytes before and after the effect; `draft` what the main branch holds
    (None: deleted); `on_side` what `side` shows there after the restart.
    """

    path: str
    intent: str
    before: bytes | None
    after: bytes | None
    draft: bytes | None
    on_side: bytes | None
    arrange: Callable
    trigger: Callable
    retry: tuple[str, ...]
    attach: tuple[str, ...] = ()

    @property
    def auto(self) -> bool:
        return "--auto-materialize" in self.attach


def _write_draft(m, disk: Path) -> None:
    (m.work / "f.txt").write_bytes(NEW)


def _rm_through_mount(m, disk: Path) -> None:
    sh(f"rm {m.work}/f.txt")


def _shell_edit(m, disk: Path) -> None:
    sh(f"printf 'shell edit\\n' > {disk}/f.txt")


def _nothing(m, disk: Path) -> None:
    pass


def _cli(*args: str) -> Callable:
    def trigger(m, disk: Path) -> None:
        m.cli(*args, check=False, timeout=60)  # the daemon dies mid-request: no clean answer
    return trigger


def _new_file_through_mount(m, disk: Path) -> None:
    """A file made in the mount; the group commit after it auto-materializes it."""
    try:
        (m.work / "n").mkdir()
        with open(m.work / "n" / "new.txt", "wb") as f:
            f.write(NEW)
            f.flush()
            os.fsync(f.fileno())  # forces the group commit
    except OSError:
        pass  # the daemon may die while answering


OPS = {
    "write": Op("f.txt", "write", OLD, NEW, NEW, OLD, _write_draft, _cli("materialize"),
                ("materialize",)),
    "unlink": Op("f.txt", "unlink", OLD, None, None, OLD, _rm_through_mount,
                 _cli("materialize", "--apply-deletions"), ("materialize", "--apply-deletions")),
    "ingest": Op("f.txt", "adopt", SHELL, SHELL, SHELL, OLD, _shell_edit, _cli("sync"),
                 ("sync",)),
    "auto-new": Op("n/new.txt", "write", None, NEW, NEW, None, _nothing,
                   _new_file_through_mount, ("materialize",), ("--auto-materialize",)),
}

CELLS = [
    pytest.param("write", "apply:after-intent"),
    pytest.param("write", "apply:after-effect"),
    pytest.param("unlink", "apply:after-intent"),
    pytest.param("unlink", "apply:after-effect"),
    pytest.param("ingest", "backing:after-adopt-intent"),
    pytest.param("ingest", "backing:after-commit"),
    pytest.param("auto-new", "apply:after-intent"),  # skipped while `attach` lacks the option
    pytest.param("auto-new", "apply:after-effect"),
]


@functools.cache
@pytest.mark.parametrize("variant", ["plain", "neither"])
@pytest.mark.parametrize("op_name,point", CELLS)
def test_kill_matrix(mount_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                     op_name: str, point: str, variant: str):
    op = OPS[op_name]
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "f.txt").write_bytes(OLD)
    m = start_crashing(mount_factory, monkeypatch, point)
    m.cli("attach", "work", str(disk), "--watch", "off", *op.attach)
    assert read(m.work / "f.txt") == OLD and evidence(m, "f.txt") == EvidenceRecord(h(OLD))
    m.cli("branch", "create", "side")
    op.arrange(m, disk)
    op.trigger(m, disk)
    killed(m)

    # Down: the intent is pending, and disk shows the effect only after it.
    intents = pending(m)
    assert [(i.path, i.op) for i in intents] == [(op.path, op.intent)]
    done = point in ("apply:after-effect", "backing:after-commit") or op.intent == "adopt"
    assert read(disk / op.path) == (op.after if done else op.before)
    if variant == "neither":
        (disk / op.path).parent.mkdir(exist_ok=True)
        (disk / op.path).write_bytes(OTHER)
    disk_now = read(disk / op.path)

    m.start()
    assert wait_for(lambda: first_pass_done(m), 10)
    if op.auto and variant == "plain":
        # Auto-materialize runs once at start: the restart itself completes the owed write.
        assert wait_for(lambda: read(disk / op.path) == op.draft and pending(m) == [], 10)
        disk_now = op.draft
    # A branch selection: `side` (made before the step), then `main` again.
    switch(m, "side")
    assert read(disk / op.path) == disk_now  # selecting a branch writes nothing to disk
    # `side` never took the step. After an interrupted push its evidence is still the old
    # bytes, so disk's newer ones are adopted there (only disk changed). After an ingest,
    # main took disk's edit first (P is global), so side's older copy reads as its draft.
    neither_side = OTHER if op.intent != "adopt" else op.on_side
    assert read(m.work / op.path) == (op.on_side if variant == "plain" else neither_side)
    switch(m, "main")
    assert read(disk / op.path) == disk_now
    entry = state_of(m, op.path)

    if op.intent == "adopt":
        check_ingest(m, disk, op, variant, entry)
    elif variant == "neither":
        check_interrupted(m, disk, op, entry)
    else:
        check_owed(m, disk, op, point, entry)


def check_owed(m, disk: Path, op: Op, point: str, entry) -> None:
    """Killed with nothing else touching disk: the draft (or deletion) is kept and still owed;
    the retry completes it."""
    assert read(m.work / op.path) == op.draft  # no draft lost, no deletion resurrected
    if op.auto and read(disk / op.path) == op.draft and pending(m) == []:
        pass  # the restart's auto-materialize was the retry
    else:
        check_retry(m, disk, op, point, entry)
    assert read(disk / op.path) == op.draft
    assert m.status()["backing"]["work"]["owed"] == {
        "changes": 0, "workspace_deletions": 0, "conflicts": 0}
    assert pending(m) == []
    want = None if op.draft is None else h(op.draft)
    assert evidence(m, op.path) == EvidenceRecord(want)


def check_retry(m, disk: Path, op: Op, point: str, entry) -> None:
    """Still owed after the restart (and counted so), and the retry completes it."""
    done = point == "apply:after-effect"
    if op.draft is None:
        assert op.path not in os.listdir(m.work)
        assert entry == ("workspace-deleted", None)
    else:
        assert entry == (("synced", None) if done else ("workspace-draft", None))
    owed = m.status()["backing"]["work"]["owed"]
    assert owed["changes" if op.draft is not None else "workspace_deletions"] == 1
    res = m.cli_json(*op.retry)["mounts"]["work"]
    assert (res["written"] if op.draft is not None else res["removed"]) == [op.path]


def check_interrupted(m, disk: Path, op: Op, entry) -> None:
    """Disk matches neither outcome: a sticky interrupted conflict; the draft (or deletion) is
    kept, disk's bytes are kept; only the named, forced path takes the workspace's side."""
    assert states(m).get(f"work/{op.path}") == ("conflict", "interrupted")
    assert read(m.work / op.path) == op.draft
    if op.draft is not None:
        assert entry == ("conflict", "interrupted")  # the xattrs
    assert read(m.mnt / ".memfs" / "conflicts" / "work" / op.path) == OTHER
    assert m.status()["backing"]["work"]["conflicts"] == [op.path]
    res = m.cli_json(*op.retry)["mounts"]["work"]
    assert [s["path"] for s in res["skipped"]] == [op.path]
    assert "--force" in res["skipped"][0]["remedy"]
    assert read(disk / op.path) == OTHER  # never overwritten unnamed
    res = m.cli_json(*op.retry, "--force", f"work/{op.path}")["mounts"]["work"]
    assert (res["written"] if op.draft is not None else res["removed"]) == [op.path]
    assert read(disk / op.path) == op.draft
    assert state_of(m, op.path) == (None if op.draft is None else ("synced", None))
    assert pending(m) == []


def check_ingest(m, disk: Path, op: Op, variant: str, entry) -> None:
    """The shell edit is never lost: adopted on restart (the tree never took it) or completed
    (the tree took it); a later disk edit while down is adopted too, not a false conflict."""
    want = SHELL if variant == "plain" else OTHER
    assert read(disk / op.path) == want
    assert read(m.work / op.path) == want
    assert entry == ("synced", None)
    assert m.status()["backing"]["work"]["conflicts"] == []
    assert pending(m) == []
    assert evidence(m, op.path) == EvidenceRecord(h(want))
    m.cli(*op.retry)
    assert read(m.work / op.path) == want and pending(m) == []


@pytest.mark.parametrize("op_name", ["write", "unlink"])
def test_workspace_changes_the_path_again_before_the_retry(mount_factory, monkeypatch,
                                                           tmp_path: Path, op_name: str):
    """Killed after the effect (disk shows it, the intent pending), restarted, then the workspace
    undoes its step before any retry: the draft is removed (`rm`) or the deleted file made again.
    The retry owes what the workspace now holds, not the interrupted step: the deletion is
    applied with --apply-deletions, the new file is written by a bare materialize, and neither
    holds up the mount's other drafts."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "f.txt").write_bytes(OLD)
    (disk / "g.txt").write_bytes(OLD)
    m = start_crashing(mount_factory, monkeypatch, "apply:after-effect")
    m.cli("attach", "work", str(disk), "--watch", "off")
    op = OPS[op_name]
    op.arrange(m, disk)
    op.trigger(m, disk)
    killed(m)
    assert [(i.path, i.op) for i in pending(m)] == [("f.txt", op.intent)]
    m.start()
    assert wait_for(lambda: first_pass_done(m), 10)
    again = b"made again\n"
    if op_name == "write":
        sh(f"rm {m.work}/f.txt")
    else:
        (m.work / "f.txt").write_bytes(again)
    (m.work / "g.txt").write_bytes(NEW)
    want = None if op_name == "write" else again
    assert states(m).get("work/f.txt") == (("workspace-deleted", None) if want is None else
                                           ("workspace-draft", None))
    res = m.cli_json("materialize")["mounts"]["work"]
    assert "g.txt" in res["written"] and read(disk / "g.txt") == NEW
    if want is None:
        assert res["deletions_left"] == ["f.txt"] and read(disk / "f.txt") == NEW
        res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
        assert res["removed"] == ["f.txt"]
    else:
        assert "f.txt" in res["written"]
    assert read(disk / "f.txt") == want and read(m.work / "f.txt") == want
    assert pending(m) == [] and evidence(m, "f.txt") == EvidenceRecord(want and h(want))
    assert m.status()["backing"]["work"]["owed"] == {
        "changes": 0, "workspace_deletions": 0, "conflicts": 0}


def test_branch_selected_while_down_keeps_both_sides(mount_factory, monkeypatch, tmp_path: Path):
    """The other order of restart and branch selection: killed after a materialize write's
    intent, disk rewritten to neither outcome, `side` selected while the daemon is down (the
    CLI opens the store itself), so the first pass to see main's interrupted push runs on side.
    side never pushed anything: for it only disk changed, so it takes disk's bytes, and main's
    intent stays pending for main (side's own adoption does not supersede it). Back on main it
    is the interrupted conflict it is: main keeps its draft, a bare materialize refuses it, and
    disk keeps its bytes until the named, forced path takes the workspace's side."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "f.txt").write_bytes(OLD)
    m = start_crashing(mount_factory, monkeypatch, "apply:after-intent")
    m.cli("attach", "work", str(disk), "--watch", "off")
    m.cli("branch", "create", "side")
    (m.work / "f.txt").write_bytes(NEW)
    m.cli("materialize", check=False)
    killed(m)
    (disk / "f.txt").write_bytes(OTHER)
    assert m.cli_json("branch", "switch", "side")["branch"] == "side"
    m.start()
    assert wait_for(lambda: first_pass_done(m), 10)
    assert read(m.work / "f.txt") == OTHER and read(disk / "f.txt") == OTHER
    assert states(m)["work/f.txt"] == ("synced", None)
    assert [(i.op, i.branch) for i in pending(m)] == [("write", "main")]
    switch(m, "main")
    assert read(m.work / "f.txt") == NEW and read(disk / "f.txt") == OTHER
    assert states(m)["work/f.txt"] == ("conflict", "interrupted")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert [s["path"] for s in res["skipped"]] == ["f.txt"] and read(disk / "f.txt") == OTHER
    assert pending(m) == []
    res = m.cli_json("materialize", "--force", "work/f.txt")["mounts"]["work"]
    assert res["written"] == ["f.txt"] and read(disk / "f.txt") == NEW
