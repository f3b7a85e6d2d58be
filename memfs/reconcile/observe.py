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

import os
import posixpath
import stat
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from memfs.pathtable import FingerprintTable
from memfs.reconcile.contained import (
    CTIME_TRUSTED,
    DIR_FLAGS,
    DirLink,
    Refused,
    RootId,
    RootUnavailable,
    close_chain,
    components,
    fs_magic,
    open_chain,
    open_root,
    root_unchanged,
    still_linked,
)
from memfs.reconcile.facts import (  # noqa: F401 - the observation's vocabulary, named here too
    DEFAULT_MAX_FILE_SIZE,
    HEAD,
    RACY_NS,
    VCS_DIRS,
    CachedHash,
    FileFact,
    Fingerprint,
    HashRecord,
    Observation,
    Region,
    sniff,
)
from memfs.reconcile.rule import MODE_BITS, MODES
from memfs.reconcile.walk import _Walk
from memfs.reconcile.walkfiles import DirMemo, WalkFiles, WalkMemo  # noqa: F401 - named here too


# Over 80 lines by its parameters and their docstring: one walk's options, each a documented
# knob of the binding (the body is short).
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
    on_walked: Callable[[int], None] | None = None,
) -> Observation:
    """Observe `scope` (a mount-relative directory or file; '' for everything) under the root.

    `cache`: fingerprints from earlier observations (journal.fingerprints); fresh hashes come
    back in `Observation.hashed` for the caller to store. `tracked`: paths the store or the
    evidence knows; an untracked file over `max_file_size` gets a head read, never a hash.
    `limit` bounds the number of entries visited; what it leaves is reported as a region.
    `memo`: the mount's directory memos (see DirMemo), read and refreshed by this walk; a
    quiet directory's files are then its memo's rows, their facts built when read (no fact
    kept per file, and none made per pass: 100k new objects a pass would set off full
    collections of the daemon's heap). Unused with `limit`. `cache` is a FingerprintTable
    (memfs.pathtable; another mapping is made one per walk). With a memo, `cache` must be a
    snapshot: never changed in place once walked with (the journal's is read-only); a
    changed cache is a new object, its rows checked by value.
    `on_walked`: called with each walked directory's entry count (a long walk's progress).
    Raises RootUnavailable for a missing or replaced root.
    """
    root_fd, rid = open_root(root_path, expected_root)
    try:
        magic = fs_magic(root_fd)
        is_tracked = tracked if callable(tracked) else frozenset(tracked).__contains__
        w = _Walk(
            Observation(rid, scope), os.fspath(root_path), FingerprintTable.of(cache or {}),
            is_tracked,
            max_file_size, tuple(ignore), ignore_vcs, magic in trusted_fs, racy_ns, clock,
            follow_symlinks, limit, on_walked, root_fd=root_fd, root_dev=rid.dev,
        )
        if memo is not None and limit is None:
            key = (rid, w.trust, racy_ns, w.ignore, ignore_vcs, follow_symlinks, max_file_size)
            if memo.key != key:
                memo.key, memo.dirs, memo.last = key, {}, None
            # A whole walk starts the memos afresh (a removed directory's goes with it); a
            # scoped one refreshes those of its directories.
            w.memo = memo.dirs
            w.memo_out = {} if scope == "" else memo.dirs
            w.hits = {} if scope == "" else None
        parts = components(scope)
        _record_dir(w.obs, "", root_fd)
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
            for depth, link in enumerate(chain[1:], 1):
                _record_dir(w.obs, "/".join(parts[:depth]), link.fd)
            try:
                _observe_scope(w, chain, parts)
            finally:
                close_chain(chain)
        w.obs.files = w.result()
        if w.memo_out is not None and scope == "" and memo is not None:
            memo.dirs = w.memo_out
            hits, last = w.hits, memo.last
            whole = hits is not None and not w.files and not w.hashed
            if (whole and last is not None
                    and len(hits) == len(last[0]) and all(
                        a is b for a, b in zip(hits.values(), last[0].values(), strict=True))):
                w.obs.files = last[1]
            else:
                memo.last = (hits, w.obs.files) if whole else None
        if not root_unchanged(root_path, rid):
            raise RootUnavailable(
                f"backing root {os.fspath(root_path)!r} was replaced during observation",
                "observe again; if it stays replaced, bring it back or `memfs sync "
                "--accept-root`", "replaced")
        return w.obs
    finally:
        os.close(root_fd)


def _record_dir(obs: Observation, rel: str, fd: int) -> None:
    """A directory's permission bits, from its held fd: a scoped observation's parents are
    opened, never walked, and a take-in below them makes them in the mount."""
    obs.dirs[rel] = MODES[os.fstat(fd).st_mode & MODE_BITS]


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
        w.descend(chain, sub, name, rel, st)
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
