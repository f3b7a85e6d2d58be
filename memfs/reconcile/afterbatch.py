"""After-tool-batch scans (`watch=on-agent-action`): coalescing, a deadline, late scans.

Why: an agent's shell tools change the backing directory behind memfs; scanning after each
batch of tool calls, before the agent continues, lets its next listing see those changes. But
a batch must not be held forever, and a burst of batches must not queue a burst of scans:

- one scan runs and at most one waits; batches that arrive while one waits share it;
- a batch waits for its scan up to the deadline (default 20 s); a miss is recorded on status
  and as an event, and the scan goes on in the background;
- while a scan that outlasted a deadline still runs, a later batch is not held: its miss is
  recorded at once and its scan comes after. The mount counts as running late until the
  newest late scan settles;
- each scan records its own outcome when it settles: on status only while it is the newest
  scan, and as an event either way, with the incomplete regions it reported;
- after `stop()` no new batch is taken ("memfs has stopped").

One coordinator per mount (or per set of on-agent-action mounts); it runs on trio and owns its
background scans in the nursery it is opened with.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from memfs.errors import MemfsError


@dataclass(frozen=True)
class ScanOutcome:
    """What a scan reports: whether it finished, and the regions it could not observe."""

    finished: bool = True
    incomplete: tuple[tuple[str, str], ...] = ()  # (path, reason)
    error: str | None = None


@dataclass
class _Scan:
    id: int
    done: trio.Event = field(default_factory=trio.Event)
    outcome: ScanOutcome | None = None
    late: bool = False  # some batch gave up waiting for it


@dataclass(frozen=True)
class BatchResult:
    scan_id: int
    missed: bool  # the deadline passed (or a late scan was running) before the scan settled
    outcome: ScanOutcome | None


class ScanCoordinator:
    def __init__(self, nursery: trio.Nursery, scan: Callable[[], Awaitable[ScanOutcome]], *,
                 deadline: float = 20.0,
                 on_event: Callable[[dict[str, object]], None] | None = None) -> None:
        self._nursery = nursery
        self._scan_fn = scan
        self.deadline = deadline
        self._on_event = on_event
        self._ids = itertools.count(1)
        self._running: _Scan | None = None
        self._waiting: _Scan | None = None
        self._newest = 0
        self._late_unsettled: set[int] = set()
        self._stopped = False
        self.events: list[dict[str, object]] = []
        self.status: dict[str, object] = {"last_scan": None, "last_miss": None}

    @property
    def running_late(self) -> bool:
        return bool(self._late_unsettled)

    def _event(self, kind: str, scan: _Scan, **extra: object) -> None:
        ev: dict[str, object] = {"event": kind, "scan": scan.id, "at": trio.current_time(),
                                 **extra}
        self.events.append(ev)
        if self._on_event is not None:
            self._on_event(ev)

    def _enqueue(self) -> _Scan:
        if self._waiting is None:
            self._waiting = _Scan(next(self._ids))
            self._newest = self._waiting.id
            if self._running is None:
                self._nursery.start_soon(self._pump)
        return self._waiting

    async def _pump(self) -> None:
        while self._waiting is not None:
            scan, self._waiting = self._waiting, None
            self._running = scan
            self._event("scan-started", scan)
            try:
                outcome = await self._scan_fn()
            except Exception as exc:  # a failing scan is an outcome, not a crash of the mount
                outcome = ScanOutcome(finished=False, error=f"{type(exc).__name__}: {exc}")
            scan.outcome = outcome
            self._running = None
            self._settle(scan)

    def _settle(self, scan: _Scan) -> None:
        outcome = scan.outcome
        assert outcome is not None
        record = {"scan": scan.id, "finished": outcome.finished, "late": scan.late,
                  "incomplete": [list(r) for r in outcome.incomplete], "error": outcome.error}
        if scan.id == self._newest:
            self.status["last_scan"] = record
        self._event("scan-finished", scan, finished=outcome.finished, late=scan.late)
        if outcome.incomplete:
            self._event("scan-incomplete", scan, regions=[list(r) for r in outcome.incomplete])
        self._late_unsettled.discard(scan.id)
        scan.done.set()

    def _miss(self, scan: _Scan, why: str) -> BatchResult:
        scan.late = True
        self._late_unsettled.add(scan.id)
        self.status["last_miss"] = {"scan": scan.id, "why": why, "at": trio.current_time()}
        self._event("scan-missed", scan, why=why)
        return BatchResult(scan.id, True, None)

    async def after_batch(self) -> BatchResult:
        """Called when an agent's tool batch completes; returns when its scan settled or the
        deadline passed."""
        if self._stopped:
            raise MemfsError("memfs has stopped", "start the mount again to scan after batches")
        scan = self._enqueue()
        if self.running_late and scan.id not in self._late_unsettled:
            return self._miss(scan, "an earlier scan is still running past its deadline")
        if scan.id in self._late_unsettled:
            return self._miss(scan, "this scan is queued behind one running past its deadline")
        with trio.move_on_after(self.deadline):
            await scan.done.wait()
        if not scan.done.is_set():
            return self._miss(scan, f"the scan did not finish within {self.deadline:g} s")
        return BatchResult(scan.id, False, scan.outcome)

    async def stop(self) -> None:
        """Take no new batch, then wait for queued and running scans to settle."""
        self._stopped = True
        while self._running is not None or self._waiting is not None:
            target = self._waiting or self._running
            assert target is not None
            await target.done.wait()


@asynccontextmanager
async def open_scan_coordinator(
    scan: Callable[[], Awaitable[ScanOutcome]], **kw: object
) -> AsyncIterator[ScanCoordinator]:
    """A coordinator whose background scans are owned by (and end with) this block."""
    async with trio.open_nursery() as nursery:
        coord = ScanCoordinator(nursery, scan, **kw)  # type: ignore[arg-type]
        try:
            yield coord
        finally:
            with trio.CancelScope(shield=True):
                await coord.stop()
