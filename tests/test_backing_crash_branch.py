"""A crash at a write-ahead point, then a branch switch while no daemon runs (issue 15, item 1).

The worst thing the reconciler can do is write over a disk edit it has not taken in. Here the
shell's edit was being adopted by main when the daemon died; `side` (which already held the
same bytes) was selected while the daemon was down, so side's first pass agreed with disk and
moved the global evidence P to the new bytes. Back on main, main's adoption was still pending:
decided from the moved P, main's old copy read as a draft and a bare materialize wrote it over
the shell's edit. An adoption's intent carries the prior its decision resolved (seed 002), and
a not-done adoption is decided again from that prior: main takes disk's edit, as it would have
without the crash.

The same class, nearby: another branch's interrupted push stays pending for its own branch
(test_backing_killmatrix.test_branch_selected_while_down_keeps_both_sides).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.backing_mount import sh, states
from helpers.killmatrix import (
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
    switch,
)
from helpers.wait import wait_for

from memfs.store.journal import EvidenceRecord


def _side_holding(m, data: bytes) -> None:
    """Branch `side` whose a.txt holds `data` (committed), main selected again."""
    m.cli("branch", "create", "side")
    switch(m, "side")
    (m.work / "a.txt").write_bytes(data)
    m.cli("sync")  # commits side's edit (a draft there) with the pass
    switch(m, "main")
    assert read(m.work / "a.txt") == OLD


@pytest.mark.parametrize("side_holds", [SHELL, OLD], ids=["side-has-the-edit", "side-old"])
def test_pending_adoption_then_switch_while_down_never_overwrites_the_shell_edit(
        mount_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, side_holds: bytes):
    """side either already holds the shell's bytes (its pass agrees with disk) or the old ones
    (its pass adopts the edit itself): either way P moves to the edit while main's adoption is
    pending, and main must take the edit, not write its old copy over it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_bytes(OLD)
    m = start_crashing(mount_factory, monkeypatch, "backing:after-adopt-intent")
    m.cli("attach", "work", str(disk), "--watch", "off")
    if side_holds == OLD:
        m.cli("branch", "create", "side")
    else:
        _side_holding(m, side_holds)
    sh(f"printf 'shell edit\\n' > {disk}/a.txt")
    m.cli("sync", check=False, timeout=60)  # main's adoption: the daemon dies after its intent
    killed(m)
    assert [(i.path, i.op, i.branch) for i in pending(m)] == [("a.txt", "adopt", "main")]

    assert m.cli_json("branch", "switch", "side")["branch"] == "side"  # no daemon runs
    m.start()
    assert wait_for(lambda: first_pass_done(m), 10)
    assert read(m.work / "a.txt") == SHELL  # side agrees with disk, or adopted the edit ...
    assert evidence(m, "a.txt") == EvidenceRecord(h(SHELL))  # ... and P moved with it
    assert [i.branch for i in pending(m)] == ["main"]  # main's adoption is left for main

    switch(m, "main")
    assert read(m.work / "a.txt") == SHELL  # main takes disk's edit, as without the crash
    assert states(m)["work/a.txt"] == ("synced", None)
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["written"] == [] and res["skipped"] == []
    assert read(disk / "a.txt") == SHELL  # the shell's edit is never overwritten
    assert pending(m) == []
    assert m.status()["backing"]["work"]["owed"] == {
        "changes": 0, "workspace_deletions": 0, "conflicts": 0}


def test_pending_adoption_then_switch_and_a_later_disk_edit_is_adopted_not_a_draft(
        mount_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The same crash, and disk edited again while side is selected (side adopts it too): main
    never saw either edit, so from its prior both are disk's changes, and it takes the last."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_bytes(OLD)
    m = start_crashing(mount_factory, monkeypatch, "backing:after-adopt-intent")
    m.cli("attach", "work", str(disk), "--watch", "off")
    _side_holding(m, SHELL)
    sh(f"printf 'shell edit\\n' > {disk}/a.txt")
    m.cli("sync", check=False, timeout=60)
    killed(m)
    assert m.cli_json("branch", "switch", "side")["branch"] == "side"
    m.start()
    assert wait_for(lambda: first_pass_done(m), 10)
    (disk / "a.txt").write_bytes(OTHER)
    m.cli("sync")
    assert read(m.work / "a.txt") == OTHER  # side adopted the second edit
    switch(m, "main")
    assert read(m.work / "a.txt") == OTHER
    m.cli("materialize")
    assert read(disk / "a.txt") == OTHER
