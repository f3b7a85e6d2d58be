"""The files an observation holds and the per-directory memos a walk keeps between passes
(memfs.reconcile.walk makes them): a memo names its files by row index in the journal
snapshot's table (memfs.pathtable), and an observation's files are read through the memos,
a fact built when read, not kept.

Read-only once a walk is done: any thread may read them; a mount's `WalkMemo` is read and
written only by that mount's walks, one at a time.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from memfs.pathtable import FingerprintTable, Row
from memfs.reconcile.facts import FileFact, Region, new_tuple
from memfs.reconcile.lstat import LStat
from memfs.reconcile.rule import MODES


@dataclass(slots=True)
class DirMemo:
    """One directory as the last walk saw it, kept only when every entry's outcome followed
    from its name, its lstat record and (for a file) the cache row that vouched for it: no
    file was hashed, no link followed, no call failed. While the listing, the records (one
    `==` on bytes) and those rows are unchanged, a walk would build exactly these facts,
    regions and subdirectories again, so it takes them as they are.

    Kept for every directory of a mount between passes, so it is compact: the listing and the
    records as their blake2b-128 digests (16 bytes a directory, where the records alone were
    64 a file; a collision would take 2**64 tries), and the files as the indices of the rows
    that vouched for them in the cache's table (memfs.pathtable) with their permission bits,
    two arrays: a file's fact is built from them when asked for (`fact`), not kept."""

    listing: bytes  # digest of the sorted listing, joined by NULs (no name holds one)
    statted: list[str] | None  # the names not ignored, in the order of `records` (None: all)
    ignored: list[Region]
    records: bytes  # digest of the names' lstat records
    idx: array[int]  # the regular files' rows in `cache`, in name order
    modes: array[int]  # their permission bits, in the same order
    specials: tuple[FileFact, ...]  # vouched by nothing but their lstat record
    regions: list[Region]  # after the ignored ones: symlinks (following off)
    subdirs: list[tuple[str, str, LStat]]
    cache: FingerprintTable  # the table the rows were last found equal in

    def vouched_in(self, cache: FingerprintTable) -> DirMemo | None:
        """This memo if `cache` still holds its rows (by value; the same table: at once), a
        copy naming their indices in `cache` if it is another lineage, else None. Never
        changes what the memo's facts read (an older observation may be reading them)."""
        old = self.cache
        if old is cache:
            return self
        if old.lineage is cache.lineage:  # a patched table: the same indices
            same = cache.same_row
            if all(same(i, old, i) for i in self.idx):
                self.cache = cache  # equal rows: the facts read the same either way
                return self
            return None
        at, paths, same = cache.at, old.paths, cache.same_row
        idx = array("I")
        for i in self.idx:
            j = at(paths[i])
            if j is None or not same(j, old, i):
                return None
            idx.append(j)
        if idx == self.idx:  # an equal table built in the same order: the same indices
            self.cache = cache
            return self
        return DirMemo(self.listing, self.statted, self.ignored, self.records, idx, self.modes,
                       self.specials, self.regions, self.subdirs, cache)

    def fact(self, path: str) -> FileFact | None:
        """The fact of `path` if it is one of this directory's files, built now."""
        table, idx = self.cache, self.idx
        paths = table.paths
        k = bisect_left(idx, path, key=paths.__getitem__)
        if k < len(idx) and paths[idx[k]] == path:
            return new_tuple(FileFact, (path, table.row(idx[k]), False, MODES[self.modes[k]]))
        for f in self.specials:
            if f.path == path:
                return f
        return None

    def paths(self) -> Iterator[str]:
        paths = self.cache.paths
        for i in self.idx:
            yield paths[i]
        for f in self.specials:
            yield f.path

    def __len__(self) -> int:
        return len(self.idx) + len(self.specials)


class HashedFiles(Mapping[str, Row]):
    """The files a walk hashed: their fresh fingerprint rows as one path table's columns
    (memfs.pathtable, a lineage of its own) and their permission bits, not a record and a
    fact object each. A take-in hashes every file, and those objects (~270 B a file) lived
    from the walk to the journal's write, the attach's peak: the arenas it filled stayed
    resident (docs/performance.md). A fact is built when read (`fact`); the journal patches
    its snapshot from the rows (this is the Mapping of them it is given). Filled by one
    walk's thread; read-only once the walk is done."""

    __slots__ = ("table", "modes")

    def __init__(self) -> None:
        self.table = FingerprintTable()
        self.modes = array("H")  # by the table's index

    def add(self, path: str, row: Row, mode: int) -> None:
        """One file hashed (once per path in a walk)."""
        self.table.add(path, row)
        self.modes.append(mode)

    def fact(self, path: str) -> FileFact | None:
        i = self.table.at(path)
        if i is None:
            return None
        t = self.table
        return new_tuple(FileFact, (t.paths[i], t.row(i), True, MODES[self.modes[i]]))

    def __getitem__(self, path: str) -> Row:
        return self.table[path]

    def __contains__(self, path: object) -> bool:
        return path in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.paths)

    def __len__(self) -> int:
        return len(self.table.paths)


class WalkFiles(Mapping[str, FileFact]):
    """An observation's files: those decided by the walk (`own`), those it hashed
    (`hashed`) and those of the directory memos it took (`memos`, by directory); the facts
    of the last two are built when asked for. Read-only once the walk is done; any thread
    may read it."""

    __slots__ = ("own", "memos", "hashed", "_len")

    def __init__(self, own: dict[str, FileFact], memos: dict[str, DirMemo],
                 hashed: HashedFiles | None = None) -> None:
        self.own, self.memos = own, memos
        self.hashed = hashed if hashed else None
        self._len = len(own) + sum(map(len, memos.values())) + len(hashed or ())

    def get(self, path: str, default: object = None) -> FileFact | None:  # type: ignore[override]
        got = self.own.get(path)
        if got is not None:
            return got
        if self.hashed is not None:
            got = self.hashed.fact(path)
            if got is not None:
                return got
        memo = self.memos.get(path.rpartition("/")[0])
        if memo is not None:
            got = memo.fact(path)
        return default if got is None else got  # type: ignore[return-value]

    def __getitem__(self, path: str) -> FileFact:
        got = self.get(path)
        if got is None:
            raise KeyError(path)
        return got

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path) is not None

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        if self.hashed is not None:
            yield from self.hashed
        for memo in self.memos.values():
            yield from memo.paths()

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other: object) -> bool:
        """Equal as mappings; the facts of a memo both hold are not built (equal at once)."""
        if self is other:
            return True
        if not isinstance(other, WalkFiles):
            return super().__eq__(other)
        if len(self) != len(other):
            return False
        theirs, get = other.memos, other.get
        for d, memo in self.memos.items():
            if theirs.get(d) is not memo and any(
                    get(p) != memo.fact(p) for p in memo.paths()):
                return False
        if self.hashed is not None and any(
                get(p) != self.hashed.fact(p) for p in self.hashed):
            return False
        # Every path here is there with an equal fact, and there are as many: equal.
        return all(get(p) == f for p, f in self.own.items())

    __hash__ = None  # type: ignore[assignment]


def listing_of(names: list[str]) -> bytes:
    """The digest of a sorted listing (a name's surrogate escapes encoded one-to-one)."""
    return records_digest("\0".join(names).encode("utf-8", "surrogatepass"))


def records_digest(data: bytes) -> bytes:
    """16 bytes for a listing or a directory's lstat records (blake2b-128)."""
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass
class WalkMemo:
    """A mount's DirMemos, for the walk settings (root, trust, ignores...) they were made
    under; the caller keeps one per mount and passes it to every observe of that mount."""

    key: tuple = ()
    dirs: dict[str, DirMemo] = field(default_factory=dict)
    # The last whole walk that took every directory from its memo: the memos it took (by
    # directory, in walk order) and the files they gave. A whole walk taking the very same
    # memos again gives the very same files, so it hands out that mapping (read-only).
    last: tuple[dict[str, DirMemo], Mapping[str, FileFact]] | None = None
