"""Backing: every backing binding of one workspace, composed from the package's owners.

Like trio's Runner, this holds named helpers from their own modules and adds little of its
own: it builds them, wires each to the few others it needs, implements the workspace's hooks
(memfs.workspace.hooks.BackingHooks) by delegating, and installs itself as `ws.backing`.

    binding      Bindings: the bound mounts and their pins
    intent       BranchIntent: tombstones, store origin, conflicts, rewind marks
    view         StoreView: the live tree's files and their digests (S)
    settle       Settler: pending adoptions settled before a change
    applier      TreeApplier: the only code that changes the live tree for the reconciler
    passes       Passes: gather -> plan -> apply -> record
    onaccess     OnAccess: lookups, opens and xattrs observing first; disk-only reads
    materialize  Materializer: what disk owes, written through the write-ahead pushes
    states       States: what the last passes found, per mount
    status       rendering of status and listings
    events       Events: the ring `memfs events` reads
    gate         Gate: per-mount locks, admission, the clean stop
    control      the one op table of the `backing_*` requests
    tasks        fs-events watchers, the root poll, auto-materialize, after-batch scans

Everything here runs on the trio loop; what runs in worker threads is said by each module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from memfs.backing import control, status
from memfs.backing.applier import TreeApplier
from memfs.backing.binding import Binding, Bindings, check_binding, check_dir, check_options
from memfs.backing.conflicts import ConflictCopies
from memfs.backing.events import Events
from memfs.backing.gate import Gate
from memfs.backing.intent import BranchIntent
from memfs.backing.materialize import Materializer
from memfs.backing.onaccess import OnAccess
from memfs.backing.owed import OwedCounter
from memfs.backing.passes import Passes
from memfs.backing.paths import split_path, under
from memfs.backing.planning import Planner
from memfs.backing.progress import PassProgress
from memfs.backing.results import (
    Attached,
    Detached,
    Entry,
    Listing,
    Listings,
    Materialized,
    PassDone,
    PassError,
    PassOutcome,
    Reopened,
    Synced,
)
from memfs.backing.settle import Settler
from memfs.backing.states import StateRow, States
from memfs.backing.storeview import StoreView
from memfs.backing.tasks import BackgroundTasks
from memfs.backing.tasks.afterbatch import AfterBatch
from memfs.backing.tasks.automaterialize import AutoMaterialize
from memfs.backing.tasks.watchers import FsEventsWatchers, RootPoll
from memfs.errors import MemfsError
from memfs.reconcile.materialize_plan import replaced_file_remedy
from memfs.reconcile.rule import State
from memfs.store.journal import Journal
from memfs.workspace.attribution import labelled
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")


class Backing:
    """Every backing binding of one workspace; installs itself as `ws.backing`."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.store = ws.store
        self.journal = Journal(ws.store.db_path)
        if ws.store.kind != "sqlite" and ws.room.reserve is not None:
            # host.db on this host's root: its reserve lets the journal append on a full disk
            self.journal.before_write = ws.room.reserve.for_write
        self.config = Bindings({m: Binding.from_json(d) for m, d in
                                self.store.bindings().items()})
        self.config.pins = self._read_pins()
        self.events = Events()
        self.gate = Gate()
        self.states = States()
        self.view = StoreView(ws)
        self.intent = BranchIntent(ws, lambda: self.config.bindings)
        self.settle = Settler(self.journal, self.view)
        self.settle.load(self.settle.read(self.config.bindings), ws.branch)
        self.conflicts = ConflictCopies(Path(self.store.root))
        self.applier = TreeApplier(ws, self.view)
        self.planner = Planner()
        self.onaccess = OnAccess(ws, self.config, self.states, self.gate,
                                 lambda mount, scope: self.run_pass(mount, scope))
        self.passes = Passes(ws, self.journal, self.config, self.states, self.view,
                             self.intent, self.settle, self.conflicts, self.events, self.gate,
                             self.applier, self.planner, self.onaccess)
        self.materializer = Materializer(self.passes)
        self.owed = OwedCounter(lambda: ws.branch, self.journal, self.view, self.intent,
                                lambda mount: self.passes.evidence_memos.get((mount, "")))
        self.agent = AfterBatch(self.config, self.events, self._pass)
        self.auto = AutoMaterialize(ws, self.config, self.view, self.gate, self.materializer,
                                    self.events)
        self.tasks = BackgroundTasks(
            self.agent, self.auto,
            lambda after: FsEventsWatchers(self.config, self.states, self.events, self._pass,
                                           after),
            lambda after: RootPoll(self.config, self.states, self.events, self.journal,
                                   self._pass, after))
        ws.backing = self

    def close(self) -> None:
        self.journal.close()

    def _read_pins(self) -> dict[str, str]:
        return {m: p for m in self.config.bindings if (p := self.journal.pin(m)) is not None}

    async def _pass(self, mount: str, scope: str) -> PassOutcome:
        return await self.run_pass(mount, scope)

    # -- the hooks (memfs.workspace.hooks.BackingHooks) ------------------------------------
    @property
    def bindings(self) -> Mapping[str, Binding]:
        return self.config.bindings

    @property
    def stopped(self) -> bool:
        return self.gate.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self.gate.stopped = value

    def settle_before_change(self, d: Node, name: bytes) -> None:
        self.settle.before_change(self.config.backed, d, name)

    def intent_bytes(self) -> dict[str, bytes] | None:
        return self.intent.encoded()

    def before_tree_replace(self) -> None:
        """memfs.workspace.replace.replace_and_cut calls this first (on the loop, the tree committed): the
        refs of every backed file, to tell afterwards which files an undo or restore changed."""
        self.intent.before_replace(self.view.file_refs)

    def tree_replaced(self) -> None:
        """Undo/restore/switch: intent rewinds with the tree; disk-only nodes went with it."""
        self.view.tree_replaced()
        self.settle.select(self.ws.branch)
        self.applier.tree_replaced()
        self.states.reset_windows()
        self.intent.replaced(self.view.file_refs)

    async def before_rewind(self) -> None:
        """Workspace.restore calls this before it rewinds: disk's changes so far are taken in
        (or recorded as conflicts) against the tree they happened to, so what the restore
        brings back is decided against them and not by when a pass happened to run (`rm -rf`
        on disk, then a restore: the restored files come back as drafts owed to disk, instead
        of being taken as deleted by the next pass). Not for undo: its steps count from the
        head the user saw, and a commit of this pass would become the step undone. `off`
        mounts are left alone (observed only on sync)."""
        for mount, b in list(self.config.bindings.items()):
            if b.watch == "off" or self.gate.stopped:
                continue
            try:
                await self.run_pass(mount)
            except MemfsError as exc:
                log.warning("pass before the rewind of %s failed: %s", mount, exc)

    def status_json(self) -> dict[str, object]:
        """Rendered from facts: nothing is computed or read here (every stat of
        `.memfs/status` asks)."""
        return status.render(self.config, self.states, self.journal, self.owed.last.get,
                             self.agent.status, self.auto.status)

    def running(self) -> list[PassProgress]:
        """The passes running now, with how far each has got (a long request's progress)."""
        return [st.running for _, st in sorted(self.states.mounts.items())
                if st.running is not None]

    async def refresh_status(self) -> None:
        """Before status is answered: what disk owes, counted again (memfs.backing.owed)."""
        if self.config.bindings and not self.journal.needs_reopen:
            await self.owed.refresh(sorted(self.config.bindings))

    async def on_access(self, node: Node, name: bytes | None = None) -> bool:
        return await self.onaccess.on_access(node, name)

    async def state_now(self, node: Node) -> tuple[StateRow | None, bool]:
        state, ran = await self.onaccess.state_now(node, self._state_at)
        return state, ran  # type: ignore[return-value]

    def state_of(self, node: Node) -> StateRow | None:
        """(state, conflict kind) of a node in a backed mount, or None (not backed/unknown)."""
        mount, rel = self.config.backed(node.path())
        return None if mount is None or not rel else self._state_at(mount, rel)

    def _state_at(self, mount: str, rel: str) -> StateRow | None:
        st = self.states.get(mount)
        if st is None:
            return None
        if st.unavailable is not None or self.journal.needs_reopen:
            return ("unverified", None)  # nothing is verified while the evidence is unreadable
        return st.states.get(rel)

    def note_created(self, node: Node, path: bytes) -> None:
        if self.config.bindings:
            self.intent.note(self.config.backed, node, path, removed=False)

    def note_removed(self, node: Node, path: bytes) -> None:
        if self.config.bindings:
            self.intent.note(self.config.backed, node, path, removed=True)

    def hold_writer(self, node: Node) -> None:
        self.applier.held[node.id] += 1

    def release_writer(self, node: Node) -> None:
        if self.applier.release(node) and node.id in self.auto.held:
            mount, _ = self.config.backed(node.path())
            self.auto.writer_closed(node, mount)

    async def read_disk(self, node: Node, off: int, size: int) -> bytes:
        return await self.onaccess.read_disk(node, off, size)

    def conflict_files(self) -> dict[str, Path | None]:
        return self.conflicts.files(self.intent.tables)

    # -- passes and materialize ------------------------------------------------------------
    async def run_pass(self, mount: str, scope: str = "", *, path_sync: bool = False,
                       accept_root: bool = False, asked_on: str | None = None) -> PassOutcome:
        return await self.passes.run_pass(mount, scope, path_sync=path_sync,
                                          accept_root=accept_root, asked_on=asked_on)

    async def pass_all(self) -> dict[str, PassOutcome | PassError]:
        return await self.passes.pass_all()

    async def materialize(self, paths: Iterable[str] | None, *, force: bool = False,
                          apply_deletions: bool = False) -> Materialized:
        if paths is not None:
            paths = list(paths)
            for path in paths:
                mount, rel = split_path(path)
                await self._refuse_nothing_at(mount, rel, "materialize")
        return await self.materializer.materialize(paths, force=force,
                                                   apply_deletions=apply_deletions)

    def listing(self, mount: str, scope: str = "") -> Listing:
        return status.listing(self.states, mount, scope)

    # -- the control plane -------------------------------------------------------------------
    async def control(self, op: str, args: Mapping[str, object]) -> dict[str, object]:
        """The daemon's `backing_*` requests (also run on a daemon-less workspace), as JSON."""
        with self.gate.admitted():
            return await control.dispatch(self, op, args)

    async def after_batch(self, agent: str | None = None) -> dict[str, object]:
        return await self.agent.after_batch(agent)

    @labelled("attach", lambda b: f"attach: {b.mount} -> {b.dir}")
    async def attach(self, binding: Binding) -> Attached:
        mount = binding.mount
        check_binding(binding)
        # Every look at the directory runs in a thread: a path into our own mount would
        # otherwise block the loop that has to answer it.
        await trio.to_thread.run_sync(check_dir, binding.dir, Path(self.store.root))
        old = self.config.get(mount)
        if old is not None and os.path.realpath(old.dir) != os.path.realpath(binding.dir):
            raise MemfsError(f"mount {mount!r} is already bound to {old.dir}",
                             f"`memfs detach {mount}` first")
        check_options(binding)
        await trio.to_thread.run_sync(self._refuse_overlap, binding)
        st = await trio.to_thread.run_sync(os.stat, binding.dir)
        recorded = await trio.to_thread.run_sync(self.journal.root, mount)
        if old is None and recorded is not None and tuple(recorded) != (st.st_dev, st.st_ino):
            # Attaching names the directory on purpose: evidence of another one is set aside.
            await trio.to_thread.run_sync(self.journal.accept_root, mount, st.st_dev, st.st_ino)
            self.passes.root_accepted(mount)
        await self.ws.before_change()  # what attach changes is an operation of its own
        self.applier.ensure_mount_dir(mount, stat.S_IMODE(st.st_mode))
        # The store's writer lock is held across a group commit's fdatasync: not on the loop.
        await trio.to_thread.run_sync(self.store.set_binding, mount, binding.to_json())
        await self.ws.changes_open()  # the intent's change below waits for a history operation
        self.config.bindings[mount] = binding
        self.intent.bound(mount)
        result = await self.run_pass(mount)
        return Attached(mount, binding.dir, binding.watch, result)

    def _refuse_overlap(self, binding: Binding) -> None:
        """One directory, one mount: a second mount bound to a directory another is bound to
        (or inside it, or holding it) took disk's files into it beside its own, and both
        mounts' materializes wrote the same files (a slip of a mount's name did it). Worker
        thread: realpath looks at disk."""
        new = os.path.realpath(binding.dir)
        for mount, other in self.config.bindings.items():
            if mount == binding.mount:
                continue
            old = os.path.realpath(other.dir)
            how = ("is the directory" if new == old else
                   "is inside the directory" if new.startswith(old.rstrip("/") + "/") else
                   "holds the directory" if old.startswith(new.rstrip("/") + "/") else None)
            if how is not None:
                raise MemfsError(
                    f"{binding.dir} {how} {other.dir}, which mount {mount!r} is bound to",
                    f"its files are in {mount!r} already (`memfs ls --states {mount}`); to "
                    f"bind them to {binding.mount!r} instead, `memfs detach {mount}` first")

    async def detach(self, mount: str) -> Detached:
        if mount not in self.config.bindings:
            raise MemfsError(f"mount {mount!r} is not bound", "see `memfs status`")
        async with self.gate.lock(mount):
            await self.ws.changes_open()
            edit = self.applier.drop_mount(mount)
            await trio.to_thread.run_sync(self.store.set_binding, mount, None)
            await trio.to_thread.run_sync(self.journal.clear_pin, mount)
            self.config.pins.pop(mount, None)
            del self.config.bindings[mount]
            self.states.forget(mount)
            self.intent.unbound(mount)
            self.onaccess.forget(mount)
            self.passes.forget(mount)
            self.planner.forget(mount)
            self.owed.forget(mount)
            self.view.forget(mount)
            self.ws.invalidate(edit.entries, edit.inodes)
        return Detached(mount)

    async def sync(self, path: str | None, *, accept_root: bool = False,
                   reopen: bool = False) -> Synced:
        """`memfs sync [PATH]`: without a path every bound mount, never discarding a draft; a
        path (MOUNT[/REL]) takes disk under it and lists what it `discarded`. `reopen` first
        reopens the journal (after a failed write), so the passes decide from the file."""
        if accept_root and path is not None:
            raise MemfsError(
                f"--accept-root takes a mount's whole root, not a path ({path!r})",
                "run `memfs sync --accept-root` without a path to take the replaced directory; "
                "`memfs sync PATH` takes disk at a path once the root is available")
        reopened = await self.reopen() if reopen else None
        out: dict[str, PassOutcome] = {}
        if path is None:
            for mount in list(self.config.bindings):
                out[mount] = await self.run_pass(mount, accept_root=accept_root)
        else:
            mount, rel = split_path(path)
            await self._refuse_nothing_at(mount, rel, "sync")
            out[mount] = await self.run_pass(mount, rel, path_sync=True,
                                             accept_root=accept_root, asked_on=self.ws.branch)
        return Synced(out, reopened)

    async def _refuse_nothing_at(self, mount: str, rel: str, verb: str) -> None:
        """A path that names nothing on disk or in the workspace is a mistyped name: refused,
        as `git add` and `ls` refuse one (a pass over it said "0 taken" and exit 0, so a typo
        looked like a file in step). A backing root that cannot be read and a journal that
        refuses are left to the pass, which says why: that is what the user must mend first."""
        binding = self.config.bindings.get(mount)
        if (binding is None or rel == "" or self.journal.refusal() is not None
                or self.view.holds(mount, rel)):
            return
        on_disk = os.path.join(binding.dir, rel)

        def disk_has() -> bool:
            return not os.path.isdir(binding.dir) or os.path.lexists(on_disk)

        if await trio.to_thread.run_sync(disk_has):
            return
        raise MemfsError(
            f"{mount}/{rel}: no such file or directory, on disk ({on_disk}) or in the workspace",
            f"check the name; `memfs ls --states {mount}` lists what {mount} holds "
            f"(`memfs {verb}` without a path covers every bound mount)")

    async def reopen(self) -> Reopened:
        """Reopen the journal's view of the store in this process, without a restart: clears a
        failed write's poison (Journal.reopen). Every mount's lock is held meanwhile, so no
        pass or materialize straddles the old view and the new one; what this process keeps
        from the journal (the pins, the pending adoptions to settle) is read again, since a
        failed write may have reached the file. A reopen that fails leaves the journal
        refusing, and says why."""
        refusal = self.journal.refusal()
        async with contextlib.AsyncExitStack() as held:
            for mount in sorted(self.config.bindings):
                await held.enter_async_context(self.gate.lock(mount))
            try:
                await trio.to_thread.run_sync(self.journal.reopen)
                pins = await trio.to_thread.run_sync(self._read_pins)
                known = await trio.to_thread.run_sync(self.settle.read,
                                                      list(self.config.bindings))
            except sqlite3.Error as exc:
                raise MemfsError(f"the journal could not be reopened ({exc})",
                                 "check the disk that holds the store (free space, dmesg), "
                                 "then run `memfs sync --reopen` again") from None
            self.config.pins = pins
            self.settle.load(known, self.ws.branch)
            self.states.reset_windows()  # on-access windows: observe afresh from the new view
        was = None if refusal is None else refusal.message
        self.events.record("journal-reopened", was_refusing=was)
        return Reopened(was)

    async def states_of(self, path: str | None) -> Listings:
        """`memfs ls --states [PATH]`: observe the scope first, then list it."""
        mounts = [split_path(path)] if path else [(m, "") for m in sorted(self.config.bindings)]
        out = []
        for mount, rel in mounts:
            await self._refuse_nothing_at(mount, rel, "ls --states")
            res = await self.run_pass(mount, rel)
            got = self.listing(mount, rel)
            out.append(Listing(got.mount, got.path, got.unavailable,
                               self._with_unwritable(mount, rel, got.entries), got.regions,
                               res.bytes_read if isinstance(res, PassDone) else 0))
        return Listings(out)

    def _with_unwritable(self, mount: str, rel: str, entries: Sequence[Entry]) -> list[Entry]:
        """The listing with what no materialize writes (materialize lists it `not-writable`):
        a FIFO, socket or device made in the mount is no file the rule decides, so it was in
        no listing at all; a hard-linked file keeps its state and says why it stays."""
        nodes, _ = self.view.nodes(mount)  # the whole mount's: rel may name a FIFO
        why = {p: w for p, w in self.view.unwritable(nodes, mount).items() if under(p, rel)}
        out = [dataclasses.replace(e, note=self._why(mount, e, why.pop(e.path)))
               if e.path in why else e for e in entries]
        out += [Entry(p, "not-writable", None, note=w) for p, w in why.items()]
        return sorted(out, key=lambda e: e.path)

    @staticmethod
    def _why(mount: str, e: Entry, why: str) -> str:
        """An unwritable entry's note; where it is a workspace deletion (a link put over a
        file disk still has), the ways out that end with nothing owed."""
        if e.state != str(State.WORKSPACE_DELETED):
            return why
        return f"{why}; {replaced_file_remedy(mount, e.path)}"

    # -- the daemon's background work ------------------------------------------------------
    async def run_watchers(self, after_change: Callable[[], Awaitable[None]]) -> None:
        """The daemon's background work (memfs.backing.tasks), until cancelled."""
        await self.tasks.run(after_change)

    async def stop(self) -> None:
        """Stop cleanly (seed 002's stop): the background tasks first, so no new work is
        generated, then every admitted piece of work, then refuse new work."""
        await self.tasks.stop()
        await self.gate.drain_and_stop()


__all__ = ["Backing"]
