"""This host's pins, published for the other hosts' garbage collection (memfs.store.pg.pins).

On a store in PostgreSQL a GC run on any host must keep what this daemon still shows or holds
open (memfs.workspace.lifecycle.pins_of). Every PUBLISH_EVERY seconds the loop computes that
set (a walk of the view roots and the open handles, no store call); when it changed, or its
published row is a quarter of its life old, a worker thread replaces the row. A failed
publish (the server away) is logged and tried at the next look; the row left behind keeps
what it named until it expires. A clean stop withdraws the row; a crash leaves it to expire.

On the embedded store one daemon owns the store and its own GC asks the loop directly, so
this does not run.

Loop thread; the publish and the withdrawal run in worker threads.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import trio

from memfs.store.pg import pins as host_pins
from memfs.workspace.lifecycle import pins_of

if TYPE_CHECKING:
    from memfs.store.pg.store import PgStore
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.pins")


class PinPublisher:
    def __init__(self, ws: Workspace, store: PgStore) -> None:
        self.ws = ws
        self.store = store
        self.hostname = socket.gethostname()
        self.ttl = host_pins.ttl()
        self.published: tuple[frozenset, frozenset] | None = None  # what the row says now
        self.published_at = 0.0  # trio clock
        self.failing: str | None = None  # the last publish's error, while it fails
        self._lock = trio.Lock()  # a publish in its thread ends before the withdrawal
        self._stopped = False

    async def run(self) -> None:
        """The daemon's background task (ends with the nursery)."""
        while True:
            await self.publish_if_due()
            await trio.sleep(host_pins.PUBLISH_EVERY)

    async def publish_if_due(self) -> None:
        async with self._lock:
            if not self._stopped:
                await self._publish_if_due()

    async def _publish_if_due(self) -> None:
        pins = pins_of(self.ws)
        key = (frozenset(pins.trees), frozenset(pins.refs))
        now = trio.current_time()
        if key == self.published and now - self.published_at < self.ttl / 4:
            return
        try:
            await trio.to_thread.run_sync(host_pins.publish, self.store, self.hostname, pins,
                                          self.ttl)
        except Exception as exc:  # noqa: BLE001 - the server away: the next look tries again
            if self.failing is None:
                log.warning("could not publish this host's pins for other hosts' GC: %s", exc)
            self.failing = str(exc)
            return
        self.failing = None
        self.published, self.published_at = key, now

    async def withdraw(self) -> None:
        """A clean stop: nothing here is shown or open any more."""
        async with self._lock:
            self._stopped = True
        try:
            await trio.to_thread.run_sync(host_pins.withdraw, self.store)
        except Exception as exc:  # noqa: BLE001 - the row expires on its own
            log.warning("could not withdraw this host's pins (they expire): %s", exc)
