"""The walk of one observation (memfs.reconcile.observe): directory by directory through held
fds, one lstat call per directory, a hash only where no trusted fingerprint vouches, and the
per-directory memos (memfs.reconcile.walkfiles) that let an unchanged directory skip its
per-entry decisions.

A `_Walk` is one observation's, in the thread that runs it; a mount's `WalkMemo` is read and
written only by that mount's walks, one at a time.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import stat
import sys
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import xxhash

from memfs.pathtable import FingerprintTable, Row
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
    REGION_DIR,
    REGION_LINK,
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
from memfs.reconcile.walkfiles import (
    DirMemo,
    HashedFiles,
    WalkFiles,
    listing_of,
    records_digest,
)


@dataclass
class _Walk:
    obs: Observation
    root_path: str
    cache: FingerprintTable
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
    hits: dict[str, DirMemo] | None = None  # memos taken by directory (see WalkMemo.last)
    # The facts this walk decided (the observation's files are these and the memos' taken).
    files: dict[str, FileFact] = field(default_factory=dict)
    # The files this walk hashed, as columns (the observation's `hashed`, and their facts).
    hashed: HashedFiles = field(default_factory=HashedFiles)
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

    def region(self, rel: str, reason: str, kind: str = "") -> None:
        self.obs.regions.append(Region(rel, reason, kind))

    def walk_dir(self, chain: list[DirLink], rel: str) -> None:
        fd = chain[-1].fd
        try:
            names = os.listdir(fd)
        except PermissionError:
            self.region(rel, "unreadable", REGION_DIR)
            return
        except OSError as exc:
            self.region(rel, f"unlistable ({errno.errorcode.get(exc.errno or 0, exc.errno)})",
                        REGION_DIR)
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
            self.region(rel, f"walk limit of {self.limit} entries reached", REGION_DIR)
            return
        self.obs.listed.add(rel)
        for name, child, st in subdirs:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except PermissionError:
                self.region(child, "unreadable", REGION_DIR)
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
            ignored = _kinds_again(fd, old.ignored)
            regions.extend(ignored)
        else:
            old = None
            mark = len(regions)
            statted = self._not_ignored(fd, rel, names)
            ignored = regions[mark:]
        recs = lstat_records(fd, statted)
        recs_digest = records_digest(recs) if self.memo_out is not None or old is not None else b""
        taken = (old.vouched_in(self.cache)
                 if old is not None and recs_digest == old.records else None)
        if taken is not None:
            regions.extend(taken.regions)
            if self.hits is not None:
                self.hits[rel] = taken
            else:
                self.files.update((p, taken.fact(p)) for p in taken.paths())  # type: ignore[misc]
            self.memo_out[rel] = taken  # type: ignore[index]
            return taken.subdirs
        self.started = None  # this directory's first hash reads the clock
        mark = len(regions)
        idx, modes = array("I"), array("H")
        specials: list[FileFact] = []
        subdirs: list[tuple[str, str, LStat]] = []
        keep = self._decide(fd, rel, statted, recs, chain, (idx, modes, specials), subdirs)
        memo = None
        if self.memo_out is not None:
            if keep:
                memo = self.memo_out[rel] = DirMemo(
                    listing, None if statted is names else statted, ignored, recs_digest,
                    idx, modes, tuple(specials), regions[mark:], subdirs, self.cache)
            else:
                self.memo_out.pop(rel, None)
        if memo is not None and self.hits is not None:
            # A whole walk's files read the new memo too: no fact object kept per file.
            self.hits[rel] = memo
            for f in specials:
                del self.files[f.path]
        else:
            self._add_vouched(rel, idx, modes)
        return subdirs

    def _add_vouched(self, rel: str, idx: array[int], modes: array[int]) -> None:
        """The facts of the files the cache vouched for (rows `idx`), into the files."""
        table, files, intern = self.cache, self.files, sys.intern
        paths, row = table.paths, table.row
        for i, bits in zip(idx, modes, strict=True):
            path = intern(paths[i])
            files[path] = new_tuple(FileFact, (path, row(i), False, MODES[bits]))

    def result(self) -> Mapping[str, FileFact]:
        """The observation's files: the decided ones, the hashed ones and the memos' taken
        (those two built on demand)."""
        self.obs.hashed = self.hashed
        if not self.hits and not self.hashed:
            return self.files
        return WalkFiles(self.files, self.hits or {}, self.hashed)

    def _not_ignored(self, fd: int, rel: str, names: list[str]) -> list[str]:
        """The names to stat; the ignored ones become regions, each with its kind from one
        lstat (`.git/` is listed as a directory, a `.git` file of a worktree as a file)."""
        prefix = rel + "/" if rel else ""
        if not self.ignore and not any(n[0] == "." or n in VCS_DIRS for n in names):
            return names  # TEMP_PREFIX starts with a dot too
        out = []
        for name in names:
            if self.ignore or name[0] == "." or name in VCS_DIRS:
                why = self.ignored(prefix + name, name)
                if why:
                    self.region(prefix + name, why, _kind_at(fd, name))
                    continue
            out.append(name)
        return out

    def _decide(self, fd: int, rel: str, names: list[str], recs: bytes,
                chain: list[DirLink],
                memo: tuple[array[int], array[int], list[FileFact]],
                subdirs: list[tuple[str, str, LStat]]) -> bool:
        """Each name's outcome from its lstat record, into `memo` (a DirMemo's row indices,
        modes and special files), `subdirs` and the observation; True if a memo may stand
        for this directory next time.

        A regular file whose cached fingerprint vouches for its bytes (the rule in `vouches`,
        compared with the table's columns) is taken from the cache with no call; everything
        else goes through `file`, `symlink` or a region."""
        prefix = rel + "/" if rel else ""
        table = self.cache
        at = table.at if self.trust else no_cache
        sizes, mtimes, ctimes = table.size, table.mtime, table.ctime
        inos, devs, hashed = table.ino, table.dev, table.hashed
        idx, modes, facts = memo
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
                i = at(child)
                if i is not None:
                    mtime, ctime, t = st.st_mtime_ns, st.st_ctime_ns, hashed[i] - racy_ns
                    # Inline copy of `vouches` on the columns (a call per file costs more).
                    if (mtime == mtimes[i] and ctime == ctimes[i] and st.st_size == sizes[i]
                            and st.st_ino == inos[i] and st.st_dev == devs[i]
                            and st.st_dev == root_dev and mtime < t and ctime < t):
                        idx.append(i)  # its fact: the memo's, or _add_vouched's
                        modes.append(mode & MODE_BITS)
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
            self.region(rel, "symlink (following is off)", REGION_LINK)
            return
        try:
            target = os.readlink(name, dir_fd=chain[-1].fd)
        except OSError:
            self.region(rel, "symlink (unreadable)", REGION_LINK)
            return
        base = posixpath.dirname(rel)
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            self.region(rel, "symlink pointing outside the root", REGION_LINK)
            return
        # Follow one level, inside the root only, through dir fds: the target must be a regular
        # file reached without further links.
        try:
            parts = components(resolved)
            if not parts:
                raise Refused("a link to the root", reason="not-a-file")
            sub = open_chain(self.root_fd, parts[:-1])
        except (Refused, OSError):
            self.region(rel, "symlink to something other than a file inside the root",
                        REGION_LINK)
            return
        try:
            st = os.stat(parts[-1], dir_fd=sub[-1].fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                self.region(rel, "symlink to something other than a file inside the root",
                            REGION_LINK)
                return
            self.file(sub[-1].fd, parts[-1], rel, st)
        except OSError:
            self.region(rel, "symlink (dangling)", REGION_LINK)
        finally:
            close_chain(sub)

    def special(self, rel: str, st: os.stat_result | LStat) -> FileFact:
        """A FIFO, socket or device: disk-only, never opened (a FIFO would block), never taken
        in nor written; no digest, so it never compares equal and never reads as agreed."""
        mime = SPECIAL_MIME.get(stat.S_IFMT(st.st_mode), "inode/x-special")
        rec = HashRecord(0, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, None,
                         "special", 0, mime)
        fact = self.files[rel] = FileFact(rel, rec, False, MODES[st.st_mode & MODE_BITS])
        return fact

    def file(self, dir_fd: int, name: str, rel: str, st: os.stat_result | LStat) -> None:
        # tuple.__new__ skips the NamedTuple's Python-level __new__: this runs once per file.
        fp = new_tuple(Fingerprint, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                                st.st_dev))
        mode = MODES[st.st_mode & MODE_BITS]
        cached = self.cache.get(rel)
        if cached is not None and self.vouches(fp, cached):
            self.files[rel] = new_tuple(FileFact, (rel, cached, False, mode))
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
                self.files[rel] = FileFact.of(
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
        bits = last.st_mode & MODE_BITS
        if all(INT64_MIN <= v <= INT64_MAX for v in fp):  # the journal's and the table's ints
            self.hashed.add(rel, new_tuple(Row, (
                fp.size, fp.mtime_ns, fp.ctime_ns, fp.ino, fp.dev, h.hexdigest(), kind,
                started, mime)), bits)
            return
        # A time past 2262 or an inode number of 2**63 and up: a fact of its own, never stored
        # (such a file is hashed on every pass instead of vouched for).
        rec = HashRecord(fp.size, fp.mtime_ns, fp.ctime_ns, fp.ino, fp.dev,
                         sys.intern(h.hexdigest()), kind, started, mime)
        self.files[rel] = FileFact(rel, rec, True, MODES[bits])


def _kinds_again(dir_fd: int, ignored: list[Region]) -> list[Region]:
    """The memo's ignored regions with each kind looked at again (one lstat each): the same
    names may be other kinds now (`d/e` a directory, then a file), and a listing shows the
    kind (hypothesis found the memo walk saying `dir` where the plain walk said file)."""
    out = []
    for r in ignored:
        kind = _kind_at(dir_fd, r.path.rpartition("/")[2])
        out.append(r if kind == r.kind else Region(r.path, r.reason, kind))
    return out


def _kind_at(dir_fd: int, name: str) -> str:
    """What `name` in `dir_fd` is, as a Region's kind (never followed; "" if it went)."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return ""
    return REGION_DIR if stat.S_ISDIR(mode) else REGION_LINK if stat.S_ISLNK(mode) else ""
