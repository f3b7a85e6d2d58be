"""What a FUSE request does first in a mount bound to a backing directory: observe what it
touches on disk (rate-limited in the workspace's backing hooks) and tell the kernel what that
observation changed behind it.

Owns nothing of its own beyond the references it is given: the workspace, and the queue of
invalidations (memfs.fs.invalidation). Runs on the trio loop only, from MemfsOperations'
handlers; a drain it starts runs as its own system task.
"""

from __future__ import annotations

import errno
import logging

import pyfuse3
import trio

from memfs.fs.invalidation import Invalidations
from memfs.workspace.hooks import BackingHooks
from memfs.workspace.nodes import DIR, Node
from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.fs")


class BackingAccess:
    def __init__(self, ws: Workspace, invalidations: Invalidations) -> None:
        self.ws = ws
        self.invalidations = invalidations

    def bound(self) -> BackingHooks | None:
        """The workspace's backing hooks when some mount is bound to a directory, else None:
        with nothing bound, its per-request hooks (observe on access, note a path's origin)
        have nothing to do, and skipping them saves a path walk on every lookup and create."""
        backing = self.ws.backing
        return backing if backing.bindings else None

    def disk_only(self, parent: Node, name: bytes) -> bool:
        """Is this name shown from disk only (read-only in the mount until it is taken in)?"""
        child = self.ws.children(parent).get(name) if parent.kind == DIR else None
        return child is not None and child.id in self.ws.disk_only

    async def on_access(self, node: Node, wait: bool, name: bytes | None = None) -> None:
        """Observe the scope first. Inside a lookup the kernel holds the parent's lock, so
        invalidating names under it must not be awaited there: the drain then runs as its
        own task."""
        if await self.ws.backing.on_access(node, name):
            if wait:
                await self.invalidations.drain()
            else:
                self.drain_later()

    async def observe_at_open(self, node: Node) -> None:
        """An open observes its file first (one contained stat against the fingerprint cache,
        rate-limited in backing.on_access), because the kernel keeps the name and attributes
        and sends no lookup. A disk change the rule takes replaces the file by a new node (new
        inode); the kernel resolved the path to the old one before this open, so the open
        answers ESTALE and the kernel walks the path once more, revalidating every name
        (LOOKUP_REVAL), and opens the new inode (or finds the name gone). A descriptor opened
        before for reading keeps the old bytes, as with a file replaced by rename on a local
        filesystem; one open for writing keeps the node in place (memfs.backing.applier)."""
        if node.parent is None:
            return  # already unlinked (an open through /proc/PID/fd): no path to observe
        if not await self.ws.backing.on_access(node):
            return
        self.drain_later()
        if node.parent is None:
            raise pyfuse3.FUSEError(errno.ESTALE)

    def drain_later(self) -> None:
        trio.lowlevel.spawn_system_task(self._drain_quietly)

    async def _drain_quietly(self) -> None:
        """A drain on its own (system) task: an error is logged, never ends the mount."""
        try:
            await self.invalidations.drain()
        except Exception:  # noqa: BLE001
            log.exception("invalidation after an on-access pass failed")
