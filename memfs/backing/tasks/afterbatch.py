"""After-batch scans (`--watch on-agent-action`): `memfs after-batch` before an agent goes on.

In the daemon, batches go through one memfs.reconcile.afterbatch.ScanCoordinator (shared
scans, a deadline), opened in the nursery of memfs.backing.tasks, which owns its background
scans (a clean stop lets them settle first). Without one (a daemon-less workspace) a batch
runs one scan directly. Owns, on the trio loop: the coordinator while the daemon's tasks run,
the number of scans run, and the last direct scan's outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from memfs.backing.binding import AGENT_WATCH, DEFAULT_SCAN_DEADLINE, Binding, Bindings
from memfs.backing.events import Events
from memfs.backing.results import NotDecided, PassDone, PassOutcome
from memfs.reconcile.afterbatch import ScanCoordinator, ScanOutcome
from memfs.testing import scan_delay

AfterChange = Callable[[], Awaitable[None]]
RunPass = Callable[[str, str], Awaitable[PassOutcome]]
Json = dict[str, object]


def _outcome_json(o: ScanOutcome) -> Json:
    return {"finished": o.finished, "incomplete": [list(r) for r in o.incomplete],
            "error": o.error}


class AfterBatch:
    def __init__(self, bindings: Bindings, events: Events, run_pass: RunPass) -> None:
        self.bindings = bindings
        self.events = events
        self.run_pass = run_pass
        self.coordinator: ScanCoordinator | None = None
        self.after_change: AfterChange | None = None
        self.scans_run = 0
        self._last_direct: Json | None = None
        self.scan_delay: Callable[[], float] = scan_delay  # the tests' shim

    def open(self, nursery: trio.Nursery, after_change: AfterChange) -> None:
        """The daemon's coordinator, whose scans run in `nursery`."""
        self.after_change = after_change
        self.coordinator = ScanCoordinator(nursery, self.scan, deadline=DEFAULT_SCAN_DEADLINE,
                                           on_event=self._coordinator_event)

    def close(self) -> None:
        self.coordinator = None

    def status(self, b: Binding) -> Json | None:
        if b.watch != AGENT_WATCH:
            return None
        coord = self.coordinator
        return {"count": self.scans_run, "deadline": b.scan_deadline,
                "running_late": bool(coord and coord.running_late),
                "last_scan": coord.status["last_scan"] if coord else self._last_direct,
                "last_miss": coord.status["last_miss"] if coord else None}

    async def after_batch(self, agent: str | None = None) -> Json:
        """Scan every on-agent-action mount before the agent goes on, through the coordinator
        (shared, deadline-bounded); without one, one scan directly."""
        mounts = self.bindings.agent_mounts()
        reply: Json = {"agent": agent, "mounts": mounts, "scan": None,
                       "missed": False, "miss": None, "outcome": None}
        if not mounts:
            return reply
        coord = self.coordinator
        if coord is None:
            self.events.record("scan-started", scan=None, mounts=mounts, agent=agent)
            outcome = await self.scan()
            self._last_direct = {"scan": None, **_outcome_json(outcome), "late": False}
            self.events.record("scan-finished", scan=None, mounts=mounts,
                               finished=outcome.finished, late=False)
            if outcome.incomplete:
                self.events.record("scan-incomplete", scan=None, mounts=mounts,
                                   regions=[list(r) for r in outcome.incomplete])
            reply["outcome"] = _outcome_json(outcome)
            return reply
        # One coordinator serves every such mount: a batch waits only as long as the
        # smallest of their deadlines allows.
        coord.deadline = min(self.bindings.bindings[m].scan_deadline for m in mounts)
        res = await coord.after_batch()
        reply.update(scan=res.scan_id, missed=res.missed,
                     miss=coord.status["last_miss"] if res.missed else None,
                     outcome=None if res.outcome is None else _outcome_json(res.outcome))
        return reply

    async def scan(self) -> ScanOutcome:
        """One scan: a full pass of each on-agent-action mount, its regions as incomplete."""
        self.scans_run += 1
        delay = self.scan_delay()
        if delay > 0:
            await trio.sleep(delay)
        incomplete: list[tuple[str, str]] = []
        errors: list[str] = []
        for mount in self.bindings.agent_mounts():
            try:
                r = await self.run_pass(mount, "")
            except Exception as exc:  # noqa: BLE001 - one mount's failure is the scan's outcome
                errors.append(f"{mount}: {exc}")
                continue
            if isinstance(r, NotDecided):
                errors.append(f"{mount}: {r.unavailable or r.incomplete or r.refused}")
            elif r.incomplete:
                errors.append(f"{mount}: {r.incomplete}")
            if isinstance(r, PassDone):
                incomplete += [(f"{mount}/{g.path}", g.reason) for g in r.regions]
        if self.after_change is not None:
            await self.after_change()  # a late scan's changes reach the kernel too
        return ScanOutcome(finished=not errors, incomplete=tuple(incomplete),
                           error="; ".join(errors) or None)

    def _coordinator_event(self, ev: dict[str, object]) -> None:
        fields = {k: v for k, v in ev.items() if k not in ("event", "at")}
        self.events.record(str(ev["event"]), mounts=self.bindings.agent_mounts(), **fields)


__all__ = ["AfterBatch"]
