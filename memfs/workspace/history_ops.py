"""The workspace's history operations: undo (by operation, by commit, to a moment), restore,
branch switch and create, checkpoints, marks, and the bookkeeping of read-only views of past
commits.

Each holds the commit lock and commits what is pending (`_settled`). Undo, restore and switch
then move the branch head in a worker thread (the store's writer may be held by a GC or
another process: the loop never waits for it) while new changes are held off
(memfs.workspace.hold), and replace the tree back on the loop before they may go on, so no
change can slip in between and be lost. The names (checkpoints, marks, branches) are written
in a worker thread too, once what was pending is committed. Loop thread, except the store
steps (`_undo_step`, `_restore_head`, `_checkpoint_step`: worker threads,
handed their inputs, touching only the store).
"""

from __future__ import annotations

import contextlib
import errno
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from memfs.store import StoreBackend as Store
from memfs.store import history, undo
from memfs.store.history import Checkpoint, Mark
from memfs.store.undo import UndoPlan
from memfs.workspace.nodes import Node, WorkspaceError
from memfs.workspace.unload import loaded_below

if TYPE_CHECKING:
    from memfs.workspace.attribution import Attribution
    from memfs.workspace.cutoff import CutOff
    from memfs.workspace.hold import ChangeHold
    from memfs.workspace.hooks import BackingHooks
    from memfs.workspace.hosts import Hosts
    from memfs.workspace.pinning import PinPublisher

VIEWS_KEPT = 4096  # read-only view roots remembered (by place and commit)
SETTLE_ROUNDS = 3  # a history operation's commits with changes flowing, before they wait


@dataclass(frozen=True)
class CheckpointSet:
    checkpoint: Checkpoint
    moved_from: str | None  # the commit the name left (a --force move), else None


class HistoryOps:
    """Mixed into Workspace, whose attributes it uses (declared here)."""

    store: Store
    head: str
    branch: str
    attribution: Attribution
    nodes: dict[int, Node]
    _commit_lock: trio.Lock
    _views: OrderedDict[tuple[str, str], Node]  # (place, commit) -> view root, oldest first
    _view_keys: dict[int, tuple[str, str]]  # view root id -> its key while cached
    _view_roots: dict[int, Node]  # every view root the kernel may still hold (GC pins them)
    _immutable: set[int]  # ids of view roots of past commits by id (never another tree)
    swept: set[int]  # ids of nodes of views dropped as swept (drop_swept_view): reads EIO
    pin_gate: PinPublisher | None  # told of each new view root (a store in PostgreSQL)

    root: Node
    hold: ChangeHold
    read_only: str | None  # why the tree takes no changes (another host's branch), or None
    hosts: Hosts | None  # this host's part in a shared store, while a daemon serves it
    backing: BackingHooks

    async def _commit_locked(self, message: str = "") -> str | None: ...
    def _replace_tree(self, commit_id: str, by: str) -> list[CutOff]:
        raise NotImplementedError  # Workspace's (memfs.workspace.replace, then the cut-offs)

    def _replace(self, commit_id: str, by: str, cut_off: list[CutOff] | None) -> None:
        """The tree replaced (memfs.workspace.replace); the writers it cut off go to
        `cut_off`, for the command to name (memfs.workspace.cutoff)."""
        cut = self._replace_tree(commit_id, by)
        if cut_off is not None:
            cut_off.extend(cut)

    # -- settling, restore, branches ---------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _settled(self, message: str, by: str) -> AsyncIterator[None]:
        """With the commit lock held: commit until nothing is dirty, and hold new changes off
        from the last round until the block ends (`by`: the operation, for status).

        Changes made while a commit runs in its thread would otherwise be replaced away
        with the tree. A steady writer can keep the tree dirty round after round, so after
        SETTLE_ROUNDS rounds with changes flowing, new ones wait and one more round commits
        what arrived during the last (a small amount); nothing can arrive after it.
        """
        for _ in range(SETTLE_ROUNDS):
            await self._commit_locked(message)
            if not self.root.dirty:
                break
        with self.hold.holding(by):
            await self._commit_locked(message)  # returns at once when nothing is dirty
            yield

    async def restore(self, rev: str, *, cut_off: list[CutOff] | None = None,
                      ) -> tuple[str, str]:
        """Move the branch head to `rev` (the old head stays in the reflog): (new head, old
        head), so the command can say how to come back. `cut_off` (here and in the other
        moves): where the writers the replacement cut off are added."""
        # `rev` as it reads now; then disk's changes so far, against this tree (the restore
        # rewinds past whatever that pass commits).
        async with self._commit_lock, self._settled("before restore", "restore"):
            resolved = (self.branch, history.resolve(self.store, rev))
        await self.backing.before_rewind()
        async with self._commit_lock, self._settled("before restore", "restore"):
            branch = self.branch
            known = resolved[1] if resolved[0] == branch else None
            await self._pins_before_move("memfs restore")
            target, old = await trio.to_thread.run_sync(self._restore_head, branch, rev, known)
            self._replace(target, "memfs restore", cut_off)
            return target, old

    def _restore_head(self, branch: str, rev: str, target: str | None) -> tuple[str, str]:
        """restore's store step (worker thread): `rev` resolved unless known, the head moved."""
        if target is None:
            target = history.resolve(self.store, rev)
        old = self.store.head(branch)
        self.store.reset_head(branch, target, f"restore {rev}")
        return target, old

    async def switch_branch(self, name: str, *, cut_off: list[CutOff] | None = None) -> str:
        self.store.head(name)  # an unknown branch is refused before anything moves
        # Its writer lease: a round trip on PostgreSQL (a worker thread), an answer from
        # memory on the embedded store (no thread hop before the settle, as before leases).
        claim = (self.store.claim(name) if self.store.kind == "sqlite"
                 else await trio.to_thread.run_sync(self.store.claim, name))
        try:
            async with self._commit_lock, self._settled("before switch", "branch switch"):
                old = self.branch
                head = await trio.to_thread.run_sync(self.store.head, name)
                if not claim.writable and self.hosts is not None:  # another host's head:
                    # in every host's GC before it is shown (NotPublished: nothing moved)
                    head = await self.hosts.published_to_show(name, head)
                await trio.to_thread.run_sync(self.store.set_current_branch, name)
                self.branch = name
                self.read_only = None if claim.writable else claim.reason()
                self._replace(head, "memfs branch switch", cut_off)
        except BaseException:
            if claim.writable and name != self.branch:  # refused: the lease claimed goes
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.store.release, name)
            raise
        if old != name:
            await trio.to_thread.run_sync(self.store.release, old)
        if self.read_only is not None and self.hosts is not None:
            # A notice of the writer's commit heard while this host still showed `old` was
            # passed over (it was of another branch then): the head is looked at once more.
            self.hosts.refollow()
        return head

    async def create_branch(self, name: str, at: str | None) -> str:
        async with self._commit_lock:
            async with self._settled("before branch", "branch create"):
                pass  # what is pending is committed: the branch starts at what the tree shows
            return await trio.to_thread.run_sync(self.store.create_branch, name, at)

    # -- undo ------------------------------------------------------------------------------
    # `disk_too`: the undo may take back edits a reconciler pass took in from a bound
    # directory (refused otherwise: memfs.store.undo._refuse_disk_edits).
    async def undo(self, steps: int = 1, *, disk_too: bool = False) -> str:
        """The last `steps` commits; returns the new head."""
        return (await self.undo_commits(steps, disk_too=disk_too)).target

    async def undo_commits(self, count: int, *, disk_too: bool = False,
                           cut_off: list[CutOff] | None = None) -> UndoPlan:
        """The last `count` commits (`memfs undo --commits N`)."""
        if count < 1:
            raise WorkspaceError(errno.EINVAL, "undo takes a positive number of commits")
        return await self._undo(lambda head: undo.plan_commits(self.store, head, count,
                                                               disk_too=disk_too), cut_off)

    async def undo_operations(self, count: int = 1, *, disk_too: bool = False,
                              cut_off: list[CutOff] | None = None) -> UndoPlan:
        """The last `count` operations (`memfs undo [N]`; memfs.store.opspan's rule)."""
        return await self._undo(lambda head: undo.plan_operations(self.store, head, count,
                                                                  disk_too=disk_too), cut_off)

    async def undo_to(self, where: str, *, disk_too: bool = False,
                      cut_off: list[CutOff] | None = None) -> UndoPlan:
        """Back to a revision or a moment on this branch's history (`memfs undo --to`)."""
        return await self._undo(lambda head: undo.plan_to(self.store, head, where,
                                                          disk_too=disk_too), cut_off)

    async def _undo(self, plan_fn: Callable[[str], UndoPlan],
                    cut_off: list[CutOff] | None) -> UndoPlan:
        async with self._commit_lock, self._settled("before undo", "undo"):
            await self._pins_before_move("memfs undo")
            plan = await trio.to_thread.run_sync(self._undo_step, plan_fn, self.head,
                                                 self.branch)
            # in the loop turn the thread's result came in
            self._replace(plan.target, "memfs undo", cut_off)
            return plan

    def _undo_step(self, plan_fn: Callable[[str], UndoPlan], head: str, branch: str,
                   ) -> UndoPlan:
        """Plan from `head` and move the branch there (worker thread; a refusal or a failed
        transaction moves nothing)."""
        plan = plan_fn(head)
        self.store.reset_head(branch, plan.target, plan.reason)
        return plan

    async def _pins_before_move(self, what: str) -> None:
        """Other hosts' GC: the files held open here that the head's move takes out of the
        tree are published before it (memfs.workspace.pinning; NotPublished refuses the
        move, before anything moved)."""
        if self.pin_gate is not None:
            await self.pin_gate.before_head_moves(what, in_tree=True)

    # -- names -------------------------------------------------------------------------------
    async def checkpoint(self, name: str, at: str | None = None, *,
                         force: bool = False) -> CheckpointSet:
        """Name the current state (what is pending is committed first), or `at` a revision."""
        async with self._commit_lock:
            async with self._settled(f"checkpoint {name}", "checkpoint"):
                head, branch = self.head, self.branch
            cp, old = await trio.to_thread.run_sync(self._checkpoint_step, name, at, head,
                                                    branch, force)
            return CheckpointSet(cp, old)

    def _checkpoint_step(self, name: str, at: str | None, head: str, branch: str,
                         force: bool) -> tuple[Checkpoint, str | None]:
        cid = history.resolve(self.store, at) if at else head
        return history.create_checkpoint(self.store, name, cid, branch, force=force)

    async def delete_checkpoint(self, name: str) -> Checkpoint:
        async with self._commit_lock:
            return await trio.to_thread.run_sync(history.delete_checkpoint, self.store, name)

    async def mark(self, name: str, label: str = "") -> Mark:
        """An operation boundary: what is pending is committed, and every change after this
        belongs to a new operation. The mark names the commit it fell on."""
        async with self._commit_lock:
            async with self._settled(f"mark {name}", "mark"):
                head, branch = self.head, self.branch
                self.attribution.mark()  # before any held change goes on
            return await trio.to_thread.run_sync(history.add_mark, self.store, name, head,
                                                 branch, label or name)

    # -- views -------------------------------------------------------------------------------
    def _remember_view(self, key: tuple[str, str], node: Node, immutable: bool) -> None:
        """Keep a new view root for reuse (the newest VIEWS_KEPT); `immutable`: a past
        commit reached by its id, never another tree, so the kernel may cache it."""
        self._views[key] = node
        self._view_keys[node.id] = key
        self._view_roots[node.id] = node
        if self.pin_gate is not None:  # other hosts' GC: published before it is shown
            self.pin_gate.made(node.id, key[1])
        if immutable:
            self._immutable.add(node.id)
        if len(self._views) > VIEWS_KEPT:  # no longer reused; the kernel may still hold it
            _, old = self._views.popitem(last=False)
            self._view_keys.pop(old.id, None)

    def forget_view(self, node: Node) -> None:
        """The kernel dropped a view root: it goes (a later lookup makes a new one)."""
        key = self._view_keys.pop(node.id, None)
        if key is not None:
            self._views.pop(key, None)
        self._immutable.discard(node.id)
        self._view_roots.pop(node.id, None)
        self.nodes.pop(node.id, None)

    def drop_swept_view(self, node: Node) -> None:
        """A view whose commit a GC on another host dropped and may have swept while this
        host's pins had lapsed (memfs.workspace.pinning): it and all loaded below it go at
        once, held or not, so no request shows part of it. The kernel's next request on one
        of its inodes is ESTALE (it looks the path up again: absent); a file still open in
        it reads EIO (`swept`)."""
        for below in loaded_below(node):
            self.nodes.pop(below.id, None)
            self.swept.add(below.id)
        self.swept.add(node.id)
        self.forget_view(node)

    def immutable_view(self, node: Node) -> bool:
        """Is this node inside a past commit's view (not a branch's or a checkpoint's, which
        move)? Such a tree never changes, so the kernel may cache its names and attributes."""
        while node.parent is not None:
            node = node.parent
        return node.id in self._immutable
