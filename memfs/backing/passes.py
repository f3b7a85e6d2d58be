"""A pass: gather -> plan -> apply -> record, for one scope of one mount.

1. Gather (worker thread, memfs.backing.gather): the journal's root, evidence, pending intents
   and the scope's fingerprints (one snapshot), the observation, and the digests of committed
   files not yet cached. If the branch or the tree was replaced meanwhile (an epoch bump), or a
   change settled an adoption (the intents and P read are stale), it gathers again; after
   GATHER_TRIES it says the pass is incomplete.
2. Plan (loop, no await from here to the plan): S from the live tree (memfs.backing.storeview),
   the branch intent with the rewind marks, plan_pass and plan_sync (memfs.backing.planning).
3. Prepare (thread): settle the pending intents the plan resolved; keep new conflicts' disk
   sides. Then, batch by batch: read the disk bytes each take needs, checked against the digest
   the decision was made on, and write the adoption intents ahead (thread); then apply the batch
   to the tree (loop, no await: memfs.backing.applier).
4. Record: `ws.sync()` makes the tree durable, and only then are the adoption intents
   completed and P recorded (thread), so P never vouches for a tree a crash lost. A pass that
   changed nothing, began no adoption and records no new evidence skips that wait.

Owns, on the trio loop: the mounts swept of scratch files in this process, each mount's
WalkMemo (read and written only by that mount's walk, one at a time under the mount's lock)
and the converted evidence per (mount, scope) (`EvidenceMemo`, replaced by each gather), and
the mounts whose next pass ends with a heap trim (`trim_next`, see TRIM_AFTER). A running
pass's progress is its MountState's `running` (memfs.backing.progress).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from memfs import heap
from memfs.backing.applier import TreeApplier, batches
from memfs.backing.binding import Binding, Bindings
from memfs.backing.conflicts import ConflictCopies
from memfs.backing.events import EVENT_PATHS, Events
from memfs.backing.gate import Gate
from memfs.backing.gather import EvidenceMemo, Gathered, gather
from memfs.backing.intent import BranchIntent
from memfs.backing.onaccess import OnAccess
from memfs.backing.paths import under
from memfs.backing.planning import PLANS_KEPT, PlanInputs, Planner
from memfs.backing.progress import PLANNING, RECORDING, TAKING, PassProgress
from memfs.backing.results import (
    Discard,
    NotDecided,
    PassDone,
    PassError,
    PassOutcome,
    RegionRow,
)
from memfs.backing.settle import Settler
from memfs.backing.states import MountState, States, record_states
from memfs.backing.storeview import StoreView
from memfs.errors import MemfsError
from memfs.reconcile.contained import RootId, RootUnavailable, read_contained
from memfs.reconcile.observe import Observation, WalkMemo
from memfs.reconcile.plan import PassPlan, SyncPlan, pending_from_journal
from memfs.reconcile.rule import ABSENT, Content, State
from memfs.store.journal import Journal, NewIntent
from memfs.testing import crash_point, pass_fault, plan_spin, walk_delay
from memfs.workspace import unload
from memfs.workspace.attribution import labelled
from memfs.workspace.health import store_full

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")

GATHER_TRIES = 3
# A pass that took in or hashed this many files built whole-tree structures: once it is done
# the C heap's free pages go back to the system (memfs.heap), and once more after the mount's
# next pass, which builds the walk memos a take-in of just-written files cannot keep (racy).
# Measured at attach's take-in of 20k files: ~0.3 KB a file of RSS. A quiet pass never trims.
TRIM_AFTER = 1000
ROOT_POLL = 2.0  # how often an unavailable root is looked at again (memfs.backing.tasks)
ACCEPT_ROOT_REMEDY = ("bring the original directory back (an unplugged drive?), or take this "
                      "one on purpose with `memfs sync --accept-root`")


def root_remedy(exc: RootUnavailable) -> str:
    """What to do about an unavailable root, for the case it is: a root that is another
    directory can be taken on purpose; a missing one can only come back."""
    if exc.reason == "replaced":
        return ACCEPT_ROOT_REMEDY
    return ("bring the directory (or the drive holding it) back; a running memfs notices "
            f"within {ROOT_POLL:g} s")


def _walk_counter(st: MountState, delay: float) -> Callable[[int], None] | None:
    """What the walk thread calls after each directory: the pass's progress (and the tests'
    walk delay, memfs.testing)."""
    progress = st.running
    if progress is None or not delay:
        return None if progress is None else progress.walked

    def walked(entries: int) -> None:
        progress.walked(entries)
        time.sleep(delay)

    return walked


@dataclass(frozen=True)
class OnOneBranch:
    """A gather that stayed on one branch and one tree throughout."""

    epoch: int
    branch: str
    got: Gathered


class Passes:
    def __init__(self, ws: Workspace, journal: Journal, bindings: Bindings, states: States,
                 view: StoreView, intent: BranchIntent, settler: Settler,
                 conflicts: ConflictCopies, events: Events, gate: Gate, applier: TreeApplier,
                 planner: Planner, onaccess: OnAccess) -> None:
        self.ws = ws
        self.journal = journal
        self.bindings = bindings
        self.states = states
        self.view = view
        self.intent = intent
        self.settler = settler
        self.conflicts = conflicts
        self.events = events
        self.gate = gate
        self.applier = applier
        self.planner = planner
        self.onaccess = onaccess
        self.swept: set[str] = set()
        self.walk_memos: dict[str, WalkMemo] = {}
        self.evidence_memos: dict[tuple[str, str], EvidenceMemo] = {}
        self.trim_next: set[str] = set()  # mounts whose next pass ends with a heap trim

    def forget(self, mount: str) -> None:
        self.walk_memos.pop(mount, None)
        self.trim_next.discard(mount)
        self.swept.discard(mount)
        for key in [k for k in self.evidence_memos if k[0] == mount]:
            del self.evidence_memos[key]

    # -- entry points ----------------------------------------------------------------------
    async def run_pass(self, mount: str, scope: str = "", *, path_sync: bool = False,
                       accept_root: bool = False, asked_on: str | None = None) -> PassOutcome:
        """Observe `scope` of a mount and apply what the rule takes (a path sync: what disk
        holds there). `asked_on`: the branch a path sync was asked on; if another one is
        selected when the pass gathers, it takes nothing and says so."""
        self.bindings.require(mount)
        with self.gate.admitted():
            async with self.gate.lock(mount):
                try:
                    try:
                        return await self.locked(mount, scope, path_sync, accept_root,
                                                 asked_on)
                    except OSError as exc:  # a conflict's disk side with no room to keep it
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise self._failed(mount, exc) from exc
                        raise self._full(f"a pass over {mount!r} could not keep what it "
                                         f"needs ({exc.strerror or exc})") from None
                except MemfsError as exc:  # e.g. the journal refusing after a failed append
                    self.states.of(mount).last_error = str(exc)
                    raise

    async def _room_for(self, contents: Mapping[str, bytes]) -> None:
        """Before a batch is taken in: if its bytes do not fit while a group commit is
        writing (that commit's chunks are on the disk and still pending, counted twice),
        wait for the commit to end, as a write through the mount does (room.settle), so
        the take-in is not refused for room it has. The batch's own check (put_file's
        require_room) still decides, on the figures after the wait."""
        need = sum(len(data) for data in contents.values())
        since = trio.current_time()
        while await self.ws.room.settle(need, since):
            pass

    def _full(self, what: str) -> MemfsError:
        """The store's filesystem is full: what could not be done, with the remedy."""
        try:
            space = self.ws.space()
        except OSError:
            space = None
        return store_full(what, space, str(self.ws.store.root), self.ws.store.kind != "sqlite",
                          self.ws.pending_bytes)

    def _failed(self, mount: str, exc: OSError) -> MemfsError:
        """An I/O error no observation step classified (a failing disk's EIO, say): the
        pass's failure, named, with where to look."""
        where = f" at {exc.filename}" if exc.filename else ""
        return MemfsError(f"a pass over {mount!r} failed: {exc.strerror or exc}{where}",
                          f"check the disk that holds {self.bindings.require(mount).dir} "
                          "(dmesg), then `memfs sync`")

    async def pass_all(self) -> dict[str, PassOutcome | PassError]:
        """Every bound mount once (the daemon's start, after an undo or a switch). A mount
        whose pass fails is that mount's outcome, told by status and the log: an exception
        out of here ended the daemon, so one unreadable backing directory unmounted all."""
        out: dict[str, PassOutcome | PassError] = {}
        for mount in list(self.bindings.bindings):
            try:
                out[mount] = await self.run_pass(mount)
            except MemfsError as exc:
                out[mount] = PassError(mount, exc.message, exc.remedy)
            except Exception as exc:  # noqa: BLE001 - the daemon goes on; status says why
                log.exception("the pass over %r failed", mount)
                why = f"the pass over {mount!r} failed: {type(exc).__name__}: {exc}"
                self.states.of(mount).last_error = why
                out[mount] = PassError(mount, why, "the daemon's log has the traceback; "
                                       "`memfs sync` tries again")
        return out

    @labelled("reconciler", lambda mount: f"reconciler: disk changes in {mount}")
    async def locked(self, mount: str, scope: str, path_sync: bool, accept_root: bool,
                     asked_on: str | None = None) -> PassOutcome:
        """A pass with the mount's lock held (materialize's closing pass calls it so)."""
        b = self.bindings.require(mount)
        st = self.states.of(mount)
        st.observed[scope] = time.monotonic()
        st.running = PassProgress(mount, scope)
        try:
            return await self._locked(b, st, scope, path_sync, accept_root, asked_on)
        finally:
            st.running = None

    async def _locked(self, b: Binding, st: MountState, scope: str, path_sync: bool,
                      accept_root: bool, asked_on: str | None) -> PassOutcome:
        mount = b.mount
        pass_fault()
        if mount not in self.swept:
            await self._sweep(b)
        if accept_root:
            await self._accept_root(b)
        gathered = await self.gather_on_one_branch(b, st, scope)
        if isinstance(gathered, NotDecided):
            return gathered
        got = gathered.got
        # On the loop from here to the plan: one branch, one tree.
        self._phase(st, PLANNING)
        plan_spin()
        nodes, _ = self.view.nodes(mount, scope)
        s_view = self.view.view(nodes)
        table = self.intent.for_pass(mount, scope)
        if path_sync and table.damaged:
            # A path sync names the paths whose intent it replaces: with disk taken there,
            # nothing is left for the damaged intent to protect.
            for p in set(s_view) | set(got.obs.files) | {
                    p for p in got.evidence if under(p, scope)}:
                table = table.with_entry(p, None)
            self.intent.replace_table(mount, table)
        pending = pending_from_journal(got.pending, gathered.branch)
        plan, sp = self.planner.plan(mount, PlanInputs(
            scope, path_sync, gathered.branch,
            asked_on if asked_on is not None else gathered.branch, got.obs, s_view,
            got.evidence, table, pending, got.modes, nodes.specials,
            self.intent.paths_under(mount, scope, table)))
        if sp.refused:
            return NotDecided(mount, refused=sp.refused)
        done = await self._apply(b, st, scope, gathered, nodes, s_view, plan, sp)
        if done.taken or done.removed:
            # Kept, this plan would hold its decisions and the walk's records (the take-in's
            # hashes) through the next pass's walk and store view: the attach's peak
            # (docs/performance.md). The view it was made on is gone, so it is never reused.
            self.planner.forget_scope(mount, scope)
            st.applied = None  # its identity with a plan that is not handed out again
        big = len(sp.take) + len(got.obs.hashed) >= TRIM_AFTER
        if big or mount in self.trim_next:
            # This pass's own structures are freed first (what the memos keep stays).
            del nodes, s_view, plan, sp, gathered, got
            self._unload_taken(mount)
            await trio.to_thread.run_sync(heap.trim)
        if big:
            self.trim_next.add(mount)
        else:
            self.trim_next.discard(mount)
        return done

    @staticmethod
    def _phase(st: MountState, phase: str) -> None:
        if st.running is not None:
            st.running.phase = phase

    def _unload_taken(self, mount: str) -> None:
        """After a large pass, and the mount's next one: the mount's clean nodes the kernel
        does not hold go (memfs.workspace.unload), and the walk memo that held them. Their
        committed rows are the truth: a pass reads them as Unbuilt files, a lookup loads a
        directory's nodes again (with the same numbers). What is not committed yet (a take
        of one batch waits for the group commit) stays loaded until the next pass."""
        top = self.view.mount_node(mount)
        if top is not None and unload.unload_clean(self.ws, top, self.ws.kernel_refs()):
            self.view.drop_memo()

    # -- 1. gather -------------------------------------------------------------------------
    async def gather_on_one_branch(self, b: Binding, st: MountState,
                                   scope: str) -> OnOneBranch | NotDecided:
        """The pass's inputs gathered while one branch and one tree stayed selected, or why
        there is nothing to decide on."""
        for _ in range(GATHER_TRIES):
            # A change settling a pending adoption while the thread reads (settle.Settler on
            # the loop) leaves the intents and P read stale: the user's edit would read as an
            # interrupted conflict. So that counts as a change of view too.
            epoch, branch, settles = self.view.epoch, self.ws.branch, self.settler.settles
            nodes, refs = self.view.nodes(b.mount, scope)
            memo = self.walk_memos.setdefault(b.mount, WalkMemo())
            if st.running is not None:
                st.running.listed = 0  # a gather again walks again
            try:
                got = await trio.to_thread.run_sync(
                    gather, self.journal, self.ws.store, b, scope, nodes, refs, memo,
                    self.evidence_memos.get((b.mount, scope)), _walk_counter(st, walk_delay()))
            except RootUnavailable as exc:
                remedy = root_remedy(exc)
                if st.unavailable is None:  # once per outage, not once per pass
                    self.events.record("root-unavailable", mount=b.mount, error=exc.message,
                                       remedy=remedy)
                st.unavailable = (exc.message, remedy)
                st.last_pass = time.time()
                return NotDecided(b.mount, unavailable=exc.message, remedy=remedy)
            # A history operation replacing the tree finishes first (memfs.workspace.hold):
            # its epoch bump is then seen below, and nothing from here to the plan waits.
            await self.ws.changes_open()
            self._learn(b.mount, scope, got)
            if epoch == self.view.epoch and branch == self.ws.branch and \
                    settles == self.settler.settles:
                st.unavailable = None
                st.incomplete = None
                return OnOneBranch(epoch, branch, got)
        st.incomplete = "the branch kept changing while the pass gathered"
        return NotDecided(b.mount, incomplete=st.incomplete)

    def _learn(self, mount: str, scope: str, got: Gathered) -> None:
        """What the thread computed, kept on the loop."""
        self.view.learn(got.digests)
        self.onaccess.learn(mount, scope, got)
        memos = self.evidence_memos
        if (mount, scope) not in memos and len(memos) >= PLANS_KEPT:
            for key in [k for k in memos if k[1]]:  # whole mounts' stay
                del memos[key]
        memos[(mount, scope)] = got.evidence_memo

    async def _sweep(self, b: Binding) -> None:
        """Remove the scratch files a write killed mid-way left in the backing directory: at
        the first pass of the mount in this process (the daemon's start, an attach, a
        daemon-less command), under the mount's lock, so no effect of ours is running there.
        A root that is unavailable is swept at the first pass that finds it back."""
        from memfs.reconcile.effects import sweep_scratch
        from memfs.reconcile.observe import VCS_DIRS

        recorded = await trio.to_thread.run_sync(self.journal.root, b.mount)
        try:
            removed = await trio.to_thread.run_sync(
                lambda: sweep_scratch(b.dir, root=RootId(*recorded) if recorded else None,
                                      skip=VCS_DIRS))
        except (RootUnavailable, OSError):
            return
        self.swept.add(b.mount)
        if removed:
            log.info("mount %s: removed %d scratch file(s) a killed write left: %s", b.mount,
                     len(removed), removed)
            self.events.record("scratch-removed", mount=b.mount, paths=removed)

    async def _accept_root(self, b: Binding) -> None:
        try:
            rst = await trio.to_thread.run_sync(os.stat, b.dir)
        except OSError as exc:
            raise MemfsError(f"backing root {b.dir!r} is missing ({exc.strerror})",
                             "bring the directory back; only an existing one can be "
                             "accepted") from None
        recorded = await trio.to_thread.run_sync(self.journal.root, b.mount)
        if recorded is not None and tuple(recorded) != (rst.st_dev, rst.st_ino):
            # Only a replaced root: accepting an unchanged one would throw away evidence
            # and turn every draft into an unknown-provenance conflict.
            aside = await trio.to_thread.run_sync(self.journal.accept_root, b.mount,
                                                  rst.st_dev, rst.st_ino)
            self.root_accepted(b.mount)
            log.info("mount %s: root accepted, %d evidence records set aside", b.mount, aside)

    def root_accepted(self, mount: str) -> None:
        """Journal.accept_root cleared the pin and abandoned the pending intents: forget ours."""
        self.bindings.pins.pop(mount, None)
        self.settler.forget_mount(mount)

    # -- 3. apply ---------------------------------------------------------------------------
    async def _apply(self, b: Binding, st: MountState, scope: str, on: OnOneBranch,
                     nodes: Mapping[str, object], s_view: Mapping[str, Content],
                     plan: PassPlan, sp: SyncPlan) -> PassDone:
        mount, obs, got = b.mount, on.got.obs, on.got
        versions = {p: nodes[p].ver for p in (*sp.take, *sp.take_modes)  # type: ignore[attr-defined]
                    if p in nodes}
        await trio.to_thread.run_sync(self._prepare, b, obs, sp, plan)
        edit = self.applier.edit(mount)
        applied: list[str] = []
        skipped: list[str] = []
        no_room: list[str] = []  # takes refused for lack of space in the store: skipped
        intent_ids: dict[str, int] = {}
        changed = False
        progress = st.running
        if progress is not None:
            progress.phase, progress.to_take = TAKING, len(sp.take)
        if sp.take:
            await self.ws.boundary()  # a take-in is an operation of its own (attribution.py)
        cut = batches(sp.take, obs)
        for batch in cut:
            contents, ids = await trio.to_thread.run_sync(
                self._fetch, b, obs, batch, sp.take, got.evidence, s_view, on.branch,
                sp.record_modes)
            intent_ids.update(ids)
            await self._room_for(contents)
            await self.ws.changes_open()  # no change while a history operation holds them off
            # No await from this check to the end of the batch's tree change.
            changed = self.view.epoch != on.epoch or self.ws.branch != on.branch
            if changed:
                break
            done, left, full = self.applier.apply_batch(edit, batch, sp.take, contents, obs,
                                                        nodes, versions,  # type: ignore[arg-type]
                                                        sp.replace)
            applied += done
            skipped += left
            no_room += full
            if progress is not None:
                progress.taken += len(batch)
            if len(cut) > 1:
                await self.ws.sync()  # a large take never holds more than a batch in memory
                self._unload_taken(mount)  # nor more than a batch of nodes
        if not changed:  # the threads and syncs above awaited: the same check, once more
            await self.ws.changes_open()
            changed = self.view.epoch != on.epoch or self.ws.branch != on.branch
        if changed:
            skipped += [p for p in sp.take if p not in applied and p not in skipped]
        else:
            skipped += self.applier.apply_modes(edit, sp, nodes, versions)  # type: ignore[arg-type]
            self.intent.apply(mount, sp, set(skipped))
            # Disk-only: the plan's, and (a path sync) binary files it took over a type change.
            want = plan.disk_only | {p for p, t in sp.take.items() if t is ABSENT and
                                     (f := obs.files.get(p)) is not None and f.kind != "text"}
            edit.apply_overlay(scope, obs, want, set(skipped))
            record_states(st, scope, obs, plan, sp, set(skipped))
            for path, c in sorted(sp.record_conflicts.items()):
                if path not in skipped:
                    self.events.record("conflict-recorded", mount=mount, path=path,
                                       kind=str(getattr(c, "kind", c)))
        self.ws.invalidate(edit.entries, edit.inodes)
        self._phase(st, RECORDING)
        await self._record(mount, obs, sp, intent_ids, set(skipped),
                           wait=bool(intent_ids or edit.entries or edit.inodes))
        if not changed:  # decided now: the rule recorded what it had to
            self.intent.decided(mount, (p for p, d in plan.decisions.items()
                                        if d.state != State.UNVERIFIED))
        taken = sorted(p for p in applied if isinstance(sp.take.get(p), Content))
        removed = sorted(p for p in applied if sp.take.get(p) is ABSENT and p in nodes)
        if taken or removed:  # a disk change taken into the tree is never silent
            self.events.record("adopted", mount=mount, branch=on.branch,
                               taken=taken[:EVENT_PATHS], removed=removed[:EVENT_PATHS],
                               counts={"taken": len(taken), "removed": len(removed)})
        st.last_pass = time.time()
        st.last_error = None
        refusal = None
        if no_room:
            refusal = self._full(f"{len(no_room)} file(s) changed on disk could not be taken in "
                                 f"({', '.join(no_room[:EVENT_PATHS])}); the workspace keeps "
                                 "what it had there")
            st.last_error = str(refusal)
        return PassDone(
            mount, scope, on.branch, taken=taken, removed=removed, skipped=sorted(skipped),
            conflicts=sorted(sp.record_conflicts),
            discarded=[Discard(d.path, d.was, d.op, d.over) for d in sp.discarded],
            unverified=sorted(sp.unverified),
            regions=[RegionRow(r.path, r.reason, r.kind) for r in obs.regions],
            incomplete="the tree was replaced while the pass applied" if changed else None,
            bytes_read=obs.bytes_read, error=refusal.message if refusal else None,
            remedy=refusal.remedy if refusal else None)

    # -- 4. record ---------------------------------------------------------------------------
    async def _record(self, mount: str, obs: Observation, sp: SyncPlan,
                      intent_ids: dict[str, int], skipped: set[str], *, wait: bool) -> None:
        # Evidence only once the tree it agrees with is durable. A pass that changed nothing
        # and vouches for nothing new (the steady state of on-access) does not wait for
        # other pending writes to commit: nothing it records depends on them.
        if wait or any(p not in skipped for p in sp.record):
            await self.ws.sync()
        if intent_ids:
            crash_point("backing:after-commit")  # tree durable, adoption intents pending
        still = await trio.to_thread.run_sync(self._record_thread, mount, obs, sp, intent_ids,
                                              skipped)
        self.settler.settled_by_pass(mount, still)

    # -- the worker-thread steps -------------------------------------------------------------
    def _prepare(self, b: Binding, obs: Observation, sp: SyncPlan, plan: PassPlan) -> None:
        """Settle the pending intents the plan resolved; keep new conflicts' disk sides."""
        from memfs.reconcile.apply import settle

        if plan.settling:
            settle(self.journal, b.mount, plan.settling, plan.pending)
        root = RootId(obs.root.dev, obs.root.ino)
        for path, c in sp.record_conflicts.items():
            digest = getattr(c, "disk", None)
            if digest and len(digest) == 32 and not self.conflicts.has(digest):
                fact = obs.files.get(path)
                if fact is not None and fact.size <= b.max_file_size:
                    data = read_contained(b.dir, root, path, digest)
                    if data is not None:
                        self.conflicts.keep(digest, data)

    def _fetch(self, b: Binding, obs: Observation, batch: list[str], take: Mapping[str, object],
               evidence: Mapping[str, object], s_view: Mapping[str, Content], branch: str,
               record_modes: Mapping[str, int] | None = None,
               ) -> tuple[dict[str, bytes], dict[str, int]]:
        """Read the disk bytes a batch takes (checked against the decided digest) and write
        the adoptions ahead."""
        root = RootId(obs.root.dev, obs.root.ino)
        record_modes = record_modes or {}
        contents: dict[str, bytes] = {}
        for path in batch:
            t = take[path]
            if isinstance(t, Content):
                data = read_contained(b.dir, root, path, t.digest)
                if data is not None:
                    contents[path] = data
        ahead: list[NewIntent] = []
        for path in batch:
            if path not in evidence:
                continue  # first sight: no evidence a crash could leave stale
            t = take[path]
            if isinstance(t, Content) and path not in contents:
                continue
            old = s_view.get(path, ABSENT)
            prior = evidence[path]  # what the decision resolved: a not-done redo starts there
            ahead.append(NewIntent(
                path, old.digest if isinstance(old, Content) else None,
                t.digest if isinstance(t, Content) else None,
                None if prior is ABSENT else prior,  # type: ignore[arg-type]
                record_modes.get(path)))  # P's mode on completion: disk's, agreed
        ids: dict[str, int] = {}
        if ahead:  # one transaction for the batch
            ids = dict(zip((i.path for i in ahead), self.journal.begin_intents(
                b.mount, "adopt", ahead, branch=branch, root=(root.dev, root.ino)),
                strict=True))
            crash_point("backing:after-adopt-intent")  # intents durable, tree not yet changed
        return contents, ids

    def _record_thread(self, mount: str, obs: Observation, sp: SyncPlan,
                       intent_ids: dict[str, int], skipped: set[str]) -> set[int]:
        """Complete this pass's adoptions and record P; returns the ids still pending."""
        left = [iid for path, iid in intent_ids.items() if path in skipped]
        if left:  # one transaction, as the completions
            self.journal.abandon_intents(left)
        self.journal.complete_intents(  # one transaction
            iid for path, iid in intent_ids.items() if path not in skipped)
        items = [(p, None if v is ABSENT else v, sp.record_modes.get(p))
                 for p, v in sp.record.items() if p not in skipped and p not in intent_ids]
        if items or self.journal.root(mount) is None:  # the root goes with the first evidence
            self.journal.record_evidence(mount, items,  # type: ignore[arg-type]
                                         root=(obs.root.dev, obs.root.ino))
        if obs.hashed:
            self.journal.put_fingerprints(mount, obs.hashed)  # type: ignore[arg-type]
        return {i.id for i in self.journal.pending_intents(mount)}


__all__ = ["ACCEPT_ROOT_REMEDY", "GATHER_TRIES", "OnOneBranch", "Passes", "ROOT_POLL",
           "root_remedy"]
