"""What an observation is made of: facts about disk the rule can trust, and the regions that
prove nothing (memfs.reconcile.observe walks; see its docstring for the trust rule).

Pure values; any thread.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from memfs.reconcile.contained import (
    RootId,
)
from memfs.reconcile.rule import ABSENT, Content, Disk, DiskUnknown, Kind

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".jj", "_darcs", ".bzr", "CVS"})
DEFAULT_MAX_FILE_SIZE = 64 * 1024 * 1024
RACY_NS = 2_000_000_000
HEAD = 8192  # bytes read to tell text from binary and sniff a MIME type
CHUNK = 1 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_MAGIC_MIME = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\x7fELF", "application/x-elf"),
    (b"\x00asm", "application/wasm"),
]


def sniff(head: bytes) -> tuple[Kind, str]:
    """Text or binary, and a MIME type, from a file's first bytes."""
    for magic, mime in _MAGIC_MIME:
        if head.startswith(magic):
            return "binary", mime
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "binary", "image/webp"
    if b"\0" in head:
        return "binary", "application/octet-stream"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the end of the head
            return "binary", "application/octet-stream"
    return "text", "text/plain"


class Fingerprint(NamedTuple):
    """Compared by value; a NamedTuple because a walk builds one per file."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, st: os.stat_result) -> Fingerprint:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


new_tuple = tuple.__new__
OCTET = "application/octet-stream"
MIME_OF_KIND = {"text": "text/plain"}  # other kinds: the MIME sniffed when hashed (cached)


def no_cache(path: str) -> None:
    """The cache lookup where fingerprints are never trusted: every file is hashed."""
    return None


class CachedHash(Protocol):
    """What the fingerprint cache holds per path (memfs.store.journal.FingerprintRow fits)."""

    @property
    def size(self) -> int: ...
    @property
    def mtime_ns(self) -> int: ...
    @property
    def ctime_ns(self) -> int: ...
    @property
    def ino(self) -> int: ...
    @property
    def dev(self) -> int: ...
    @property
    def digest(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def hashed_at_ns(self) -> int: ...
    @property
    def mime(self) -> str | None: ...  # sniffed when hashed (None: not recorded)


class HashRecord(NamedTuple):
    """A fresh cache entry; its fields (names and order) are memfs.store.journal.FingerprintRow's,
    so a FileFact keeps either as its record. A NamedTuple: a walk makes one per file hashed."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    digest: str | None  # None: never hashed (a special file, an untracked oversize one)
    kind: str
    hashed_at_ns: int
    mime: str | None = None


class FileFact(NamedTuple):
    """One file as a walk found it: the fingerprint, digest, kind and MIME type are its
    record's, `seen`: the cache row that vouched for the bytes (a view of the journal
    snapshot's table, memfs.pathtable) or the HashRecord this walk made. A quiet directory's
    facts are not kept between passes: its memo names the rows, and a fact is built when read
    (memfs.reconcile.walkfiles.WalkFiles). Two facts
    are equal when all the rule and the fast paths read is (`key`), whatever the record's
    hash time."""

    path: str
    seen: CachedHash  # a FingerprintRow or a HashRecord
    rehashed: bool  # False when a trusted fingerprint vouched for the cached digest
    mode: int | None = None  # permission bits (rule.MODE_BITS) as lstat gave them

    @classmethod
    def of(cls, path: str, size: int, fp: Fingerprint, digest: str | None, kind: Kind,
           mime: str, rehashed: bool, mode: int | None = None) -> FileFact:
        """A fact from its parts."""
        return cls(path, HashRecord(size, fp.mtime_ns, fp.ctime_ns, fp.ino, fp.dev, digest,
                                    kind, 0, mime), rehashed, mode)

    @property
    def size(self) -> int:
        return self.seen.size

    @property
    def fingerprint(self) -> Fingerprint:
        s = self.seen
        return new_tuple(Fingerprint, (s.size, s.mtime_ns, s.ctime_ns, s.ino, s.dev))

    @property
    def digest(self) -> str | None:  # None: an untracked oversize file seen by a head read only
        return self.seen.digest

    @property
    def kind(self) -> Kind:
        return self.seen.kind  # type: ignore[return-value]

    @property
    def mime(self) -> str:
        return MIME_OF_KIND.get(self.seen.kind) or getattr(self.seen, "mime", None) or OCTET

    def key(self) -> tuple[object, ...]:
        s = self.seen
        return (self.path, s.size, s.mtime_ns, s.ctime_ns, s.ino, s.dev, s.digest, s.kind,
                self.mime, self.rehashed, self.mode)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, FileFact):
            return NotImplemented
        return self.key() == other.key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.key())


REGION_DIR, REGION_LINK = "dir", "symlink"  # Region.kind, where the walk knows it


@dataclass(frozen=True)
class Region:
    """A part of the tree not (completely) observed; it proves no absence. `kind` says what
    is there where the walk saw it (REGION_DIR, REGION_LINK; "" for a file or unknown), so a
    listing shows a symlink as one, not as a directory."""

    path: str
    reason: str
    kind: str = ""


@dataclass
class Observation:
    root: RootId
    scope: str
    # Read-only once observed: a dict, or the walk's view over its directory memos
    # (memfs.reconcile.walkfiles.WalkFiles), whose facts are built when asked for.
    files: Mapping[str, FileFact] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # directories listed completely
    # Directories' permission bits (rule.MODE_BITS) as the walk found them: the root (''),
    # a scope's parents and every directory walked into. What a take-in makes in the mount
    # gets these (a 0700 directory must not become 0755 there).
    dirs: dict[str, int] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    # Cache entries to store: the walk's HashedFiles (memfs.reconcile.walkfiles), read-only.
    hashed: Mapping[str, CachedHash] = field(default_factory=dict)
    bytes_read: int = 0

    def disk(self, path: str) -> Disk:
        """The rule's D for a path: content, ABSENT only where absence is proven, or unknown."""
        fact = self.files.get(path)
        if fact is not None:
            return shared_content(fact.digest, fact.kind, fact.mode)
        for r in self.regions:
            if r.path == "" or path == r.path or path.startswith(r.path + "/"):
                return DiskUnknown(r.reason, link=path == r.path and r.kind == REGION_LINK)
        if not _under(path, self.scope):
            return DiskUnknown("outside the observed scope")
        if path in self.listed:
            return ABSENT  # a directory, listed completely: no file there
        parts = path.split("/")
        for i in range(len(parts) - 1, -1, -1):
            ancestor = "/".join(parts[:i])
            if ancestor in self.listed or ancestor in self.files:
                # The nearest completely listed ancestor lacks the next component, or a file
                # stands where a directory would be: proven absent.
                return ABSENT
        return DiskUnknown("not observed")

    @property
    def complete(self) -> bool:
        return not self.regions

    def same_disk(self, other: Observation) -> bool:
        """Does `other` show the rule the same disk (root, scope, facts, listings, regions)?"""
        return (self.root == other.root and self.scope == other.scope
                and self.regions == other.regions and self.listed == other.listed
                and self.dirs == other.dirs
                and (self.files is other.files or self.files == other.files))


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + "/")


# One Content per (digest, kind, mode), found by the digest alone first: nearly every digest
# has one kind and mode, and a key tuple of its own was 64 bytes an entry. The others (one
# content under two modes, say) are kept by the whole key.
_BY_DIGEST: dict[str | None, Content] = {}
_CONTENTS: dict[tuple[str | None, Kind, int | None], Content] = {}
CONTENTS_KEPT = 1 << 16


def shared_content(digest: str | None, kind: Kind, mode: int | None) -> Content:
    """D for a fact, one object per (digest, kind, mode): dicts emptied when full (an
    lru_cache's links cost ~150 bytes an entry more); losing an entry only costs building it
    again. The store view takes S's from here too, so a file both sides agree on has one
    Content, not two (plain dicts: any thread may read or fill them, losing nothing but an
    entry to a race)."""
    got = _BY_DIGEST.get(digest)
    if got is not None and got.kind == kind and got.mode == mode:
        return got
    if got is None:
        if len(_BY_DIGEST) >= CONTENTS_KEPT:
            _BY_DIGEST.clear()
        got = _BY_DIGEST[digest] = Content(digest, kind, mode)
        return got
    key = (digest, kind, mode)
    got = _CONTENTS.get(key)
    if got is None:
        if len(_CONTENTS) >= CONTENTS_KEPT:
            _CONTENTS.clear()
        got = _CONTENTS[key] = Content(digest, kind, mode)
    return got


SPECIAL_MIME = {stat.S_IFIFO: "inode/fifo", stat.S_IFSOCK: "inode/socket",
                 stat.S_IFCHR: "inode/chardevice", stat.S_IFBLK: "inode/blockdevice"}


