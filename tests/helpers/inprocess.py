"""The in-process tier: MemfsOperations driven as the kernel would, with no kernel.

The handlers are the real ones over a real store; what stands in for the kernel is only the
request itself: a context (who asks, their umask) and, for setattr, which fields it sets, as
plain values (pyfuse3 makes its own read-only). Fast, for the translation logic: errnos,
attributes, what reaches the workspace. Anything the kernel decides (permission checks, its
caches, readdir's buffer) is the real-mount tests' (helpers/mount.py).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyfuse3

from memfs.fs.operations import MemfsOperations
from memfs.store import Store
from memfs.workspace.workspace import ROOT_ID, Workspace


@dataclass(frozen=True)
class Ctx:
    """What a FUSE request carries about its sender (pyfuse3.RequestContext's fields)."""

    pid: int = os.getpid()
    uid: int = os.getuid()
    gid: int = os.getgid()
    umask: int = 0o022


@dataclass(frozen=True)
class Fields:
    """Which attributes a setattr sets (pyfuse3.SetattrFields' fields)."""

    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


class Requests:
    """A MemfsOperations over a store, and the requests a shell's calls would send."""

    def __init__(self, root: Path) -> None:
        self.ws = Workspace(Store.open(root), 0.0)
        self.ops = MemfsOperations(self.ws)
        self.ctx = Ctx()

    def close(self) -> None:
        self.ws.store.close()

    async def lookup(self, path: str) -> pyfuse3.EntryAttributes:
        ino = ROOT_ID
        attr = await self.ops.getattr(ROOT_ID, self.ctx)
        for name in [p for p in path.split("/") if p]:
            attr = await self.ops.lookup(ino, name.encode(), self.ctx)
            ino = attr.st_ino
        return attr

    async def mkdir(self, path: str, mode: int = 0o777) -> pyfuse3.EntryAttributes:
        parent, name = await self._parent(path)
        return await self.ops.mkdir(parent, name, mode, self.ctx)

    async def create(self, path: str, data: bytes = b"", mode: int = 0o666,
                     ) -> pyfuse3.EntryAttributes:
        parent, name = await self._parent(path)
        info, attr = await self.ops.create(parent, name, mode, os.O_WRONLY, self.ctx)
        if data:
            await self.ops.write(info.fh, 0, data)
        await self.ops.release(info.fh)
        return attr

    async def read(self, path: str, size: int = 1 << 20) -> bytes:
        attr = await self.lookup(path)
        info = await self.ops.open(attr.st_ino, os.O_RDONLY, self.ctx)
        try:
            return await self.ops.read(info.fh, 0, size)
        finally:
            await self.ops.release(info.fh)

    async def unlink(self, path: str) -> None:
        parent, name = await self._parent(path)
        await self.ops.unlink(parent, name, self.ctx)

    async def rename(self, old: str, new: str, flags: int = 0) -> None:
        op, on = await self._parent(old)
        np_, nn = await self._parent(new)
        await self.ops.rename(op, on, np_, nn, flags, self.ctx)

    async def chmod(self, path: str, mode: int) -> pyfuse3.EntryAttributes:
        attr = await self.lookup(path)
        want = pyfuse3.EntryAttributes()
        want.st_mode = mode
        return await self.ops.setattr(attr.st_ino, want, Fields(update_mode=True), None,
                                      self.ctx)

    async def _parent(self, path: str) -> tuple[int, bytes]:
        head, _, name = path.rstrip("/").rpartition("/")
        return (await self.lookup(head)).st_ino, name.encode()


@contextmanager
def fails_with(code: int) -> Iterator[None]:
    """The request is answered with this errno (a FUSEError, as the kernel would get)."""
    try:
        yield
    except pyfuse3.FUSEError as exc:
        assert exc.errno == code, f"answered {errno.errorcode.get(exc.errno)}, not " \
                                  f"{errno.errorcode.get(code)}"
    else:
        raise AssertionError(f"no {errno.errorcode.get(code)}")
