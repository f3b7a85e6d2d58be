"""The branch pin through a real mount: disk holds the branch it was last materialized from.

A materialize on another branch is refused unless forced (force moves the pin); a push cut
short by a branch switch writes nothing more and leaves the pin where it was, pinned or not.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers.backing_mount import states
from helpers.mount import memfs_cmd

from memfs.testing import PUSH_GATE_ENV

QUEUED = 0.5  # s for a second materialize's request to reach the daemon (see its test)


def _materialize(m, *args: str) -> dict:
    """`memfs materialize --json ARGS` whatever its exit code (a refusal exits 1)."""
    out = m.cli("materialize", *args, "--json", check=False)
    return json.loads(out.stdout)["mounts"]["work"]


def _pinned(m) -> str | None:
    return m.status()["backing"]["work"]["pinned"]


def test_materialize_pins_and_a_divergent_branch_is_refused_unless_forced(backed):  # noqa: F811
    m, disk = backed
    (m.work / "a.txt").write_text("a-main\n")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["written"] == ["a.txt"] and res["pinned"] == "main"
    assert _pinned(m) == "main"
    m.cli("branch", "create", "feature")
    m.cli("branch", "switch", "feature")
    (m.work / "a.txt").write_text("a-feature\n")
    out = m.cli("materialize", check=False)
    assert out.returncode == 1
    assert "'main'" in out.stdout and "--force" in out.stdout  # says why and the way out
    res = _materialize(m)
    assert res["refused"] and res["written"] == [] and res["pinned"] == "main"
    assert (disk / "a.txt").read_text() == "a-main\n"  # disk still holds main
    res = m.cli_json("materialize", "--force")["mounts"]["work"]
    assert res["written"] == ["a.txt"] and res["pinned"] == "feature"
    assert (disk / "a.txt").read_text() == "a-feature\n"
    # Back on main, main diverges from what disk now holds.
    m.cli("branch", "switch", "main")
    assert _materialize(m)["refused"]
    assert (disk / "a.txt").read_text() == "a-feature\n"


def test_nothing_owed_still_pins_and_the_pin_survives_a_restart(backed):  # noqa: F811
    m, disk = backed
    assert _pinned(m) is None  # attached, never materialized
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["written"] == [] and res["pinned"] == "main"
    m.remount()
    assert _pinned(m) == "main"
    m.cli("branch", "create", "other")
    m.cli("branch", "switch", "other")
    assert _materialize(m)["refused"]


@pytest.fixture
def slow_pushes(mount_factory, tmp_path: Path):
    """A daemon whose materialize pushes wait at a gate before each effect while the gate
    file exists (memfs.testing.push_gate), so a branch switch really lands while one runs;
    `work` bound to a directory holding a.txt. The mount carries its gate as `m.gate`."""
    gate = tmp_path / "push-gate"
    m = mount_factory(env={PUSH_GATE_ENV: str(gate)})
    m.require_real()
    m.gate = gate
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk))
    return m, disk


def _waiting(m) -> int:
    """How many pushes have reached the gate."""
    try:
        return len(Path(str(m.gate) + ".waiting").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _start_held_push(m) -> subprocess.Popen:
    """A materialize whose push is inside its wait at the gate when this returns."""
    Path(str(m.gate) + ".waiting").unlink(missing_ok=True)
    m.gate.touch()
    proc = subprocess.Popen(memfs_cmd(m.root, "materialize", "--json"), stdout=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not _waiting(m):
        assert proc.poll() is None, "the materialize ended before its push waited"
        assert time.monotonic() < deadline, "the push never reached its gate"
        time.sleep(0.01)
    return proc


def _switch_and_open(m, branch: str) -> None:
    """`memfs branch switch BRANCH` while a push waits at the gate; the gate opens once the
    mount shows the new branch (the switch then waits for the push it cut short), the switch
    is done, or its own push reaches the gate too."""
    switch = subprocess.Popen(memfs_cmd(m.root, "branch", "switch", branch),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while switch.poll() is None and _waiting(m) < 2 and m.status()["branch"] != branch:
        assert time.monotonic() < deadline, "the switch neither ended nor moved the branch"
        time.sleep(0.01)
    m.gate.unlink()
    out, err = switch.communicate(timeout=60)
    assert switch.returncode == 0, out + err


def _switch_during_push(m, branch: str) -> dict:
    """Start a materialize, switch branch while its push waits, and return its result."""
    proc = _start_held_push(m)
    _switch_and_open(m, branch)
    out, _ = proc.communicate(timeout=60)
    return json.loads(out)["mounts"]["work"]


@pytest.mark.parametrize("pinned_first", [False, True])
def test_a_push_cut_by_a_branch_switch_leaves_the_pin(slow_pushes, pinned_first: bool):
    m, disk = slow_pushes
    m.cli("branch", "create", "other")
    if pinned_first:
        assert m.cli_json("materialize")["mounts"]["work"]["pinned"] == "main"
    (m.work / "a.txt").write_text("a-main-draft\n")
    (m.work / "n.txt").write_text("new on main\n")
    res = _switch_during_push(m, "other")
    assert res["interrupted"] and res["written"] == []
    assert {s["path"] for s in res["skipped"] if s["state"] == "interrupted"} == {"a.txt",
                                                                                 "n.txt"}
    assert (disk / "a.txt").read_text() == "a1\n" and not (disk / "n.txt").exists()
    assert _pinned(m) == ("main" if pinned_first else None)
    m.cli("branch", "switch", "main")
    # The drafts are still owed on main, and main is still what the pin allows.
    assert states(m)["work/a.txt"] == ("workspace-draft", None)


def test_a_materialize_queued_behind_another_is_refused_after_a_switch(slow_pushes):
    """Seed 002: the guard runs in the turn that selects the paths, not when the call came."""
    m, disk = slow_pushes
    m.cli("branch", "create", "other")
    assert m.cli_json("materialize")["mounts"]["work"]["pinned"] == "main"
    (m.work / "a.txt").write_text("a-main-draft\n")
    first = _start_held_push(m)  # it holds the mount's turn, inside its push's wait
    queued = subprocess.Popen(memfs_cmd(m.root, "materialize", "--json"),
                              stdout=subprocess.PIPE, text=True)
    # The queued call waits for the mount's turn: nothing outside shows it has arrived, so
    # this is a pause, not a condition. Arriving late is harmless to the assertions (a call
    # made after the switch is refused too), it only leaves the queued case untried.
    time.sleep(QUEUED)
    _switch_and_open(m, "other")
    (m.work / "a.txt").write_text("a-other\n")
    res1 = json.loads(first.communicate(timeout=60)[0])["mounts"]["work"]
    res2 = json.loads(queued.communicate(timeout=60)[0])["mounts"]["work"]
    assert res1["interrupted"] and res1["written"] == []
    assert res2["branch"] == "other" and res2["refused"] and res2["written"] == []
    assert (disk / "a.txt").read_text() == "a1\n"
    assert _pinned(m) == "main"
