"""`--auto-materialize`: a bare materialize of each such mount after each group commit that
changed it, and once at start (drafts a stop or a crash left owed).

A background task of the daemon (`run`, in memfs.backing.tasks' watcher scope; a round is
shielded, so a stop never cuts a push in half). Owns, on the trio loop: per mount the (mount
node id, ver) the last round covered, the outcome of the last round (status), the mounts with
a round running, the nodes a round left for their writer's close (close-to-open), and the
mounts whose last round found no root to write to (tried again every AUTO_RETRY s: a drive
plugged back in makes no commit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from memfs.backing.binding import Bindings
from memfs.backing.events import Events
from memfs.backing.gate import Gate
from memfs.backing.materialize import Materializer
from memfs.backing.results import MaterializeDone, NotDecided
from memfs.backing.storeview import StoreView
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")

AUTO_RETRY = 2.0  # seconds before an auto round that found the root away is tried again
AfterChange = Callable[[], Awaitable[None]]


class AutoMaterialize:
    def __init__(self, ws: Workspace, bindings: Bindings, view: StoreView, gate: Gate,
                 materializer: Materializer, events: Events) -> None:
        self.ws = ws
        self.bindings = bindings
        self.view = view
        self.gate = gate
        self.materializer = materializer
        self.events = events
        self.seen: dict[str, tuple[int, int]] = {}
        self.last: dict[str, dict[str, object]] = {}  # mount -> the last round's outcome
        self.running: set[str] = set()
        self.held: set[int] = set()  # nodes a round left for their writer's close
        self._wake = trio.Event()
        self._retry: set[str] = set()

    def status(self, mount: str) -> dict[str, object]:
        return {"last": self.last.get(mount), "running": mount in self.running}

    def writer_closed(self, node: Node, mount: str | None) -> None:
        """The last writable descriptor of `node` closed: a round it was left for runs."""
        if node.id in self.held:
            self.held.discard(node.id)
            if mount is not None:
                self.seen.pop(mount, None)
            self._wake.set()

    def forget(self, mount: str) -> None:
        self.seen.pop(mount, None)

    async def run(self, after_change: AfterChange) -> None:
        """Commits that come while one round runs are taken together by the next round."""
        seen = -1
        while True:
            if seen >= 0:
                # A round that found the root away is tried again without waiting for a
                # change: the drive coming back makes no commit.
                self._retry &= set(self.bindings.bindings)  # a detached mount is owed nothing
                await self._wait(seen, AUTO_RETRY if self._retry else float("inf"))
            seen = self.ws.commit_count
            ran = False
            for mount, b in list(self.bindings.bindings.items()):
                if b.auto_materialize and self._changed(mount):
                    ran = True
                    with trio.CancelScope(shield=True):  # stop never cuts a push in half
                        await self._round(mount)
            if ran:
                await after_change()

    async def _wait(self, seen: int, timeout: float) -> None:
        """Until a commit beyond `seen`, a writer closing a file a round held back, or the
        timeout."""
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                async def first(wait: Callable[[], Awaitable[object]]) -> None:
                    await wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(first, lambda: self.ws.wait_for_commit(seen))
                nursery.start_soon(first, self._wake.wait)
        self._wake = trio.Event()

    def _changed(self, mount: str) -> bool:
        node = self.view.mount_node(mount)
        key = None if node is None else (node.id, node.ver)
        return key is not None and self.seen.get(mount) != key

    async def _round(self, mount: str) -> None:
        # What this round covers is the tree as it is now: a change made while the round runs
        # has a newer version and starts the next round (this round's own adoptions start one
        # too, which then finds nothing owed).
        node = self.view.mount_node(mount)
        if node is not None:
            self.seen[mount] = (node.id, node.ver)
        self.running.add(mount)
        res: MaterializeDone | NotDecided | None = None
        error = None
        try:
            with self.gate.admitted():
                async with self.gate.lock(mount):
                    res = await self.materializer.locked(mount, None, False, False,
                                                         held=self.held)
        except Exception as exc:  # noqa: BLE001 - the loop goes on; status and events say why
            log.warning("auto-materialize of %s failed: %s", mount, exc)
            error = str(exc)
            self.events.record("write-failed", mount=mount, path=None, reason=error)
        finally:
            self.running.discard(mount)
        if isinstance(res, NotDecided) and (res.unavailable or res.incomplete):
            self.seen.pop(mount, None)  # nothing was written: this tree is still owed
            self._retry.add(mount)
        else:
            self._retry.discard(mount)
        done = res if isinstance(res, MaterializeDone) else None
        refused = (res.refused or res.unavailable) if isinstance(res, NotDecided) else \
            done.refused if done is not None else None
        self.last[mount] = {
            "time": time.time(), "branch": done.branch if done else None,
            "written": done.written if done else [],
            "skipped": len(done.skipped) if done else 0,
            "failed": len(done.failed) if done else 0,
            "refused": refused or error,
            "disk_errors": _disk_errors(done)}


def _disk_errors(done: MaterializeDone | None) -> list[dict[str, str]]:
    """The writes the backing disk failed (full, read-only, an I/O error) and those not known
    durable: nobody reads an automatic round's output, so status names them."""
    if done is None:
        return []
    return ([{"path": s["path"], "reason": s["reason"], "remedy": s["remedy"]}
             for s in done.skipped if s["state"] == "disk-error"]
            + [{"path": f["path"], "reason": f["message"], "remedy": f["remedy"]}
               for f in done.failed])


__all__ = ["AUTO_RETRY", "AutoMaterialize"]
