"""The review lock: one consolidation commit or recovery at a time per memory root.

Two layers, because either alone leaves a gap. `fcntl.flock` on `<root>/review.lock`
serializes processes on one host (the kernel drops it when a holder dies, even by
SIGKILL, so a crash never leaves a stale lock). A `threading.Lock` per root serializes
threads of one process, which flock alone would not do cleanly for callers sharing one
descriptor. A root whose store is shared in PostgreSQL (docs/scaling.md) adds a third layer:
a session advisory lock in that database, so reviews on every host serialize; the server
drops it when the holder's connection ends, so a host that dies leaves no stale lock either.

The lock guards only the short commit barrier (recheck, receipt, CAS, mark). It must
never be held while a model is asked anything: a provider's latency would then stall
every other review. The worker can check that with `held_here(root)` before a request.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from memfs.errors import MemfsError

if TYPE_CHECKING:
    import psycopg

LOCK_NAME = "review.lock"

_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}
_holders: dict[str, int] = {}  # root key -> thread id holding it in this process


def _key(root: Path) -> str:
    return os.path.realpath(root)


def _thread_lock(key: str) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault(key, threading.Lock())


def held_here(root: Path) -> bool:
    """True when some thread of this process holds the review lock of `root`."""
    with _guard:
        return _key(root) in _holders


def _try_review_lock(conn: psycopg.Connection) -> bool:
    """One try at the server's review lock (a session-level advisory lock: it goes with the
    connection, so a host that dies frees it)."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (REVIEW_KEY,)).fetchone()
    return bool(row and row[0])


@contextmanager
def review_lock(root: Path, timeout: float | None = 120.0) -> Iterator[None]:
    """Hold the review lock of `root` (waiting at most `timeout` seconds; None waits forever).

    Not reentrant: a thread that already holds it is refused rather than deadlocked.
    """
    key = _key(root)
    with _guard:
        if _holders.get(key) == threading.get_ident():
            raise MemfsError(
                "this thread already holds the review lock",
                "finish the current review before starting another",
            )
    deadline = None if timeout is None else time.monotonic() + timeout
    tlock = _thread_lock(key)
    if not tlock.acquire(timeout=-1 if deadline is None else max(0.0, timeout or 0.0)):
        raise _busy(root, timeout)
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(root) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _flock(fd, deadline, root, timeout)
            try:
                with _database_lock(root, deadline, timeout):
                    with _guard:
                        _holders[key] = threading.get_ident()
                    try:
                        yield
                    finally:
                        with _guard:
                            _holders.pop(key, None)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        tlock.release()


def _flock(fd: int, deadline: float | None, root: Path, timeout: float | None) -> None:
    """Take the exclusive flock, polling so a deadline can be honoured."""
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                raise _busy(root, timeout) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


REVIEW_KEY = 0x6D656D66735256  # the advisory lock's key in a shared store's database


@contextmanager
def _database_lock(root: Path, deadline: float | None, timeout: float | None) -> Iterator[None]:
    """The review lock among hosts, when the root's store is shared; else nothing."""
    from memfs.store.backend import read_location

    loc = read_location(Path(root))
    if loc is None:
        yield
        return
    from memfs.store.pg.conn import connect

    conn = connect(loc.url, autocommit=True)
    try:
        delay = 0.01
        while not _try_review_lock(conn):
            if deadline is not None and time.monotonic() >= deadline:
                raise MemfsError(f"a review on another host holds the shared store's review "
                                 f"lock (waited {timeout} s)",
                                 "wait for that host's consolidation or recovery to finish, "
                                 "then retry")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        yield
    finally:
        conn.close()  # the server releases a session's advisory locks with it


def _busy(root: Path, timeout: float | None) -> MemfsError:
    return MemfsError(
        f"another review holds {Path(root) / LOCK_NAME} (waited {timeout} s)",
        "wait for the running consolidation or recovery to finish, then retry",
    )
