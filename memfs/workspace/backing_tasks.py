"""The daemon's background work for backing directories: fs-events watchers, the
auto-materialize loop, after-batch scans, and the clean stop that ends them.

A mixin of memfs.workspace.backing.Backing, kept apart because it is the part that runs on
its own (started by the daemon in `run_watchers`) rather than when asked: the passes,
materialize and the states it drives are Backing's. It uses Backing's attributes and methods
(`bindings`, `mounts`, `run_pass`, `_materialize_locked`, `record_event`, ...).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import trio

from memfs.errors import MemfsError
from memfs.reconcile.afterbatch import ScanCoordinator, ScanOutcome
from memfs.reconcile.watch import Watcher, narrow

if TYPE_CHECKING:
    from memfs.workspace.backing import Binding

log = logging.getLogger("memfs.backing")

AGENT_WATCH = "on-agent-action"
DEFAULT_SCAN_DEADLINE = 20.0  # seconds an after-batch call waits for its scan
SCAN_DELAY_ENV = "MEMFS_TEST_SCAN_DELAY"  # fault-injection shim: seconds each scan sleeps first
AUTO_RETRY = 2.0  # seconds before an auto round that found the root away is tried again
ROOT_POLL = 2.0  # how often an unavailable root is looked at again
WATCH_POLL = 0.5  # how often the watcher supervisor looks at the bindings
WATCH_COALESCE = 0.05  # events arriving together make one pass
WATCH_RETRY = 5.0  # seconds before a watcher the kernel refused is tried again
WATCH_REMEDY = ("raise fs.inotify.max_user_instances (sysctl), or attach with --watch "
                "on-access; memfs tries again every 5 s")
WATCH_MAX_SCOPES = 16  # more dirty scopes than this: their parents, then a full pass


class DaemonTasks:
    """Backing's background work (see the module docstring)."""

    async def run_watchers(self, after_change: Callable[[], Awaitable[None]]) -> None:
        """The daemon's background work: one inotify watcher per `watch=fs-events` binding
        (started and stopped as bindings come and go), the auto-materialize loop and the one
        after-batch coordinator. Runs until cancelled; `stop()` ends the watchers first.
        `after_change` tells the kernel."""
        async with trio.open_nursery() as nursery:
            # The coordinator's scans run in this nursery, outside the watchers' scope, so
            # stopping the watchers never cuts a scan an agent is waiting for.
            self._after_change = after_change
            self.coordinator = ScanCoordinator(nursery, self._agent_scan,
                                               deadline=DEFAULT_SCAN_DEADLINE,
                                               on_event=self._coordinator_event)
            try:
                with self._watch_scope:
                    async with trio.open_nursery() as watchers:
                        watchers.start_soon(self._auto_materialize_loop, after_change)
                        watchers.start_soon(self._supervise_watchers, after_change)
                        watchers.start_soon(self._watch_roots, after_change)
                self._watchers_done.set()
                await trio.sleep_forever()
            finally:
                self._watchers_done.set()
                self.coordinator = None

    async def _supervise_watchers(self, after_change: Callable[[], Awaitable[None]]) -> None:
        running: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            while True:
                for mount, b in self.bindings.items():
                    if b.watch == "fs-events" and mount not in running:
                        running[mount] = await nursery.start(self._watch, b, after_change)
                for mount in list(running):
                    b = self.bindings.get(mount)
                    if b is None or b.watch != "fs-events":
                        running.pop(mount).cancel()
                await trio.sleep(WATCH_POLL)

    async def _watch_roots(self, after_change: Callable[[], Awaitable[None]]) -> None:
        """An unavailable root is looked at every ROOT_POLL s: once the directory disk agreed
        with is back at its path, the mount is available again (status said UNAVAILABLE until
        an access happened to run a pass) and a `root-available` event says so; an fs-events
        mount, whose watcher saw nothing while it was away, is observed at once. A replaced
        root stays unavailable until `memfs sync --accept-root`."""
        while True:
            await trio.sleep(ROOT_POLL)
            for mount, b in list(self.bindings.items()):
                st = self.mounts.get(mount)
                if st is None or st.unavailable is None:
                    continue
                if not await trio.to_thread.run_sync(self._root_back, b):
                    continue
                st.unavailable = None
                self.record_event("root-available", mount=mount, dir=b.dir)
                if b.watch == "fs-events":
                    try:
                        await self.run_pass(mount)
                        await after_change()
                    except MemfsError as exc:
                        log.warning("pass after the root of %s came back failed: %s", mount,
                                    exc)

    def _root_back(self, b: Binding) -> bool:
        """Is the directory disk last agreed with at b.dir again (any directory, before the
        first evidence recorded one)?"""
        try:
            st = os.stat(b.dir)
            recorded = self.journal.root(b.mount)
        except (OSError, MemfsError):
            return False
        return stat.S_ISDIR(st.st_mode) and (
            recorded is None or tuple(recorded) == (st.st_dev, st.st_ino))

    # -- clean stop ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Count a piece of backing work in, so `stop()` can drain it; refused once stopped."""
        if self.stopped:
            raise MemfsError("memfs has stopped", "mount the store again (`memfs mount`)")
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def stop(self) -> None:
        """Stop cleanly (seed 002's stop): watchers first, so no new work is generated; then
        the after-batch scans queued and running; then every admitted piece of work, until
        nothing new was admitted while draining; then refuse new work ("memfs has stopped")
        — with no await between the last empty check and the flag, so nothing slips in after
        the drain and before the caller saves its state."""
        self._watch_scope.cancel()
        if self.coordinator is not None:
            await self._watchers_done.wait()
            await self.coordinator.stop()
        while self._active:
            self._idle = trio.Event()
            await self._idle.wait()
        self.stopped = True

    # -- auto-materialize ---------------------------------------------------------------
    async def _auto_materialize_loop(self, after_change: Callable[[], Awaitable[None]]) -> None:
        """`--auto-materialize`: a bare materialize of each such mount after each group commit
        that changed it (and once at start, for drafts a stop or crash left owed). Commits
        that come while one runs are taken together by the next round."""
        seen = -1
        while True:
            if seen >= 0:
                # A round that found the root away is tried again without waiting for a
                # change: the drive coming back makes no commit.
                self._auto_retry &= set(self.bindings)  # a detached mount is owed nothing
                await self._auto_wait(seen, AUTO_RETRY if self._auto_retry else float("inf"))
            seen = self.ws.commit_count
            ran = False
            for mount, b in list(self.bindings.items()):
                if b.auto_materialize and self._changed_since_auto(mount):
                    ran = True
                    with trio.CancelScope(shield=True):  # stop never cuts a push in half
                        await self._auto_materialize_one(mount)
            if ran:
                await after_change()

    async def _auto_wait(self, seen: int, timeout: float) -> None:
        """Until a commit beyond `seen`, a writer closing a file a round held back, or the
        timeout."""
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                async def first(wait: Callable[[], Awaitable[object]]) -> None:
                    await wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(first, lambda: self.ws.wait_for_commit(seen))
                nursery.start_soon(first, self._auto_wake.wait)
        self._auto_wake = trio.Event()

    def _changed_since_auto(self, mount: str) -> bool:
        node = self._mount_node(mount)
        key = None if node is None else (node.id, node.ver)
        return key is not None and self._auto_seen.get(mount) != key

    async def _auto_materialize_one(self, mount: str) -> None:
        # What this round covers is the tree as it is now: a change made while the round runs
        # has a newer version and starts the next round (this round's own adoptions start one
        # too, which then finds nothing owed).
        node = self._mount_node(mount)
        if node is not None:
            self._auto_seen[mount] = (node.id, node.ver)
        self.auto_running.add(mount)
        try:
            with self._admitted():
                async with self._lock(mount):
                    res = await self._materialize_locked(mount, None, False, False, auto=True)
        except Exception as exc:  # noqa: BLE001 - the loop goes on; status and events say why
            log.warning("auto-materialize of %s failed: %s", mount, exc)
            res = {"error": str(exc)}
            self.record_event("write-failed", mount=mount, path=None, reason=str(exc))
        finally:
            self.auto_running.discard(mount)
        if res.get("unavailable") or res.get("incomplete"):
            self._auto_seen.pop(mount, None)  # nothing was written: this tree is still owed
            self._auto_retry.add(mount)
        else:
            self._auto_retry.discard(mount)
        self.auto_last[mount] = {
            "time": time.time(), "branch": res.get("branch"), "written": res.get("written", []),
            "skipped": len(res.get("skipped", [])), "failed": len(res.get("failed", [])),
            "refused": res.get("refused") or res.get("unavailable") or res.get("error")}

    # -- after-batch scans -----------------------------------------------------------------
    def _agent_mounts(self) -> list[str]:
        return sorted(m for m, b in self.bindings.items() if b.watch == AGENT_WATCH)

    async def after_batch(self, agent: str | None = None) -> dict:
        """`memfs after-batch`: scan every on-agent-action mount before the agent goes on,
        through the coordinator (shared, deadline-bounded); without one, one scan directly."""
        mounts = self._agent_mounts()
        reply: dict[str, object] = {"agent": agent, "mounts": mounts, "scan": None,
                                    "missed": False, "miss": None, "outcome": None}
        if not mounts:
            return reply
        coord = self.coordinator
        if coord is None:
            self.record_event("scan-started", scan=None, mounts=mounts, agent=agent)
            outcome = await self._agent_scan()
            self._last_direct_scan = {"scan": None, **_outcome_json(outcome), "late": False}
            self.record_event("scan-finished", scan=None, mounts=mounts,
                              finished=outcome.finished, late=False)
            if outcome.incomplete:
                self.record_event("scan-incomplete", scan=None, mounts=mounts,
                                  regions=[list(r) for r in outcome.incomplete])
            reply["outcome"] = _outcome_json(outcome)
            return reply
        # One coordinator serves every such mount: a batch waits only as long as the
        # smallest of their deadlines allows.
        coord.deadline = min(self.bindings[m].scan_deadline for m in mounts)
        res = await coord.after_batch()
        reply.update(scan=res.scan_id, missed=res.missed,
                     miss=coord.status["last_miss"] if res.missed else None,
                     outcome=None if res.outcome is None else _outcome_json(res.outcome))
        return reply

    async def _agent_scan(self) -> ScanOutcome:
        """One scan: a full pass of each on-agent-action mount, its regions as incomplete."""
        self.scans_run += 1
        delay = float(os.environ.get(SCAN_DELAY_ENV) or 0)
        if delay > 0:
            await trio.sleep(delay)
        incomplete: list[tuple[str, str]] = []
        errors: list[str] = []
        for mount in self._agent_mounts():
            try:
                r = await self.run_pass(mount)
            except Exception as exc:  # noqa: BLE001 - one mount's failure is the scan's outcome
                errors.append(f"{mount}: {exc}")
                continue
            if r.get("unavailable"):
                errors.append(f"{mount}: {r['unavailable']}")
            if r.get("incomplete") or r.get("refused"):
                errors.append(f"{mount}: {r.get('incomplete') or r.get('refused')}")
            incomplete += [(f"{mount}/{g['path']}", g["reason"]) for g in r.get("regions", [])]
        if self._after_change is not None:
            await self._after_change()  # a late scan's changes reach the kernel too
        return ScanOutcome(finished=not errors, incomplete=tuple(incomplete),
                           error="; ".join(errors) or None)

    def _coordinator_event(self, ev: dict[str, object]) -> None:
        fields = {k: v for k, v in ev.items() if k not in ("event", "at")}
        self.record_event(str(ev["event"]), mounts=self._agent_mounts(), **fields)

    async def _watch(self, b: Binding, after_change: Callable[[], Awaitable[None]],
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Events only choose what to observe again; an overflow, a moved root or a full
        watch table means a full pass (and a new watcher, for a root that came back)."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                watcher = await self._start_watcher(b)
                if watcher is None:
                    await trio.sleep(WATCH_RETRY)
                    continue
                try:
                    while True:
                        with trio.move_on_after(WATCH_POLL * 5) as idle:
                            await trio.lowlevel.wait_readable(watcher.fileno())
                        if idle.cancelled_caught:
                            st = self.mounts.get(b.mount)
                            if st is not None and st.unavailable is not None:
                                break  # the root may be back: watch it afresh, observe it
                            continue
                        await trio.sleep(WATCH_COALESCE)
                        dirty = watcher.read()
                        scopes = [""] if dirty.full else narrow(dirty.paths)
                        if len(scopes) > WATCH_MAX_SCOPES:
                            scopes = narrow({p.rpartition("/")[0] for p in scopes})
                            if len(scopes) > WATCH_MAX_SCOPES:
                                scopes = [""]
                        await self._passes(b.mount, scopes, after_change)
                        if dirty.full:
                            break
                finally:
                    watcher.close()
                await self._passes(b.mount, [""], after_change)

    async def _start_watcher(self, b: Binding) -> Watcher | None:
        """A new inotify watcher, or None when the kernel refuses one (EMFILE: the instance
        limit; ENOMEM): that is shown on status (`watch_error`) and as an event, and tried
        again, never an error that ends the daemon."""
        st = self._state(b.mount)
        try:
            watcher = await trio.to_thread.run_sync(Watcher, b.dir)
        except OSError as exc:
            error = f"fs-events watcher could not start: {exc.strerror or exc}"
            if st.watch_error != error:
                log.warning("mount %s: %s", b.mount, error)
                self.record_event("watch-failed", mount=b.mount, error=error,
                                  remedy=WATCH_REMEDY)
            st.watch_error = error
            return None
        st.watch_error = None
        return watcher

    async def _passes(self, mount: str, scopes: list[str],
                      after_change: Callable[[], Awaitable[None]]) -> None:
        for scope in scopes:
            try:
                with trio.CancelScope(shield=True):  # stopping the watcher never cuts a pass
                    await self.run_pass(mount, scope)
            except Exception as exc:  # noqa: BLE001 - the watcher goes on; status says why
                log.warning("fs-events pass of %s/%s failed: %s", mount, scope, exc)
                self._state(mount).last_error = str(exc)
        await after_change()


def _outcome_json(o: ScanOutcome) -> dict:
    return {"finished": o.finished, "incomplete": [list(r) for r in o.incomplete],
            "error": o.error}


