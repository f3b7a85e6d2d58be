"""Telling the kernel to forget names and inodes changed behind its back (an undo, a restore,
a branch switch, a backing pass).

Owns the queue of what is still to be told. The workspace queues on the loop
(Workspace.invalidate); `drain` sends, from a worker thread, only what the kernel may hold
(pyfuse3's invalidate calls block on the kernel, which may be waiting for this very loop).
The lookup counts it filters by are MemfsOperations.lookups.
"""

from __future__ import annotations

import pyfuse3
import trio

from memfs.workspace.nodes import ROOT_ID

Entries = list[tuple[int, bytes]]


class Invalidations:
    def __init__(self, lookups: dict[int, int]) -> None:
        self._lookups = lookups  # the kernel's references by inode (shared, loop-written)
        self._pending: list[tuple[Entries, list[int]]] = []

    def queue(self, entries: Entries, inodes: list[int]) -> None:
        self._pending.append((entries, inodes))

    async def drain(self) -> None:
        """Tell the kernel to forget what changed behind it, from a worker thread."""
        while self._pending:
            entries, inodes = self._pending.pop(0)
            known = [i for i in inodes if self._lookups.get(i)]
            known_entries = [(p, n) for p, n in entries if self._lookups.get(p) or p == ROOT_ID]
            await trio.to_thread.run_sync(_invalidate, known_entries, known)


def _invalidate(entries: Entries, inodes: list[int]) -> None:
    for parent, name in entries:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except (FileNotFoundError, OSError):
            pass
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino)
        except (FileNotFoundError, OSError):
            pass
