"""Issue 4 wiring through a real mount: status counts what disk owes, after-batch scans of
`--watch on-agent-action` mounts (coalesced by one coordinator per daemon), and events."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.backing_mount import ACCESS
from helpers.mount import REPO, memfs_cmd
from helpers.wait import wait_for

from memfs.testing import SCAN_DELAY_ENV

# Seconds each scan sleeps in the slow-scan daemon: two CLI processes must reach it while one
# runs, and under the whole suite's load (8 on 2 cores) each took ~2 s to start (at 2.0 the
# third request came after scan 2 had begun).
SLOW = 5.0


def _owed(m) -> dict:
    return m.status()["backing"]["work"]["owed"]


def test_status_counts_what_disk_owes(backed):  # noqa: F811
    m, disk = backed
    assert _owed(m) == {"changes": 0, "workspace_deletions": 0, "conflicts": 0}
    (m.work / "a.txt").write_text("a-draft\n")
    assert _owed(m)["changes"] == 1
    assert m.cli_json("status")["backing"]["work"]["owed"]["changes"] == 1
    assert "disk owes 1 change(s), 0 deletion(s), 0 conflict(s)" in m.cli("status").stdout
    m.cli("materialize")
    assert (disk / "a.txt").read_text() == "a-draft\n"
    assert _owed(m)["changes"] == 0
    assert "disk owes 0 change(s)" in m.cli("status").stdout
    (m.work / "b.txt").unlink()
    assert _owed(m) == {"changes": 0, "workspace_deletions": 1, "conflicts": 0}
    m.cli("materialize", "--apply-deletions")
    assert not (disk / "b.txt").exists() and _owed(m)["workspace_deletions"] == 0


def _agent_mount(m, tmp_path: Path, *extra: str) -> Path:
    disk = tmp_path / "disk"
    disk.mkdir(exist_ok=True)
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk), "--watch", "on-agent-action", *extra)
    return disk


def _scans(m) -> dict:
    return m.status()["backing"]["work"]["scans"]


def test_after_batch_scans_an_on_agent_action_mount(mounted, tmp_path: Path):
    m = mounted
    m.require_real()
    disk = _agent_mount(m, tmp_path)
    assert (m.work / "a.txt").read_text() == "a1\n"  # attach's own pass took it in
    (disk / "shell.txt").write_text("made by a tool\n")
    time.sleep(ACCESS)
    # on-access is off for this mode: neither a listing nor a lookup observes disk.
    assert "shell.txt" not in os.listdir(m.work)
    assert not (m.work / "shell.txt").exists()
    assert _scans(m)["count"] == 0
    res = m.cli_json("after-batch", "--agent", "coder")
    assert res["mounts"] == ["work"] and res["agent"] == "coder"
    assert res["missed"] is False and res["outcome"]["finished"] is True
    assert (m.work / "shell.txt").read_text() == "made by a tool\n"
    scans = _scans(m)
    assert scans["count"] == 1 and scans["last_scan"]["finished"] is True
    assert scans["deadline"] == 20.0 and scans["last_miss"] is None
    assert "; 1 after-batch scan(s))" in m.cli("status").stdout
    assert "scanned work" in m.cli("after-batch").stdout
    events = [e for e in m.cli_json("events")["events"] if e["event"].startswith("scan-")]
    assert [e["event"] for e in events] == ["scan-started", "scan-finished"] * 2
    assert events[1]["finished"] is True and events[1]["mounts"] == ["work"]
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    # A region the scan could not observe is reported: in the reply, on status, as an event.
    os.symlink("a.txt", disk / "pipe")  # not followed: the scan cannot say what it holds
    res = m.cli_json("after-batch")
    assert [r[0] for r in res["outcome"]["incomplete"]] == ["work/pipe"]
    assert _scans(m)["last_scan"]["incomplete"] == res["outcome"]["incomplete"]
    last = m.cli_json("events")["events"][-1]
    assert last["event"] == "scan-incomplete" and last["regions"][0][0] == "work/pipe"


def test_events_record_conflicts_and_refused_writes_and_follow(backed):  # noqa: F811
    m, disk = backed
    # ^C as a terminal delivers it: a suite started in the background by a non-interactive
    # shell (CI) runs with SIGINT ignored, which the follower would inherit and keep.
    follow = subprocess.Popen(memfs_cmd(m.root, "events", "--follow", "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        (m.work / "a.txt").write_text("a-draft\n")
        (disk / "a.txt").write_text("a-disk\n")
        m.cli("sync")
        m.cli("materialize")
        events = m.cli_json("events")["events"]
        conflict = [e for e in events if e["event"] == "conflict-recorded"]
        assert [(e["mount"], e["path"], e["kind"]) for e in conflict] == [
            ("work", "a.txt", "both-changed")]
        refused = [e for e in events if e["event"] == "write-refused"]
        assert [(e["mount"], e["path"]) for e in refused] == [("work", "a.txt")]
        assert "conflict-recorded" in m.cli("events").stdout
        time.sleep(1.2)  # > two of the follower's 0.5 s polls
        follow.send_signal(signal.SIGINT)
        out, _ = follow.communicate(timeout=10)
        assert follow.returncode == 0
        # The follower printed the same events, one JSON object a line, as they came.
        assert [json.loads(line)["seq"] for line in out.splitlines()] == [
            e["seq"] for e in events]
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


def test_after_batch_without_daemon_runs_one_pass(tmp_path: Path):
    root = tmp_path / "root"
    subprocess.run(memfs_cmd(root, "init"), check=True, capture_output=True, cwd=REPO)
    disk = tmp_path / "disk"
    disk.mkdir()
    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=REPO)
    assert run(memfs_cmd(root, "attach", "work", str(disk), "--watch", "on-agent-action")
               ).returncode == 0
    (disk / "late.txt").write_text("late\n")
    out = run(memfs_cmd(root, "after-batch", "--json"))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["scan"] is None and res["outcome"]["finished"] is True
    listed = json.loads(run(memfs_cmd(root, "ls", "--json")).stdout)["mounts"][0]["entries"]
    assert {"path": "late.txt", "state": "synced", "conflict": None} in listed


@pytest.fixture
def slow_scans(mount_factory):
    """A daemon whose every after-batch scan first sleeps (the fault-injection shim), so that
    batches really arrive while one runs."""
    m = mount_factory(env={SCAN_DELAY_ENV: str(SLOW)})
    m.require_real()
    return m


def _after_batch(m) -> subprocess.Popen[str]:
    return subprocess.Popen(memfs_cmd(m.root, "after-batch", "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def _reply(p: subprocess.Popen[str]) -> dict:
    out, err = p.communicate(timeout=60)
    return json.loads(out) if out.strip() else {"rc": p.returncode, "stderr": err}


def test_batches_arriving_while_a_scan_runs_share_the_next(slow_scans, tmp_path: Path):
    m = slow_scans
    disk = _agent_mount(m, tmp_path)
    first = _after_batch(m)
    assert wait_for(lambda: _scans(m)["count"] == 1, 10)  # scan 1 is running (asleep)
    second, third = _after_batch(m), _after_batch(m)
    r1, r2, r3 = _reply(first), _reply(second), _reply(third)
    assert r1["scan"] == 1 and not r1["missed"]
    assert r2["scan"] == r3["scan"] == 2 and not r2["missed"] and not r3["missed"]
    assert _scans(m)["count"] == 2  # three batches, two scans
    kinds = [e["event"] for e in m.cli_json("events")["events"]]
    assert kinds.count("scan-started") == 2 and kinds.count("scan-finished") == 2
    # A deadline shorter than the scan: the batch returns at the deadline, missed, and the
    # miss is on status and an event; the scan finishes in the background.
    m.cli("attach", "work", str(disk), "--watch", "on-agent-action", "--scan-deadline", "0.3")
    t0 = time.monotonic()
    out = m.cli("after-batch", "--json", check=False)
    assert out.returncode == 1 and time.monotonic() - t0 < SLOW  # before the scan could end
    res = json.loads(out.stdout)
    assert res["missed"] is True and "0.3 s" in res["miss"]["why"]
    assert _scans(m)["last_miss"]["scan"] == res["scan"]
    assert wait_for(lambda: (_scans(m)["last_scan"] or {}).get("scan") == res["scan"], 20)
    assert _scans(m)["last_scan"]["late"] is True
    kinds = [e["event"] for e in m.cli_json("events")["events"]]
    assert "scan-missed" in kinds


# Each scan's sleep in the late-scan daemon: batches 2 and 3 land inside scan 1, and the checks
# between scan 1's end and scan 2's (each a CLI process, ~2 s under load) fit in one sleep
# (at 3.0, CI at load 8 saw both scans finished at its first look).
LATE = 8.0


@pytest.fixture
def late_scans(mount_factory, monkeypatch: pytest.MonkeyPatch):
    """A daemon whose after-batch scans each sleep LATE seconds first (the fault shim)."""
    with monkeypatch.context() as env:
        env.setenv(SCAN_DELAY_ENV, str(LATE))
        m = mount_factory()
    m.require_real()
    return m


def _events(m, kind: str) -> list[dict]:
    return [e for e in m.cli_json("events")["events"] if e["event"] == kind]


def test_late_scan_with_a_second_batch_queued_and_a_third_arriving(late_scans, tmp_path: Path):
    """Scan 1 outlasts its deadline (batch 1 misses); batches 2 and 3 arrive while it still runs,
    are not held (their misses are recorded at once) and share scan 2, which runs after it.
    Each scan then records its own outcome: scan 1 (incomplete: a symlink, not followed) as
    events only, since
    a newer scan is queued; scan 2 (complete) on status and as events."""
    m = late_scans
    disk = _agent_mount(m, tmp_path, "--scan-deadline", "0.5")
    os.symlink("one.txt", disk / "pipe")  # an incomplete region (following is off)
    (disk / "one.txt").write_text("seen by scan 1\n")
    r1 = _reply(_after_batch(m))
    assert (r1["scan"], r1["missed"]) == (1, True) and "within 0.5 s" in r1["miss"]["why"]
    second, third = _after_batch(m), _after_batch(m)
    r2, r3 = _reply(second), _reply(third)
    # Both missed without waiting for a deadline of their own: scan 1 was still running late.
    assert r2["scan"] == r3["scan"] == 2 and r2["missed"] and r3["missed"]
    assert sorted(r["miss"]["why"] for r in (r2, r3)) == [
        "an earlier scan is still running past its deadline",
        "this scan is queued behind one running past its deadline"]
    scans = m.cli_json("status")["backing"]["work"]["scans"]
    assert scans["running_late"] is True and scans["last_scan"] is None
    assert scans["last_miss"]["scan"] == 2
    assert [e["scan"] for e in _events(m, "scan-missed")] == [1, 2, 2]

    assert wait_for(lambda: [e["scan"] for e in _events(m, "scan-finished")] == [1], 30)
    # Scan 1 settled: its outcome is an event, not status (scan 2 is newer and still queued).
    os.unlink(disk / "pipe")
    (disk / "two.txt").write_text("seen by scan 2\n")
    assert (m.work / "one.txt").read_text() == "seen by scan 1\n"  # the late scan's change shows
    assert _scans(m)["last_scan"] is None and _scans(m)["running_late"] is True
    assert not (m.work / "two.txt").exists()  # scan 2 has not looked yet

    assert wait_for(lambda: len(_events(m, "scan-finished")) == 2, 30)
    finished = {e["scan"]: e for e in _events(m, "scan-finished")}
    assert finished[1]["late"] is True and finished[2]["late"] is True
    assert finished[1]["finished"] is True and finished[2]["finished"] is True
    incomplete = _events(m, "scan-incomplete")
    assert [(e["scan"], [r[0] for r in e["regions"]]) for e in incomplete] == [(1, ["work/pipe"])]
    assert "symlink" in incomplete[0]["regions"][0][1]
    scans = m.cli_json("status")["backing"]["work"]["scans"]
    assert scans["count"] == 2 and scans["running_late"] is False
    assert scans["last_scan"] == {"scan": 2, "finished": True, "late": True, "incomplete": [],
                                  "error": None}
    assert (m.work / "two.txt").read_text() == "seen by scan 2\n"
    assert [e["scan"] for e in _events(m, "scan-started")] == [1, 2]


def test_after_batch_marks_with_any_agent_name(mounted) -> None:
    """Mark names refuse ':' and '/' (revision syntax), and an agent id such as
    `claude:main/2` failed the whole after-batch with "invalid name". The mark takes the
    agent's name as far as a revision name may; one that would shadow a branch falls back
    to `after-batch`; the label keeps the agent as given."""
    m = mounted
    m.require_real()
    for agent in ("claude:main/2", "main"):
        (m.work / f"{agent.replace('/', '_')}.txt").write_text("x\n")
        res = m.cli("after-batch", "--agent", agent, check=False)
        assert res.returncode == 0, res.stderr
    log = m.cli("log", "-n", "3").stdout
    assert "[mark claude-main-2]" in log and "[mark after-batch]" in log, log
