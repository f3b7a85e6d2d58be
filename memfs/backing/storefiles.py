"""The store side's unloaded files of one walk, packed: what a pass keeps between passes for
each committed file whose directory has no nodes loaded, without an object per file.

After a take-in a mount's files are nearly all such files (memfs.workspace.unload), and a pass
reads each from its tree row. Kept as objects, each cost ~0.35 KB between passes: a stand-in
(64 B), its committed ref string (88 B), a Content (64-80 B) and a slot in four maps keyed by
path (the walk's files, the view, the ref digests' two). Here a file is a position in columns
sorted by path: the path (the interned string the disk side holds too), the committed ref as
16 bytes (a chunk ref, `c:` and 32 hex digits; any other ref kept as its string by position),
size, mode, the link count only where it is not 1, and the xxh3-128 of the content as 16
bytes once known: ~55 bytes a file. `StoreFiles` (path -> Node or Unbuilt) and
`StoreContents` (path -> Content, the rule's S) are the read-only maps a pass reads; an
Unbuilt or a Content is built when asked (Contents from the shared cache, as the disk side's).

A digest is a function of the (ref, size) only, so a new walk's table takes the digests of
the last one's files with the same path, ref and size (`carry`), and `set_digest` is the only
other writer. Thread: built and filled on the trio loop (StoreView's); its paths never change
once built, so a worker thread may look paths up (the gather's `tracked`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from sys import intern
from typing import TYPE_CHECKING, Generic, TypeVar

from memfs.pathtable import pack16
from memfs.reconcile.facts import shared_content
from memfs.reconcile.rule import MODE_BITS, MODES, Content
from memfs.store.trees import FILE, Entry
from memfs.workspace.nodes import FileData, shared_int, unloaded

if TYPE_CHECKING:
    from memfs.workspace.nodes import Node

V = TypeVar("V")
CHUNK_REF = "c:"
PACK_BATCH = 256  # refs packed at once while a table is built
_NONE16 = bytes(16)


def _pack_refs(refs: list[str]) -> tuple[bytearray, dict[int, str]]:
    """16 bytes a ref, and the refs that are no chunk's by position (zeros in their place).
    All of them at once where every one is a chunk's (a take-in's small files): three C calls
    instead of one conversion a file."""
    hexes = "".join([r[2:] for r in refs])
    if set(map(len, refs)) <= {34} and "".join([r[:2] for r in refs]) == CHUNK_REF * len(refs):
        try:
            raw = bytes.fromhex(hexes)
        except ValueError:
            raw = b""
        if len(raw) == 16 * len(refs) and raw.hex() == hexes:
            return bytearray(raw), {}
    packed, odd = bytearray(), {}
    for i, ref in enumerate(refs):
        one = pack16(ref[2:]) if ref.startswith(CHUNK_REF) else None
        if one is None:
            odd[i] = ref
            one = _NONE16
        packed += one
    return packed, odd


class Unbuilt:
    """A committed file below a directory whose nodes are not loaded (a take-in's files the
    kernel never looked up: memfs.workspace.unload), as a pass reads it: what its node would
    say, from its row in the committed tree, with no node built. Clean by definition; its
    `data` is the shared unloaded data of its size. Built when asked from a `FileTable`, so
    two asks give equal objects, not one. A pass that changes the file asks for its node then
    (StoreView.node_at loads the directory), and `same_as_decided` compares the two by their
    committed ref and mode."""

    __slots__ = ("ref", "mode", "data", "nlink")
    kind = FILE
    id = None  # no node: never held, never disk-only
    dirty = False
    ver = 0

    def __init__(self, e: Entry) -> None:
        self.ref: str = e.ref
        self.mode = shared_int(e.mode)
        self.data: FileData = unloaded(e.size)
        self.nlink = e.nlink or 1

    @classmethod
    def of(cls, ref: str, mode: int, size: int, nlink: int) -> Unbuilt:
        u = cls.__new__(cls)
        u.ref, u.mode, u.data, u.nlink = ref, shared_int(mode), unloaded(size), nlink
        return u

    def size(self) -> int:
        return self.data.size


class FileTable:
    """Packed columns of a walk's unloaded files, sorted by path (module docstring)."""

    __slots__ = ("paths", "refs", "sizes", "modes", "odd_refs", "nlinks", "digests", "known",
                 "odd_digests", "_hint", "_texts")

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.refs = bytearray()  # 16 bytes a file: a chunk ref's; zeros where odd_refs has it
        self.sizes = array("q")
        self.modes = array("I")
        self.odd_refs: dict[int, str] = {}  # position -> a ref that is not a chunk's
        self.nlinks: dict[int, int] = {}  # position -> a link count other than 1
        self.digests = bytearray()  # 16 bytes a file, once known
        self.known = bytearray()  # 1 where the digest is known
        self.odd_digests: dict[int, str] = {}  # position -> a digest that is not 32 hex
        self._hint = -1  # the last position found: the plan asks for paths in sorted order
        self._texts: list[str] = []  # refs added, not packed yet (`add`)

    def add(self, path: str, e: Entry) -> None:
        """One more file (a walk's; `done` sorts them once all are in)."""
        if (e.nlink or 1) != 1:
            self.nlinks[len(self.paths)] = e.nlink  # type: ignore[assignment]
        self.paths.append(path)
        self.sizes.append(e.size)
        self.modes.append(e.mode)
        texts = self._texts
        texts.append(e.ref)
        if len(texts) >= PACK_BATCH:
            self._pack()

    def _pack(self) -> None:
        """The refs added since the last time, packed: a ref string lives a few directories'
        rows, not the whole walk (nor do the pieces of heap it held stay split between)."""
        base = len(self.refs) // 16
        packed, odd = _pack_refs(self._texts)
        self.refs += packed
        for i, ref in odd.items():
            self.odd_refs[base + i] = ref
        self._texts = []

    def done(self) -> FileTable:
        """Sorted by path (each path once), no digest known yet."""
        self._pack()
        paths = self.paths
        n = len(paths)
        order = sorted(range(n), key=paths.__getitem__)
        self.paths = [paths[i] for i in order]
        # Moved one at a time, by generators: a list of 16-byte slices or of sizes would be
        # an object a file at once (a memoryview slice is 184 B).
        refs, self.refs = self.refs, bytearray(16 * n)
        for new, old in enumerate(order):
            self.refs[16 * new:16 * new + 16] = refs[16 * old:16 * old + 16]
        sizes, modes = self.sizes, self.modes
        self.sizes = array("q", (sizes[i] for i in order))
        self.modes = array("I", (modes[i] for i in order))
        if self.odd_refs or self.nlinks:
            at = array("q", bytes(8 * n))
            for new, old in enumerate(order):
                at[old] = new
            self.odd_refs = {at[i]: r for i, r in self.odd_refs.items()}
            self.nlinks = {at[i]: k for i, k in self.nlinks.items()}
        self.digests = bytearray(16 * n)
        self.known = bytearray(n)
        return self

    def __len__(self) -> int:
        return len(self.paths)

    def index(self, path: str) -> int:
        """path's position, -1 if the table has none. The one after the last found is tried
        first (a plan asks in sorted order); a race on the hint only costs the search."""
        paths = self.paths
        i = self._hint + 1
        if i < len(paths) and paths[i] == path:
            self._hint = i
            return i
        i = bisect_left(paths, path)
        if i < len(paths) and paths[i] == path:
            self._hint = i
            return i
        return -1

    def ref(self, i: int) -> str:
        odd = self.odd_refs.get(i) if self.odd_refs else None
        return odd if odd is not None else CHUNK_REF + self.refs[16 * i:16 * i + 16].hex()

    def key(self, i: int) -> tuple[str, int]:
        """(committed ref, size): what the digest is of."""
        return self.ref(i), self.sizes[i]

    def unbuilt(self, i: int) -> Unbuilt:
        return Unbuilt.of(self.ref(i), self.modes[i], self.sizes[i], self.nlinks.get(i, 1))

    def digest(self, i: int) -> str | None:
        if not self.known[i]:
            return None
        odd = self.odd_digests.get(i) if self.odd_digests else None
        return odd if odd is not None else self.digests[16 * i:16 * i + 16].hex()

    def set_digest(self, i: int, digest: str) -> None:
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raw = b""
        if len(raw) == 16 and raw.hex() == digest:  # pack16, inline: once a file a pass
            if self.odd_digests:
                self.odd_digests.pop(i, None)
            self.digests[16 * i:16 * i + 16] = raw
        else:
            self.odd_digests[i] = digest
        self.known[i] = 1

    def unknown(self) -> list[int]:
        """Positions whose digest is not known yet."""
        if all(self.known):
            return []
        return [i for i, k in enumerate(self.known) if not k]

    def content(self, i: int) -> Content:
        """S for the file at i (its digest known). The digest is interned: a Content the
        shared cache keeps then holds the disk side's string, not a copy of its own."""
        digest = self.digest(i)
        return shared_content(None if digest is None else intern(digest), "text",
                              MODES[self.modes[i] & MODE_BITS])

    def carry(self, old: FileTable) -> int:
        """Take `old`'s known digests for the files with the same path, ref and size (a
        digest is of the ref and size alone). Returns how many were taken."""
        if not old.paths or not self.paths:
            return 0
        if old.paths == self.paths and old.refs == self.refs and old.sizes == self.sizes \
                and old.odd_refs == self.odd_refs and not self.odd_digests:
            self.digests[:] = old.digests  # the same files: nearly every walk of a quiet tree
            self.known[:] = old.known
            self.odd_digests.update(old.odd_digests)
            return sum(self.known)
        taken = 0
        theirs, m = old.paths, len(old.paths)
        j = bisect_left(theirs, self.paths[0])
        for i, p in enumerate(self.paths):
            while j < m and theirs[j] < p:
                j += 1
            if j == m:
                break
            if theirs[j] != p or not old.known[j] or self.known[i]:
                continue
            if old.sizes[j] == self.sizes[i] and old.ref(j) == self.ref(i):
                digest = old.digest(j)
                assert digest is not None
                self.set_digest(i, digest)
                taken += 1
        return taken

    def same(self, other: FileTable) -> bool:
        """The same files with the same modes and digests (all known on both)."""
        return (self is other or (
            self.paths == other.paths and self.modes == other.modes
            and self.digests == other.digests and self.known == other.known
            and self.odd_digests == other.odd_digests))


EMPTY_TABLE = FileTable()


class _LoadedAndTable(Generic[V]):
    """The paths of a view: loaded nodes' (a dict) first, then the table's unloaded files.
    Shared by StoreFiles and StoreContents, which differ in what a path maps to."""

    loaded: Mapping[str, V]
    table: FileTable

    def __contains__(self, path: object) -> bool:
        return path in self.loaded or (isinstance(path, str) and self.table.index(path) >= 0)

    def __iter__(self) -> Iterator[str]:
        yield from self.loaded
        yield from self.table.paths

    def __len__(self) -> int:
        return len(self.loaded) + len(self.table)


class StoreFiles(_LoadedAndTable["Node | Unbuilt"], Mapping[str, "Node | Unbuilt"]):
    """path -> the loaded node, or an Unbuilt built from the table (read-only). `specials`:
    the walk's other entries that are neither file nor directory (path -> kind: a symlink,
    FIFO, socket or device made in the mount), which no materialize writes; seen by the same
    walk, so status learns them with no walk of its own."""

    __slots__ = ("loaded", "table", "specials")

    def __init__(self, loaded: dict[str, Node | Unbuilt], table: FileTable = EMPTY_TABLE,
                 specials: Mapping[str, str] | None = None):
        self.loaded = loaded  # paths apart from the table's
        self.table = table
        self.specials: Mapping[str, str] = specials or {}

    def __getitem__(self, path: str) -> Node | Unbuilt:
        got = self.loaded.get(path)
        if got is not None:
            return got
        i = self.table.index(path)
        if i < 0:
            raise KeyError(path)
        return self.table.unbuilt(i)

    def get(self, path: str, default: object = None) -> Node | Unbuilt | None:  # type: ignore[override]
        try:
            return self[path]
        except KeyError:
            return default  # type: ignore[return-value]

    def keys(self) -> KeysView[str]:
        return KeysView(self)

    def values(self) -> ValuesView[Node | Unbuilt]:
        return _Values(self)

    def items(self) -> ItemsView[str, Node | Unbuilt]:
        return _Items(self)


class _Values(ValuesView["Node | Unbuilt"]):
    def __init__(self, m: StoreFiles) -> None:
        super().__init__(m)
        self._m = m

    def __iter__(self) -> Iterator[Node | Unbuilt]:
        m = self._m
        yield from m.loaded.values()
        table = m.table
        for i in range(len(table)):
            yield table.unbuilt(i)


class _Items(ItemsView[str, "Node | Unbuilt"]):
    def __init__(self, m: StoreFiles) -> None:
        super().__init__(m)
        self._m = m

    def __iter__(self) -> Iterator[tuple[str, Node | Unbuilt]]:
        m = self._m
        yield from m.loaded.items()
        table = m.table
        for i, p in enumerate(table.paths):
            yield p, table.unbuilt(i)


class StoreContents(_LoadedAndTable[Content], Mapping[str, Content]):
    """The rule's S: path -> Content, the loaded files' as objects, the table's built when
    asked (its digests all known; read-only, as every view handed out)."""

    __slots__ = ("loaded", "table")

    def __init__(self, loaded: dict[str, Content], table: FileTable = EMPTY_TABLE) -> None:
        self.loaded = loaded
        self.table = table

    def __getitem__(self, path: str) -> Content:
        got = self.loaded.get(path)
        if got is not None:
            return got
        i = self.table.index(path)
        if i < 0:
            raise KeyError(path)
        return self.table.content(i)

    def get(self, path: str, default: object = None) -> Content | None:  # type: ignore[override]
        got = self.loaded.get(path)
        if got is not None:
            return got
        i = self.table.index(path)
        return self.table.content(i) if i >= 0 else default  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StoreContents) and self.loaded.keys() == other.loaded.keys() \
                and self.table.same(other.table):
            return self.loaded == other.loaded  # the same split: the columns compared as such
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def keys(self) -> KeysView[str]:
        return KeysView(self)

    def values(self) -> ValuesView[Content]:
        return _Contents(self)

    def items(self) -> ItemsView[str, Content]:
        return _ContentItems(self)


class _Contents(ValuesView[Content]):
    def __init__(self, m: StoreContents) -> None:
        super().__init__(m)
        self._m = m

    def __iter__(self) -> Iterator[Content]:
        m = self._m
        yield from m.loaded.values()
        for i in range(len(m.table)):
            yield m.table.content(i)


class _ContentItems(ItemsView[str, Content]):
    def __init__(self, m: StoreContents) -> None:
        super().__init__(m)
        self._m = m

    def __iter__(self) -> Iterator[tuple[str, Content]]:
        m = self._m
        yield from m.loaded.items()
        table = m.table
        for i, p in enumerate(table.paths):
            yield p, table.content(i)


__all__ = ["EMPTY_TABLE", "FileTable", "StoreContents", "StoreFiles", "Unbuilt", "pack16"]
