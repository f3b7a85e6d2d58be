"""inotify over a backing root (`watch=fs-events`): events choose which paths to observe again.

Why only "choose": an event says something happened at a name, not what disk now holds — it
may be stale, coalesced, or about a directory that has since moved. So events only mark paths
dirty; observation (observe.py) then finds the truth, contained as always. When the kernel's
queue overflows (IN_Q_OVERFLOW), the root itself is moved or deleted, or a watch cannot be
added (the per-user limit), the result says `full`: fall back to a full pass, which is never
wrong, only slower.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
from dataclasses import dataclass, field

from memfs.reconcile.observe import VCS_DIRS

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
        | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
_EVENT = struct.Struct("iIII")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


@dataclass
class Dirty:
    """Paths to observe again (mount-relative; a directory covers what is under it), or `full`
    for a full pass, with why."""

    paths: set[str] = field(default_factory=set)
    full: bool = False
    why: list[str] = field(default_factory=list)


class Watcher:
    def __init__(self, root_path: str | os.PathLike[str], *, ignore_vcs: bool = True) -> None:
        self.root_path = os.fspath(root_path)
        self.ignore_vcs = ignore_vcs
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), "inotify_init1")
        self.fd = fd
        self._paths: dict[int, str] = {}  # wd -> directory, relative to the root
        self._pending = Dirty()
        self._add_tree("")

    def fileno(self) -> int:
        """Readable when events are queued (for select, or trio.lowlevel.wait_readable)."""
        return self.fd

    def _add_tree(self, rel: str) -> None:
        stack = [rel]
        while stack:
            cur = stack.pop()
            path = os.path.join(self.root_path, cur) if cur else self.root_path
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err == errno.ENOSPC:
                    self._full(f"inotify watch limit reached at {cur or '.'!r}")
                # ENOENT/ENOTDIR/ELOOP: gone or replaced by a link since; observation decides.
                continue
            self._paths[wd] = cur
            try:
                with os.scandir(path) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False) and not (
                            self.ignore_vcs and entry.name in VCS_DIRS
                        ):
                            stack.append(f"{cur}/{entry.name}" if cur else entry.name)
            except OSError:
                self._pending.paths.add(cur)  # could not list: observe it, which says why

    def _full(self, why: str) -> None:
        self._pending.full = True
        self._pending.why.append(why)

    def read(self, timeout: float | None = 0) -> Dirty:
        """Drain queued events (waiting up to `timeout` seconds for the first; None: forever)
        and return what to observe again. Resets the accumulated result."""
        if timeout != 0:
            select.select([self.fd], [], [], timeout)
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            self._parse(buf)
        out, self._pending = self._pending, Dirty()
        return out

    def _parse(self, buf: bytes) -> None:
        off = 0
        while off + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
            raw = buf[off + _EVENT.size: off + _EVENT.size + length]
            off += _EVENT.size + length
            name = os.fsdecode(raw.rstrip(b"\0"))
            if mask & IN_Q_OVERFLOW:
                self._full("inotify queue overflow")
                continue
            base = self._paths.get(wd)
            if mask & IN_IGNORED:
                self._paths.pop(wd, None)
                continue
            if base is None:
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if base == "":
                    self._full("the backing root itself was moved or deleted")
                else:
                    self._pending.paths.add(base)
                continue
            if self.ignore_vcs and name in VCS_DIRS:
                continue
            rel = f"{base}/{name}" if base and name else (name or base)
            self._pending.paths.add(rel)
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                self._add_tree(rel)  # files made inside before the watch are in its scope

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def narrow(paths: set[str]) -> list[str]:
    """The dirty paths without those a dirty ancestor already covers (scopes to observe)."""
    out: list[str] = []
    for p in sorted(paths):
        if out and (out[-1] == "" or p == out[-1] or p.startswith(out[-1] + "/")):
            continue
        out.append(p)
    return out
