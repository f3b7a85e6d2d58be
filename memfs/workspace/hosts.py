"""This host's part in a store many hosts share (memfs.store.pg): the writer lease of the
selected branch, and the branch followed while another host writes it.

- At start and at each branch switch the daemon claims the branch's lease. Without it the
  workspace is read-only (`Workspace.read_only` says who writes the branch; every change is
  EROFS), and each commit another host makes on the branch replaces the tree here, as an
  undo does, with the kernel told to forget what changed: `ls` and `cat` show it at once.
- A lease lost to a takeover (this host was paused or cut off past its expiry) makes the
  workspace read-only the same way; what it had not committed cannot be committed (the
  store fences it) and is dropped when the new writer's head is shown, said in the log and
  in status.
- `takeover` moves an expired lease here and makes the branch writable, continuing from its
  last durable commit.
- On PostgreSQL the commit a follower shows is in its pins for every host's GC (the writer's
  next commit leaves it named by no head): before the follower shows a commit, at start or
  followed, it publishes it (memfs.workspace.pinning.before_showing), still pinning the one
  it shows; a commit a GC dropped meanwhile is not shown (the newer head is), and while the
  publish fails the follower keeps showing the commit it published before, and retries.
  A branch switch to a branch another host writes publishes its head the same way first,
  and is refused (NotPublished, nothing changed) while it cannot be; once done, it reads the
  head again (`refollow`), as a notice that came meanwhile was of a branch not shown then.

On the embedded store every claim succeeds and no other host moves a head, so this is idle.
Loop thread; every store call runs in a worker thread; the store's watcher and lease threads
reach the loop only through a memory channel.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable

import trio

from memfs.store.pg.pins import PUBLISH_EVERY
from memfs.store.store import CommitDropped
from memfs.store.trees import DIR, decode_dir
from memfs.workspace.cutoff import CutOff
from memfs.workspace.pinning import TRIES, NotPublished, NotShown

log = logging.getLogger("memfs.hosts")
PREFETCH_LIMIT = 10_000  # directory objects read ahead per followed commit
RETRY_EVERY = PUBLISH_EVERY  # seconds between two tries at publishing a commit to show


class Hosts:
    def __init__(self, ws) -> None:  # ws: memfs.workspace.workspace.Workspace
        self.ws = ws
        self.store = ws.store
        self._send, self._recv = trio.open_memory_channel(math.inf)
        self._token: trio.lowlevel.TrioToken | None = None
        self.followed = 0  # commits of other hosts shown here (status)
        self.heard = 0  # notices of other hosts' head moves, of any branch (status)
        self.dropped: str | None = None  # what a lost lease cost, once it happened
        self.pinned: str | None = None  # the commit last published before it was shown

    async def start(self) -> None:
        """Start hearing other hosts (before serving; the workspace claimed its branch)."""
        if self.ws.read_only is not None:
            log.info("read-only: %s", self.ws.read_only)
        self._token = trio.lowlevel.current_trio_token()
        self.store.watch(self._heard, self._lost)
        if self.ws.read_only is not None:  # the commit shown (published before serving),
            branch = self.ws.branch            # or one made before the watch began
            await self._follow_latest(branch,
                                      await trio.to_thread.run_sync(self.store.head, branch))

    # -- from the store's threads ---------------------------------------------------------
    def _heard(self, branch: str, head: str) -> None:
        self._to_loop(("head", branch, head))

    def _lost(self, branch: str) -> None:
        self._to_loop(("lost", branch, ""))

    def refollow(self) -> None:
        """Loop: show the selected branch's head now (the commit shown was swept by a GC
        while this host's pins had lapsed: memfs.workspace.pinning; or a branch switch
        showed a head read before a notice it passed over)."""
        self._send.send_nowait(("refollow", self.ws.branch, ""))

    def _to_loop(self, item: tuple[str, str, str]) -> None:
        try:
            trio.from_thread.run_sync(self._send.send_nowait, item, trio_token=self._token)
        except trio.RunFinishedError:
            pass

    # -- on the loop --------------------------------------------------------------------------
    async def run(self, drain: Callable[[], Awaitable[None]]) -> None:
        """Follow the selected branch while another host writes it; `drain` tells the kernel."""
        async for what, branch, head in self._recv:
            self.heard += what == "head"
            if branch != self.ws.branch:
                continue
            if what == "lost":
                self.ws.read_only = (f"this host lost the lease of branch {branch} (another "
                                     "host took it over)")
            if what in ("lost", "refollow"):
                head = await trio.to_thread.run_sync(self.store.head, branch)
            if self.ws.read_only is None:
                continue  # our own branch: nobody else may move it (the lease fences them)
            await self._follow_latest(branch, head)
            await drain()

    async def _follow_latest(self, branch: str, head: str) -> None:
        """Follow `head`, or the branch's head now if a GC dropped `head` in between (the
        writer committed again and a collection ran before this host showed it): a head a
        notice named is no longer kept once it is not the head. A branch head is never
        dropped, so the head read again is newer, unless the branch moved back to a dropped
        commit, which no head move allows. While the commit cannot be published for other
        hosts' GC (the server away), the one shown stays, and the publish is tried again."""
        told = None
        while True:
            try:
                await self.follow(head)
                return
            except CommitDropped:
                pass
            except NotShown as exc:
                if not exc.dropped:
                    if told != head:
                        log.warning("not showing %s yet: it could not be published for "
                                    "other hosts' garbage collection (%s)", head[:12], exc)
                        told = head
                    await trio.sleep(RETRY_EVERY)
                    continue
            newer = await trio.to_thread.run_sync(self.store.head, branch)
            if newer == head:
                log.error("branch %s's head %s was dropped: not followed", branch, head[:12])
                return
            head = newer

    async def follow(self, head: str, cut_off: list[CutOff] | None = None) -> None:
        """Show `head` (another host's commit): objects read ahead in a thread, then, under
        the commit lock, the commit published for other hosts' GC and the tree replaced,
        as an undo replaces it (the writers it cuts off are added to `cut_off`)."""
        ws = self.ws
        if head == ws.head and self._published(head):
            return
        await trio.to_thread.run_sync(self._read_ahead, ws.head, head)
        async with ws._commit_lock:
            if head == ws.head and self._published(head):
                return
            await self._publish(head)
            if head == ws.head:
                return
            if ws.root.dirty or ws.mutation_seq != ws.durable_seq:
                self._drop_uncommitted(ws.mutation_seq - ws.durable_seq)
            cut = ws._replace_tree(head, f"another host's commit on {ws.branch}")
            if cut_off is not None:
                cut_off.extend(cut)
            ws._recount_dirty()
            ws.durable_seq = ws.mutation_seq
            ws.dirty_since = None
            self.followed += 1

    def _drop_uncommitted(self, n: int) -> None:
        """Changes this host made on a branch whose lease another host took before they were
        committed (this host paused or cut off past its lease): the tree shown now drops
        them. Said in status (`lost_changes`) and the log; the commit failure they kept
        (Fenced, "commits by itself once it is possible") is moot, nothing is pending."""
        ws = self.ws
        self.dropped = (f"{n} change(s) made here on branch {ws.branch} were never committed "
                        f"and are dropped (at {time.strftime('%H:%M:%S')}): another host took "
                        "the branch's lease over first; none was fsynced (an fsync returns "
                        "only once its commit landed) — `memfs log` shows the branch as that "
                        "host wrote it; redo what is missing on a branch of your own or after "
                        "`memfs takeover`")
        log.error("%s", self.dropped)
        ws.last_error = self.dropped
        ws.health.moot("the changes it was committing were dropped (the lease was lost)")

    async def published_to_show(self, branch: str, head: str) -> str:
        """Before a branch switch shows `head` of a branch another host writes (loop, the
        commit lock held): published as a followed commit is; a head dropped meanwhile is
        read again (the one returned is shown). NotPublished if it cannot be published (the
        server away): the switch is refused, as it would show a commit no run elsewhere
        keeps once the writer moves on."""
        what = f"memfs branch switch {branch}"
        for _ in range(TRIES):
            try:
                await self._publish(head)
                return head
            except CommitDropped:
                pass
            except NotShown as exc:
                if not exc.dropped:
                    raise NotPublished(what, str(exc)) from None
            head = await trio.to_thread.run_sync(self.store.head, branch)
        raise NotPublished(what, f"branch {branch}'s head kept being dropped by garbage "
                           "collection")

    def _published(self, head: str) -> bool:
        return self.ws.pin_gate is None or self.pinned == head

    async def _publish(self, head: str) -> None:
        """Before `head` is shown: published (pinning.before_showing; NotShown or
        CommitDropped if it cannot be)."""
        gate = self.ws.pin_gate
        if gate is None:
            return
        try:
            tree, table = await trio.to_thread.run_sync(self._refs_of, head)
        except CommitDropped:
            raise
        except Exception as exc:  # noqa: BLE001 - the server away: retried
            raise NotShown(head, str(exc)) from None
        await gate.before_showing(head, tree, table)
        self.pinned = head

    def _refs_of(self, head: str) -> tuple[str, str | None]:
        """Worker thread: the commit's tree and inode table (cached by the read-ahead)."""
        return self.store.commit(head).tree, self.store.inode_table(head)

    def _read_ahead(self, old: str, new: str) -> None:
        """Worker thread: the new commit, its inode table, and the directory objects on the
        paths where the two trees differ, so the replacement on the loop reads them from the
        cache instead of the database."""
        try:
            old_tree = self.store.commit(old).tree
            new_tree = self.store.commit(new).tree
            self.store.inode_table(new)
        except Exception as exc:  # noqa: BLE001 - the loop reads (and reports) it again
            log.warning("reading ahead %s: %s", new[:12], exc)
            return
        todo, seen = [(new_tree, old_tree)], 0
        while todo and seen < PREFETCH_LIMIT:
            n, o = todo.pop()
            if n == o:
                continue
            seen += 1
            try:
                fresh = decode_dir(self.store.read_object(n))
                known = {e.name: e for e in decode_dir(self.store.read_object(o))}
            except Exception:  # noqa: BLE001
                continue
            for e in fresh:
                k = known.get(e.name)
                if e.kind == DIR and k is not None and k.kind == DIR and k.ref != e.ref:
                    todo.append((e.ref, k.ref))

    async def takeover(self, branch: str) -> dict:
        """Move `branch`'s expired lease here and continue from its last durable commit."""
        claim = await trio.to_thread.run_sync(self.store.takeover, branch)
        was = self.ws.branch
        cut: list[CutOff] = []  # writers of files the shown tree replaced (memfs.workspace.cutoff)
        if branch != was:
            await self.ws.switch_branch(branch, cut_off=cut)
        else:
            head = await trio.to_thread.run_sync(self.store.head, branch)
            await self.follow(head, cut)
            self.ws.read_only = None
        return {"branch": branch, "head": self.ws.head, "switched_from": None if was == branch
                else was, **claim.to_json(), "cut_off": [c.to_json() for c in cut]}

    def status(self) -> dict:
        """Other hosts' commits heard of and shown here, and what a lost lease cost."""
        return {"heard": self.heard, "followed": self.followed, "dropped": self.dropped}
