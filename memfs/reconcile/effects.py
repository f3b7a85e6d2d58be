"""Effects on a backing directory: write and unlink, contained and checked where they happen.

Every operation goes through directory fds opened from the held root fd one component at a
time (O_NOFOLLOW|O_NONBLOCK), so a symlink or a parent swapped after planning cannot redirect
it: mkdirat, openat, renameat2 and unlinkat all act inside a directory we hold. Before any byte
changes, in this order:

 1. the existing file is opened (O_NONBLOCK: a FIFO swapped in neither blocks nor passes) and
    must be a regular file with no other hard links — refused with or without force, since a
    write must not reach another name's content;
 2. unless forced, its bytes are hashed and must be what the decision was made on;
 3. then the checks: still the file its name names, every parent still at its path, the root
    still the recorded one;
 4. then a last fstat (lstat for an unlink) comparing size, mtime, ctime and inode with the first,
    so an edit made while we hashed or checked is refused, not overwritten.

A write goes to a scratch file (TEMP_PREFIX, in the same directory), is fsynced, and is renamed
over the name (or, for a new file, renamed with RENAME_NOREPLACE, so a file that appeared in the
meantime is never clobbered). Then every directory from the parent up to the root is fsynced;
only then does the call return, and only then may the caller record completion. The rename gives
a crash either the old or the new file, never a torn one; the price (a new inode, the owner and
mode copied over) is in docs/reconciliation.md. What stays open: an edit landing between the last
fstat and the rename is kept on the old inode but no longer at the name; a hard link made in that
same moment keeps the old content. A crash can leave a scratch file, which observation skips and
`sweep_scratch` removes.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import xxhash

from memfs.reconcile.contained import (
    FILE_FLAGS,
    RENAME_NOREPLACE,
    TEMP_PREFIX,
    DirLink,
    Refused,
    RootId,
    chmod_keeping_setgid,
    close_chain,
    components,
    hash_fd,
    ident,
    open_chain,
    open_root,
    renameat2,
    root_unchanged,
    still_linked,
)
from memfs.reconcile.rule import ABSENT, MODE_BITS, _Absent
from memfs.testing import crash_point

HARD_LINK_REMEDY = (
    "force does not override this; to write this path alone, give it a copy of its own first "
    "(copy it to a new name, then move that over it) and materialize again")


class EffectFailed(Refused):
    """The effect may have happened but is not known durable: the path stays owed."""


def _os_refusal(rel: str, exc: OSError, *, touched: bool = False) -> Refused:
    """The backing disk refused an effect (reason `os-error-<ERRNO>`); a full disk says so
    and what frees it, where a bare 'check the backing directory' left the user guessing."""
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return Refused(f"{rel}: {exc.strerror or exc}", disk_remedy(exc), reason=f"os-error-{code}",
                   touched=touched)


def disk_remedy(exc: OSError) -> str:
    """What fits an error the backing disk gave: a full disk, a read-only one, a refusal of
    permission and a failing device each have their own remedy."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ("the backing directory's filesystem is full: free space there, then "
                "`memfs materialize` again")
    if exc.errno == errno.EROFS:
        return ("the backing directory's filesystem is mounted read-only: remount it "
                "read-write, then `memfs materialize` again")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"memfs (uid {os.geteuid()}) may not write there: fix the directory's "
                "permissions or owner, then retry")
    if exc.errno == errno.EIO:
        return ("the backing disk reported an I/O error: check the device (`dmesg`), "
                "then retry")
    return "check the backing directory, then retry"


@dataclass(frozen=True)
class Written:
    path: str
    digest: str
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int


def _same_bytes_stat(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ctime_ns, a.st_ino, a.st_dev) == (
        b.st_size, b.st_mtime_ns, b.st_ctime_ns, b.st_ino, b.st_dev)


def _where_ok(chain: list[DirLink], root_path: str, rid: RootId) -> bool:
    return still_linked(chain) and root_unchanged(root_path, rid)


def _fsync_chain(chain: list[DirLink], rel: str) -> None:
    for link in reversed(chain):
        try:
            os.fsync(link.fd)
        except OSError as exc:
            raise EffectFailed(
                f"{rel}: syncing a directory failed ({exc.strerror}); the change may not be durable",
                "it stays owed: retry the materialize", reason="barrier-failed", touched=True,
            ) from None


def _open_existing(parent: int, name: str, rel: str) -> tuple[int, os.stat_result] | None:
    """Open the file at name for checking; None if nothing is there."""
    try:
        lst = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(lst.st_mode):
        raise Refused(f"{rel}: not a regular file on disk (a directory, symlink or special file)",
                      "move it out of the way on disk, then materialize again",
                      reason="not-regular")
    crash_point("effect:before-open")
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):
            raise Refused(f"{rel}: changed while it was checked", "observe it and try again",
                          reason="changed") from None
        raise Refused(f"{rel}: cannot open it ({exc.strerror})", "check its permissions",
                      reason="unreadable") from None
    first = os.fstat(fd)
    if not stat.S_ISREG(first.st_mode) or ident(first) != ident(lst):
        os.close(fd)
        raise Refused(f"{rel}: changed while it was checked", "observe it and try again",
                      reason="changed")
    return fd, first


def _check_fresh(fd: int, expected: str | _Absent, force: bool, rel: str) -> None:
    if force:
        return
    if expected is ABSENT:
        raise Refused(f"{rel}: a file appeared on disk after planning",
                      "observe it (sync or ls) first, or materialize this path with --force",
                      reason="appeared")
    digest, _ = hash_fd(fd)
    if digest != expected:
        raise Refused(f"{rel}: the disk copy changed since the decision was made",
                      "sync it to take disk's copy, or materialize this path with --force",
                      reason="changed")


# Long on purpose: its checks run in the order of the numbered steps in docs/reconciliation.md
# ("Effects"), each before the next I/O on the same held fds; cut into helpers, the fds and the
# order would pass between functions and the order would no longer read top to bottom.
def write_file(
    root_path: str | os.PathLike[str],
    rel: str,
    data: bytes | Iterable[bytes],
    *,
    root: RootId,
    expected: str | _Absent,
    force: bool = False,
    mode: int | None = None,
    dir_modes: Mapping[str, int] | None = None,
) -> Written:
    """Write `data` at `rel` under the backing root, contained and checked (module docstring).

    expected: the digest the decision saw on disk, or ABSENT if it saw no file. force skips the
    freshness check only. `mode`: the permission bits the file gets (rule.MODE_BITS; None:
    the existing file's, or 0o644 for a new one); set-id and sticky bits are never written.
    `dir_modes`: the bits each parent directory this write makes gets (by rel; the
    workspace's), made 0700 and given them once the file is in (missing: 0700, never wider;
    a directory disk already has keeps its mode).
    Returns once data and every directory up to the root are fsynced.
    Raises Refused (touched=False: disk unchanged at the path), EffectFailed (touched=True:
    written but not known durable) or RootUnavailable.
    """
    root_s = os.fspath(root_path)
    parts = components(rel)
    if not parts:
        raise Refused("cannot write the root itself", reason="bad-path")
    root_fd, rid = open_root(root_s, root)
    chain: list[DirLink] = []
    made: list[int] = []
    fd = tmp_fd = -1
    tmp = ""
    try:
        try:
            chain = open_chain(root_fd, parts[:-1])
        except FileNotFoundError:
            if expected is not ABSENT and not force:
                raise Refused(f"{rel}: deleted on disk since the decision was made",
                              "sync it to take the deletion, or materialize it with --force",
                              reason="deleted") from None
            chain = open_chain(root_fd, parts[:-1], create=True, mode=NEW_DIR_MODE,
                               made=made)
        parent, name = chain[-1].fd, parts[-1]
        existing = _open_existing(parent, name, rel)
        first = None
        if existing is None:
            if expected is not ABSENT and not force:
                raise Refused(f"{rel}: deleted on disk since the decision was made",
                              "sync it to take the deletion, or materialize it with --force",
                              reason="deleted")
        else:
            fd, first = existing
            if first.st_nlink != 1:
                raise Refused(f"{rel}: not written: a file with other hard links, which writing "
                              "it would change too", HARD_LINK_REMEDY, reason="hard-link")
            _check_fresh(fd, expected, force, rel)
            if mode is None:
                mode = stat.S_IMODE(first.st_mode) & MODE_BITS
        crash_point("effect:checked")
        if not _where_ok(chain, root_s, rid):
            raise Refused(f"{rel}: a parent directory or the root moved while it was checked",
                          "observe again, then materialize", reason="moved")
        if first is not None:
            last = os.fstat(fd)
            if not _same_bytes_stat(first, last) or last.st_nlink != 1:
                raise Refused(f"{rel}: edited while it was checked", "observe it and try again",
                              reason="changed")

        tmp = TEMP_PREFIX + secrets.token_hex(8)
        tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=parent)
        h = xxhash.xxh3_128()
        for chunk in ([data] if isinstance(data, bytes | bytearray | memoryview) else data):
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(tmp_fd, view):]
        os.fchmod(tmp_fd, (0o644 if mode is None else mode) & MODE_BITS)
        if first is not None and os.geteuid() == 0:
            os.fchown(tmp_fd, first.st_uid, first.st_gid)
        try:
            os.fsync(tmp_fd)
        except OSError as exc:
            raise Refused(f"{rel}: syncing the new content failed ({exc.strerror})",
                          f"it stays owed: {disk_remedy(exc)}", reason="write-failed") from None
        crash_point("effect:temp-synced")

        # The last look before the name changes.
        if first is not None:
            try:
                now = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or not _same_bytes_stat(first, now) or now.st_nlink != 1:
                raise Refused(f"{rel}: edited while it was written", "observe it and try again",
                              reason="changed")
        if not _where_ok(chain, root_s, rid):
            raise Refused(f"{rel}: a parent directory or the root moved during the write",
                          "observe again, then materialize", reason="moved")
        if first is not None:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        else:
            try:
                renameat2(parent, tmp, parent, name, RENAME_NOREPLACE)
            except FileExistsError:
                raise Refused(f"{rel}: a file appeared on disk during the write",
                              "observe it (sync or ls) first, or materialize it with --force",
                              reason="appeared") from None
        tmp = ""
        crash_point("effect:renamed")
        written = os.fstat(tmp_fd)
        if not _where_ok(chain, root_s, rid):
            # The directory left its path during the rename: take our file back out of it.
            try:
                if ident(os.stat(name, dir_fd=parent, follow_symlinks=False)) == ident(written):
                    os.unlink(name, dir_fd=parent)
            except OSError:
                pass
            raise EffectFailed(f"{rel}: a parent directory moved during the write",
                               "observe again, then materialize", reason="moved", touched=True)
        _give_modes(chain, parts, made, dir_modes or {})
        _fsync_chain(chain, rel)
        crash_point("effect:durable")
        return Written(rel, h.hexdigest(), written.st_size, written.st_mtime_ns,
                       written.st_ctime_ns, written.st_ino, written.st_dev)
    except OSError as exc:
        raise _os_refusal(rel, exc, touched=not tmp and tmp_fd >= 0) from None
    finally:
        if tmp and chain:
            try:
                os.unlink(tmp, dir_fd=chain[-1].fd)
            except OSError:
                pass
        for f in (fd, tmp_fd):
            if f >= 0:
                os.close(f)
        close_chain(chain)
        os.close(root_fd)


NEW_DIR_MODE = 0o700  # a directory a write makes, until its file is in: no one else's yet


def _give_modes(chain: list[DirLink], parts: list[str], made: list[int],
                dir_modes: Mapping[str, int]) -> None:
    """The directories this write made get the workspace's permission bits (set-id and sticky
    bits not carried; a set-gid bit inherited from disk's parent kept), now that the file is
    in them: a 0500 one could not have taken it."""
    for i in made:
        want = dir_modes.get("/".join(parts[:i]), NEW_DIR_MODE) & MODE_BITS
        if want != NEW_DIR_MODE:
            chmod_keeping_setgid(chain[i].fd, want)


def unlink_file(
    root_path: str | os.PathLike[str],
    rel: str,
    *,
    root: RootId,
    expected: str,
    force: bool = False,
) -> bool:
    """Remove the file at `rel` if it still holds `expected` (unless forced). Returns False when
    nothing was there. A refusal by the OS (EACCES, EPERM, EROFS, EBUSY) leaves it untouched."""
    root_s = os.fspath(root_path)
    parts = components(rel)
    if not parts:
        raise Refused("cannot unlink the root itself", reason="bad-path")
    root_fd, rid = open_root(root_s, root)
    chain: list[DirLink] = []
    fd = -1
    try:
        try:
            chain = open_chain(root_fd, parts[:-1])
        except FileNotFoundError:
            return False
        parent, name = chain[-1].fd, parts[-1]
        existing = _open_existing(parent, name, rel)
        if existing is None:
            _fsync_chain(chain, rel)  # a retry completes an unlink only with its barriers
            return False
        fd, first = existing
        _check_fresh(fd, expected, force, rel)
        crash_point("effect:checked")
        if not _where_ok(chain, root_s, rid):
            raise Refused(f"{rel}: a parent directory or the root moved while it was checked",
                          "observe again, then materialize", reason="moved")
        try:
            now = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not _same_bytes_stat(first, now):
            raise Refused(f"{rel}: edited while it was checked", "observe it and try again",
                          reason="changed")
        try:
            os.unlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EBUSY):
                raise Refused(f"{rel}: the system refused the unlink ({exc.strerror})",
                              disk_remedy(exc), reason="os-refused") from None
            raise
        crash_point("effect:unlinked")
        _fsync_chain(chain, rel)
        return True
    except OSError as exc:
        raise _os_refusal(rel, exc) from None
    finally:
        if fd >= 0:
            os.close(fd)
        close_chain(chain)
        os.close(root_fd)


def remove_empty_dir(root_path: str | os.PathLike[str], rel: str, *, root: RootId) -> bool:
    """rmdir the directory at `rel` if it is empty (a materialize removed its last file and
    the workspace has no directory there: a `mv` of a directory leaves none on disk, as a
    native mv does). True if it went. Not empty, gone, not a directory, or refused by the OS:
    False, disk untouched. Through the held chain like every effect; no intent is needed, as
    an empty directory holds nothing to lose and a crash leaves at worst the empty directory."""
    root_s = os.fspath(root_path)
    parts = components(rel)
    if not parts:
        return False  # never the root
    root_fd, rid = open_root(root_s, root)
    chain: list[DirLink] = []
    try:
        try:
            chain = open_chain(root_fd, parts[:-1])
        except (OSError, Refused):
            return False
        if not _where_ok(chain, root_s, rid):
            return False
        try:
            os.rmdir(parts[-1], dir_fd=chain[-1].fd)
        except OSError:
            return False  # ENOTEMPTY (something is there), ENOENT, ENOTDIR (a link), EACCES
        _fsync_chain(chain, rel)
        return True
    finally:
        close_chain(chain)
        os.close(root_fd)


def is_scratch(name: str) -> bool:
    """Is this one of write_file's scratch names (TEMP_PREFIX and 16 hex digits)? Only those
    are swept: a user's own `.memfs-tmp-notes` is not ours to remove."""
    tail = name[len(TEMP_PREFIX):]
    return (name.startswith(TEMP_PREFIX) and len(tail) == 16
            and all(c in "0123456789abcdef" for c in tail))


def sweep_scratch(root_path: str | os.PathLike[str], *, root: RootId | None,
                  skip: frozenset[str] = frozenset({".git"})) -> list[str]:
    """Remove scratch files a crashed write left (call when no effect runs on this root: the
    first pass of a mount in a process, under the mount's lock). Directories named in `skip`
    (the VCS directories no write enters) are not walked."""
    removed: list[str] = []
    root_fd, _ = open_root(root_path, root)
    try:
        stack: list[tuple[int, str]] = [(os.dup(root_fd), "")]
        while stack:
            dfd, rel = stack.pop()
            try:
                for name in os.listdir(dfd):
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    child = f"{rel}/{name}" if rel else name
                    if is_scratch(name) and stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=dfd)
                        removed.append(child)
                    elif stat.S_ISDIR(st.st_mode) and name not in skip:
                        try:
                            stack.append((os.open(name, FILE_FLAGS | os.O_DIRECTORY,
                                                  dir_fd=dfd), child))
                        except OSError:
                            pass
            except OSError:
                pass
            finally:
                os.close(dfd)
    finally:
        os.close(root_fd)
    return removed
