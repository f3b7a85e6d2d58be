"""The workspace's history operations: undo (by operation, by commit, to a moment),
checkpoints, marks, and the bookkeeping of read-only views of past commits.

Each holds the commit lock, commits what is pending (`_settle_locked`), then plans, moves
the branch head and replaces the tree with no await in between, so no change can slip in
and be lost. Plans and head moves are short SQLite statements, run on the loop for that
reason. Loop thread only.
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from memfs.store import StoreBackend as Store
from memfs.store import history, undo
from memfs.store.history import Checkpoint, Mark
from memfs.store.undo import UndoPlan
from memfs.workspace.nodes import Node, WorkspaceError

if TYPE_CHECKING:
    from memfs.workspace.attribution import Attribution

VIEWS_KEPT = 4096  # read-only view roots remembered (by place and commit)


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

    async def _settle_locked(self, message: str) -> None: ...
    def _replace_tree(self, commit_id: str) -> None: ...

    # -- undo ------------------------------------------------------------------------------
    async def undo(self, steps: int = 1) -> str:
        """The last `steps` commits; returns the new head."""
        return (await self.undo_commits(steps)).target

    async def undo_commits(self, count: int) -> UndoPlan:
        """The last `count` commits (`memfs undo --commits N`)."""
        if count < 1:
            raise WorkspaceError(errno.EINVAL, "undo takes a positive number of commits")
        return await self._undo(lambda: undo.plan_commits(self.store, self.head, count))

    async def undo_operations(self, count: int = 1) -> UndoPlan:
        """The last `count` operations (`memfs undo [N]`; memfs.store.opspan's rule)."""
        return await self._undo(lambda: undo.plan_operations(self.store, self.head, count))

    async def undo_to(self, where: str) -> UndoPlan:
        """Back to a revision or a moment on this branch's history (`memfs undo --to`)."""
        return await self._undo(lambda: undo.plan_to(self.store, self.head, where))

    async def _undo(self, plan_fn) -> UndoPlan:
        async with self._commit_lock:
            await self._settle_locked("before undo")
            plan = plan_fn()
            self.store.reset_head(self.branch, plan.target, plan.reason)
            self._replace_tree(plan.target)
            return plan

    # -- names -------------------------------------------------------------------------------
    async def checkpoint(self, name: str, at: str | None = None, *,
                         force: bool = False) -> CheckpointSet:
        """Name the current state (what is pending is committed first), or `at` a revision."""
        async with self._commit_lock:
            await self._settle_locked(f"checkpoint {name}")
            cid = history.resolve(self.store, at) if at else self.head
            cp, old = history.create_checkpoint(self.store, name, cid, self.branch, force=force)
            return CheckpointSet(cp, old)

    async def delete_checkpoint(self, name: str) -> Checkpoint:
        async with self._commit_lock:
            return history.delete_checkpoint(self.store, name)

    async def mark(self, name: str, label: str = "") -> Mark:
        """An operation boundary: what is pending is committed, and every change after this
        belongs to a new operation. The mark names the commit it fell on."""
        async with self._commit_lock:
            await self._settle_locked(f"mark {name}")
            self.attribution.mark()
            return history.add_mark(self.store, name, self.head, self.branch, label or name)

    # -- views -------------------------------------------------------------------------------
    def _remember_view(self, key: tuple[str, str], node: Node, immutable: bool) -> None:
        """Keep a new view root for reuse (the newest VIEWS_KEPT); `immutable`: a past
        commit reached by its id, never another tree, so the kernel may cache it."""
        self._views[key] = node
        self._view_keys[node.id] = key
        self._view_roots[node.id] = node
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

    def immutable_view(self, node: Node) -> bool:
        """Is this node inside a past commit's view (not a branch's or a checkpoint's, which
        move)? Such a tree never changes, so the kernel may cache its names and attributes."""
        while node.parent is not None:
            node = node.parent
        return node.id in self._immutable
