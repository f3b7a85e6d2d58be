"""The group commit: the loop that commits within `commit_interval` of the first change, and
one commit's course (memfs.workspace.snapshot holds its three steps).

State is the workspace's (its events, counters and health, on the trio loop); these are its
functions, so that the workspace module keeps the tree and its changes and this one how they
become durable.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from memfs.store.history import OpRecord, ProcRef
from memfs.workspace import snapshot
from memfs.workspace.health import CommitError
from memfs.workspace.nodes import DIRTY_BYTES_SOON

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.workspace")



async def run(ws: Workspace) -> None:
    """The group-commit loop: commit within commit_interval of the first change."""
    await trio.to_thread.run_sync(ws.room.take_reserve)
    while not ws.stopped:
        await ws._wake.wait()
        ws._wake = trio.Event()
        if ws.dirty_since is None:
            continue
        if ws.health.failure is not None:  # a failed commit (perhaps an fsync's): retry
            await ws.health.wait_to_retry()
        elif ws._dirty_bytes < DIRTY_BYTES_SOON:
            delay = ws.dirty_since + ws.commit_interval - time.monotonic()
            with trio.move_on_after(max(0.0, delay)):
                await ws._urgent.wait()
        ws._urgent = trio.Event()
        try:
            await ws.commit()
        except Exception:  # noqa: BLE001 - a failed commit is retried, never fatal
            ws._wake.set()  # logged by health.failed; the retry waits at the top
            continue
        if time.monotonic() - ws.room.reserve_checked > 5.0:  # it may have been given back
            await trio.to_thread.run_sync(ws.room.take_reserve)


async def commit_locked(ws: Workspace, message: str = "") -> str | None:
    """One commit: snapshot on the loop, write in the commit thread, apply on the loop; a
    failure keeps every change pending and the operations that made them, and wakes the loop
    to retry."""
    if not ws.root.dirty:
        ws.durable_seq = max(ws.durable_seq, ws.mutation_seq)
        ws.dirty_since = None
        # Nothing in the tree to commit, so no operation's changes wait either: a write to
        # a file an undo replaced (an orphan, no longer under the root) names its writer
        # here, and kept, it made the next two commands one mixed group (user trial).
        ws._group, ws._last_op = {}, None
        ws._recount_dirty()
        return None
    ops = [op.with_pids(list(procs.values())) for op, procs in ws._group.values()]
    ws._group, ws._last_op = {}, None
    ws.attribution.forget_processes()
    plan = snapshot.take(ws, ops)  # memfs.workspace.snapshot: the commit's three steps
    ws.dirty_since = None
    text = snapshot.message_of(plan.ops, message)
    ws.room.commit_writing()  # writes that do not fit meanwhile wait for its end
    try:
        return await _write_and_apply(ws, plan, text)
    finally:
        ws.room.commit_done()


async def _write_and_apply(ws: Workspace, plan: snapshot.CommitPlan, text: str) -> str:
    """The commit thread's write, then the apply on the loop (or the failure kept)."""
    try:
        if ws.pin_gate is not None:  # what this commit leaves only held open: published first
            await ws.pin_gate.before_head_moves("a commit")
        commit = await trio.to_thread.run_sync(ws._write, plan, text)
    except Exception as exc:
        ws.last_error = f"{type(exc).__name__}: {exc}"
        regroup(ws, plan)  # the retry still names who made these changes
        ws.dirty_since = time.monotonic()
        ws._wake.set()  # the commit loop retries, whoever asked for this commit,
        ws._urgent.set()  # at the retry pace, not after the commit interval
        ws.room.changed()
        space = None
        try:
            space = ws.space()
        except OSError:
            pass
        error = ws.health.failed(exc, space, str(ws.store.root), ws.store.kind != "sqlite")
        if ws.health.full and ws.lifecycle is not None:
            ws.lifecycle.poke()  # a GC may make the room
        raise error from exc
    ws.last_error = None
    ws.health.succeeded()
    snapshot.apply(plan)
    ws._recount_dirty()
    ws.room.changed()  # the committed bytes left memory for the disk
    ws.head = commit.id
    ws.durable_seq = max(ws.durable_seq, plan.seq)
    ws.commit_count += 1
    ws._committed.set()
    ws._committed = trio.Event()
    if ws.root.dirty and ws.dirty_since is None:
        ws.dirty_since = time.monotonic()
        ws._wake.set()
    return commit.id


def regroup(ws: Workspace, plan: snapshot.CommitPlan) -> None:
    """A failed commit's operations go back in front of what came since."""
    merged: dict[str, tuple[OpRecord, dict[int, ProcRef]]] = {}
    for op in plan.ops:
        merged[op.key] = (op, {p.pid: p for p in op.pids})
    for key, (op, procs) in ws._group.items():
        if key in merged:
            merged[key][1].update(procs)
            if op.set_times and not merged[key][0].set_times:
                merged[key] = (op, merged[key][1])
            merged[key] = merged.pop(key)
        else:
            merged[key] = (op, procs)
    ws._group = merged


async def final_commit(ws: Workspace, message: str, limit: float) -> None:
    """The mount has ended: commit what is pending, retrying a failing commit (a full
    disk someone may still clear) for up to `limit` seconds before giving up loudly."""
    deadline = time.monotonic() + limit
    while True:
        try:
            await ws.commit(message)
            return
        except CommitError as exc:
            if time.monotonic() >= deadline:
                log.error("giving up: %d change(s) made before the unmount could not be "
                          "committed and are lost: %s", ws.mutation_seq - ws.durable_seq, exc)
                raise
            await ws.health.wait_to_retry()
