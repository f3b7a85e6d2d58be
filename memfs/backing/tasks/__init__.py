"""The daemon's background work for backing directories, as tasks started in one nursery.

`BackgroundTasks.run(after_change)` (the daemon's, until cancelled) opens the after-batch
coordinator in its own nursery, and, inside a cancel scope of their own, the fs-events
watchers (memfs.backing.tasks.watchers), the unavailable-root poll and the auto-materialize
loop (memfs.backing.tasks.automaterialize). `stop()` cancels that scope first, so nothing new
is generated (a pass a watcher started finishes: passes are shielded), then lets the
after-batch scans queued and running settle. `after_change` tells the kernel (the FUSE layer's
invalidation drain). Loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from memfs.backing.tasks.afterbatch import AfterBatch
from memfs.backing.tasks.automaterialize import AutoMaterialize
from memfs.backing.tasks.watchers import FsEventsWatchers, RootPoll

AfterChange = Callable[[], Awaitable[None]]


class BackgroundTasks:
    def __init__(self, after_batch: AfterBatch, auto: AutoMaterialize,
                 watchers: Callable[[AfterChange], FsEventsWatchers],
                 roots: Callable[[AfterChange], RootPoll]) -> None:
        self.after_batch = after_batch
        self.auto = auto
        self._watchers = watchers
        self._roots = roots
        self._scope = trio.CancelScope()
        self._done = trio.Event()

    async def run(self, after_change: AfterChange) -> None:
        async with trio.open_nursery() as nursery:
            # The coordinator's scans run in this nursery, outside the watchers' scope, so
            # stopping the watchers never cuts a scan an agent is waiting for.
            self.after_batch.open(nursery, after_change)
            try:
                with self._scope:
                    async with trio.open_nursery() as watchers:
                        watchers.start_soon(self.auto.run, after_change)
                        watchers.start_soon(self._watchers(after_change).run)
                        watchers.start_soon(self._roots(after_change).run)
                self._done.set()
                await trio.sleep_forever()
            finally:
                self._done.set()
                self.after_batch.close()

    async def stop(self) -> None:
        """Watchers first, then the after-batch scans queued and running."""
        self._scope.cancel()
        coord = self.after_batch.coordinator
        if coord is not None:
            await self._done.wait()
            await coord.stop()


__all__ = ["BackgroundTasks"]
