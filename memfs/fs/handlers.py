"""How every FUSE handler is wrapped: its request counted, a tree-changing request's
operation ended with it, and any exception mapped to an errno.

A WorkspaceError becomes its errno, anything else is logged with the operation and answered
EIO, because an exception other than FUSEError would end pyfuse3.main() and leave a dead
mount behind. No state of its own (the counts are MemfsOperations.requests). Loop thread only.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Callable

import pyfuse3

from memfs.fs.memory_view import MemError
from memfs.workspace.attribution import CURRENT
from memfs.workspace.nodes import WorkspaceError

log = logging.getLogger("memfs.fs")


def reader(fn: Callable) -> Callable:
    """For a request that never changes the tree itself and never names an operation
    (lookups, attributes, reads, closes): counted and mapped, no context variable to set and
    reset per request. A backing pass it starts names its own operation
    (attribution.labelled)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self, *args):
        self.requests[name] += 1
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped; anything else would end the mount
            raise fuse_error(name, args, exc) from None

    return wrapper


def guard(fn: Callable) -> Callable:
    """`reader`, for a request that may change the tree: its operation (attribution.py's
    CURRENT, set by note_process) ends with it, so the next request this pyfuse3 task serves
    starts unnamed."""
    counted = reader(fn)

    @functools.wraps(fn)
    async def wrapper(self, *args):
        token = CURRENT.set(None)  # a request's operation ends with it (attribution.py)
        try:
            return await counted(self, *args)
        finally:
            CURRENT.reset(token)

    return wrapper


def fuse_error(op: str, args: tuple, exc: Exception) -> pyfuse3.FUSEError:
    """A WorkspaceError is its errno; another OSError is logged with its errno; anything else
    is logged with its traceback and answered EIO."""
    if isinstance(exc, (WorkspaceError, MemError)):
        return pyfuse3.FUSEError(exc.errno or errno.EIO)  # both always carry one
    if isinstance(exc, OSError):
        log.error("%s%r failed: %s", op, args[:2], exc)
        return pyfuse3.FUSEError(exc.errno or errno.EIO)
    log.error("%s%r failed", op, args[:2], exc_info=exc)
    return pyfuse3.FUSEError(errno.EIO)
