"""One compact table of fingerprint rows, indexed by path: the disk side's per-file memory.

Why: a bound mount keeps a fingerprint row per file between passes (the journal's snapshot,
memfs.store.journal) and the walk's directory memos name those rows
(memfs.reconcile.walkfiles). As objects that was a dict entry, a 9-field tuple (112 B) and
its inode int per file, and a walk fact (80 B) naming it. Here each path has one int index and the row's fields sit in
`array` columns: sizes, times, inode, device and hash time as int64, the digest as 16 raw
bytes, kind and MIME type as small codes of an intern table. A caller that needs a record
gets a `Row` (a NamedTuple) built on demand; the walk compares an lstat record with the
columns directly (`vouches`).

A table is read-only once built: a write makes a new one (`patched`: new columns, the same
index) that keeps every old path's index (new paths are appended, a dropped one is marked
dead), so a directory memo's indices stay valid across patches of one lineage; a table read
afresh is a new lineage. The tables of one lineage share the index and the path list, which
only grow (a table reads an index past its columns, or a dead row, as no row): a patch
copies the columns only. Any thread may read a table; patches of one lineage are made one
at a time (the journal's lock); the intern table is appended to under a lock.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

_INT_COLS = ("size", "mtime", "ctime", "ino", "dev", "hashed")
DEAD = 0  # the kind code of a dropped row


class Row(NamedTuple):
    """One fingerprint row, as callers read it (the journal's FingerprintRow)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    digest: str
    kind: str
    hashed_at_ns: int
    mime: str | None = None  # None: not recorded (a row older than the column)


# Kinds and MIME types: a handful of values, one small code each (code 0: none / dead).
_NAMES: list[str | None] = [None]
_CODES: dict[str | None, int] = {None: 0}
_NAMES_LOCK = threading.Lock()


def code_of(name: str | None) -> int:
    got = _CODES.get(name)
    if got is None:
        with _NAMES_LOCK:
            got = _CODES.get(name)
            if got is None:
                if len(_NAMES) >= 0xFFFF:
                    raise ValueError("too many distinct kinds and MIME types")
                got = len(_NAMES)
                _NAMES.append(name)  # the name first: a reader that sees the code finds it
                _CODES[name] = got
    return got


def pack16(digest: str | None) -> bytes | None:
    """16 raw bytes for a 32-digit lowercase hex digest (what the walk makes), else None (not
    the canonical spelling: kept as text). Also the store side's (memfs.backing.storefiles)."""
    if digest is None or len(digest) != 32:
        return None
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    return raw if raw.hex() == digest else None


_ZERO = bytes(16)


class FingerprintTable(Mapping[str, Row]):
    """path -> Row, as columns. Built by `build` or `patched`, never changed after."""

    __slots__ = ("index", "paths", "size", "mtime", "ctime", "ino", "dev", "hashed",
                 "digests", "kind", "mime", "odd", "lineage", "_len")

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.paths: list[str] = []  # index -> path (a dead row's path stays; shared, growing)
        self.size, self.mtime, self.ctime = array("q"), array("q"), array("q")
        self.ino, self.dev, self.hashed = array("q"), array("q"), array("q")
        self.digests = bytearray()  # 16 bytes a row
        self.kind, self.mime = array("H"), array("H")  # codes (kind DEAD: dropped)
        self.odd: dict[int, str | None] = {}  # digests that are not 32 lowercase hex digits
        self.lineage: object = object()
        self._len = 0

    @classmethod
    def build(cls, rows: Iterable[tuple[str, Row]]) -> FingerprintTable:
        t = cls()
        for path, row in rows:
            t._set(path, row)
        return t

    @classmethod
    def of(cls, rows: Mapping[str, Row]) -> FingerprintTable:
        """A table of a mapping's rows (the mapping itself when it is one)."""
        return rows if isinstance(rows, FingerprintTable) else cls.build(rows.items())

    def add(self, path: str, row: Row) -> None:
        """One more row, while the table is being built (by one thread; not once handed out)."""
        self._set(path, row)

    def _set(self, path: str, row: Row) -> None:
        i = self.index.get(path)
        if i is None:
            i = self.index[path] = len(self.paths)
            self.paths.append(path)
        if i >= len(self.kind):  # dead slots up to it (a path another patch appended)
            n = i + 1 - len(self.kind)
            for name in _INT_COLS:
                getattr(self, name).frombytes(bytes(8 * n))
            self.digests += bytes(16 * n)
            self.kind.frombytes(bytes(2 * n))
            self.mime.frombytes(bytes(2 * n))
        if self.kind[i] == DEAD:
            self._len += 1
        self.size[i], self.mtime[i], self.ctime[i] = row.size, row.mtime_ns, row.ctime_ns
        self.ino[i], self.dev[i], self.hashed[i] = row.ino, row.dev, row.hashed_at_ns
        raw = pack16(row.digest)
        self.digests[16 * i:16 * i + 16] = _ZERO if raw is None else raw
        if raw is None:
            self.odd[i] = row.digest
        else:
            self.odd.pop(i, None)
        self.kind[i] = code_of(row.kind)
        self.mime[i] = code_of(getattr(row, "mime", None))

    def patched(self, changes: Iterable[tuple[str, Row | None]]) -> FingerprintTable:
        """A new table with `changes` (None drops a row); the same lineage, so every path
        this one has keeps its index. A table mostly dead is built afresh (a new lineage)."""
        t = FingerprintTable.__new__(FingerprintTable)
        t.index, t.paths, t.odd = self.index, self.paths, dict(self.odd)
        for name in (*_INT_COLS, "kind", "mime"):
            setattr(t, name, array(getattr(self, name).typecode, getattr(self, name)))
        t.digests = bytearray(self.digests)
        t.lineage, t._len = self.lineage, self._len
        for path, row in changes:
            if row is not None:
                t._set(path, row)
                continue
            i = t.at(path)
            if i is not None:
                t.kind[i] = DEAD
                t._len -= 1
                t.odd.pop(i, None)
        if len(t.kind) > 1024 and t._len < len(t.kind) // 2:
            return FingerprintTable.build(t.items())
        return t

    # -- reads -------------------------------------------------------------------------------

    def row(self, i: int) -> Row:
        """The record at index `i` (a live one), built now."""
        names, odd = _NAMES, self.odd
        d = odd[i] if odd and i in odd else self.digests[16 * i:16 * i + 16].hex()
        return tuple.__new__(Row, (
            self.size[i], self.mtime[i], self.ctime[i], self.ino[i], self.dev[i], d,
            names[self.kind[i]], self.hashed[i], names[self.mime[i]]))

    def at(self, path: str) -> int | None:
        """The live row's index for `path`, or None."""
        i = self.index.get(path)
        kind = self.kind
        return None if i is None or i >= len(kind) or kind[i] == DEAD else i

    def digest_of(self, path: str, default: object = None) -> object:
        """The row's digest alone (P over the rows reads only that)."""
        i = self.at(path)
        if i is None:
            return default
        odd = self.odd
        return odd[i] if odd and i in odd else self.digests[16 * i:16 * i + 16].hex()

    def same_row(self, i: int, other: FingerprintTable, j: int) -> bool:
        """Do this table's row `i` and `other`'s row `j` hold the same values?"""
        if i >= len(self.kind) or j >= len(other.kind):
            return False
        return (self.kind[i] == other.kind[j] != DEAD and self.size[i] == other.size[j]
                and self.mtime[i] == other.mtime[j] and self.ctime[i] == other.ctime[j]
                and self.ino[i] == other.ino[j] and self.dev[i] == other.dev[j]
                and self.hashed[i] == other.hashed[j] and self.mime[i] == other.mime[j]
                and self.odd.get(i, _ZERO) == other.odd.get(j, _ZERO)
                and self.digests[16 * i:16 * i + 16] == other.digests[16 * j:16 * j + 16])

    def get(self, path: str, default: object = None) -> Row | None:  # type: ignore[override]
        i = self.at(path)
        return default if i is None else self.row(i)  # type: ignore[return-value]

    def __getitem__(self, path: str) -> Row:
        i = self.at(path)
        if i is None:
            raise KeyError(path)
        return self.row(i)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.at(path) is not None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        # The shared path list may run past this table's columns: those paths are not its.
        for p, k in zip(self.paths, self.kind, strict=False):
            if k != DEAD:
                yield p

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


__all__ = ["DEAD", "FingerprintTable", "Row", "code_of"]
