"""Giving the C heap's free pages back to the system after a large, short-lived peak.

A pass over a large tree (a take-in of 20k files at attach) builds whole-tree structures,
some in worker threads, and frees them when it ends. glibc keeps what was freed inside its
arenas (one per thread that allocated), so the daemon's RSS stays at the peak although the
memory is free. `malloc_trim(0)` hands the free pages of every arena back (madvise), which is
what a long-lived daemon wants after a one-off peak. Python's own small-object allocator is
not affected (its arenas go back when empty). Elsewhere (musl, macOS) there is no such call
and `trim` does nothing.

No state but the looked-up function; `trim` may be called from any thread (glibc locks each
arena it trims). It walks the free lists, so it belongs in a worker thread, not on the loop.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _lookup() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the process's own libc, no library search
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> bool:
    """Return the C heap's free pages to the system; True if the call exists here."""
    fn = _lookup()
    if fn is None:
        return False
    fn(0)
    return True


__all__ = ["trim"]
