"""The daemon's garbage collection: automatic runs, `memfs gc` and `memfs du` requests, and
what status says about them.

A run is memfs.store.gc's Collector (on a store in PostgreSQL, memfs.store.pg.gc's
PgCollector) in a worker thread; one at a time (a trio lock here, the store's gc.lock across
processes, or the database's advisory lock across hosts). The automatic runs, when the policy's `gc-auto` is on:

- low space: the store's filesystem is below the policy's floor, a write was refused for
  lack of space, or a commit failed for it: at once, then at most every 10 s, backing off
  (doubling, up to 10 min) while runs give nothing back;
- growth: the packs grew by max(256 MiB, 5% of the filesystem) since the last run (on
  PostgreSQL: the database, by 256 MiB; there is no low-space trigger there, the server's
  disk is not this host's to measure);
- age: the last run is 6 h old (or there was none) and some commit is older than `keep-all`.

The check runs every minute, when a write or commit fails for space, and just after a file
is removed while space is short (once its commit has landed). After a run, a failing commit
is retried at once.

What GC must keep for this process beyond the store's refs (views shown under
`.memfs/history`, files still open after they left the tree) is asked of the loop
(Workspace.gc_pins) before the run takes any lock.

Loop thread, except `_due` (a worker thread: it reads the store and the disk).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, cast

import trio

from memfs.store import gc
from memfs.store.packs import pack_usage
from memfs.store.refs import CHUNK, INODES, Ref, file_refs
from memfs.store.retention import Policy
from memfs.store.space import Space, size_text
from memfs.store.store import Store
from memfs.store.trees import DIR, FILE

if TYPE_CHECKING:
    from memfs.store.pg.gc import PgCollector
    from memfs.store.pg.store import PgStore
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.gc")

CHECK_EVERY = 60.0
LOW_SPACE_EVERY = 10.0
LOW_SPACE_MAX = 600.0
AGE_EVERY = 6 * 3600.0
GROWTH_MIN = 256 << 20
FOLLOW_UP_EVERY = 1.0  # while a run's uncommitted changes are awaited


class Lifecycle:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        store = ws.store
        self.store = store
        # Exactly one of the two: the embedded store, or one in PostgreSQL (memfs.store.pg.gc).
        self.embedded: Store | None = store if isinstance(store, Store) else None
        self.pg: PgStore | None = None if self.embedded else cast("PgStore", store)
        self.shared = self.pg is not None
        self.running: gc.Collector | PgCollector | None = None
        self.last: dict | None = (_pg_gc().last_run(self.pg) if self.pg is not None else
                                  gc.last_run(cast(Store, self.embedded)))
        self._last_at = 0.0  # monotonic time of this process's last automatic run
        self._low_every = LOW_SPACE_EVERY  # grows while low-space runs give nothing back
        self._delay = 0.0
        # mutation_seq a run could not get committed first: once durable_seq reaches it, an
        # automatic run collects what those changes free
        self._follow_up: int | None = None
        self._lock = trio.Lock()
        self._poke = trio.Event()
        ws.lifecycle = self

    # -- automatic runs -------------------------------------------------------------------------
    async def run(self) -> None:
        """The daemon's background task (ends with the nursery)."""
        wait = CHECK_EVERY
        while True:
            with trio.move_on_after(wait):
                await self._poke.wait()
            wait = CHECK_EVERY if self._follow_up is None else FOLLOW_UP_EVERY
            self._poke = trio.Event()
            if self._delay:  # let the commit of a removal land first
                await trio.sleep(self._delay)
                self._delay = 0.0
            if self._lock.locked():
                continue
            landed = self._follow_up is not None and self.ws.durable_seq >= self._follow_up
            if landed:
                self._follow_up = None  # one follow-up (none with gc-auto off: `memfs gc` said so)
            try:
                trigger, later = await trio.to_thread.run_sync(self._due, landed)
                if later is not None:
                    # space is short but the last run was too recent
                    wait = later if self._follow_up is None else min(wait, later)
                if trigger:
                    log.info("automatic garbage collection: %s", trigger)
                    report = await self.collect(trigger=trigger)
                    log.info("garbage collection done: %s", summary(report))
            except Exception as exc:  # noqa: BLE001 - a failed run is logged and tried again later
                if type(exc).__name__ == "GcBusy":  # another host's run (memfs.store.pg.gc)
                    log.info("automatic garbage collection skipped: %s", exc)
                else:
                    log.exception("automatic garbage collection failed")

    def poke(self, delay: float = 0.0) -> None:
        """Space is short (a write or commit was refused, a file went): check soon."""
        self._delay = max(self._delay, delay)
        self._poke.set()

    def _due(self, landed: bool = False) -> tuple[str | None, float | None]:
        """Why an automatic run is due now (or None), and when to look again if a run for
        space is wanted but the last one was too recent (worker thread). `landed`: the
        changes the last run could not get committed first are in now."""
        policy = self.store.policy()
        if not policy.gc_auto:
            return None, None
        if landed:
            return "changes the last run could not commit first are committed now", None
        since = time.monotonic() - self._last_at if self._last_at else float("inf")
        if self.pg is not None:
            return self._due_shared(self.pg, policy, since), None
        store = cast(Store, self.embedded)
        space = Space.of(store.root)
        short = None
        if self.ws.health.full:
            short = "commits are failing for lack of space"
        elif self.ws.room.refused:
            short = "a write was refused for lack of space"
        elif policy.space_floor and space.avail < gc.space_floor(space, policy):
            short = f"free space {size_text(space.avail)} is under the {policy.space_floor:g}% floor"
        if short:
            if since >= self._low_every:
                return short, None
            return None, self._low_every - since
        base = (self.last or {}).get("store_after", 0)
        if pack_usage(store.root) - base > max(GROWTH_MIN, space.size // 20):
            return "the packs grew since the last run", None
        last = (self.last or {}).get("started", 0.0)
        if time.time() - last >= AGE_EVERY and since >= AGE_EVERY and policy.keep_all != float(
                "inf"):
            cutoff = time.time_ns() - int(policy.keep_all * 1e9)
            if store._query("SELECT 1 FROM commits WHERE time_ns < ? LIMIT 1", (cutoff,)):
                return "history has aged past the keep-all window", None
        return None, None

    def _due_shared(self, store: PgStore, policy: Policy, since: float) -> str | None:
        """On PostgreSQL: growth of the database, or history aged past keep-all (worker
        thread). Every host's daemon asks; the database's lock lets one run at a time."""
        pg_gc = _pg_gc()
        size = pg_gc.database_size(store)
        self.last = pg_gc.last_run(store) or self.last  # any host's last run
        base = (self.last or {}).get("store_after", 0)
        if base and size - base > GROWTH_MIN:
            return "the database grew since the last run"
        last = (self.last or {}).get("started", 0.0)
        if time.time() - last >= AGE_EVERY and since >= AGE_EVERY and policy.keep_all != float(
                "inf"):
            cutoff = time.time_ns() - int(policy.keep_all * 1e9)
            if pg_gc.has_commits_before(store, cutoff):
                return "history has aged past the keep-all window"
        return None

    # -- a run ------------------------------------------------------------------------------------
    async def collect(self, *, dry_run: bool = False, trigger: str = "manual") -> dict:
        async with self._lock:
            await self.ws.release_views()  # a view only browsed keeps nothing (view_release)
            uncommitted, for_commit = await self._commit_first(dry_run)
            collector: gc.Collector | PgCollector
            if self.pg is not None:
                collector = _pg_gc().PgCollector(self.pg, dry_run=dry_run, trigger=trigger,
                                                 pins=self._pins)
            else:
                collector = gc.Collector(cast(Store, self.embedded), dry_run=dry_run,
                                         trigger=trigger, pins=self._pins,
                                         short_of_space=self.ws.room.refused
                                         or self.ws.health.full,
                                         all_for_space=trigger in ("manual", "du"))
            self.running = collector
            try:
                report = await trio.to_thread.run_sync(collector.run)
                doc = report.to_json()
                doc["uncommitted"] = uncommitted
                doc["reserve_for_commit"] = for_commit
                if trigger != "du":  # du shows the store's bytes; memory is not counted there
                    doc["memory"] = await trio.to_thread.run_sync(
                        lambda: memory_step(self.store.root, self.store.policy(), dry_run))
            finally:
                self.running = None
                if trigger != "manual" and not dry_run:
                    self._last_at = time.monotonic()
            if trigger not in ("manual", "du"):
                self._low_every = LOW_SPACE_EVERY if doc["returned"] >= 1 << 20 else min(
                    LOW_SPACE_MAX, self._low_every * 2)
            if not dry_run:
                self.last = doc
                self.ws.room.changed()
                reserve = self.ws.room.reserve
                if doc["reserve_released"] or for_commit or (reserve is not None
                                                             and not reserve.held()):
                    await trio.to_thread.run_sync(self.ws.room.take_reserve)  # for the next time
                self.ws.health.poke()
            return doc

    async def _commit_first(self, dry_run: bool) -> tuple[int, int]:
        """Commit what waits in memory before the run marks, so what a pending rm freed is
        history the run can drop, not files the head still names (user trial: one run gave
        back a fraction; two or three more were needed). A commit failing for space gets the
        reserve (an embedded store's, and not for a dry run, which changes nothing): that
        is what it is kept for. The changes still not durable, and the reserve's bytes
        given to the commit."""
        ws = self.ws
        if ws.mutation_seq == ws.durable_seq and not ws.root.dirty:
            return 0, 0
        released = 0
        for attempt in range(2):
            try:
                await ws.commit()
                self._follow_up = None
                return 0, released
            except Exception as exc:  # noqa: BLE001 - the run goes on; its report says so
                log.info("garbage collection: the pending changes did not commit first: %s",
                         exc)
            if attempt or dry_run or not ws.health.full or ws.room.reserve is None or \
                    self.embedded is None:
                break
            released = await trio.to_thread.run_sync(ws.room.reserve.release)
            ws.room.changed()
            if not released:
                break
        if not dry_run:
            self._follow_up = ws.mutation_seq  # collect what they free once they are in
        return ws.mutation_seq - ws.durable_seq, released

    def _pins(self) -> gc.Pins:
        return trio.from_thread.run_sync(pins_of, self.ws)

    def status(self) -> dict:
        running = self.running
        return {
            "running": None if running is None else {
                "trigger": running.report.trigger, "dry_run": running.dry_run,
                **running.progress.to_json()},
            "last": None if self.last is None else {
                k: self.last.get(k) for k in (
                    "started", "seconds", "trigger", "returned", "commits_dropped",
                    "dropped_for_space", "chunk_bytes_freed", "live_bytes", "history_bytes",
                    "reclaimable_bytes", "problems")},
        }


def memory_step(root, policy: Policy, dry_run: bool) -> dict:
    """The memory generations' part of a run (memfs.consolidate.memory_retention); a
    failure there is the run's problem, not its end (worker thread)."""
    from memfs.consolidate.memory_retention import collect_memory

    try:
        return collect_memory(root, policy, dry_run=dry_run).to_json()
    except Exception as exc:  # noqa: BLE001 - a server's error too: the store's report stands
        return {"dry_run": dry_run, "generations": 0, "dropped": 0, "named_by_receipts": 0,
                "problems": [f"memory generations were not pruned: {exc}"]}


def _pg_gc():
    """memfs.store.pg.gc, imported only for a store in PostgreSQL (it needs psycopg)."""
    from memfs.store.pg import gc as pg_gc

    return pg_gc


def pins_of(ws: Workspace, *, in_tree: bool = False) -> gc.Pins:
    """What GC must keep for this process beyond the store's refs (loop thread): the trees
    and inode tables of views shown under .memfs (every view root the kernel may still
    hold, not only those cached for reuse), and the content of files held open that are no
    longer in the tree (unlinked, replaced by an undo) or belong to a view. `in_tree`: the
    held ones still in the tree too (before an undo or restore moves the head off them).
    While this host follows a branch another host writes, the commit it shows too (tree and
    inode table): the writer's next commit leaves it named by no head (memfs.workspace.hosts
    publishes it before showing it)."""
    pins = gc.Pins()
    if ws.read_only is not None and ws.root.ref:
        pins.trees.add(ws.root.ref)
        if ws.inodes.table:
            pins.refs.add(Ref(INODES, ws.inodes.table))
    for root in ws._view_roots.values():
        if root.ref:
            pins.trees.add(root.ref)
        if root.space is not None and root.space.table:
            pins.refs.add(Ref(INODES, root.space.table))
    for node in ws.held_nodes():
        if not in_tree and not node.readonly and ws._attached(node):
            continue  # in the tree: the head names it
        if node.kind == DIR and node.ref:
            pins.trees.add(node.ref)
        elif node.kind == FILE:
            if node._data_loaded and node.data is not None:
                pins.refs.update(Ref(CHUNK, c) for c in node.data.chunks.values())
            elif node.ref:
                pins.refs.update(file_refs(node.ref))
    return pins


def summary(doc: dict) -> str:
    """One line for people and the log. A dry run frees nothing: it says what a run would
    give back (what `memfs du` calls reclaimable)."""
    space = f" ({doc['dropped_for_space']} for space)" if doc.get("dropped_for_space") else ""
    gens = (doc.get("memory") or {}).get("dropped", 0)
    mem = f" and {gens} memory generation(s)" if gens else ""
    if doc.get("dry_run"):
        return (f"would drop {doc['commits_dropped']} commit(s){space}{mem} and would give "
                f"back {size_text(doc['reclaimable_bytes'])}; nothing was changed")
    return (f"dropped {doc['commits_dropped']} commit(s){space}{mem}, freed "
            f"{size_text(doc['chunk_bytes_freed'] + doc['object_bytes_freed'])} of chunks and "
            f"objects, gave back {size_text(doc['returned'])} in {doc['seconds']:.1f} s")
