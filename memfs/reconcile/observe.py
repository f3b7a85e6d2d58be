"""Observation: what a backing directory holds, as facts the rule can trust.

Walks from the held root fd through directory fds (O_NOFOLLOW|O_DIRECTORY|O_NONBLOCK), stats
without following links, and hashes (xxh3-128, streamed) unless a cached fingerprint vouches.

Trust, the way git's racy-index rule has it: a fingerprint {size, mtime_ns, ctime_ns, ino, dev}
equal by value to the one recorded when the bytes were hashed vouches for them only
  - on a filesystem that maintains ctime (a statfs-magic allowlist): utimes, `cp -p` and
    `touch -r` can restore mtime but never ctime;
  - for a file on the root's own device (a mount below the root may be anything);
  - outside a 2 s racy window: if the file changed less than 2 s before it was hashed, a
    same-size rewrite within timestamp granularity could leave the fingerprint unchanged.
Elsewhere every observation rehashes.

Absence is proven only by a complete listing of a directory that was still at its path once
listed. Unreadable, symlinked, ignored, swapped, changing and capped regions are reported as
incomplete regions with their reason and prove nothing. A FIFO, socket or device is a disk-only
fact from its lstat alone (never opened: a FIFO would block), and so is an untracked file with
other hard links (its head read for its type, never hashed nor taken in). A missing or replaced root raises RootUnavailable: no observation at all.

VCS directories (.git, .hg, .svn, .jj, _darcs, .bzr, CVS) are ignored by default — reported as
incomplete regions (reason "vcs"), never taken in nor written — so a repository is only ever
changed by the git run on its own side and two sides running git cannot corrupt either one. See
docs/reconciliation.md.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import posixpath
import stat
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import xxhash

from memfs.reconcile.contained import (
    CTIME_TRUSTED,
    DIR_FLAGS,
    FILE_FLAGS,
    TEMP_PREFIX,
    DirLink,
    Refused,
    RootId,
    RootUnavailable,
    close_chain,
    components,
    fs_magic,
    ident,
    open_chain,
    open_root,
    root_unchanged,
    still_linked,
)
from memfs.reconcile.lstat import LStat, unpack
from memfs.reconcile.lstat import records as lstat_records
from memfs.reconcile.rule import ABSENT, MODE_BITS, Content, Disk, DiskUnknown, Kind

VCS_DIRS = frozenset({".git", ".hg", ".svn", ".jj", "_darcs", ".bzr", "CVS"})
DEFAULT_MAX_FILE_SIZE = 64 * 1024 * 1024
RACY_NS = 2_000_000_000
HEAD = 8192  # bytes read to tell text from binary and sniff a MIME type
CHUNK = 1 << 20
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

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


_new = tuple.__new__
_OCTET = "application/octet-stream"
_MIME_OF_KIND = {"text": "text/plain"}  # other kinds: the MIME sniffed when hashed (cached)


def _no_cache(path: str) -> None:
    """The cache lookup where fingerprints are never trusted: every file is hashed."""
    return None


class CachedHash(Protocol):
    """What the fingerprint cache holds per path (memfs.store.journal.FingerprintRow fits)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    digest: str
    kind: str
    hashed_at_ns: int
    mime: str | None  # sniffed when hashed (None: not recorded)


@dataclass(frozen=True)
class HashRecord:
    """A fresh cache entry; field names match memfs.store.journal.FingerprintRow."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int
    digest: str
    kind: str
    hashed_at_ns: int
    mime: str | None = None


class FileFact(NamedTuple):
    path: str
    size: int
    fingerprint: Fingerprint
    digest: str | None  # None: an untracked oversize file seen by a head read only
    kind: Kind
    mime: str
    rehashed: bool  # False when a trusted fingerprint vouched for the cached digest
    mode: int | None = None  # permission bits (rule.MODE_BITS) as lstat gave them


@dataclass(frozen=True)
class Region:
    """A part of the tree not (completely) observed; it proves no absence."""

    path: str
    reason: str


@dataclass
class Observation:
    root: RootId
    scope: str
    files: dict[str, FileFact] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # directories listed completely
    regions: list[Region] = field(default_factory=list)
    hashed: dict[str, HashRecord] = field(default_factory=dict)  # cache entries to store
    bytes_read: int = 0

    def disk(self, path: str) -> Disk:
        """The rule's D for a path: content, ABSENT only where absence is proven, or unknown."""
        fact = self.files.get(path)
        if fact is not None:
            return _content(fact.digest, fact.kind, fact.mode)
        for r in self.regions:
            if r.path == "" or path == r.path or path.startswith(r.path + "/"):
                return DiskUnknown(r.reason)
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
                and (self.files is other.files or self.files == other.files))


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + "/")


@functools.lru_cache(maxsize=1 << 16)
def _content(digest: str | None, kind: Kind, mode: int | None) -> Content:
    """D for a fact, one object per (digest, kind, mode)."""
    return Content(digest, kind, mode)


_SPECIAL_MIME = {stat.S_IFIFO: "inode/fifo", stat.S_IFSOCK: "inode/socket",
                 stat.S_IFCHR: "inode/chardevice", stat.S_IFBLK: "inode/blockdevice"}


@dataclass
class DirMemo:
    """One directory as the last walk saw it, kept only when every entry's outcome followed
    from its name, its lstat record and (for a file) the cache row that vouched for it: no
    file was hashed, no link followed, no call failed. While the listing, the records (one
    `==` on bytes) and those rows are unchanged, a walk would build exactly these facts,
    regions and subdirectories again, so it takes them as they are."""

    names: list[str]  # the sorted listing
    statted: list[str]  # the names not ignored, in the order of `records`
    ignored: list[Region]
    records: bytes
    facts: list[tuple[str, FileFact]]
    rows: list[tuple[str, CachedHash]]  # the cache row that vouched for each fact
    regions: list[Region]  # after the ignored ones: symlinks (following off)
    subdirs: list[tuple[str, str, LStat]]
    cache: object = None  # the cache mapping the rows were last found equal in

    def vouched_by(self, cache: Mapping[str, CachedHash]) -> bool:
        """Does `cache` still hold the rows (by value; the same mapping object: at once)?"""
        if self.cache is cache:
            return True
        get = cache.get
        if all(get(p) == row for p, row in self.rows):
            self.cache = cache
            return True
        return False


@dataclass
class WalkMemo:
    """A mount's DirMemos, for the walk settings (root, trust, ignores...) they were made
    under; the caller keeps one per mount and passes it to every observe of that mount."""

    key: tuple = ()
    dirs: dict[str, DirMemo] = field(default_factory=dict)
    # The last whole walk that took every directory from its memo: the memos in walk order
    # and the files they gave. A whole walk taking the very same memos again gives the very
    # same files, so it hands out that dict (read-only) instead of building 100k entries.
    last: tuple[list[DirMemo], dict[str, FileFact]] | None = None


@dataclass
class _Walk:
    obs: Observation
    root_path: str
    cache: Mapping[str, CachedHash]
    tracked: Callable[[str], bool]
    max_file_size: int
    ignore: tuple[str, ...]
    ignore_vcs: bool
    trust: bool
    racy_ns: int
    clock: Callable[[], int]
    follow_symlinks: bool
    limit: int | None
    seen: int = 0
    root_fd: int = -1
    root_dev: int = -1
    memo: dict[str, DirMemo] | None = None  # read per directory (None: off)
    memo_out: dict[str, DirMemo] | None = None  # where this walk's memos go
    hits: list[DirMemo] | None = None  # memos taken, files not yet added (see WalkMemo.last)

    def ignored(self, rel: str, name: str) -> str | None:
        if name.startswith(TEMP_PREFIX):
            return "memfs-scratch"
        if self.ignore_vcs and name in VCS_DIRS:
            return "vcs"
        for pat in self.ignore:
            if fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(name, pat):
                return "ignored"
        return None

    def region(self, rel: str, reason: str) -> None:
        self.obs.regions.append(Region(rel, reason))

    def walk_dir(self, chain: list[DirLink], rel: str) -> None:
        fd = chain[-1].fd
        try:
            names = os.listdir(fd)
        except PermissionError:
            self.region(rel, "unreadable")
            return
        except OSError as exc:
            self.region(rel, f"unlistable ({errno.errorcode.get(exc.errno or 0, exc.errno)})")
            return
        # A listing counts only if, once listed, the directory is still the one its path names
        # (all the way up): otherwise its names may be another directory's, or outside the root.
        if not still_linked(chain) or not root_unchanged(self.root_path, self.obs.root):
            self.region(rel, "swapped")
            return
        names.sort()
        cut = None
        if self.limit is not None and len(names) > self.limit - self.seen:
            cut = max(0, self.limit - self.seen)
            names = names[:cut]
        self.seen += len(names)
        subdirs = self._entries(fd, rel, names, chain)
        if cut is not None:
            # Reported, never silent: the whole directory proves nothing from here on.
            self.region(rel, f"walk limit of {self.limit} entries reached")
            return
        self.obs.listed.add(rel)
        for name, child, st in subdirs:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                self.region(child, "unreadable")
                continue
            except OSError:
                self.region(child, "swapped")  # became a symlink, a file, or vanished
                continue
            try:
                if ident(os.fstat(sub)) != ident(st):  # type: ignore[arg-type]
                    self.region(child, "swapped")
                    continue
                chain.append(DirLink(sub, name, ident(st)))  # type: ignore[arg-type]
                try:
                    self.walk_dir(chain, child)
                finally:
                    chain.pop()
            finally:
                os.close(sub)

    def _entries(self, fd: int, rel: str, names: list[str], chain: list[DirLink],
                 ) -> list[tuple[str, str, LStat]]:
        """Stat each listed name; returns the subdirectories to descend into.

        The hot loop of a pass. The names are stat'ed in one call (`lstat.records`); if the
        listing, the records and the vouching cache rows are those of the directory's memo,
        its facts are taken as they are (a quiet directory costs one `==` on bytes).
        Otherwise each name is decided (`_decide`) and, where every outcome is one the memo
        can stand for, the directory's memo is made afresh."""
        regions = self.obs.regions
        old = self.memo.get(rel) if self.memo is not None else None
        if old is not None and old.names == names:
            statted = old.statted
            ignored = old.ignored
            regions.extend(ignored)
        else:
            old = None
            mark = len(regions)
            statted = self._not_ignored(rel, names)
            ignored = regions[mark:]
        recs = lstat_records(fd, statted)
        if old is not None and recs == old.records and old.vouched_by(self.cache):
            regions.extend(old.regions)
            if self.hits is not None:
                self.hits.append(old)
            else:
                self.obs.files.update(old.facts)
            self.memo_out[rel] = old  # type: ignore[index]
            return old.subdirs
        self.flush()
        mark = len(regions)
        memo = DirMemo(names, statted, ignored, recs, [], [], [], [], self.cache)
        keep = self._decide(fd, rel, statted, recs, chain, memo)
        if self.memo_out is not None:
            if keep:
                memo.regions = regions[mark:]
                self.memo_out[rel] = memo
            else:
                self.memo_out.pop(rel, None)
        return memo.subdirs

    def flush(self) -> None:
        """Add the facts of the memos taken so far, in walk order; no deferring after."""
        if self.hits is not None:
            for memo in self.hits:
                self.obs.files.update(memo.facts)
            self.hits = None

    def _not_ignored(self, rel: str, names: list[str]) -> list[str]:
        """The names to stat; the ignored ones become regions."""
        prefix = rel + "/" if rel else ""
        if not self.ignore and not any(n[0] == "." or n in VCS_DIRS for n in names):
            return names  # TEMP_PREFIX starts with a dot too
        out = []
        for name in names:
            if self.ignore or name[0] == "." or name in VCS_DIRS:
                why = self.ignored(prefix + name, name)
                if why:
                    self.region(prefix + name, why)
                    continue
            out.append(name)
        return out

    def _decide(self, fd: int, rel: str, names: list[str], recs: bytes,
                chain: list[DirLink], memo: DirMemo) -> bool:
        """Each name's outcome from its lstat record, into `memo` (facts, rows, subdirs) and
        the observation; True if the memo may stand for this directory next time.

        A regular file whose cached fingerprint vouches for its bytes (the rule in `vouches`)
        is taken from the cache with no call; everything else goes through `file`,
        `symlink` or a region."""
        prefix = rel + "/" if rel else ""
        cache_get = self.cache.get if self.trust else _no_cache
        files, facts, rows, subdirs = self.obs.files, memo.facts, memo.rows, memo.subdirs
        root_dev, racy_ns, intern = self.root_dev, self.racy_ns, sys.intern
        isreg, isdir, islnk = stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK
        keep = True
        for name, st in zip(names, unpack(recs), strict=True):
            child = prefix + name
            if type(st) is int:  # the call failed: errno
                keep = False
                if st == errno.ENOENT:
                    continue  # gone since the listing: absent now, which the listing allows
                if st in (errno.EACCES, errno.EPERM):
                    self.region(child, "unreadable")
                else:
                    self.region(child, f"unreadable ({errno.errorcode.get(st, st)})")
                continue
            mode = st.st_mode
            if isreg(mode):
                cached = cache_get(child)
                if cached is not None:
                    mtime, ctime = st.st_mtime_ns, st.st_ctime_ns
                    # Inline copy of `vouches` (a call per file costs more than the test).
                    if (mtime == cached.mtime_ns and ctime == cached.ctime_ns
                            and st.st_size == cached.size and st.st_ino == cached.ino
                            and st.st_dev == cached.dev and cached.dev == root_dev
                            and mtime < cached.hashed_at_ns - racy_ns
                            and ctime < cached.hashed_at_ns - racy_ns):
                        kind = cached.kind
                        child = intern(child)
                        fact = files[child] = _new(FileFact, (
                            child, st.st_size,
                            _new(Fingerprint, (st.st_size, mtime, ctime, st.st_ino, st.st_dev)),
                            cached.digest, kind,
                            _MIME_OF_KIND.get(kind) or cached.mime or _OCTET, False,
                            mode & MODE_BITS))
                        facts.append((child, fact))
                        rows.append((child, cached))
                        continue
                keep = False
                self.file(fd, name, child, st)
            elif isdir(mode):
                subdirs.append((name, child, st))
            elif islnk(mode):
                keep = keep and not self.follow_symlinks
                self.symlink(chain, name, child)
            else:
                child = intern(child)
                facts.append((child, self.special(child, st)))  # from the record alone
        return keep

    def vouches(self, fp: Fingerprint, cached: CachedHash | None) -> bool:
        """Does the cached row vouch for the bytes of a file with fingerprint `fp`?

        Equal by value, on a ctime-maintaining filesystem, on the root's device, and both
        timestamps older than the racy window before the row was hashed (see the module doc)."""
        return (
            cached is not None and self.trust and fp.dev == self.root_dev
            and fp.mtime_ns == cached.mtime_ns and fp.ctime_ns == cached.ctime_ns
            and fp.size == cached.size and fp.ino == cached.ino and fp.dev == cached.dev
            and fp.mtime_ns < cached.hashed_at_ns - self.racy_ns
            and fp.ctime_ns < cached.hashed_at_ns - self.racy_ns
        )

    def symlink(self, chain: list[DirLink], name: str, rel: str) -> None:
        if not self.follow_symlinks:
            self.region(rel, "symlink (following is off)")
            return
        try:
            target = os.readlink(name, dir_fd=chain[-1].fd)
        except OSError:
            self.region(rel, "symlink (unreadable)")
            return
        base = posixpath.dirname(rel)
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            self.region(rel, "symlink pointing outside the root")
            return
        # Follow one level, inside the root only, through dir fds: the target must be a regular
        # file reached without further links.
        try:
            parts = components(resolved)
            if not parts:
                raise Refused("a link to the root", reason="not-a-file")
            sub = open_chain(self.root_fd, parts[:-1])
        except (Refused, OSError):
            self.region(rel, "symlink to something other than a file inside the root")
            return
        try:
            st = os.stat(parts[-1], dir_fd=sub[-1].fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                self.region(rel, "symlink to something other than a file inside the root")
                return
            self.file(sub[-1].fd, parts[-1], rel, st)
        except OSError:
            self.region(rel, "symlink (dangling)")
        finally:
            close_chain(sub)

    def special(self, rel: str, st: os.stat_result | LStat) -> FileFact:
        """A FIFO, socket or device: disk-only, never opened (a FIFO would block), never taken
        in nor written; no digest, so it never compares equal and never reads as agreed."""
        mime = _SPECIAL_MIME.get(stat.S_IFMT(st.st_mode), "inode/x-special")
        fp = Fingerprint(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        fact = self.obs.files[rel] = FileFact(rel, 0, fp, None, "special", mime, False,
                                              st.st_mode & MODE_BITS)
        return fact

    def file(self, dir_fd: int, name: str, rel: str, st: os.stat_result | LStat) -> None:
        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs once per file.
        fp = _new(Fingerprint, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                st.st_dev))
        mode = st.st_mode & MODE_BITS
        cached = self.cache.get(rel)
        if cached is not None and self.vouches(fp, cached):
            kind: Kind = cached.kind  # type: ignore[assignment]
            self.obs.files[rel] = _new(FileFact, (rel, fp.size, fp, cached.digest, kind,
                                                  _MIME_OF_KIND.get(kind) or
                                                  getattr(cached, "mime", None) or _OCTET,
                                                  False, mode))
            return
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
        except PermissionError:
            self.region(rel, "unreadable")
            return
        except OSError:
            self.region(rel, "swapped")
            return
        try:
            first = os.fstat(fd)
            if not stat.S_ISREG(first.st_mode) or ident(first) != ident(st):
                self.region(rel, "swapped")
                return
            oversize = first.st_size > self.max_file_size
            # A file with other hard links, untracked: disk-only, as an oversize one (taken in,
            # it would be one copy of several names; the names are disk's to keep together).
            linked = first.st_nlink > 1
            if (oversize or linked) and not self.tracked(rel):
                head = os.pread(fd, HEAD, 0)
                self.obs.bytes_read += len(head)
                _, mime = sniff(head)
                self.obs.files[rel] = FileFact(rel, first.st_size, Fingerprint.of(first), None,
                                               "hardlink" if linked else "oversize", mime,
                                               True, first.st_mode & MODE_BITS)
                return
            started = self.clock()
            h = xxhash.xxh3_128()
            head = b""
            offset = 0
            while True:
                chunk = os.pread(fd, CHUNK, offset)
                if not chunk:
                    break
                if offset < HEAD:
                    head += chunk[: HEAD - offset]
                h.update(chunk)
                offset += len(chunk)
            self.obs.bytes_read += offset
            last = os.fstat(fd)
            if Fingerprint.of(last) != Fingerprint.of(first) or offset != first.st_size:
                self.region(rel, "changing while read")
                return
        except OSError as exc:
            self.region(rel, f"unreadable ({errno.errorcode.get(exc.errno or 0, exc.errno)})")
            return
        finally:
            os.close(fd)
        kind, mime = sniff(head)
        if oversize:
            kind = "oversize"
        fp = Fingerprint.of(last)
        digest = sys.intern(h.hexdigest())
        self.obs.files[rel] = FileFact(rel, fp.size, fp, digest, kind, mime, True,
                                       last.st_mode & MODE_BITS)
        if all(_INT64_MIN <= v <= _INT64_MAX for v in fp):
            self.obs.hashed[rel] = HashRecord(fp.size, fp.mtime_ns, fp.ctime_ns, fp.ino,
                                              fp.dev, digest, kind, started, mime)
        # else: a time past 2262 or an inode number of 2**63 and up does not fit the journal's
        # integers; such a file is hashed on every pass instead of vouched for.


def observe(
    root_path: str | os.PathLike[str],
    *,
    expected_root: RootId | None = None,
    scope: str = "",
    cache: Mapping[str, CachedHash] | None = None,
    tracked: Collection[str] | Callable[[str], bool] = (),
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    ignore: Iterable[str] = (),
    ignore_vcs: bool = True,
    follow_symlinks: bool = False,
    trusted_fs: Collection[int] = CTIME_TRUSTED,
    racy_ns: int = RACY_NS,
    clock: Callable[[], int] = time.time_ns,
    limit: int | None = None,
    memo: WalkMemo | None = None,
) -> Observation:
    """Observe `scope` (a mount-relative directory or file; '' for everything) under the root.

    `cache`: fingerprints from earlier observations (journal.fingerprints); fresh hashes come
    back in `Observation.hashed` for the caller to store. `tracked`: paths the store or the
    evidence knows; an untracked file over `max_file_size` gets a head read, never a hash.
    `limit` bounds the number of entries visited; what it leaves is reported as a region.
    `memo`: the mount's directory memos (see DirMemo), read and refreshed by this walk; a
    quiet directory's facts are then the very objects of the last walk (no rebuilding, and
    100k new facts per pass would set off full collections of the daemon's heap). Unused
    with `limit`. With a memo, `cache` must be a snapshot: never changed in place once walked
    with (the journal's is read-only); a changed cache is a new object, checked row by row.
    Raises RootUnavailable for a missing or replaced root.
    """
    root_fd, rid = open_root(root_path, expected_root)
    try:
        magic = fs_magic(root_fd)
        is_tracked = tracked if callable(tracked) else frozenset(tracked).__contains__
        w = _Walk(
            Observation(rid, scope), os.fspath(root_path), cache or {}, is_tracked,
            max_file_size, tuple(ignore), ignore_vcs, magic in trusted_fs, racy_ns, clock,
            follow_symlinks, limit, root_fd=root_fd, root_dev=rid.dev,
        )
        if memo is not None and limit is None:
            key = (rid, w.trust, racy_ns, w.ignore, ignore_vcs, follow_symlinks, max_file_size)
            if memo.key != key:
                memo.key, memo.dirs, memo.last = key, {}, None
            # A whole walk starts the memos afresh (a removed directory's goes with it); a
            # scoped one refreshes those of its directories.
            w.memo = memo.dirs
            w.memo_out = {} if scope == "" else memo.dirs
            w.hits = [] if scope == "" else None
        parts = components(scope)
        try:
            chain = open_chain(root_fd, parts[:-1])
        except FileNotFoundError:
            chain = None
        except Refused:
            w.region(posixpath.dirname(scope), "swapped")
            chain = None
        except PermissionError:
            w.region(scope, "unreadable")
            chain = None
        if chain is None:
            _prove_parent_missing(w, root_fd, parts)
        else:
            try:
                _observe_scope(w, chain, parts)
            finally:
                close_chain(chain)
        if w.memo_out is not None and scope == "" and memo is not None:
            memo.dirs = w.memo_out
            hits, last = w.hits, memo.last
            if hits is not None and last is not None and len(hits) == len(last[0]) and all(
                    a is b for a, b in zip(hits, last[0], strict=True)):
                w.obs.files = last[1]
            else:
                w.flush()
                memo.last = (hits, w.obs.files) if hits is not None else None
        if not root_unchanged(root_path, rid):
            raise RootUnavailable(
                f"backing root {os.fspath(root_path)!r} was replaced during observation",
                "observe again; if it stays replaced, bring it back or `memfs sync "
                "--accept-root`", "replaced")
        return w.obs
    finally:
        os.close(root_fd)


def _observe_scope(w: _Walk, chain: list[DirLink], parts: list[str]) -> None:
    if not parts:
        w.walk_dir(chain, "")
        return
    name, rel = parts[-1], "/".join(parts)
    parent_rel = "/".join(parts[:-1])
    why = w.ignored(rel, name)
    if why:
        w.region(rel, why)
        return
    fd = chain[-1].fd
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        if still_linked(chain) and root_unchanged(w.root_path, w.obs.root):
            w.obs.listed.add(parent_rel)  # the held parent, still at its path, lacks it
        else:
            w.region(parent_rel, "swapped")
        return
    except PermissionError:
        w.region(rel, "unreadable")
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:
            w.region(rel, "swapped")
            return
        try:
            if ident(os.fstat(sub)) != ident(st):
                w.region(rel, "swapped")
                return
            chain.append(DirLink(sub, name, ident(st)))
            try:
                w.walk_dir(chain, rel)
            finally:
                chain.pop()
        finally:
            os.close(sub)
    elif stat.S_ISREG(st.st_mode):
        w.file(fd, name, rel, st)
    elif stat.S_ISLNK(st.st_mode):
        w.symlink(chain, name, rel)
    else:
        w.special(rel, st)


def _prove_parent_missing(w: _Walk, root_fd: int, parts: list[str]) -> None:
    """A scope whose parent chain is missing: absent if the deepest existing directory, still
    at its path, lacks the next component (or holds a non-directory there)."""
    for depth in range(len(parts) - 1, -1, -1):
        try:
            chain = open_chain(root_fd, parts[:depth])
        except (OSError, Refused):
            continue
        try:
            try:
                st = os.stat(parts[depth], dir_fd=chain[-1].fd, follow_symlinks=False)
                present_dir = stat.S_ISDIR(st.st_mode)
            except FileNotFoundError:
                present_dir = False
            if not present_dir and still_linked(chain) and root_unchanged(w.root_path,
                                                                           w.obs.root):
                w.obs.listed.add("/".join(parts[:depth]))
            else:
                w.region("/".join(parts[: depth + 1]), "changed during observation")
        finally:
            close_chain(chain)
        return
