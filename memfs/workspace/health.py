"""Whether group commits are going through; when they are not, why and what to do.

A failed commit is never fatal: its changes stay pending in memory and the commit loop retries
them. What this module adds is the telling: one record of the failure (`memfs status`, the
errno an fsync or close answers, the refusal of `memfs umount`), a retry pace that does not
flood the log, and a wake-up for the retry when something frees space (an unlink, a GC).

Loop thread only (the commit thread raises; the loop records).
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass

import trio

from memfs.errors import MemfsError
from memfs.store.space import Space, headroom, size_text, writable

log = logging.getLogger("memfs.workspace")

RETRY_MIN = 0.1
RETRY_MAX = 5.0
LOG_EVERY = 60.0  # a failure that goes on is logged again this often, not at every retry


class CommitError(OSError, MemfsError):
    """A group commit that could not be stored: an OSError for the FUSE layer (fsync and
    close answer its errno) and a MemfsError with a remedy for the control channel."""

    def __init__(self, code: int, message: str, remedy: str) -> None:
        OSError.__init__(self, code, message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message} — {self.remedy}"


@dataclass
class CommitFailure:
    errno: int
    error: str  # what the store reported
    reason: str  # in plain words
    remedy: str
    since: float  # wall clock of the first failed attempt
    attempts: int = 1

    def to_json(self) -> dict:
        return {"errno": self.errno, "error": self.error, "reason": self.reason,
                "remedy": self.remedy, "since": self.since, "attempts": self.attempts}


def explain(exc: BaseException, space: Space | None, root: str,
            shared: bool = False) -> CommitFailure:
    """The failure in words a user can act on (`shared`: the store is in PostgreSQL, and
    what is full is this host's root). No count of what is pending: the words are kept
    between retries (5 s apart at most) while changes go on arriving, and status showed
    two different counts side by side; its `pending` line is the live one."""
    code = getattr(exc, "errno", None) or errno.EIO
    error = f"{type(exc).__name__}: {exc}"
    later = ("what is pending stays in memory and commits by itself once it is possible "
             "(`pending` in `memfs status` says how much)")
    if isinstance(exc, MemfsError) and not isinstance(exc, OSError) and exc.remedy:
        # the store said what happened and what to do (a PostgreSQL server out of reach, or
        # one whose disk is full: that one's `errno` is ENOSPC, so writes are refused as on
        # a full embedded store): its words, not a guess from an errno
        reason, remedy = exc.message, f"{exc.remedy}; {later}"
        error = type(exc).__name__  # its words are the reason: the log says them once
    elif code in (errno.ENOSPC, errno.EDQUOT):
        reason, remedy = full_words(space, root, shared)
        if not shared:
            remedy = ("delete files in the mount (also ones still being written), then run "
                      "`memfs gc` to reclaim their space from history (or free space on that "
                      "filesystem)")
        remedy = f"{remedy}; {later}"
    elif code == errno.EIO:
        reason = f"the store's disk reports I/O errors at {root}"
        remedy = f"check the disk (`dmesg`), then `memfs fsck`; {later}"
    else:
        reason = f"the store refuses the commit at {root}"
        remedy = f"see the daemon log (<root>/daemon.log); {later}"
    return CommitFailure(code, error, reason, remedy, time.time())


def full_words(space: Space | None, root: str, shared: bool,
               waiting: int | None = None) -> tuple[str, str]:
    """What is full, and what frees it. On a store in PostgreSQL the history is the server's
    and no GC runs (docs/lifecycle.md): what fills is this host's root, whose chunk and object
    caches are copies of rows and may be deleted, even under a running daemon. `waiting`
    (bytes pending in memory; given where new data was refused): the count is said, so
    "full" with MiB free is explained (user trial: "full (18.4 MiB free ...)")."""
    free = f"{size_text(space.avail)} free of {size_text(space.size)}" if space else "no space"
    if space is not None and waiting is not None:
        free += (f", less {size_text(headroom(space.size))} kept for the commits' own "
                 f"metadata and {size_text(waiting)} waiting in memory to be committed: "
                 f"{size_text(writable(space, waiting))} writable")
    if shared:
        return (f"this host's root is full ({free} at {root}; the store itself is in "
                "PostgreSQL)",
                f"free space on that filesystem: this host's caches ({root}/cache) are safe "
                "to delete, they are read again from the database")
    return (f"the store's filesystem is full ({free} at {root})",
            "delete files in the mount, then run `memfs gc` to reclaim their space from "
            "history (or free space on that filesystem)")


def store_full(what: str, space: Space | None, root: str, shared: bool = False,
               waiting: int = 0) -> MemfsError:
    """A backing-directory pass refused for lack of space in the store, in words."""
    reason, remedy = full_words(space, root, shared, waiting)
    if waiting:  # stored by the next commit: counted as taken until it lands
        remedy += (f"; the {size_text(waiting)} waiting in memory counts as taken until its "
                   "commit lands, so a pass refused while a commit was in flight may fit "
                   "once it has")
    return MemfsError(f"{reason}: {what}", f"{remedy}; then `memfs sync`")


class CommitHealth:
    def __init__(self) -> None:
        self.failure: CommitFailure | None = None
        self.retry_now = trio.Event()  # set by what may let a failing commit through
        self._logged_at = 0.0

    @property
    def full(self) -> bool:
        """Commits are failing for lack of space: new data is refused at write()."""
        return self.failure is not None and self.failure.errno in (errno.ENOSPC, errno.EDQUOT)

    def failed(self, exc: BaseException, space: Space | None, root: str,
               shared: bool = False) -> CommitError:
        new = explain(exc, space, root, shared)
        old = self.failure
        if old is not None and old.errno == new.errno:
            old.attempts += 1
            old.error, old.reason, old.remedy = new.error, new.reason, new.remedy
            new = old
        self.failure = new
        now = time.monotonic()
        if new is not old or now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.error("group commit failed (attempt %d): %s: %s — %s", new.attempts, new.reason,
                      new.error, new.remedy)
        return CommitError(new.errno, f"commits are failing: {new.reason}", new.remedy)

    def succeeded(self) -> None:
        if self.failure is not None:
            log.info("group commits go through again (after %d failed attempt(s))",
                     self.failure.attempts)
        self.failure = None

    def moot(self, why: str) -> None:
        """What the failing commit held is gone (`why`), so nothing fails any more: no
        success to report, and no retry to promise in status."""
        if self.failure is not None:
            log.info("group commit failure cleared after %d attempt(s): %s",
                     self.failure.attempts, why)
        self.failure = None

    def retry_delay(self) -> float:
        if self.failure is None:
            return RETRY_MIN
        return min(RETRY_MAX, RETRY_MIN * 2 ** min(self.failure.attempts, 8))

    def poke(self) -> None:
        """Something freed space (or may have): retry a failing commit now."""
        if self.failure is not None:
            self.retry_now.set()

    async def wait_to_retry(self) -> None:
        await trio.sleep(RETRY_MIN)
        with trio.move_on_after(self.retry_delay() - RETRY_MIN):
            await self.retry_now.wait()
        self.retry_now = trio.Event()
