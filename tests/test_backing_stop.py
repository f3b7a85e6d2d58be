"""A clean stop (issue 4): watchers stop first, queued work drains until nothing new is queued,
then new work is refused ("memfs has stopped") before the state is saved.

The first test drives memfs.backing in trio with no FUSE (the order is the point);
the second unmounts a real daemon while an after-batch scan runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from helpers.mount import memfs_cmd

from memfs.backing import Backing, Binding
from memfs.errors import MemfsError
from memfs.store import Store
from memfs.testing import SCAN_DELAY_ENV
from memfs.workspace.workspace import Workspace

SLOW = 1.0  # seconds each after-batch scan sleeps first (the fault-injection shim)


def _text(ws: Workspace, mount: bytes, name: bytes) -> bytes | None:
    node = ws.children(ws.children(ws.root)[mount]).get(name)
    return None if node is None else ws.read(node, 0, 1 << 20)


async def _until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait on the loop until cond() holds (instead of sleeping a guessed time)."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)


@pytest.mark.trio
async def test_stop_drains_work_admitted_while_draining_then_refuses(tmp_path: Path):
    agent_disk, watched_disk = tmp_path / "agent", tmp_path / "watched"
    agent_disk.mkdir()
    watched_disk.mkdir()
    ws = Workspace(Store.open(tmp_path / "root"), 0.0)
    b = Backing(ws)
    await b.attach(Binding("agent", str(agent_disk), watch="on-agent-action"))
    await b.attach(Binding("watched", str(watched_disk), watch="fs-events"))
    done: dict[str, float] = {}
    os.environ[SCAN_DELAY_ENV] = str(SLOW)
    try:
        async with trio.open_nursery() as nursery:
            async def no_kernel() -> None:
                return None

            nursery.start_soon(b.run_watchers, no_kernel)
            await _until(lambda: b.agent.coordinator is not None)  # the watchers are up
            (agent_disk / "a.txt").write_text("from the agent\n")

            async def batch() -> None:
                res = await b.control("backing_after_batch", {"agent": "agent-1"})
                assert not res["missed"] and res["outcome"]["finished"]
                done["batch"] = trio.current_time()

            async def late_sync() -> None:
                # stop has begun (the watchers' scope is cancelled) and is draining the scan
                await _until(lambda: b.tasks._scope.cancel_called)
                await b.control("backing_sync", {"path": "watched"})
                done["late_sync"] = trio.current_time()

            nursery.start_soon(batch)
            await _until(lambda: b.agent.scans_run >= 1)  # the scan runs (asleep in the shim)
            nursery.start_soon(late_sync)
            await b.stop()
            done["stop"] = trio.current_time()
            # Everything admitted before the flag finished first.
            assert done["batch"] <= done["stop"] and done["late_sync"] <= done["stop"]
            assert _text(ws, b"agent", b"a.txt") == b"from the agent\n"
            # Then new work is refused, each way it can come.
            with pytest.raises(MemfsError, match="memfs has stopped"):
                await b.control("backing_sync", {})
            with pytest.raises(MemfsError, match="memfs has stopped"):
                await b.materialize(None)
            with pytest.raises(MemfsError, match="memfs has stopped"):
                await b.after_batch("agent-1")
            assert await b.on_access(ws.children(ws.root)[b"watched"]) is False
            # The watchers are gone: a disk change now reaches nothing.
            (watched_disk / "w.txt").write_text("after stop\n")
            await trio.sleep(0.5 + 0.3)
            assert _text(ws, b"watched", b"w.txt") is None
            nursery.cancel_scope.cancel()
    finally:
        del os.environ[SCAN_DELAY_ENV]
        b.close()
        ws.store.close()


def test_umount_during_a_scan_keeps_what_the_scan_took(mount_factory, tmp_path: Path):
    m = mount_factory(env={SCAN_DELAY_ENV: str(SLOW)})
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    m.cli("attach", "work", str(disk), "--watch", "on-agent-action")
    (disk / "late.txt").write_text("made by a tool\n")
    batch = subprocess.Popen(memfs_cmd(m.root, "after-batch", "--json"),
                             stdout=subprocess.PIPE, text=True)
    for _ in range(200):  # until the scan is running (asleep in the shim)
        if (m.status()["backing"]["work"]["scans"] or {}).get("count", 0) >= 1:
            break
        time.sleep(0.05)
    m.umount()  # while the scan sleeps: the stop drains it
    res = json.loads(batch.communicate(timeout=60)[0])
    assert not res["missed"] and res["outcome"]["finished"]
    # The store, read with no daemon and no pass: the scan's take was committed before exit.
    ws = Workspace(Store.open(m.root), 0.0)
    try:
        assert _text(ws, b"work", b"late.txt") == b"made by a tool\n"
    finally:
        ws.store.close()
