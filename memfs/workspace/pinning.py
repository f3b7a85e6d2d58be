"""This host's pins, published for the other hosts' garbage collection (memfs.store.pg.pins).

On a store in PostgreSQL a GC run on any host must keep what this daemon still shows or holds
open (memfs.workspace.lifecycle.pins_of). Every PUBLISH_EVERY seconds the loop computes that
set (a walk of the view roots and the open handles, no store call); when it changed, or its
published row is a quarter of its life old, a worker thread replaces the row. A failed
publish (the server away) is logged and tried at the next look; the row left behind keeps
what it named until it expires. A clean stop withdraws the row; a crash leaves it to expire.

A view of a past commit is published before it is usable: the workspace tells `made` of
each new view root (`fresh`), and the FUSE lookup or listing that made it awaits `shown`,
which publishes at once (in a worker thread; the loop goes on serving other requests) with
the check that the views' commits are still there (pins.publish_checked). A view whose
commit a GC dropped meanwhile is forgotten and answered as absent; one that could not be
published (the server away) fails with EIO and is published at the next try. So no GC run
on another host sweeps what a view shows here, however late the periodic look would be.

A row that lapsed (this daemon paused, or cut off from the server, past its life) kept
nothing meanwhile: a run on another host may have dropped and swept any view's commit. The
publish finds its row no longer live and checks every view's commit (pins.publish_checked);
a view whose commit is gone is dropped whole at once (Workspace.drop_swept_view): a lookup
of its name says absent, a request on an inode of it the kernel still holds says ESTALE
(the kernel looks the path up again: absent), a read of a file still open in it EIO. Never
part of a swept tree (a listing from memory beside reads that fail), and never a row that
names it again. EIO rather than the bytes still cached for an open file: which ones are
cached is chance, and a view is the commit whole or not at all. The commit a follower shows
(below) is checked with them: one found gone leaves the set, and the follower shows the
branch's head (Hosts.refollow).

Likewise before this host moves a head off a file it holds open (a commit of its unlink,
an undo, a restore: `before_head_moves`), a grown set is published first, and the move is
refused (NotPublished: nothing changed) if it cannot be; so is a branch switch to a branch
another host writes whose head cannot be published (memfs.workspace.hosts). A host that
follows a branch another host writes pins the commit it shows (lifecycle.pins_of): the
writer's next commit leaves it named by no head, and a run may start before this host hears
of that commit. So before it shows a commit (memfs.workspace.hosts: at start and at each
followed commit), `before_showing` publishes the set with that commit added, checked as a
view's is, while the one it still shows stays in it; the next look drops the old one. A
file held open that the new commit takes out stays kept through the old one's tree until
that look names it alone.

On the embedded store one daemon owns the store and its own GC asks the loop directly, so
this does not run.

Loop thread; the publish and the withdrawal run in worker threads.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from memfs.errors import MemfsError
from memfs.store.pg import pins as host_pins
from memfs.store.refs import INODES, Ref
from memfs.workspace.lifecycle import pins_of
from memfs.workspace.nodes import WorkspaceError

if TYPE_CHECKING:
    from memfs.store.gc import Pins
    from memfs.store.pg.store import PgStore
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.pins")
TRIES = 8  # publishes in one `shown` when views' commits keep going (each try forgets some)


@dataclass
class Shown:
    """What `shown` did to the views made before it: `gone` (node ids) were forgotten, their
    commits dropped by a GC; `failed`, the error while the fresh views could not be published
    (they stay fresh: not usable yet)."""

    gone: set[int] = field(default_factory=set)
    failed: str | None = None


class NotShown(Exception):  # noqa: N818 - an outcome the follower acts on, not a fault
    """A commit to show was not published: `dropped`, a GC dropped it (follow the newer
    head); else the server's error (keep showing the commit published before; retry)."""

    def __init__(self, commit_id: str, error: str | None = None) -> None:
        super().__init__(error or f"commit {commit_id[:12]} was dropped by garbage collection")
        self.commit_id = commit_id
        self.dropped = error is None


class NotPublished(MemfsError):  # noqa: N818 - a refusal, named for what it says
    """A head move (`what`: an undo, a restore, a branch switch, a commit) refused because
    this host's pins could not be published first for other hosts' GC: nothing changed."""

    def __init__(self, what: str, error: str) -> None:
        # The cause first (the server out of reach, mostly): status's "commits FAILING"
        # line read as a pins problem, with the server's own words in brackets at its end.
        super().__init__(f"{what} was refused: {error}; what this host shows and holds open "
                         "could not be published first for other hosts' garbage collection, "
                         "so nothing was changed",
                         "retry once the PostgreSQL server answers this host (`memfs status` "
                         "says whether it does)")


@dataclass
class Lapse:
    """This host's row was found no longer live by a publish: the daemon was paused, or cut
    off from the server, past the row's life, so GC runs elsewhere kept nothing of it."""

    at: float  # wall clock, when this host found it
    commits_gone: int  # of the views' (and a followed) commits, dropped meanwhile
    seconds: float  # the row's life it outlasted (ttl)

    def to_json(self) -> dict:
        return {"at": self.at, "commits_gone": self.commits_gone, "ttl": self.seconds}


class PinPublisher:
    def __init__(self, ws: Workspace, store: PgStore) -> None:
        self.ws = ws
        self.store = store
        self.hostname = socket.gethostname()
        self.ttl = host_pins.ttl()
        self.published: tuple[frozenset, frozenset] | None = None  # what the row says now
        self.published_at = 0.0  # trio clock
        self.failing: str | None = None  # the last publish's error, while it fails
        self.fresh: dict[int, str] = {}  # view root id -> its commit, not yet published
        self.views: dict[int, str] = {}  # every view root id -> its commit (pruned at publish)
        self._lapsing = False  # the last publish found it so (one warning a lapse)
        self.lapses = 0  # how often since the start (status)
        self.last_lapse: Lapse | None = None
        self.swept_shown: tuple[str, str, str | None] | None = None  # (commit, tree, table)
        self._lock = trio.Lock()  # one publish at a time, each of the set computed under it
        self._stopped = False

    async def run(self) -> None:
        """The daemon's background task (ends with the nursery)."""
        while True:
            await self.publish_if_due()
            await trio.sleep(host_pins.publish_every())

    def made(self, node_id: int, commit_id: str) -> None:
        """A new view root (loop; Workspace._remember_view): not usable until `shown`."""
        self.fresh[node_id] = commit_id
        self.views[node_id] = commit_id

    async def shown(self) -> Shown:
        """Publish the fresh views now, before the kernel is answered (loop)."""
        out = Shown()
        async with self._lock:
            for _ in range(TRIES):
                if not self.fresh or self._stopped:
                    return out
                try:
                    gone = await self._publish()
                except Exception as exc:  # noqa: BLE001 - the views wait; the caller says EIO
                    self._failed(exc)
                    out.failed = str(exc)
                    return out
                out.gone |= self._forget(gone)
        out.failed = "the views' commits kept being dropped by garbage collection"
        return out

    async def before_head_moves(self, what: str, *, in_tree: bool = False) -> None:
        """Before this host moves a branch head off what it holds open (loop: `what`, a
        commit of an unlink, with `in_tree` an undo or a restore): a set grown since the
        last publish, or one published long ago (its row may have lapsed), is published
        first, so a run on another host that plans after the move still keeps it.
        NotPublished if it cannot be: the caller moves nothing."""
        async with self._lock:
            for _ in range(TRIES):
                if self._stopped:
                    return
                pins = pins_of(self.ws, in_tree=in_tree)
                if not self.fresh and self.published is not None and \
                        trio.current_time() - self.published_at < self.ttl / 2 and \
                        pins.trees <= self.published[0] and pins.refs <= self.published[1]:
                    return
                try:
                    gone = await self._publish(pins)
                except Exception as exc:  # noqa: BLE001 - the server away: refused
                    self._failed(exc)
                    raise NotPublished(what, _said(exc)) from None
                if not gone:
                    return
                self._forget(gone)  # views of dropped commits: the set changed
            raise NotPublished(what, "the views' commits kept being dropped by garbage "
                               "collection")

    async def before_showing(self, commit_id: str, tree: str, table: str | None) -> None:
        """Before this host shows another host's commit (loop, the commit lock held by
        memfs.workspace.hosts): the set, with that commit's tree and inode table, published
        with the check that the commit is still there. NotShown if it is not, or the
        publish failed."""
        async with self._lock:
            if self._stopped:
                return
            for _ in range(TRIES):
                pins = pins_of(self.ws)
                pins.trees.add(tree)
                if table:
                    pins.refs.add(Ref(INODES, table))
                try:
                    gone = await self._publish(pins, also={commit_id})
                except Exception as exc:  # noqa: BLE001 - the follower retries
                    self._failed(exc)
                    raise NotShown(commit_id, _said(exc)) from None
                if commit_id in gone:
                    raise NotShown(commit_id)
                if not gone:
                    return
                self._forget(gone)  # fresh views of dropped commits: the set changed
            raise NotShown(commit_id, "the views' commits kept being dropped by garbage "
                           "collection")

    async def publish_if_due(self) -> None:
        async with self._lock:
            if not self._stopped:
                await self._publish_if_due()

    async def _publish_if_due(self) -> None:
        pins = pins_of(self.ws)
        key = (frozenset(pins.trees), frozenset(pins.refs))
        if not self.fresh and key == self.published and \
                trio.current_time() - self.published_at < self.ttl / 4:
            return
        for _ in range(TRIES):
            try:
                gone = await self._publish()
            except Exception as exc:  # noqa: BLE001 - the server away: the next look tries
                self._failed(exc)
                return
            if not gone:
                return
            self._forget(gone)

    async def _publish(self, pins: Pins | None = None, also: set[str] | None = None
                       ) -> set[str]:
        """One checked publish of the set as it is now, or `pins` (under `_lock`): the
        commits of fresh views, or of `also`, or (the row lapsed) of any view, found gone
        (nothing was published then), else none."""
        fresh = dict(self.fresh)
        views = {nid: cid for nid, cid in self.views.items() if nid in self.ws._view_roots}
        self.views = views
        pins = self._without_swept(pins if pins is not None else pins_of(self.ws))
        following = self._following()
        now = trio.current_time()
        checked = await trio.to_thread.run_sync(
            host_pins.publish_checked, self.store, self.hostname, pins, self.ttl,
            set(fresh.values()) | (also or set()),
            set(views.values()) | ({following} if following else set()))
        if following is not None and following in checked.gone:
            self._shown_swept(following)
        if checked.lapsed and self.published is not None and not self._lapsing:
            self.lapses += 1
            self.last_lapse = Lapse(time.time(), len(checked.gone), self.ttl)
            log.warning("this host's pins had lapsed on the server (not renewed within %.0f "
                        "s): every view's commit was checked again%s", self.ttl,
                        f"; {len(checked.gone)} commit(s) gone" if checked.gone else "")
        self._lapsing = checked.lapsed
        if not checked.gone:
            for node_id in fresh:  # views made during the publish stay fresh
                self.fresh.pop(node_id, None)
            self.failing = None
            self.published, self.published_at = (frozenset(pins.trees),
                                                  frozenset(pins.refs)), now
        return checked.gone

    def _following(self) -> str | None:
        """The commit this host shows of a branch another host writes (in its pins: checked
        after a lapse as views are), unless already found swept."""
        ws = self.ws
        if ws.read_only is None or not ws.root.ref:
            return None
        if self.swept_shown is not None and self.swept_shown[0] == ws.head:
            return None
        return ws.head

    def _shown_swept(self, commit_id: str) -> None:
        """The commit this follower shows was dropped by a GC while this host's row had
        lapsed: its tree leaves the set (a row naming it would keep nothing), and the
        follower shows the branch's head now (memfs.workspace.hosts)."""
        log.warning("commit %s, which this host shows, was dropped by a garbage collection on "
                    "another host while this host's pins had lapsed: showing the branch's "
                    "head instead", commit_id[:12])
        self.swept_shown = (commit_id, self.ws.root.ref or "", self.ws.inodes.table)
        if self.ws.hosts is not None:
            self.ws.hosts.refollow()

    def _without_swept(self, pins: Pins) -> Pins:
        """`pins` without the tree of a shown commit found swept, while it is still shown."""
        swept = self.swept_shown
        if swept is None:
            return pins
        if swept[0] != self.ws.head:
            self.swept_shown = None  # the follower moved on
            return pins
        out = type(pins)(set(pins.trees) - {swept[1]}, set(pins.refs))
        if swept[2]:
            out.refs.discard(Ref(INODES, swept[2]))
        return out

    def _forget(self, gone: set[str]) -> set[int]:
        """Forget the views of dropped commits: fresh ones (a later lookup says absent), and
        published ones a run swept while this host's row had lapsed (dropped whole)."""
        out = set()
        for node_id, cid in [*self.views.items(), *self.fresh.items()]:
            if cid not in gone or node_id in out:
                continue
            out.add(node_id)
            was_fresh = self.fresh.pop(node_id, None) is not None
            self.views.pop(node_id, None)
            node = self.ws._view_roots.get(node_id)
            if node is None:
                continue
            if was_fresh:
                self.ws.forget_view(node)
                continue
            log.warning("the view of commit %s was dropped and swept by a garbage collection "
                        "on another host while this host's pins had lapsed: it is gone here "
                        "too", cid[:12])
            self.ws.drop_swept_view(node)
        return out

    def status(self) -> dict:
        """What status says of this host's pins: whether publishing fails, and the lapses
        (a lapse is when other hosts' GC may have taken what this host showed)."""
        return {"failing": self.failing, "lapses": self.lapses,
                "last_lapse": self.last_lapse.to_json() if self.last_lapse else None}

    def _failed(self, exc: Exception) -> None:
        if self.failing is None:
            log.warning("could not publish this host's pins for other hosts' GC: %s", exc)
        self.failing = str(exc)

    async def withdraw(self) -> None:
        """A clean stop: nothing here is shown or open any more."""
        async with self._lock:
            self._stopped = True
        try:
            await trio.to_thread.run_sync(host_pins.withdraw, self.store)
        except Exception as exc:  # noqa: BLE001 - the row expires on its own
            log.warning("could not withdraw this host's pins (they expire): %s", exc)


def _said(exc: Exception) -> str:
    """What happened, without the remedy of its own (the refusal names the one that fits)."""
    return exc.message if isinstance(exc, MemfsError) else str(exc)


async def views_published(ws: Workspace) -> set[int]:
    """Before a lookup or listing under .memfs is answered (loop): the views it made are
    published for other hosts' GC. The ids of those whose commit was dropped meanwhile
    (answered as absent); EIO while they cannot be published."""
    gate = ws.pin_gate
    if gate is None or not gate.fresh:
        return set()
    shown = await gate.shown()
    if shown.failed is not None and gate.fresh:
        raise WorkspaceError(errno.EIO, "this view could not be published for other hosts' "
                             f"garbage collection: {shown.failed}")
    return shown.gone
