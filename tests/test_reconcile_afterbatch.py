"""After-batch scans on trio's autojump clock, each scan a real observation of a directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from memfs.errors import MemfsError
from memfs.reconcile.afterbatch import ScanOutcome, open_scan_coordinator
from memfs.reconcile.observe import observe


def make_scan(root: Path, durations: list[float], started: list[float]):
    """A scan that takes durations[i] seconds (of trio time) and then really observes root."""

    async def scan() -> ScanOutcome:
        i = len(started)
        started.append(trio.current_time())
        await trio.sleep(durations[i] if i < len(durations) else 1)
        obs = observe(root)
        return ScanOutcome(True, tuple((r.path, r.reason) for r in obs.regions))

    return scan


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("a\n")
    return tmp_path


async def at(t: float, fn, results: dict, key):
    await trio.sleep_until(t)
    results[key] = (await fn(), trio.current_time())


@pytest.mark.trio
async def test_batches_coalesce_one_running_one_waiting(root: Path, autojump_clock):
    started: list[float] = []
    res: dict = {}
    async with open_scan_coordinator(make_scan(root, [5, 5], started), deadline=20) as c:
        async with trio.open_nursery() as n:
            t0 = trio.current_time()
            n.start_soon(at, t0, c.after_batch, res, 1)
            for k, dt in ((2, 1), (3, 2), (4, 3)):  # all arrive while scan 1 runs
                n.start_soon(at, t0 + dt, c.after_batch, res, k)
    assert len(started) == 2
    assert res[1][0].scan_id == 1 and {res[k][0].scan_id for k in (2, 3, 4)} == {2}
    assert not any(r.missed for r, _ in res.values())
    assert res[4][1] == pytest.approx(t0 + 10)  # held until the shared scan settled


@pytest.mark.trio
async def test_deadline_miss_is_reported_and_the_scan_goes_on(root: Path, autojump_clock):
    started: list[float] = []
    async with open_scan_coordinator(make_scan(root, [30], started), deadline=20) as c:
        t0 = trio.current_time()
        r = await c.after_batch()
        assert r.missed and trio.current_time() == pytest.approx(t0 + 20)
        assert c.status["last_miss"]["scan"] == 1 and c.running_late
        assert [e["event"] for e in c.events] == ["scan-started", "scan-missed"]
    finished = [e for e in c.events if e["event"] == "scan-finished"]
    assert finished and finished[0]["late"] is True
    assert c.status["last_scan"]["scan"] == 1 and not c.running_late


@pytest.mark.trio
async def test_late_scan_second_queued_third_arriving(root: Path, autojump_clock):
    """The seed's case: scan 1 runs late; batch 2 is not held (its miss recorded at once, its
    scan after); batch 3 while scan 2 still runs is not held either; each scan records its own
    outcome and the newest one is on status."""
    started: list[float] = []
    res: dict = {}
    async with open_scan_coordinator(make_scan(root, [30, 10, 1], started), deadline=20) as c:
        t0 = trio.current_time()
        async with trio.open_nursery() as n:
            n.start_soon(at, t0, c.after_batch, res, 1)
            n.start_soon(at, t0 + 21, c.after_batch, res, 2)  # scan 1 still running, late
            n.start_soon(at, t0 + 33, c.after_batch, res, 3)  # scan 2 running (late)
        assert res[1][0].missed and res[1][1] == pytest.approx(t0 + 20)
        assert res[2][0].missed and res[2][1] == pytest.approx(t0 + 21)  # not held
        assert res[3][0].missed and res[3][1] == pytest.approx(t0 + 33)  # not held
        assert [res[k][0].scan_id for k in (1, 2, 3)] == [1, 2, 3]
    assert started == pytest.approx([t0, t0 + 30, t0 + 40])
    finished = [e["scan"] for e in c.events if e["event"] == "scan-finished"]
    assert finished == [1, 2, 3]
    assert c.status["last_scan"]["scan"] == 3 and not c.running_late


@pytest.mark.trio
async def test_running_late_until_the_newest_late_scan_settles(root: Path, autojump_clock):
    started: list[float] = []
    async with open_scan_coordinator(make_scan(root, [30, 15], started), deadline=20) as c:
        t0 = trio.current_time()
        assert (await c.after_batch()).missed  # scan 1 late at t0+20
        await trio.sleep_until(t0 + 25)
        assert (await c.after_batch()).missed  # scan 2 queued behind it
        await trio.sleep_until(t0 + 31)  # scan 1 settled; scan 2 runs until t0+45
        assert c.running_late
        # Scan 1 recorded its outcome as an event, but not on status: scan 2 is newer.
        assert any(e["event"] == "scan-finished" and e["scan"] == 1 for e in c.events)
        assert c.status["last_scan"] is None
        r = await c.after_batch()  # a batch now is still not held
        assert r.missed and trio.current_time() == pytest.approx(t0 + 31)


@pytest.mark.trio
async def test_incomplete_regions_reach_status_and_events(root: Path, autojump_clock):
    (root / "link").symlink_to("/etc")
    async with open_scan_coordinator(make_scan(root, [1], []), deadline=20) as c:
        r = await c.after_batch()
    assert not r.missed and r.outcome is not None
    assert ["link", "symlink (following is off)"] in c.status["last_scan"]["incomplete"]
    assert any(e["event"] == "scan-incomplete" for e in c.events)


@pytest.mark.trio
async def test_stop_drains_then_refuses(root: Path, autojump_clock):
    started: list[float] = []
    async with open_scan_coordinator(make_scan(root, [30, 30], started), deadline=5) as c:
        await c.after_batch()
        await c.after_batch()  # queued behind the first
        await c.stop()
        assert len(started) == 2
        assert [e["scan"] for e in c.events if e["event"] == "scan-finished"] == [1, 2]
        assert c.status["last_scan"]["scan"] == 2
        with pytest.raises(MemfsError, match="memfs has stopped"):
            await c.after_batch()


@pytest.mark.trio
async def test_a_failing_scan_is_an_outcome(autojump_clock):
    async def broken() -> ScanOutcome:
        raise OSError("backing root vanished")

    async with open_scan_coordinator(broken, deadline=5) as c:
        r = await c.after_batch()
    assert not r.missed and r.outcome is not None and not r.outcome.finished
    assert "vanished" in (r.outcome.error or "")
