"""The live tree: nodes loaded lazily from the store, changed in memory, committed in groups.

A node is clean when `ref` names its committed form. Any change marks the node and its
ancestors dirty and bumps their `ver`; a group commit snapshots dirty nodes and, once the
commit is durable, marks clean only those whose `ver` did not move meanwhile.

File data is cut into CHUNK_SIZE pieces. Committed pieces are chunk ids in the store;
changed pieces live in memory (`dirty`) until the next commit takes them. Absent pieces
below `size` are holes and read as zeros, so a huge truncate costs nothing.
"""

from __future__ import annotations

import errno
import itertools
import stat
from collections.abc import Callable

from memfs.store.chunks import CHUNK_SIZE
from memfs.store.trees import DIR, FILE, LINK, Entry, xattrs_from_store, xattrs_to_store


class WorkspaceError(OSError):
    """A refusal the FUSE layer answers with `errno`."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(code, message or errno.errorcode.get(code, str(code)))


def fail(code: int, message: str = "") -> WorkspaceError:
    return WorkspaceError(code, message)


_generation = itertools.count(1)


class FileData:
    """A file's bytes: committed chunk ids plus changed pieces, held in memory or (a file that
    left the tree but is still open) spilled to disk (memfs.workspace.spill)."""

    __slots__ = ("size", "chunks", "dirty", "gen", "spill")

    def __init__(self, size: int = 0, chunks: dict[int, str] | None = None) -> None:
        self.size = size
        self.chunks: dict[int, str] = chunks or {}
        # Changed pieces. A piece written whole is kept as the immutable bytes the kernel
        # handed us (no copy, and the commit can take it as is); a partly written one is a
        # bytearray.
        self.dirty: dict[int, bytes | bytearray] = {}
        self.gen: dict[int, int] = {}
        self.spill = None  # memfs.workspace.spill.Spill, once spilled

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


class Node:
    __slots__ = (
        "id", "kind", "mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns", "xattrs",
        "parent", "name", "ref", "dirty", "ver", "_children", "data", "target", "readonly",
        "_data_loaded", "row",
    )

    def __init__(self, nid: int, kind: str, mode: int, uid: int, gid: int, now_ns: int) -> None:
        self.id = nid
        self.kind = kind
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.atime_ns = self.mtime_ns = self.ctime_ns = now_ns
        self.xattrs: dict[bytes, bytes] = {}
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

    @property
    def is_dir(self) -> bool:
        return self.kind == DIR

    def st_mode(self) -> int:
        kind_bits = {DIR: stat.S_IFDIR, FILE: stat.S_IFREG, LINK: stat.S_IFLNK}[self.kind]
        return kind_bits | (self.mode & 0o7777)

    def size(self) -> int:
        if self.kind == FILE:
            return self.data.size if self.data is not None else 0
        if self.kind == LINK:
            return len(self.target)
        return 4096

    def path(self) -> bytes:
        parts = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return b"/".join(reversed(parts))

    def entry(self, ref: str, size: int) -> Entry:
        from memfs.store.trees import name_to_str

        return Entry(
            name_to_str(self.name), self.kind, self.mode & 0o7777, self.uid, self.gid,
            self.mtime_ns, self.ctime_ns, size, ref, xattrs_to_store(self.xattrs), self.atime_ns,
        )

    def apply_entry(self, e: Entry) -> None:
        """Take a committed entry's metadata (used on load and on branch switch)."""
        self.mode = e.mode
        self.uid, self.gid = e.uid, e.gid
        self.mtime_ns, self.ctime_ns = e.mtime_ns, e.ctime_ns
        self.atime_ns = e.mtime_ns if e.atime_ns is None else e.atime_ns
        self.xattrs = xattrs_from_store(e.xattrs)
        self.ref = e.ref
        self.dirty = False
        self.row = None
        if self.kind == LINK:
            from memfs.store.trees import name_to_bytes

            self.target = name_to_bytes(e.ref)
        elif self.kind == DIR:
            self._children = None
        elif self.kind == FILE:
            self.data = FileData(e.size)
            self._data_loaded = False
