"""Letting the kernel forget history views no process stands in, before GC decides what to keep.

A view under `.memfs/` (a past commit, a branch, a checkpoint) pins its tree from GC while the
kernel may still reach it (memfs.workspace.lifecycle.pins_of). After `find` or `grep -r` walked
history and exited, the kernel keeps those dentries cached until memory pressure, so a deleted
file's bytes would stay "live" for as long. Before a GC run (and `memfs du`) this module tells
the kernel to drop the cached names of every view that nothing holds, then waits briefly for
its FORGETs, so only what a process still uses is kept.

What "holds" means here: an open file or directory handle below the view (the FUSE layer
counts them), or a process whose working directory or root is inside it (read from
/proc/PID/cwd and /proc/PID/root). A cwd must not be invalidated: the dentry would be
unhashed and getcwd() in that shell would fail. Processes this daemon may not inspect (other
users', when not root) are not seen; their cwd inside a view may then read as deleted.

Owns the map of where each view root was shown (parent inode, name); loop thread, except the
/proc scan and the kernel calls, which run in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import pyfuse3
import trio

from memfs.workspace.nodes import Node
from memfs.workspace.workspace import Workspace

FORGET_WAIT = 1.0  # s: how long a GC run waits for the kernel's FORGETs of released views
POLL = 0.01


class ViewEntries:
    """Where each view root was last handed to the kernel: (parent inode, name)."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self._shown: dict[int, tuple[int, bytes]] = {}

    def shown(self, parent_ino: int, name: bytes, node: object) -> None:
        """A lookup or listing in a .memfs directory answered `node`: if it is a view root,
        remember the name it has there."""
        if isinstance(node, Node) and node.id in self.ws._view_roots:
            self._shown[node.id] = (parent_ino, name)

    async def release(self, held: Callable[[], Iterable[Node]]) -> int:
        """Drop the kernel's cached names of the views nothing holds, and wait (at most
        FORGET_WAIT) until it has forgotten them. Returns how many views were released."""
        for gone in [v for v in self._shown if v not in self.ws._view_roots]:
            del self._shown[gone]
        where = self.ws.served_by.mountpoint if self.ws.served_by else None
        if not self._shown or not where:
            return 0
        busy = {_top(n).id for n in held()}
        for ino in await trio.to_thread.run_sync(_standing_in, where):
            if (node := self.ws.nodes.get(ino)) is not None:
                busy.add(_top(node).id)
        free = {v: e for v, e in self._shown.items() if v not in busy}
        if not free:
            return 0
        await trio.to_thread.run_sync(_invalidate, list(free.values()))
        with trio.move_on_after(FORGET_WAIT):
            while any(v in self.ws._view_roots for v in free):
                await trio.sleep(POLL)
        return len(free)


def _standing_in(mountpoint: str) -> set[int]:
    """Worker thread: the inode numbers of the directories under `mountpoint`/.memfs that
    processes have as working directory or root. Only readlink touches /proc (a stat of
    /proc/PID/cwd would reach into any filesystem, a hung one too); what points into this
    mount's .memfs is then stat'ed here, answered by this daemon's loop."""
    inside = os.path.join(mountpoint, ".memfs") + os.sep
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for link in ("cwd", "root"):
            try:
                path = os.readlink(f"/proc/{pid}/{link}")
                if path.startswith(inside):
                    found.add(os.stat(path).st_ino)
            except OSError:  # gone, not ours to inspect, or no longer there
                continue
    return found


def _top(node: Node) -> Node:
    while node.parent is not None:
        node = node.parent
    return node


def _invalidate(entries: list[tuple[int, bytes]]) -> None:
    """Worker thread: the kernel drops each name and its unused dentries below."""
    for parent, name in entries:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except OSError:  # already gone from the kernel's cache
            pass
