"""Long control requests, as a user meets them through a real daemon and mount: the CLI waits as
long as the daemon makes progress (an attach of 1M files takes minutes; the socket's fixed
600 s timeout told the user it failed while it went on), fails within the stall window with
what happened and the remedy when the daemon stops answering, and on Ctrl-C says what goes
on and where to watch it; `memfs status` shows a running attach with its counts.

The walk is slowed by the daemon's test shim (MEMFS_TEST_WALK_DELAY, per directory) so a
small tree's attach outlasts a shortened stall window (MEMFS_CONTROL_STALL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.mount import REPO, memfs_cmd
from helpers.wait import wait_for

pytestmark = pytest.mark.mount

DIRS, PER_DIR = 16, 4
DELAY = 0.4  # seconds the walk sleeps per directory: 17 directories, ~7 s of walking
STALL = 2.0


def slow_tree(d: Path) -> None:
    for i in range(DIRS):
        sub = d / f"d{i:02d}"
        sub.mkdir(parents=True)
        for j in range(PER_DIR):
            (sub / f"f{j}.txt").write_text(f"file {i}.{j}\n")


def cli_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", **extra)


def attach(m, proj: Path, **env: str) -> subprocess.Popen[str]:
    """`memfs attach p PROJ --watch off` in the background (off: no on-access pass, which
    the slowed walk would make slow too), once it has printed its first progress line: the
    CLI has had one from the daemon."""
    proc = subprocess.Popen(memfs_cmd(m.root, "attach", "p", str(proj), "--watch", "off"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=cli_env(MEMFS_PROGRESS_EVERY="0.1", **env),
                            start_new_session=True)
    first = proc.stderr.readline()  # type: ignore[union-attr]
    assert f"memfs: attach p -> {proj}: " in first, first
    return proc


def running_attach(m) -> dict | None:
    """The status of the running attach's pass, once it has walked a directory."""
    st = m.cli_json("status")
    p = (st.get("backing") or {}).get("p", {}).get("running")
    reqs = [r["request"] for r in st["requests"]["running"]]
    return p if p and p["listed"] > 0 and any(r.startswith("attach p -> ") for r in reqs) \
        else None


def finished_attach(m) -> dict | None:
    done = [f for f in m.cli_json("status")["requests"]["finished"]
            if f["request"].startswith("attach p -> ")]
    return done[0] if done else None


def timed_attach(mount_factory, tmp_path: Path, daemon_env: dict[str, str],
                 **cli: str) -> tuple[object, Path, subprocess.CompletedProcess[str], float]:
    """A daemon started with `daemon_env` (a test shim), `memfs attach p PROJ` of a slow tree
    from a CLI with the short stall window (and `cli` in its environment): the mount, the
    tree, the CLI's result and how long it took."""
    m = mount_factory(env=daemon_env)
    m.require_real()
    proj = tmp_path / "proj"
    slow_tree(proj)
    t0 = time.monotonic()
    res = subprocess.run(memfs_cmd(m.root, "attach", "p", str(proj), "--watch", "off"),
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=cli_env(MEMFS_CONTROL_STALL=str(STALL), **cli))
    return m, proj, res, time.monotonic() - t0


def test_an_attach_longer_than_the_stall_window_completes(mount_factory, tmp_path: Path) -> None:
    """The daemon sends a progress line a second while the attach runs: a CLI whose stall
    window is shorter than the whole attach waits it out, shows its progress, and reports
    success. (With only the reply on the socket, it gave up after the window.)"""
    m, proj, res, took = timed_attach(mount_factory, tmp_path,
                                      {"MEMFS_TEST_WALK_DELAY": str(DELAY)},
                                      MEMFS_PROGRESS_EVERY="0.5")
    assert res.returncode == 0, res.stderr
    assert took > 2 * STALL, f"the attach took {took:.1f} s: not longer than the window"
    assert f"p is bound to {proj}" in res.stdout and f"{DIRS * PER_DIR} taken" in res.stdout
    # Not a terminal: a line every MEMFS_PROGRESS_EVERY seconds, with the walk's count.
    assert f"memfs: attach p -> {proj}: p: walking disk (" in res.stderr, res.stderr
    assert "entries looked at" in res.stderr, res.stderr
    assert (m.mnt / "p" / "d15" / "f3.txt").read_text() == "file 15.3\n"
    assert finished_attach(m)["ok"] is True


def test_a_daemon_busy_without_a_line_is_waited_for(mount_factory, tmp_path: Path) -> None:
    """Planning a pass keeps the daemon's loop busy without a pause (~7 s at 200k files on
    a loaded machine, so tens of seconds at 1M): no progress line for longer than the stall
    window, but the daemon spends CPU, so the CLI waits (it gave up after the window)."""
    spin = 3 * STALL
    _, _, res, took = timed_attach(mount_factory, tmp_path, {"MEMFS_TEST_PLAN_SPIN": str(spin)})
    assert res.returncode == 0, res.stderr
    assert took > spin
    assert f"{DIRS * PER_DIR} taken" in res.stdout, res.stdout


def test_a_stopped_daemon_fails_the_cli_within_the_stall_window(mount_factory,
                                                                tmp_path: Path) -> None:
    """SIGSTOP the daemon mid-attach: the CLI fails within the stall window, saying the
    daemon is stopped, with its pid and `kill -CONT`; resumed, the attach finishes and
    status says so."""
    m = mount_factory(env={"MEMFS_TEST_WALK_DELAY": str(DELAY)})
    m.require_real()
    proj = tmp_path / "proj"
    slow_tree(proj)
    pid = m.cli_json("status")["daemon"]["pid"]
    proc = attach(m, proj, MEMFS_CONTROL_STALL=str(STALL))
    try:
        assert wait_for(lambda: running_attach(m), timeout=30), "the attach never ran"
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
            took = time.monotonic() - stopped
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    # Within the window (and a loaded machine's scheduling), not the old 600 s.
    assert took <= STALL + 5, f"the CLI gave up {took:.1f} s after the stop"
    assert f"the memfs daemon of {m.root} (pid {pid}) is stopped" in err, err
    assert f"made no progress for {STALL:g} s" in err and f"kill -CONT {pid}" in err, err
    assert "`memfs status` shows whether it has finished" in err, err
    assert wait_for(lambda: finished_attach(m), timeout=60), "the resumed attach never ended"
    done = finished_attach(m)
    assert done["ok"] and done["client_left"], done
    assert (m.mnt / "p" / "d15" / "f3.txt").read_text() == "file 15.3\n"


def test_status_shows_a_running_attach_and_ctrl_c_says_it_goes_on(mount_factory,
                                                                    tmp_path: Path) -> None:
    """While an attach runs, `memfs status` shows it and its pass's counts; Ctrl-C on the
    attach says the daemon goes on and how to watch it; status then says how it ended."""
    # A slower walk (~17 s) than the others: four status calls must fall inside it, and on
    # a loaded machine each call's start-up alone took a second or two.
    m = mount_factory(env={"MEMFS_TEST_WALK_DELAY": "1.0"})
    m.require_real()
    proj = tmp_path / "proj"
    slow_tree(proj)
    proc = attach(m, proj)
    try:
        assert wait_for(lambda: running_attach(m), timeout=30), "the attach never ran"
        text = m.cli("status").stdout
        assert f"running  attach p -> {proj} for " in text, text
        assert "pass     p: walking disk (" in text and " entries looked at), " in text, text
        # The mount's own status file says the same (an agent may read it, not run the CLI).
        doc = json.loads((m.mnt / ".memfs" / "status").read_text())
        assert any(r["request"] == f"attach p -> {proj}" for r in doc["requests"]["running"]), doc
        # Counts grow while it walks.
        first = running_attach(m)["listed"]
        assert wait_for(lambda: (running_attach(m) or {"listed": 0})["listed"] > first,
                        timeout=30)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert f"interrupted; the daemon goes on with 'attach p -> {proj}'" in err, err
    assert "`memfs status` shows how far it has got" in err, err
    assert wait_for(lambda: finished_attach(m), timeout=60), "the attach never ended"
    assert finished_attach(m)["client_left"] is True
    text = m.cli("status").stdout
    assert f"finished attach p -> {proj} at " in text and ": ok (its client had left)" in text
    assert (m.mnt / "p" / "d15" / "f3.txt").read_text() == "file 15.3\n"


def test_a_daemon_less_attach_shows_its_progress(memfs_root: Path, tmp_path: Path) -> None:
    """With no daemon the CLI takes the directory in itself (as `memfs mount --bind` does
    before the daemon starts): its long walk is shown on stderr the same way."""
    proj = tmp_path / "proj"
    slow_tree(proj)
    env = cli_env(MEMFS_TEST_WALK_DELAY=str(DELAY), MEMFS_PROGRESS_EVERY="0.5")
    subprocess.run(memfs_cmd(memfs_root, "init"), check=True, capture_output=True, cwd=REPO,
                   env=env, timeout=60)
    res = subprocess.run(memfs_cmd(memfs_root, "attach", "p", str(proj), "--watch", "off"),
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{DIRS * PER_DIR} taken" in res.stdout, res.stdout
    assert f"memfs: attach p -> {proj}: p: walking disk (" in res.stderr, res.stderr
