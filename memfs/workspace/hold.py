"""Holding new changes to the live tree off while a history operation finishes.

An undo, restore or branch switch moves the store's branch head (a transaction in a worker
thread: the store's writer may be held by a GC or another process) and then replaces the live
tree (on the loop). No change may land in between, or the replacement would drop it. So the
operation closes the hold before its last commit and opens it once the tree is replaced; every
change to the live tree waits for it to open first (`Workspace.before_change` for the FUSE
layer's requests, `Workspace.changes_open` for the backing layer's passes), with no await
between that wait and the change. Reads, getattr and readdir never wait: they see the tree as
it was until the replacement, which happens in one loop turn.

`Workspace._writable` checks that the hold is open at the start of every change, before
anything moved, so a change that skipped the wait is refused (EIO, logged as a bug) instead of
being lost with the old tree.

Loop thread only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import trio


class ChangeHold:
    def __init__(self) -> None:
        self._open: trio.Event | None = None  # set when the hold opens; None while open
        self.by = ""  # the history operation holding changes off (status shows it)
        self._since = 0.0

    @property
    def held(self) -> bool:
        return self._open is not None

    def status(self) -> dict[str, object] | None:
        """What `.memfs/status` says while changes wait: which operation, for how long."""
        if self._open is None:
            return None
        return {"by": self.by, "seconds": round(time.monotonic() - self._since, 3)}

    async def wait(self) -> None:
        """Return once no history operation holds changes off (at once if none does)."""
        while self._open is not None:
            await self._open.wait()

    @contextlib.contextmanager
    def holding(self, by: str) -> Iterator[None]:
        """Changes wait while the block runs (one history operation at a time: the commit
        lock serializes them)."""
        assert self._open is None, "history operations hold changes one at a time"
        self._open, self.by, self._since = trio.Event(), by, time.monotonic()
        try:
            yield
        finally:
            opened, self._open, self.by = self._open, None, ""
            opened.set()


__all__ = ["ChangeHold"]
