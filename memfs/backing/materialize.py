"""Materialize: write what the evidence says disk owes, through the write-ahead pushes.

The plan (memfs.reconcile.materialize_plan.plan_materialize) is made on the loop in the turn that gathered
on one branch, with the pin guard in the same turn. The bytes to write are taken on the loop
too: a committed file by its immutable ref (streamed in the thread), a dirty one by its live
bytes. The push runs in a worker thread; before each effect it asks whether the branch and tree
it planned on are still selected (`still_selected`, which reads two loop-owned values, the
branch name and the epoch: a stale read only stops the push one effect later or sooner, never
writes another tree). A materialize that ran to its end pins the mount to its branch.

Owns nothing of its own; `held` (node ids an auto round left for their writer's close) is
memfs.backing.tasks.automaterialize's, passed in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import trio

from memfs.backing.applier import TreeApplier
from memfs.backing.binding import Bindings
from memfs.backing.events import Events
from memfs.backing.gate import Gate
from memfs.backing.intent import BranchIntent
from memfs.backing.passes import Passes
from memfs.backing.paths import split_path
from memfs.backing.results import Materialized, MaterializeDone, MaterializeOutcome, NotDecided
from memfs.backing.states import States
from memfs.backing.storeview import StoreView, ref_chunks
from memfs.reconcile.apply import MaterializeResult
from memfs.reconcile.contained import RootId
from memfs.reconcile.materialize_plan import MaterializePlan
from memfs.reconcile.plan import pending_from_journal, plan_pass
from memfs.reconcile.rule import Content
from memfs.store.journal import Journal
from memfs.testing import push_delay, push_gate
from memfs.workspace.attribution import labelled
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")

PIN_REMEDY = ("switch back to {pinned!r} and materialize there, or `memfs materialize --force` "
              "to write {branch!r} over it (the mount is then pinned to {branch!r})")


class Materializer:
    """A materialize gathers and closes with a pass, so it works with the pass's owners."""

    def __init__(self, passes: Passes) -> None:
        self.passes = passes
        self.ws: Workspace = passes.ws
        self.journal: Journal = passes.journal
        self.bindings: Bindings = passes.bindings
        self.states: States = passes.states
        self.view: StoreView = passes.view
        self.intent: BranchIntent = passes.intent
        self.events: Events = passes.events
        self.gate: Gate = passes.gate
        self.applier: TreeApplier = passes.applier
        self.push_delay: Callable[[], float] = push_delay  # the tests' shim

    async def materialize(self, paths: Iterable[str] | None, *, force: bool = False,
                          apply_deletions: bool = False) -> Materialized:
        """`memfs materialize [PATH ...]`: write what disk owes (plan.py's contract), then
        observe again for the states."""
        wanted: dict[str, list[str]] = {}
        for path in paths or []:
            mount, rel = split_path(path)
            wanted.setdefault(mount, []).append(rel)
        out: dict[str, MaterializeOutcome] = {}
        for mount in sorted(wanted) if wanted else sorted(self.bindings.bindings):
            self.bindings.require(mount)
            with self.gate.admitted():
                async with self.gate.lock(mount):
                    out[mount] = await self.locked(mount, wanted.get(mount), force,
                                                   apply_deletions)
        return Materialized(out)

    @labelled("materialize", lambda mount: f"materialize: {mount}")
    async def locked(self, mount: str, rels: list[str] | None, force: bool,
                     apply_deletions: bool, held: set[int] | None = None) -> MaterializeOutcome:
        """With the mount's lock held. `held`: an auto round's (close-to-open: a file still
        open for writing is left for its last writer's close, its node id added here)."""
        from memfs.reconcile.apply import run_materialize, settle
        from memfs.reconcile.materialize_plan import plan_materialize

        b = self.bindings.require(mount)
        st = self.states.of(mount)
        await self.ws.sync()  # what is written is what the store durably holds
        gathered = await self.passes.gather_on_one_branch(b, st, "")
        if isinstance(gathered, NotDecided):
            return gathered
        epoch, branch, got = gathered.epoch, gathered.branch, gathered.got
        obs = got.obs
        # The pin guard runs here, in the turn that selects the paths: no await from the
        # gathered branch to the plan.
        pinned = self.bindings.pins.get(mount)
        nodes, _ = self.view.nodes(mount)
        s_view = self.view.view(nodes)
        plan = plan_pass(obs, s_view, got.evidence, self.intent.for_pass(mount, ""),
                         pending_from_journal(got.pending, branch), branch=branch,
                         modes=got.modes, specials=nodes.specials)
        mplan = plan_materialize(plan, obs, paths=rels, force=force,
                                 apply_deletions=apply_deletions, pinned_branch=pinned,
                                 mount=mount, unwritable=self.view.unwritable(nodes, mount))
        sources = self._sources(mount, mplan, nodes, s_view, held)  # type: ignore[arg-type]
        dir_modes = self.view.dir_modes(mount, [w.path for w in mplan.writes])
        store = self.ws.store

        def content(path: str) -> tuple[bytes | Iterator[bytes], str]:
            src, digest = sources[path]
            data = src if isinstance(src, bytes) else ref_chunks(store, *src)
            return data, digest

        delay = self.push_delay()

        def store_dirs(candidates: Iterable[str]) -> set[str]:
            """Asked from the worker thread after the unlinks: the workspace's directories
            among `candidates` (kept on disk), read on the loop."""
            return trio.from_thread.run_sync(self.view.dirs_held, mount, list(candidates))

        def still_selected() -> bool:  # asked from the worker thread before each effect
            if delay > 0:
                time.sleep(delay)
            push_gate()
            return self.ws.branch == branch and self.view.epoch == epoch

        def run() -> MaterializeResult:
            settle(self.journal, mount, plan.decisions, plan.pending)
            result = run_materialize(self.journal, mount, b.dir,
                                     RootId(obs.root.dev, obs.root.ino), mplan, content,
                                     branch=branch, still_selected=still_selected,
                                     dir_modes=dir_modes, store_dirs=store_dirs)
            if not result.refused and not result.interrupted and pinned != branch:
                # Disk now holds this branch (nothing owed counts too: it already did). A push
                # cut short by a branch change leaves the pin as it was.
                self.journal.set_pin(mount, branch)
            return result

        result = await trio.to_thread.run_sync(run)
        if not result.refused and not result.interrupted:
            self.bindings.pins[mount] = branch
        self._events(mount, branch, result, auto=held is not None)
        await self.passes.locked(mount, "", False, False)  # conflicts converge, states refresh
        return MaterializeDone(
            mount, branch, self.bindings.pins.get(mount), result.written, result.removed,
            result.skipped, result.deletions_left, result.failed, result.refused,
            PIN_REMEDY.format(pinned=pinned, branch=branch)
            if result.refused and pinned is not None else None, result.interrupted,
            result.removed_dirs)

    def _sources(self, mount: str, mplan: MaterializePlan, nodes: Mapping[str, Node],
                 s_view: Mapping[str, Content], held: set[int] | None,
                 ) -> dict[str, tuple[bytes | tuple[str, int], str]]:
        """The bytes each write takes, now, on the loop: a committed file by its immutable
        ref (streamed in the thread), a dirty one by its live bytes. Writes the plan cannot
        carry out are moved to `skipped` first."""
        from memfs.reconcile.materialize_plan import Skipped

        for w in [w for w in mplan.writes if w.path not in nodes]:
            # Unreachable by the rule (a write is owed only for store content); if a future plan
            # broke that, one path is refused instead of the whole mount's materialize failing.
            log.error("materialize of %s/%s: a write is owed but the store has no file", mount,
                      w.path)
            mplan.writes.remove(w)
            mplan.skipped.append(Skipped(w.path, "refused", "the store holds no file to write",
                                         f"`memfs sync {mount}/{w.path}` takes disk's side"))
        if held is not None:
            for w in [w for w in mplan.writes if nodes[w.path].id in self.applier.held]:
                mplan.writes.remove(w)
                held.add(nodes[w.path].id)
                mplan.skipped.append(Skipped(w.path, "open-for-writing",
                                             "still open for writing through the mount",
                                             "it is written when the last writer closes it"))
        sources: dict[str, tuple[bytes | tuple[str, int], str]] = {}
        for w in mplan.writes:
            node, digest = nodes[w.path], s_view[w.path].digest
            assert digest is not None  # the store side always has its digest
            if node.dirty or node.ref is None:
                sources[w.path] = (self.ws.read(node, 0, node.size()), digest)
            else:
                sources[w.path] = ((node.ref, node.size()), digest)
        return sources

    def _events(self, mount: str, branch: str, result: MaterializeResult, *,
                auto: bool) -> None:
        if result.refused:
            self.events.record("write-refused", mount=mount, path=None, reason=result.refused)
        for s in result.skipped:
            self.events.record("write-refused", mount=mount, path=s["path"], state=s["state"],
                               reason=s["reason"])
        for f in result.failed:
            self.events.record("write-failed", mount=mount, path=f["path"], reason=f["message"])
        if result.written or result.removed:
            self.events.record("materialized", mount=mount, branch=branch, auto=auto,
                               written=result.written, removed=result.removed)


__all__ = ["Materializer", "PIN_REMEDY"]
