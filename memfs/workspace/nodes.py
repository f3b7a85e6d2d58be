"""The live tree: nodes loaded lazily from the store, changed in memory, committed in groups.

A node is clean when `ref` names its committed form. Any change marks the node and its
ancestors dirty and bumps their `ver`; a group commit snapshots dirty nodes and, once the
commit is durable, marks clean only those whose `ver` did not move meanwhile.

File data is cut into CHUNK_SIZE pieces. Committed pieces are chunk ids in the store;
changed pieces live in memory (`dirty`) until the next commit takes them. Absent pieces
below `size` are holes and read as zeros, so a huge truncate costs nothing.

Nodes are the trio loop's only: a commit's thread works on copies (memfs.workspace.snapshot).
"""

from __future__ import annotations

import errno
import itertools
import stat
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from memfs.store.chunks import CHUNK_SIZE
from memfs.store.trees import (
    BLK,
    CHR,
    DIR,
    FIFO,
    FILE,
    LINK,
    SOCK,
    SPECIAL,
    Entry,
    name_to_bytes,
    name_to_str,
    xattrs_from_store,
    xattrs_to_store,
)

if TYPE_CHECKING:
    from memfs.workspace.inodes import Inodes

# One clock with the kernel. The kernel stamps UTIME_NOW (touch) with current_time(): its coarse
# wall clock, which since Linux 6.13 (multigrain timestamps) is also never below the fine times
# it has handed to other filesystems. A fine clock runs up to a tick ahead of that, so a touch
# after a memfs change went back in time; CLOCK_REALTIME_COARSE alone can lag the kernel's floor
# by a tick, so a memfs change after a touch went back. memfs's clock is therefore the coarse
# clock, never below the latest "now" the kernel has sent (any setattr time not in the future).
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)
_last_ns = 0  # loop thread only


def now_ns() -> int:
    """Now, for every time memfs sets: the kernel's coarse clock, never going back."""
    global _last_ns
    t = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    if t <= _last_ns:  # the same int object while the tick lasts: a take-in's nodes share it
        return _last_ns
    _last_ns = t
    return t


def saw_kernel_time(t: int) -> None:
    """A time the kernel sent (utimes): if it is a "now", later stamps must not be earlier."""
    global _last_ns
    if _last_ns < t <= time.time_ns():
        _last_ns = t


KIND_BITS = {DIR: stat.S_IFDIR, FILE: stat.S_IFREG, LINK: stat.S_IFLNK, FIFO: stat.S_IFIFO,
             SOCK: stat.S_IFSOCK, CHR: stat.S_IFCHR, BLK: stat.S_IFBLK}
KIND_OF_MODE = {bits: kind for kind, bits in KIND_BITS.items()}


ROOT_ID = 1  # the mount root's node id (and inode number)
DIRTY_BYTES_SOON = 16 << 20  # commit early when this much data waits in memory

class WorkspaceError(OSError):
    """A refusal the FUSE layer answers with `errno`."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(code, message or errno.errorcode.get(code, str(code)))


def fail(code: int, message: str = "") -> WorkspaceError:
    return WorkspaceError(code, message)


_generation = itertools.count(1)

# The empty map every node and file starts with, shared: most files have no xattrs and, once
# committed, no changed pieces, and an empty dict of their own costs 64 bytes each (a dict
# emptied by deletions keeps its table: 160 more). Read-only, so a write that forgot to take
# a map of its own (`own`) fails loudly instead of changing every node's.
EMPTY: Any = MappingProxyType({})


def own(m: dict[Any, Any]) -> dict[Any, Any]:
    """`m` if it is a node's own map, else a new empty one to store in its place."""
    return {} if m is EMPTY else m


class FileData:
    """A file's bytes: committed chunk ids plus changed pieces, held in memory or (a file that
    left the tree but is still open) spilled to disk (memfs.workspace.spill).

    The three maps are EMPTY until something is put in them (`_own`), and go back to EMPTY
    when a commit takes the last changed piece (memfs.workspace.snapshot.apply)."""

    __slots__ = ("size", "chunks", "dirty", "gen", "spill")

    def __init__(self, size: int = 0, chunks: dict[int, str] | None = None) -> None:
        self.size = size
        self.chunks: dict[int, str] = chunks or EMPTY
        # Changed pieces. A piece written whole is kept as the immutable bytes the kernel
        # handed us (no copy, and the commit can take it as is); a partly written one is a
        # bytearray.
        self.dirty: dict[int, bytes | bytearray] = EMPTY
        self.gen: dict[int, int] = EMPTY
        self.spill = None  # memfs.workspace.spill.Spill, once spilled

    def _own(self) -> None:
        """Before a changed piece is put in: maps of its own."""
        if self.dirty is EMPTY:
            self.dirty = {}
        if self.gen is EMPTY:
            self.gen = {}

    def committed(self, idx: int, chunk_id: str) -> None:
        """A changed piece is stored as `chunk_id` (a group commit, once durable): it leaves
        `dirty` and, unless a truncate cut it off meanwhile, becomes a committed chunk."""
        del self.dirty[idx]
        del self.gen[idx]
        if idx * CHUNK_SIZE < self.size:
            if self.chunks is EMPTY:
                self.chunks = {}
            self.chunks[idx] = chunk_id
        if not self.dirty:  # the emptied maps' tables go
            self.dirty = self.gen = EMPTY

    def dirty_bytes(self) -> int:
        return sum(len(b) for b in self.dirty.values())

    def growth(self, off: int, length: int) -> int:
        """How many bytes of changed pieces a write of `length` at `off` adds (what it will
        take in the store: a piece written is stored anew, copy-on-write)."""
        total, pos, end = 0, off, off + length
        while pos < end:
            idx, start = divmod(pos, CHUNK_SIZE)
            n = min(end - pos, CHUNK_SIZE - start)
            cur = len(self.dirty[idx]) if idx in self.dirty else 0
            if start == 0 and n == CHUNK_SIZE:
                new = CHUNK_SIZE
            elif idx in self.dirty:
                new = max(cur, start + n)
            elif self.spill is not None and idx in self.spill.present:
                new = max(self.spill.present[idx], start + n)
            elif idx in self.chunks:  # loaded whole, then changed
                new = max(min(CHUNK_SIZE, self.size - idx * CHUNK_SIZE), start + n)
            else:
                new = start + n
            total += max(0, new - cur)
            pos += n
        return total

    def read(self, off: int, length: int, fetch: Callable[[str, int, int], bytes]) -> bytes:
        end = min(self.size, off + length)
        if off >= end:
            return b""
        out = bytearray()
        pos = off
        while pos < end:
            idx, start = divmod(pos, CHUNK_SIZE)
            n = min(end - pos, CHUNK_SIZE - start)
            if idx in self.dirty:
                piece = bytes(self.dirty[idx][start:start + n])
            elif self.spill is not None and idx in self.spill.present:
                piece = self.spill.read(idx, start, n)
            elif idx in self.chunks:
                piece = fetch(self.chunks[idx], start, n)
            else:
                piece = b""
            out += piece
            if len(piece) < n:
                out += bytes(n - len(piece))
            pos += n
        return bytes(out)

    def _piece(self, idx: int, fetch: Callable[[str, int, int], bytes], whole: bool) -> bytearray:
        self._own()
        ba = self.dirty.get(idx)
        if isinstance(ba, bytes):
            ba = self.dirty[idx] = bytearray(ba)
        if ba is None:
            if whole:
                ba = bytearray()
            elif self.spill is not None and idx in self.spill.present:
                ba = bytearray(self.spill.read(idx, 0, CHUNK_SIZE))
            elif idx in self.chunks:
                ba = bytearray(fetch(self.chunks[idx], 0, CHUNK_SIZE))
            else:
                ba = bytearray()
            self.dirty[idx] = ba
        self.gen[idx] = next(_generation)
        return ba

    def write(self, off: int, data: bytes, fetch: Callable[[str, int, int], bytes]) -> int:
        pos, view, done = off, memoryview(data), 0
        while done < len(data):
            idx, start = divmod(pos, CHUNK_SIZE)
            n = min(len(data) - done, CHUNK_SIZE - start)
            if start == 0 and n == CHUNK_SIZE:
                self._own()
                self.dirty[idx] = bytes(data) if len(data) == n else bytes(view[done:done + n])
                self.gen[idx] = next(_generation)
                pos += n
                done += n
                continue
            ba = self._piece(idx, fetch, whole=False)
            if len(ba) < start:
                ba.extend(bytes(start - len(ba)))
            ba[start:start + n] = view[done:done + n]
            pos += n
            done += n
        self.size = max(self.size, off + len(data))
        return len(data)

    def truncate(self, size: int, fetch: Callable[[str, int, int], bytes]) -> None:
        if size < self.size:
            last = (size - 1) // CHUNK_SIZE if size else -1
            for idx in [i for i in self.chunks if i > last]:
                del self.chunks[idx]
            for idx in [i for i in self.dirty if i > last]:
                del self.dirty[idx]
                self.gen.pop(idx, None)
            spilled = self.spill is not None and last in self.spill.present
            if size % CHUNK_SIZE and last >= 0 and (
                    last in self.chunks or last in self.dirty or spilled):
                keep = size - last * CHUNK_SIZE
                ba = self._piece(last, fetch, whole=False)
                del ba[keep:]
            if self.spill is not None:
                self.spill.trim(last, size - last * CHUNK_SIZE if last >= 0 else 0)
        self.size = size


class UnloadedData(FileData):
    """A committed file's data before its chunk map is read: nothing but its size, one object
    shared by the unloaded files of that size (`unloaded`). A bound mount keeps a node per
    file it takes in, and a FileData of its own was 72 bytes each. Read-only: every change
    goes through memfs.workspace.loading.load_data, which gives the file a FileData of its
    own first; anything else setting a field fails loudly instead of changing every file of
    that size."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(f"an unloaded file's data is shared (setting {name}): load it first")


_UNLOADED: dict[int, UnloadedData] = {}
UNLOADED_KEPT = 1 << 16  # sizes remembered; emptied when full (a miss costs one object)


def unloaded(size: int) -> FileData:
    """The shared data of an unloaded file of `size` bytes (loop thread)."""
    got = _UNLOADED.get(size)
    if got is None:
        if len(_UNLOADED) >= UNLOADED_KEPT:
            _UNLOADED.clear()
        got = FileData.__new__(UnloadedData)
        for name, value in (("size", size), ("chunks", EMPTY), ("dirty", EMPTY),
                            ("gen", EMPTY), ("spill", None)):
            object.__setattr__(got, name, value)
        _UNLOADED[size] = got
    return got


# One int object per permission value and per owner id kept on nodes: CPython shares only
# -5..256, so 0o644 or a uid of 1000 was a new 32-byte int per node (a bound mount keeps a
# node per file it takes in). Loop thread only.
_PERMS = tuple(range(0o10000))
_OWNERS: dict[int, int] = {}


def shared_int(v: int) -> int:
    """A node's mode (permission bits) or owner as the one int object for its value."""
    if 0 <= v < 0o10000:
        return _PERMS[v]
    if len(_OWNERS) >= 4096:
        _OWNERS.clear()
    return _OWNERS.setdefault(v, v)


class Node:
    __slots__ = (
        "id", "kind", "mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns", "xattrs",
        "parent", "name", "ref", "dirty", "ver", "_children", "data", "target", "readonly",
        "_data_loaded", "row", "rdev", "nlink", "ikey", "space", "links",
    )

    def __init__(self, nid: int, kind: str, mode: int, uid: int, gid: int, now_ns: int) -> None:
        self.id = nid
        self.kind = kind
        self.mode = shared_int(mode)
        self.uid = shared_int(uid)
        self.gid = shared_int(gid)
        self.atime_ns = self.mtime_ns = self.ctime_ns = now_ns
        self.xattrs: dict[bytes, bytes] = EMPTY  # own() before setting one
        self.parent: Node | None = None
        self.name = b""
        self.ref: str | None = None
        self.dirty = True
        self.ver = 0
        self._children: dict[bytes, Node] | None = {} if kind == DIR else None
        self.data: FileData | None = FileData() if kind == FILE else None
        self._data_loaded = True
        self.target = b""
        self.readonly = False
        self.row: tuple | None = None  # (name, encoded row) while clean: see encode_rows
        self.rdev = 0  # character and block devices
        # Names of a file (0 once unlinked); a directory's 2 + subdirectories, None until known
        # (entries of older stores do not record it: counted when the listing is loaded).
        self.nlink: int | None = 2 if kind == DIR else 1
        self.ikey: str | None = None  # its inode-table key, once it has had a second name
        self.space: Inodes | None = None  # the tree it belongs to (memfs.workspace.inodes)
        self.links: set[tuple[Node, bytes]] | None = None  # linked: the names loaded so far

    @property
    def is_dir(self) -> bool:
        return self.kind == DIR

    def st_mode(self) -> int:
        return KIND_BITS[self.kind] | (self.mode & 0o7777)

    def size(self) -> int:
        if self.kind == FILE:
            return self.data.size if self.data is not None else 0
        if self.kind == LINK:
            return len(self.target)
        if self.kind in SPECIAL:
            return 0
        return 4096

    def path(self) -> bytes:
        parts = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return b"/".join(reversed(parts))

    def entry(self, ref: str, size: int) -> Entry:
        """Its row in its directory, or (linked) in the inode table under its key."""
        if self.kind in SPECIAL:
            ref = str(self.rdev) if self.rdev else ""
        name = self.ikey if self.ikey is not None else name_to_str(self.name)
        nlink = self.nlink if self.kind == DIR or self.ikey is not None else None
        return Entry(
            name, self.kind, self.mode & 0o7777, self.uid, self.gid,
            self.mtime_ns, self.ctime_ns, size, ref, xattrs_to_store(self.xattrs), self.atime_ns,
            nlink,
        )

    def apply_entry(self, e: Entry) -> None:
        """Take a committed entry's metadata (used on load and on branch switch)."""
        self.mode = shared_int(e.mode)
        self.uid, self.gid = shared_int(e.uid), shared_int(e.gid)
        self.mtime_ns, self.ctime_ns = e.mtime_ns, e.ctime_ns
        self.atime_ns = e.mtime_ns if e.atime_ns is None else e.atime_ns
        self.xattrs = xattrs_from_store(e.xattrs) if e.xattrs else EMPTY
        self.ref = e.ref
        self.dirty = False
        self.row = None
        if e.nlink is not None or self.kind == DIR:
            self.nlink = e.nlink
        if self.kind == LINK:
            self.target = name_to_bytes(e.ref)
        elif self.kind in SPECIAL:
            self.rdev = int(e.ref or 0)
        elif self.kind == DIR:
            self._children = None
        elif self.kind == FILE:
            self.data = unloaded(e.size)
            self._data_loaded = False
