"""The walk of one observation (memfs.reconcile.observe): directory by directory through held
fds, one lstat call per directory, a hash only where no trusted fingerprint vouches, and the
per-directory memos that let an unchanged directory skip its per-entry decisions.

A `_Walk` is one observation's, in the thread that runs it; a mount's `WalkMemo` is read and
written only by that mount's walks, one at a time.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import operator
import os
import posixpath
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import xxhash

from memfs.reconcile.contained import (
    DIR_FLAGS,
    FILE_FLAGS,
    TEMP_PREFIX,
    DirLink,
    Refused,
    close_chain,
    components,
    ident,
    open_chain,
    root_unchanged,
    still_linked,
)
from memfs.reconcile.facts import (
    CHUNK,
    HEAD,
    INT64_MAX,
    INT64_MIN,
    SPECIAL_MIME,
    VCS_DIRS,
    CachedHash,
    FileFact,
    Fingerprint,
    HashRecord,
    Observation,
    Region,
    new_tuple,
    no_cache,
    sniff,
)
from memfs.reconcile.lstat import LStat, unpack
from memfs.reconcile.lstat import records as lstat_records
from memfs.reconcile.rule import MODE_BITS, MODES
from memfs.shared import shared_int


@dataclass(slots=True)
class DirMemo:
    """One directory as the last walk saw it, kept only when every entry's outcome followed
    from its name, its lstat record and (for a file) the cache row that vouched for it: no
    file was hashed, no link followed, no call failed. While the listing, the records (one
    `==` on bytes) and those rows are unchanged, a walk would build exactly these facts,
    regions and subdirectories again, so it takes them as they are.

    Kept for every directory of a mount between passes, so it is compact: the listing and the
    records as their blake2b-128 digests (16 bytes a directory, where the records alone were
    64 a file; a collision would take 2**64 tries), the facts as one tuple (a fact's path is
    its own, and a file's fact keeps the very cache row that vouched for it as its record,
    `FileFact.seen`)."""

    listing: bytes  # digest of the sorted listing, joined by NULs (no name holds one)
    statted: list[str] | None  # the names not ignored, in the order of `records` (None: all)
    ignored: list[Region]
    records: bytes  # digest of the names' lstat records
    facts: tuple[FileFact, ...]  # a special file's vouched by nothing: its lstat record
    regions: list[Region]  # after the ignored ones: symlinks (following off)
    subdirs: list[tuple[str, str, LStat]]
    cache: object = None  # the cache mapping the rows were last found equal in

    def vouched_by(self, cache: Mapping[str, CachedHash]) -> bool:
        """Does `cache` still hold the rows (by value; the same mapping object: at once)?"""
        if self.cache is cache:
            return True
        get = cache.get
        if all(f.seen.kind == "special" or get(f.path) == f.seen for f in self.facts):
            self.cache = cache
            return True
        return False

    def add_to(self, files: dict[str, FileFact]) -> None:
        """Its facts, into an observation's files."""
        facts = self.facts
        files.update(zip(map(_path_of, facts), facts, strict=True))


def listing_of(names: list[str]) -> bytes:
    """The digest of a sorted listing (a name's surrogate escapes encoded one-to-one)."""
    return _digest("\0".join(names).encode("utf-8", "surrogatepass"))


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_path_of = operator.itemgetter(0)  # FileFact.path


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
    on_walked: Callable[[int], None] | None = None  # told each directory's entry count
    seen: int = 0
    root_fd: int = -1
    root_dev: int = -1
    memo: dict[str, DirMemo] | None = None  # read per directory (None: off)
    memo_out: dict[str, DirMemo] | None = None  # where this walk's memos go
    hits: list[DirMemo] | None = None  # memos taken, files not yet added (see WalkMemo.last)
    # When the current directory's first hash began: every file hashed in the directory
    # records it as its hash time (earlier than its own start, so the racy rule only gets
    # stricter), one int for the directory's rows instead of one per file.
    started: int | None = None

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
        if self.on_walked is not None:
            self.on_walked(len(names))
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
            self.descend(chain, sub, name, child, st)

    def descend(self, chain: list[DirLink], sub: int, name: str, rel: str,
                st: os.stat_result | LStat) -> None:
        """Walk the directory `sub` (an fd just opened on chain[-1]/name; closed here) if it
        is still the entry `st` was taken from, else report it swapped. Its permission bits
        go into the observation's `dirs`."""
        try:
            if ident(os.fstat(sub)) != ident(st):  # type: ignore[arg-type]
                self.region(rel, "swapped")
                return
            self.obs.dirs[rel] = MODES[st.st_mode & MODE_BITS]
            chain.append(DirLink(sub, name, ident(st)))  # type: ignore[arg-type]
            try:
                self.walk_dir(chain, rel)
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
        listing = listing_of(names) if self.memo_out is not None or old is not None else b""
        if old is not None and old.listing == listing:
            statted = names if old.statted is None else old.statted
            ignored = old.ignored
            regions.extend(ignored)
        else:
            old = None
            mark = len(regions)
            statted = self._not_ignored(rel, names)
            ignored = regions[mark:]
        recs = lstat_records(fd, statted)
        recs_digest = _digest(recs) if self.memo_out is not None or old is not None else b""
        if old is not None and recs_digest == old.records and old.vouched_by(self.cache):
            regions.extend(old.regions)
            if self.hits is not None:
                self.hits.append(old)
            else:
                old.add_to(self.obs.files)
            self.memo_out[rel] = old  # type: ignore[index]
            return old.subdirs
        self.flush()
        self.started = None  # this directory's first hash reads the clock
        mark = len(regions)
        facts: list[FileFact] = []
        subdirs: list[tuple[str, str, LStat]] = []
        keep = self._decide(fd, rel, statted, recs, chain, facts, subdirs)
        if self.memo_out is not None:
            if keep:
                self.memo_out[rel] = DirMemo(
                    listing, None if statted is names else statted, ignored, recs_digest,
                    tuple(facts), regions[mark:], subdirs, self.cache)
            else:
                self.memo_out.pop(rel, None)
        return subdirs

    def flush(self) -> None:
        """Add the facts of the memos taken so far, in walk order; no deferring after."""
        if self.hits is not None:
            for memo in self.hits:
                memo.add_to(self.obs.files)
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
                chain: list[DirLink], facts: list[FileFact],
                subdirs: list[tuple[str, str, LStat]]) -> bool:
        """Each name's outcome from its lstat record, into `facts` and `subdirs` (a
        DirMemo's) and the observation; True if a memo may stand for this directory next time.

        A regular file whose cached fingerprint vouches for its bytes (the rule in `vouches`)
        is taken from the cache with no call; everything else goes through `file`,
        `symlink` or a region."""
        prefix = rel + "/" if rel else ""
        cache_get = self.cache.get if self.trust else no_cache
        files = self.obs.files
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
                        child = intern(child)
                        # The row itself is the fact's record (equal, just compared): the
                        # record's new ints go, and the memo shares the journal's row.
                        fact = files[child] = new_tuple(FileFact, (
                            child, cached, False, MODES[mode & MODE_BITS]))
                        facts.append(fact)
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
                facts.append(self.special(child, st))  # from the record alone
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
        mime = SPECIAL_MIME.get(stat.S_IFMT(st.st_mode), "inode/x-special")
        rec = HashRecord(0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, None,
                         "special", 0, mime)
        fact = self.obs.files[rel] = FileFact(rel, rec, False, MODES[st.st_mode & MODE_BITS])
        return fact

    def file(self, dir_fd: int, name: str, rel: str, st: os.stat_result | LStat) -> None:
        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs once per file.
        fp = new_tuple(Fingerprint, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                st.st_dev))
        mode = MODES[st.st_mode & MODE_BITS]
        cached = self.cache.get(rel)
        if cached is not None and self.vouches(fp, cached):
            self.obs.files[rel] = new_tuple(FileFact, (rel, cached, False, mode))
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
                self.obs.files[rel] = FileFact.of(
                    rel, first.st_size, Fingerprint.of(first), None,
                    "hardlink" if linked else "oversize", mime, True,
                    MODES[first.st_mode & MODE_BITS])
                return
            started = self.started
            if started is None:
                started = self.started = self.clock()
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
        # Its ints shared as the journal's rows share them (memfs.shared), so the snapshot
        # keeps this very record as the file's row: one object for the fact and the row.
        mtime = shared_int(fp.mtime_ns)
        rec = HashRecord(shared_int(fp.size), mtime,
                         mtime if fp.ctime_ns == mtime else shared_int(fp.ctime_ns), fp.ino,
                         shared_int(fp.dev), digest, kind, shared_int(started), mime)
        self.obs.files[rel] = FileFact(rel, rec, True, MODES[last.st_mode & MODE_BITS])
        if all(INT64_MIN <= v <= INT64_MAX for v in fp):
            self.obs.hashed[rel] = rec  # the fact's own record
        # else: a time past 2262 or an inode number of 2**63 and up does not fit the journal's
        # integers; such a file is hashed on every pass instead of vouched for.


