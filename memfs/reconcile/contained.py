"""Containment primitives: the held root fd, component-wise opens, root identity, statfs.

Why fds: a path re-resolved by name can be redirected by a symlink or a swapped parent between
the check and the use. Every read and write under a backing root therefore goes through a
directory fd opened from the held root fd one component at a time with O_NOFOLLOW, so the
kernel resolves nothing we did not check. (The seed's Node code had no openat; Python's
`dir_fd=` has, so its create/mkdir/unlink window is closed here.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
from dataclasses import dataclass

import xxhash

from memfs.errors import MemfsError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEMP_PREFIX = ".memfs-tmp-"  # scratch names of effects.py; never a tracked path

# statfs f_type magics of Linux filesystems that maintain ctime on every change, so an
# unchanged {size, mtime, ctime, ino, dev} vouches for unchanged bytes (git's assumption too).
CTIME_TRUSTED: frozenset[int] = frozenset({
    0xEF53,  # ext2/3/4
    0x58465342,  # xfs
    0x9123683E,  # btrfs
    0x01021994,  # tmpfs
    0xF2F52010,  # f2fs
    0x2FC12FC1,  # zfs
    0x3153464A,  # jfs
    0x52654973,  # reiserfs
})


@dataclass(frozen=True)
class RootId:
    """A backing root's identity: the directory disk agreed with, not just its path."""

    dev: int
    ino: int


class RootUnavailable(MemfsError):
    """The backing root is missing or is another directory: observe nothing, write nothing."""

    def __init__(self, message: str, remedy: str, reason: str) -> None:
        super().__init__(message, remedy)
        self.reason = reason


class Refused(MemfsError):
    """A contained operation refused. `reason` is a short code; `touched` says whether the path
    may have changed (False: nothing at the path was modified)."""

    def __init__(self, message: str, remedy: str = "", *, reason: str, touched: bool = False):
        super().__init__(message, remedy)
        self.reason = reason
        self.touched = touched


def components(rel: str) -> list[str]:
    """Split a mount-relative path; refuse anything that could step outside or alias."""
    if rel in ("", "."):
        return []
    parts = rel.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\0" in part:
            raise Refused(f"not a plain relative path: {rel!r}",
                          "name the path relative to the mount, without '.', '..' or '//'",
                          reason="bad-path")
    return parts


def ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def open_root(path: str | os.PathLike[str], expected: RootId | None) -> tuple[int, RootId]:
    """Open the configured root (a symlinked root is followed: it is configuration, not content)
    and check it is the directory disk last agreed with."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RootUnavailable(f"backing root {os.fspath(path)!r} is missing",
                              "bring the directory (or the drive holding it) back",
                              "missing") from None
    except NotADirectoryError:
        raise RootUnavailable(f"backing root {os.fspath(path)!r} is not a directory",
                              "bring the directory back", "not-a-directory") from None
    st = os.fstat(fd)
    rid = RootId(st.st_dev, st.st_ino)
    if expected is not None and rid != expected:
        os.close(fd)
        raise RootUnavailable(
            f"backing root {os.fspath(path)!r} is not the directory disk last agreed with "
            f"(device/inode {rid.dev}/{rid.ino}, recorded {expected.dev}/{expected.ino})",
            "bring the original directory back (an unplugged drive?), or take this one on "
            "purpose with `memfs sync --accept-root`", "replaced")
    return fd, rid


def root_unchanged(path: str | os.PathLike[str], rid: RootId) -> bool:
    """Is the configured path still the root we hold?"""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return RootId(st.st_dev, st.st_ino) == rid


@dataclass
class DirLink:
    """One held directory of a chain: its fd, its name in the parent, its identity."""

    fd: int
    name: str
    ident: tuple[int, int]


def still_linked(chain: list[DirLink]) -> bool:
    """Is every directory of the chain still the entry its name names in its parent?"""
    for parent, child in zip(chain, chain[1:], strict=False):
        try:
            st = os.stat(child.name, dir_fd=parent.fd, follow_symlinks=False)
        except OSError:
            return False
        if ident(st) != child.ident or not stat.S_ISDIR(st.st_mode):
            return False
    return True


def open_chain(root_fd: int, parts: list[str], *, create: bool = False,
               mode: int = 0o777, made: list[int] | None = None) -> list[DirLink]:
    """Open directories component by component from the root fd (O_NOFOLLOW at each step).

    With create, missing directories are made with mkdirat in the held parent, so they can
    only ever appear inside it. `made`: told the chain index of each directory this call
    made, which then gets exactly `mode` (fchmod: the umask could take the owner's own write
    bit; an inherited set-gid bit is kept), for the caller to give its final bits once filled. The caller closes every fd but
    the root's (close_chain).
    Raises FileNotFoundError for a missing component (without create) and Refused for a
    component that is a symlink or not a directory.
    """
    st = os.fstat(root_fd)
    chain = [DirLink(root_fd, "", ident(st))]
    try:
        for name in parts:
            parent = chain[-1].fd
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode, dir_fd=parent)
                    fresh = True
                except FileExistsError:
                    fresh = False
                fd = os.open(name, DIR_FLAGS, dir_fd=parent)
                if fresh and made is not None:
                    made.append(len(chain))
                    chmod_keeping_setgid(fd, mode)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"{name!r} is a symlink or not a directory",
                                  "replace it with a real directory inside the backing root",
                                  reason="not-a-directory") from None
                raise
            chain.append(DirLink(fd, name, ident(os.fstat(fd))))
    except BaseException:
        close_chain(chain)
        raise
    return chain


def chmod_keeping_setgid(fd: int, mode: int) -> None:
    """fchmod a directory memfs made to `mode`, keeping the set-group-ID bit the kernel gave it
    in a set-gid parent (a group-shared tree's new directories must stay in the group); a
    plain fchmod would clear it."""
    os.fchmod(fd, mode | (os.fstat(fd).st_mode & stat.S_ISGID))


def close_chain(chain: list[DirLink]) -> None:
    for link in chain[1:]:
        try:
            os.close(link.fd)
        except OSError:
            pass


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _Statfs(ctypes.Structure):
    # Linux struct statfs on 64-bit: f_type is the first long; the rest we only need to size.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]


def fs_magic(fd: int) -> int | None:
    """The filesystem type magic (statfs f_type) of an open fd, or None if unknown."""
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    """renameat2(2) (glibc >= 2.28): NOREPLACE to create without clobbering, EXCHANGE to swap."""
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)


def hash_fd(fd: int, chunk: int = 1 << 20) -> tuple[str, int]:
    """xxh3-128 of everything an fd holds, streamed with pread; (hex digest, bytes read)."""
    h = xxhash.xxh3_128()
    offset = 0
    while True:
        data = os.pread(fd, chunk, offset)
        if not data:
            return h.hexdigest(), offset
        h.update(data)
        offset += len(data)


def open_contained_file(root_path: str | os.PathLike[str], rel: str, *,
                        root: RootId | None) -> tuple[int, os.stat_result]:
    """A read-only fd on the regular file at `rel` under the root, reached through directory
    fds (for serving a disk-only file's bytes). The caller closes it.

    Refuses symlinks and special files (opened O_NONBLOCK, so a FIFO never blocks), a path whose
    parents moved while it was opened, and raises RootUnavailable for a missing or replaced root.
    """
    parts = components(rel)
    if not parts:
        raise Refused("the root is not a file", reason="bad-path")
    root_fd, rid = open_root(root_path, root)
    chain: list[DirLink] = []
    try:
        chain = open_chain(root_fd, parts[:-1])
        try:
            fd = os.open(parts[-1], FILE_FLAGS, dir_fd=chain[-1].fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):
                raise Refused(f"{rel}: not a regular file inside the backing root",
                              "list the directory again", reason="not-regular") from None
            raise
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or not still_linked(chain)
                or not root_unchanged(root_path, rid)):
            os.close(fd)
            raise Refused(f"{rel}: not a regular file inside the backing root",
                          "list the directory again", reason="not-regular")
        return fd, st
    finally:
        close_chain(chain)
        os.close(root_fd)


# --- contained readers (what the backing layer reads from a backing root) --------------------

def read_contained(root_dir: str, expected: RootId | None, rel: str,
                   digest: str | None) -> bytes | None:
    """A backing file's bytes through dir fds from the held root; None if it is not the file
    the decision saw (digest differs), is gone, or is not a regular file."""
    try:
        fd, _ = open_contained_file(root_dir, rel, root=expected)
    except (RootUnavailable, Refused, OSError):
        return None
    try:
        out = bytearray()
        while piece := os.pread(fd, 1 << 20, len(out)):
            out += piece
    finally:
        os.close(fd)
    data = bytes(out)
    if digest is not None and xxhash.xxh3_128_hexdigest(data) != digest:
        return None
    return data


def pread_contained(root_dir: str, expected: RootId | None, rel: str, off: int,
                    size: int) -> bytes:
    """`size` bytes at `off` of a disk-only file, through a contained open. Raises
    RootUnavailable (a replaced or missing root) and Refused (not a regular file inside it)."""
    fd, _ = open_contained_file(root_dir, rel, root=expected)
    try:
        return os.pread(fd, size, off)
    finally:
        os.close(fd)


def ctime_trusted(root_dir: str) -> bool:
    """Does the backing root's filesystem keep ctime (the walk's allowlist)?"""
    try:
        fd = os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fs_magic(fd) in CTIME_TRUSTED
    finally:
        os.close(fd)
