"""Admission of backing work: per-mount locks, the count of work in flight, the clean stop.

Owns, on the trio loop: one trio.Lock per mount (a pass, a materialize, a detach or a reopen
of that mount runs under it; on-access never waits for it), the number of admitted pieces of
work, and `stopped`. `stop()` (the daemon's, once the kernel's mount has ended) waits until a
check finds nothing admitted, then refuses new work with no await between the check and the
flag, so nothing slips in after the drain and before the caller saves its state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import trio

from memfs.errors import MemfsError


class Gate:
    def __init__(self) -> None:
        self.stopped = False
        self._active = 0
        self._idle = trio.Event()
        self._locks: dict[str, trio.Lock] = {}

    def lock(self, mount: str) -> trio.Lock:
        return self._locks.setdefault(mount, trio.Lock())

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Count a piece of backing work in, so `drain()` waits for it; refused once stopped."""
        if self.stopped:
            raise MemfsError("memfs has stopped", "mount the store again (`memfs mount`)")
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def drain_and_stop(self) -> None:
        """Every admitted piece of work, and work admitted while draining, then refuse."""
        while self._active:
            self._idle = trio.Event()
            await self._idle.wait()
        self.stopped = True


__all__ = ["Gate"]
