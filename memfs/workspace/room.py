"""Room for writes: the store filesystem's space as memfs counts it, the refusals for lack of
it, and the space reserve a full disk's GC gets (memfs.store.space, docs/guarantees.md).

Owns the briefly cached statvfs figures (stale 0.5 s after they were read, and at once after a
commit or a GC, which move bytes between memory and disk), whether a group commit is writing
(its chunks are then on the disk and still pending, counted twice: a write that does not fit
meanwhile waits for it to end and decides again), whether the last write that needed space
was refused (the lifecycle's GC reads it; status says so, with the remedy, while it still
would not fit), and the reserve. Loop thread, except
`take_reserve`, which creates or checks a file and so runs in a worker thread; it writes only
`reserve_checked` (when it last ran, a float the loop reads to decide when to run it again).
"""

from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING

import trio

from memfs.store.space import Reserve, Space, headroom, writable
from memfs.workspace.health import full_words
from memfs.workspace.nodes import fail

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.workspace")

# Seconds a write that does not fit waits, all told, for commits in flight to end before it is
# decided on the figures it has (a commit of DIRTY_BYTES_MAX on a slow disk takes seconds).
COMMIT_WAIT = 30.0


class Room:
    def __init__(self, ws: Workspace) -> None:
        self._ws = ws
        self._space: tuple[float, Space] | None = None  # (when, what): statvfs, cached briefly
        # The full-disk reserve (SQLite needs room to delete, or to append): the embedded
        # store's GC gives it back; on a store in PostgreSQL it is host.db's, given back by
        # the backing journal before a write on a short disk (memfs.store.space), and held
        # there only once a backing directory is bound (the journal's first write takes it).
        self.reserve: Reserve | None = Reserve(ws.store.root)
        self.refused = False  # the last write that needed space was refused
        # (since when, bytes it needed) while writes are refused: status names it
        self.refusal: tuple[float, int] | None = None
        self.reserve_checked = 0.0
        self._written: trio.Event | None = None  # set once the commit now writing has ended

    def space(self) -> Space:
        """The store filesystem's space, read at most every 0.5 s (and again after each
        commit, which moves pending bytes from memory to disk)."""
        now = time.monotonic()
        if self._space is None or now - self._space[0] > 0.5:
            self._space = (now, Space.of(self._ws.store.root))
            if self.refusal is not None and self.refusal[1] <= self.free_bytes():
                self.refusal = None  # answered: a later fill by another program is not it
        return self._space[1]

    def changed(self) -> None:
        """Space was given or taken (a commit, a GC): read it again before the next write."""
        self._space = None

    def free_bytes(self) -> int:
        """What writes may still take: the store filesystem's available space, less what
        waits in memory to be committed and the headroom its commits need."""
        sp = self.space()
        return writable(sp, self._ws.pending_bytes)

    def fits(self, nbytes: int) -> bool:
        """Do `nbytes` of new data fit in what is free, less what already waits? A no is
        said on fresh figures (space freed just now); never while commits fail for space."""
        if self._ws.health.full:
            return False
        if nbytes > self.free_bytes():
            self._space = None
        return nbytes <= self.free_bytes()

    def require(self, nbytes: int) -> None:
        """Refuse (ENOSPC) `nbytes` of new data that would not fit in what is free, less what
        already waits, or while commits fail for space. The reconciler asks before it replaces
        a file with disk's bytes, so a take-in that cannot be stored changes nothing."""
        if not nbytes:
            return
        if not self.fits(nbytes):
            self._refuse(nbytes)
        self.refused = False
        self.refusal = None

    @property
    def commit_in_flight(self) -> bool:
        return self._written is not None

    def commit_writing(self) -> None:
        """A group commit starts writing: until `commit_done`, what it has put on the disk
        is still in pending_bytes too, so free_bytes says less than there is."""
        self._written = trio.Event()

    def commit_done(self) -> None:
        """The commit ended (pending recounted, or its failure recorded): writes that waited
        for it decide again."""
        if self._written is not None:
            self._written.set()
            self._written = None

    async def settle(self, nbytes: int, since: float) -> bool:
        """Before a write of `nbytes` new bytes (first asked at `since`, trio's clock): if it
        does not fit while a commit is writing, wait for that commit to end, so that it is
        not refused for bytes counted twice. True if it waited (the caller checks again);
        False once it fits, no commit is writing, commits fail for space (refused at once),
        or COMMIT_WAIT has passed since `since` (then `require` decides on the figures
        there are)."""
        written = self._written
        if not nbytes or written is None or self._ws.health.full \
                or trio.current_time() >= since + COMMIT_WAIT or self.fits(nbytes):
            return False
        with trio.move_on_at(since + COMMIT_WAIT):
            await written.wait()
        return True

    def _refuse(self, nbytes: int) -> None:
        lifecycle = self._ws.lifecycle
        if not self.refused and lifecycle is not None:
            lifecycle.poke()  # a GC may make room
        self.refused = True
        self.refusal = (self.refusal[0] if self.refusal else time.time(), nbytes)
        raise fail(errno.ENOSPC)

    def refusal_status(self) -> dict | None:
        """Writes refused for lack of space, in words, while the last one still would not
        fit: a `dd` that met ENOSPC at write() leaves no failed commit for status to show."""
        if self.refusal is None or self._ws.health.full:
            return None  # none, or commits fail: their failure says it (health)
        since, nbytes = self.refusal
        if nbytes <= self.free_bytes():
            self.refusal = None  # room came back (an rm, a GC): the next write fits
            return None
        store = self._ws.store
        reason, remedy = full_words(self.space(), str(store.root), store.kind != "sqlite")
        return {"since": since, "bytes": nbytes, "reason": reason, "remedy": remedy}

    def short(self) -> bool:
        """Does the space free right now (read again) fall short of what waits in memory?
        Someone else may have filled the disk since the writes were let in."""
        self._space = None
        sp = self.space()
        return sp.avail < self._ws.pending_bytes + headroom(sp.size) // 2

    def take_reserve(self) -> None:
        """Hold the space reserve (memfs.store.space) when there is room for it (worker
        thread)."""
        self.reserve_checked = time.monotonic()
        if self.reserve is None or (self._ws.store.kind != "sqlite"
                                    and not self._ws.backing.bindings):
            return  # on PostgreSQL it is the journal's: none without a backing directory
        try:
            self.reserve.ensure()
        except OSError as exc:
            log.warning("could not take the space reserve: %s", exc)

    def status(self) -> dict:
        """statfs's figures and what memfs keeps of them (bytes)."""
        sp = self.space()
        return {**sp.to_json(), "pending_bytes": self._ws.pending_bytes,
                "writable": self.free_bytes(), "headroom": headroom(sp.size),
                "refused": self.refusal_status(),
                "reserve": self.reserve.held() if self.reserve is not None else 0}
