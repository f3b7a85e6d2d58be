"""Handles open for writing across a tree replacement: which the replacement cut off.

An undo, restore, branch switch (or another host's commit followed after a takeover) replaces
the live tree. A handle open for writing on a file the new tree removed or holds another
version of would otherwise write into a node no tree names: its bytes vanish with success.
The history operation wins instead: such a handle is cut off, and the FUSE layer answers its
later write, fsync and truncate with ESTALE (reads go on answering what the node had). A
writer whose file the replacement kept as it was is left alone, and a handle open only for
reading is never cut off: nothing it does can land anywhere.

An open racing the kernel's invalidation can still reach a replaced node through a name the
kernel cached; the nodes a replacement took out are kept here too, so that open answers ESTALE
and the kernel looks the name up again, instead of handing out a fresh writer of a dead file.

The FUSE layer registers each writable handle of a live-tree file at open and drops it at
release; `replace_and_cut` (memfs.workspace.replace) takes the paths before and asks which handles lost their
file after. A writer whose file was unlinked under it (`rm`, a rename over it) writes into a
file no tree names, as on any filesystem; the path it was unlinked from is kept, and a
replacement that puts a file back there (the undo of that `rm`) cuts the writer off too: its
later bytes would otherwise vanish with success beside the file the undo brought back. Who holds the handle (comm) is read from /proc when it is cut off, not at open:
no cost on the open path, and the program a shell's `>` exec'd is named rather than the shell.

Loop thread only.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memfs.store.trees import name_to_str
from memfs.workspace.nodes import Node, WorkspaceError

log = logging.getLogger("memfs.workspace")


@dataclass(frozen=True)
class CutOff:
    """One handle a tree replacement cut off: the file's path in the mount as it was, who
    opened it, and which operation cut it off."""

    path: str
    pid: int
    comm: str
    by: str

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "pid": self.pid, "comm": self.comm, "by": self.by}

    @classmethod
    def from_json(cls, doc: dict) -> CutOff:
        return cls(str(doc["path"]), int(doc["pid"]), str(doc["comm"]), str(doc["by"]))

    def error(self) -> WorkspaceError:
        """ESTALE, naming what happened and the remedy."""
        return WorkspaceError(errno.ESTALE, (
            f"{self.path} was replaced by {self.by} while open for writing here; "
            "open it again to write the file the tree has now"))


@dataclass
class _Writer:
    node: Node
    pid: int
    unlinked_from: bytes | None = None  # the path its file's last name was taken from


@dataclass(frozen=True)
class Before:
    """The writers as a replacement found them: the path of each whose file the tree names,
    and, for each whose file was unlinked, that path and the node the tree had there."""

    named: dict[int, str]
    unlinked: dict[int, tuple[bytes, int | None]]


def _comm(pid: int) -> str:
    """The program behind `pid` (the kernel's comm), or "?" once it has gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


class OpenWriters:
    """Writable handles of live-tree files, by the FUSE layer's handle number, the ones a
    tree replacement cut off (until released), and the nodes it took out of the tree (until
    the kernel forgets them)."""

    def __init__(self) -> None:
        self._open: dict[int, _Writer] = {}
        self._cut: dict[int, CutOff] = {}
        self._taken: set[int] = set()  # node ids a replacement took out of the tree

    def took_out(self, ids: Iterable[int]) -> None:
        self._taken.update(ids)

    def taken_out(self, node: Node) -> bool:
        """An open racing the kernel's invalidation reaches such a node through a cached
        name: it would get a handle on a file no tree names (a write after the undo, lost).
        ESTALE there makes the kernel look the name up again (do_filp_open's LOOKUP_REVAL)
        and open what the tree has now."""
        return node.id in self._taken

    def forgot(self, nid: int) -> None:
        self._taken.discard(nid)

    def opened(self, fh: int, node: Node, pid: int) -> None:
        self._open[fh] = _Writer(node, pid)

    def holds(self, node: Node) -> bool:
        """Is `node` open for writing here? (Asked before an unlink: cheap while none is.)"""
        return any(w.node is node for w in self._open.values())

    def unlinked(self, node: Node, path: bytes) -> None:
        """`node`'s last name, `path`, was taken away while it was open for writing."""
        for w in self._open.values():
            if w.node is node:
                w.unlinked_from = path

    def released(self, fh: int) -> None:
        self._open.pop(fh, None)
        self._cut.pop(fh, None)

    def refusal(self, fh: int | None) -> WorkspaceError | None:
        """ESTALE for a handle a replacement cut off, else None (one dict lookup)."""
        if fh is None or not self._cut:
            return None
        cut = self._cut.get(fh)
        return cut.error() if cut is not None else None

    def check(self, fh: int | None) -> None:
        refused = self.refusal(fh)
        if refused is not None:
            raise refused

    def before(self, attached: Callable[[Node], bool],
               node_at: Callable[[bytes], Node | None]) -> Before:
        """Before a replacement: each writer's path, for those whose file the tree names,
        and for those whose file was unlinked, where it was and what the tree has there."""
        named, unlinked = {}, {}
        for fh, w in self._open.items():
            if attached(w.node):
                named[fh] = name_to_str(w.node.path())
            elif w.unlinked_from is not None:
                there = node_at(w.unlinked_from)
                unlinked[fh] = (w.unlinked_from, there.id if there is not None else None)
        return Before(named, unlinked)

    def cut(self, before: Before, attached: Callable[[Node], bool],
            node_at: Callable[[bytes], Node | None], by: str) -> list[CutOff]:
        """After a replacement: cut off each writer that had a file in the old tree and
        has none in the new one (removed, or another version under a new inode), and each
        writer of an unlinked file whose path the replacement put another file at (the
        undo of its `rm`, or of a rename over it)."""
        lost = [(fh, path) for fh, path in before.named.items()
                if (w := self._open.get(fh)) is not None and not attached(w.node)]
        for fh, (path, was) in before.unlinked.items():
            there = node_at(path)
            if fh in self._open and there is not None and there.id != was:
                lost.append((fh, name_to_str(path)))
        return [self._cut_off(fh, path, by) for fh, path in lost]

    def _cut_off(self, fh: int, path: str, by: str) -> CutOff:
        w = self._open.pop(fh)
        cut = CutOff(path, w.pid, _comm(w.pid), by)
        self._cut[fh] = cut
        log.warning("cut off: %s, open for writing by %s (pid %d), replaced by %s",
                    path, cut.comm, cut.pid, by)
        return cut

    def status(self) -> list[dict[str, object]]:
        """The cut-off handles still open (`.memfs/status`'s `cut_off`)."""
        return [c.to_json() for c in self._cut.values()]


__all__ = ["Before", "CutOff", "OpenWriters"]
