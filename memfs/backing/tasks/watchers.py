"""fs-events watchers and the unavailable-root poll: background tasks of the daemon.

`FsEventsWatchers.run` keeps one inotify watcher per `watch=fs-events` binding (started and
stopped as bindings come and go); events only choose what to observe again. `RootPoll.run`
looks at every unavailable root every ROOT_POLL s and says when it is back. Both run on the
trio loop in memfs.backing.tasks' watcher scope, which `stop()` cancels first; a pass they
started is shielded, so it finishes. Their only state is a watcher's own (memfs.reconcile.watch)
and the mounts' `watch_error`, `unavailable` (memfs.backing.states).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable

import trio

from memfs.backing.binding import Binding, Bindings
from memfs.backing.events import Events
from memfs.backing.passes import ROOT_POLL
from memfs.backing.states import States
from memfs.backing.status import WATCH_REMEDY
from memfs.errors import MemfsError
from memfs.reconcile.watch import Watcher, narrow
from memfs.store.journal import Journal

log = logging.getLogger("memfs.backing")

WATCH_POLL = 0.5  # how often the watcher supervisor looks at the bindings
WATCH_COALESCE = 0.05  # events arriving together make one pass
WATCH_RETRY = 5.0  # seconds before a watcher the kernel refused is tried again
WATCH_MAX_SCOPES = 16  # more dirty scopes than this: their parents, then a full pass
AfterChange = Callable[[], Awaitable[None]]
RunPass = Callable[[str, str], Awaitable[object]]


class FsEventsWatchers:
    def __init__(self, bindings: Bindings, states: States, events: Events, run_pass: RunPass,
                 after_change: AfterChange) -> None:
        self.bindings = bindings
        self.states = states
        self.events = events
        self.run_pass = run_pass
        self.after_change = after_change

    async def run(self) -> None:
        running: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            while True:
                for mount, b in self.bindings.bindings.items():
                    if b.watch == "fs-events" and mount not in running:
                        running[mount] = await nursery.start(self._watch, b)
                for mount in list(running):
                    b2 = self.bindings.get(mount)
                    if b2 is None or b2.watch != "fs-events":
                        running.pop(mount).cancel()
                await trio.sleep(WATCH_POLL)

    async def _watch(self, b: Binding,
                     task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
                     ) -> None:
        """An overflow, a moved root or a full watch table means a full pass (and a new
        watcher, for a root that came back)."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                watcher = await self._start_watcher(b)
                if watcher is None:
                    await trio.sleep(WATCH_RETRY)
                    continue
                try:
                    await self._follow(b, watcher)
                finally:
                    watcher.close()
                await self._passes(b.mount, [""])

    async def _follow(self, b: Binding, watcher: Watcher) -> None:
        """Passes over what the watcher reports, until it needs replacing."""
        while True:
            with trio.move_on_after(WATCH_POLL * 5) as idle:
                await trio.lowlevel.wait_readable(watcher.fileno())
            if idle.cancelled_caught:
                st = self.states.get(b.mount)
                if st is not None and st.unavailable is not None:
                    return  # the root may be back: watch it afresh, observe it
                continue
            await trio.sleep(WATCH_COALESCE)
            dirty = watcher.read()
            scopes = [""] if dirty.full else narrow(dirty.paths)
            if len(scopes) > WATCH_MAX_SCOPES:
                scopes = narrow({p.rpartition("/")[0] for p in scopes})
                if len(scopes) > WATCH_MAX_SCOPES:
                    scopes = [""]
            await self._passes(b.mount, scopes)
            if dirty.full:
                return

    async def _start_watcher(self, b: Binding) -> Watcher | None:
        """A new inotify watcher, or None when the kernel refuses one (EMFILE: the instance
        limit; ENOMEM): that is shown on status (`watch_error`) and as an event, and tried
        again, never an error that ends the daemon."""
        st = self.states.of(b.mount)
        try:
            watcher = await trio.to_thread.run_sync(Watcher, b.dir)
        except OSError as exc:
            error = f"fs-events watcher could not start: {exc.strerror or exc}"
            if st.watch_error != error:
                log.warning("mount %s: %s", b.mount, error)
                self.events.record("watch-failed", mount=b.mount, error=error,
                                   remedy=WATCH_REMEDY)
            st.watch_error = error
            return None
        st.watch_error = None
        return watcher

    async def _passes(self, mount: str, scopes: list[str]) -> None:
        for scope in scopes:
            try:
                with trio.CancelScope(shield=True):  # stopping the watcher never cuts a pass
                    await self.run_pass(mount, scope)
            except Exception as exc:  # noqa: BLE001 - the watcher goes on; status says why
                log.warning("fs-events pass of %s/%s failed: %s", mount, scope, exc)
                self.states.of(mount).last_error = str(exc)
        await self.after_change()


class RootPoll:
    """An unavailable root is looked at every ROOT_POLL s: once the directory disk agreed
    with is back at its path, the mount is available again (status said UNAVAILABLE until an
    access happened to run a pass) and a `root-available` event says so; an fs-events mount,
    whose watcher saw nothing while it was away, is observed at once. A replaced root stays
    unavailable until `memfs sync --accept-root`."""

    def __init__(self, bindings: Bindings, states: States, events: Events, journal: Journal,
                 run_pass: RunPass, after_change: AfterChange) -> None:
        self.bindings = bindings
        self.states = states
        self.events = events
        self.journal = journal
        self.run_pass = run_pass
        self.after_change = after_change

    async def run(self) -> None:
        while True:
            await trio.sleep(ROOT_POLL)
            for mount, b in list(self.bindings.bindings.items()):
                st = self.states.get(mount)
                if st is None or st.unavailable is None:
                    continue
                if not await trio.to_thread.run_sync(self._root_back, b):
                    continue
                st.unavailable = None
                self.events.record("root-available", mount=mount, dir=b.dir)
                if b.watch == "fs-events":
                    try:
                        await self.run_pass(mount, "")
                        await self.after_change()
                    except MemfsError as exc:
                        log.warning("pass after the root of %s came back failed: %s", mount,
                                    exc)

    def _root_back(self, b: Binding) -> bool:
        """Is the directory disk last agreed with at b.dir again (any directory, before the
        first evidence recorded one)? Worker thread."""
        try:
            st = os.stat(b.dir)
            recorded = self.journal.root(b.mount)
        except (OSError, MemfsError):
            return False
        return stat.S_ISDIR(st.st_mode) and (
            recorded is None or tuple(recorded) == (st.st_dev, st.st_ino))


__all__ = ["FsEventsWatchers", "RootPoll", "WATCH_MAX_SCOPES", "WATCH_POLL"]
