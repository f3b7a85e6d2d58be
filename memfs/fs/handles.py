"""The open-file table: what each file handle the kernel holds stands for.

Owns the handles and the numbering of new ones (never reused while the daemon runs), and
each directory handle's listing snapshot (readdir's offsets index it). Loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memfs.fs.memory_view import MemFile
from memfs.workspace.nodes import Node


class Handle:
    __slots__ = ("node", "data", "writable", "mem", "who")

    def __init__(self, node: Node | None, data: Any = None, writable: bool = False,
                 mem: MemFile | None = None, who: tuple[int, int] | None = None):
        # data: a generated file's rendered bytes, or a directory handle's inode number
        self.node, self.data, self.writable, self.mem = node, data, writable, mem
        # (pid, uid) of the opener: pyfuse3 passes no context to write(), and the commit
        # should still say which process changed the file.
        self.who = who


class Handles(dict[int, Handle]):
    """Handles by number, as the kernel names them in read, write, flush and release."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 1
        self.dir_snapshots: dict[int, list[tuple[bytes, Any]]] = {}

    def open(self, h: Handle) -> int:
        fh = self._next
        self._next += 1
        self[fh] = h
        return fh

    def nodes(self) -> Iterator[Node]:
        """The live or history nodes some handle holds open."""
        return (h.node for h in self.values() if isinstance(h.node, Node))

    def close_dir(self, fh: int) -> None:
        self.dir_snapshots.pop(fh, None)
        self.pop(fh, None)
