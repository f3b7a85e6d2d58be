"""The mount daemon: one root, one mount, one process (pyfuse3's session is global).

Start-up order matters: take the root's lock first (a second daemon is refused before it
touches anything), open the store, mount, then serve. Shut-down commits everything that is
pending before the store closes, whichever way the mount ends (SIGTERM, SIGINT, `memfs
umount`, or `fusermount3 -u`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path

import pyfuse3
import trio

from memfs.backing import Backing
from memfs.control import MAX_LINE, encode_reply
from memfs.errors import MemfsError
from memfs.fs.longops import Requests
from memfs.fs.operations import MemfsOperations
from memfs.liveness import HEARTBEAT, DaemonRecord, lock_path, mount_source, read_record
from memfs.rootdir import control_socket, socket_address
from memfs.store import StoreBackend, undo
from memfs.workspace.agent_memory import recover_reviews
from memfs.workspace.cutoff import CutOff
from memfs.workspace.hosts import Hosts
from memfs.workspace.lifecycle import Lifecycle
from memfs.workspace.pinning import PinPublisher
from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.daemon")
STOP_DRAIN_LIMIT = 60  # seconds a stop waits for running backing work before cutting it
STOP_COMMIT_LIMIT = 60  # seconds a stop retries a failing last commit (a full disk)
# pyfuse3's worker tasks at most (its default is 99). A change asked for while a history
# operation holds changes off waits in its task; at 99, 98 parallel writers during one undo
# took every task and reads waited for the undo too. A task is spawned only when no idle one
# is reading, and each holds a receive buffer the kernel fills only as far as the request
# (a waiting mkdir touches one page), so a large bound costs nothing until it is used.
MAX_TASKS = 1024
LOCK_PATIENCE = 1.0  # seconds to wait out a CLI's liveness probe of the root lock
READ_ONLY_OPS = ("ping", "status", "requests", "log", "branch_list", "backing_events",
                 "backing_states")


class RootLock:
    """flock on <root>/daemon.lock, holding the daemon's record (memfs.liveness): its pid and
    mountpoint for the refusal message and `memfs status`, and what is not yet durable, so
    that after a SIGKILL the CLI can say what was lost. A clean exit empties the file."""

    def __init__(self, root: Path, record: DaemonRecord) -> None:
        self.path = lock_path(root)
        root.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.written = 0
        deadline = time.monotonic() + LOCK_PATIENCE
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:  # a CLI's liveness probe holds it briefly
                    time.sleep(0.02)
                    continue
                holder = read_record(root)
                os.close(self.fd)
                where = f"pid {holder.pid}, mounted at {holder.mountpoint}" if holder else "starting"
                raise MemfsError(
                    f"the store at {root} is already served by another memfs daemon ({where})",
                    f"use that mount, or `memfs umount {holder.mountpoint if holder else 'MNT'}`"
                    " first") from None
        os.ftruncate(self.fd, 0)
        self.write(record)

    def write(self, record: DaemonRecord) -> None:
        """Rewrite the record in place (blocking: call it from a worker thread once serving).
        Padded to the length written before, so a reader never sees a stale tail."""
        data = json.dumps(record.to_json()).encode()
        os.pwrite(self.fd, data.ljust(self.written), 0)
        self.written = max(self.written, len(data))

    def release(self, final: DaemonRecord | None = None) -> None:
        """Empty the record (a clean exit) or leave `final` (changes were not durable)."""
        if final is None:
            os.ftruncate(self.fd, 0)
        else:
            self.write(final)
        os.close(self.fd)


def _record(base: DaemonRecord, ws: Workspace) -> DaemonRecord:
    """`base` with the workspace's durability now (trio thread: reads the workspace's state)."""
    pending = ws.mutation_seq - ws.durable_seq
    since = None
    if pending and ws.dirty_since is not None:
        since = time.time() - (time.monotonic() - ws.dirty_since)
    return replace(base, seen=time.time(), head=ws.head, pending=pending, pending_since=since,
                   last_commit_error=ws.last_error)


def fuse_options(root: Path, allow_other: bool, extra: list[str], debug: bool) -> set[str]:
    """pyfuse3's defaults, the source naming the store, and what the user asked for. root's
    mounts allow other users by default (as before)."""
    options = set(pyfuse3.default_options) | {f"fsname={mount_source(root)}", "subtype=memfs"}
    if allow_other or os.getuid() == 0:
        options.add("allow_other")
    options.update(extra)
    if debug:
        options.add("debug")
    return options


def run_daemon(root: Path, mountpoint: Path, commit_interval: float, debug: bool = False,
               allow_other: bool = False, extra_options: list[str] | None = None) -> int:
    now = time.time()
    base = DaemonRecord(pid=os.getpid(), mountpoint=str(mountpoint), started=now, seen=now,
                        commit_interval_ms=int(commit_interval * 1000))
    lock = RootLock(root, base)
    ws: Workspace | None = None
    try:
        recover_reviews(root)
        ws = Workspace.open(root, commit_interval)
        ws.served_by = base
        options = fuse_options(root, allow_other, extra_options or [], debug)
        _mount_and_serve(ws, lock, root, mountpoint, options)
    finally:
        final = None
        if ws is not None and ws.mutation_seq != ws.durable_seq:
            final = replace(_record(base, ws), ended=time.time())
            log.error("exiting with %d change(s) not durable: %s", final.pending,
                      final.last_commit_error)
        lock.release(final)
    return 0


def _mount_and_serve(ws: Workspace, lock: RootLock, root: Path, mountpoint: Path,
                     options: set[str]) -> None:
    store = ws.store
    backing = Backing(ws)
    lifecycle = Lifecycle(ws)  # retention and GC, on either backend (docs/lifecycle.md)
    ops = MemfsOperations(ws)
    try:
        pyfuse3.init(ops, str(mountpoint), options)
    except RuntimeError as exc:  # libfuse printed why just before (unknown option, fuse.conf)
        backing.close()
        store.close()
        raise MemfsError(f"FUSE could not mount {mountpoint} ({exc})",
                         "the fuse line before this one says why") from None
    try:
        trio.run(_serve, ws, backing, lifecycle, ops, root, lock)
    except BaseException:
        log.exception("daemon stopped by an error")
        raise
    finally:
        try:
            pyfuse3.close(unmount=True)
        finally:
            backing.close()
            if ws.read_only is None:  # a clean end: the next writer needs no takeover
                store.release(ws.branch)
            store.close()
            sock = control_socket(root)
            if sock.exists():
                sock.unlink()


async def _serve(ws: Workspace, backing: Backing, lifecycle: Lifecycle,
                 ops: MemfsOperations, root: Path, lock: RootLock) -> None:
    pins = PinPublisher(ws, lifecycle.pg) if lifecycle.pg is not None else None
    ws.pin_gate = pins  # first: a follower publishes the commit it shows before serving
    hosts = Hosts(ws)
    ws.hosts = hosts
    await hosts.start()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ws.run)
        nursery.start_soon(lifecycle.run)
        if pins is not None:  # other hosts' GC keeps what this one shows (pinning)
            nursery.start_soon(pins.run)
        nursery.start_soon(hosts.run, ops.drain_invalidations)
        nursery.start_soon(_signals, ws)
        nursery.start_soon(_heartbeat, ws, lock)
        await nursery.start(_control_server, ws, backing, ops, root)
        nursery.start_soon(_initial_passes, backing, ops)
        nursery.start_soon(backing.run_watchers, ops.drain_invalidations)
        await pyfuse3.main(max_tasks=MAX_TASKS)
        await _stop(ws, backing)
        if pins is not None:
            await pins.withdraw()
        nursery.cancel_scope.cancel()


async def _stop(ws: Workspace, backing: Backing) -> None:
    """The mount has ended. Backing work first: watchers stopped, queued work drained, new work
    refused (backing.stop). Then the workspace refuses changes, and what is pending is
    committed. A drain that outlasts STOP_DRAIN_LIMIT (a pass stuck on a hung disk) is no
    longer waited for before the commit (the write-ahead intents make that no worse than a
    crash); work already in a thread or a shielded scope still holds the process's exit."""
    log.info("mount ended; stopping backing work")
    with trio.move_on_after(STOP_DRAIN_LIMIT) as limit:
        await backing.stop()
    if limit.cancelled_caught:
        log.warning("backing work still running after %d s; stopping anyway", STOP_DRAIN_LIMIT)
        backing.stopped = True
    log.info("committing what is pending")
    ws.stopped = True
    await ws.final_commit("unmount", STOP_COMMIT_LIMIT)


async def _batch_mark(ws: Workspace, agent: str | None) -> None:
    """The mark an after-batch leaves, named by the agent as far as a revision name may be
    (an agent id with ':' or '/' — `claude:main/2` — is no branch, checkpoint or mark name,
    and refusing it would fail the batch's scan); one that would shadow a revision (an agent
    named like a branch) falls back to `after-batch`. The label keeps the agent as given."""
    name = "".join("-" if ch in "/~:" or ord(ch) < 32 or ord(ch) == 127 else ch
                   for ch in (agent or "")).strip().lstrip(".") or "after-batch"
    try:
        await ws.mark(name[:200], label=agent or "after-batch")
    except MemfsError:
        await ws.mark("after-batch", label=agent or "after-batch")


async def _heartbeat(ws: Workspace, lock: RootLock) -> None:
    """Every HEARTBEAT seconds, the record in daemon.lock says what is not yet durable: after a
    SIGKILL that is what `memfs status` reports as lost. A record that cannot be written (a
    full disk) is logged and retried; serving goes on."""
    base = ws.served_by
    assert base is not None
    while True:
        record = _record(base, ws)
        try:
            await trio.to_thread.run_sync(lock.write, record)
        except OSError as exc:
            log.warning("could not update %s: %s", lock.path, exc)
        await trio.sleep(HEARTBEAT)


async def _initial_passes(backing: Backing, ops: MemfsOperations) -> None:
    """Backed mounts are observed once at start (the mount shows disk's truth from the start)."""
    if backing.bindings:
        done = await backing.pass_all()
        log.info("initial passes: %s", {m: r.to_json() for m, r in done.items()})
        await ops.drain_invalidations()


async def _signals(ws: Workspace) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for _ in signals:
            log.info("signal received: committing and unmounting")
            try:
                await ws.commit("stop")
            finally:
                pyfuse3.terminate()
            return


async def _control_server(ws: Workspace, backing: Backing, ops: MemfsOperations, root: Path,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    path = control_socket(root)
    if path.exists():
        path.unlink()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_address(path) as address:
        await sock.bind(address)
    os.chmod(path, 0o600)
    sock.listen(16)
    requests = Requests(lambda: _doing(ws, backing))
    ops.virtual.requests_status = requests.status_json  # .memfs/status shows them too
    task_status.started()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(requests.run)
        while True:
            conn, _ = await sock.accept()
            nursery.start_soon(_handle_client, conn, ws, backing, ops, requests)


def _doing(ws: Workspace, backing: Backing) -> list[str]:
    """What the daemon's long work is doing now, for a long request's progress lines."""
    out = [p.text() for p in backing.running()]
    running = ws.lifecycle.status().get("running") if ws.lifecycle is not None else None
    if running:
        total = f" {running['done']}/{running['total']}" if running.get("total") else ""
        out.append(f"gc: {running['phase']}{total}")
    if not out and (pending := ws.mutation_seq - ws.durable_seq):
        out.append(f"committing ({pending} change(s) pending)")
    return out


async def _handle_client(conn, ws: Workspace, backing: Backing, ops: MemfsOperations,
                         requests: Requests) -> None:
    stream = trio.SocketStream(conn)
    try:
        async with stream:
            buf = bytearray()
            while not buf.endswith(b"\n") and len(buf) < MAX_LINE:
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    return
                buf += chunk
            try:
                req = json.loads(buf)
                op, args = req["op"], req.get("args") or {}
            except Exception as exc:  # noqa: BLE001 - every request is answered (a nest too deep)
                await stream.send_all(encode_reply(error=MemfsError(
                    f"a malformed control request ({exc})", "upgrade the CLI and daemon "
                    "together")))
                return

            async def run() -> object:
                result = await _dispatch(ws, backing, ops, op, args)
                if op in ("status", "sync"):  # what runs now, and the last long requests
                    result = {**result, "requests": requests.status_json()}  # type: ignore[dict-item]
                return result

            await requests.answer(stream, op, args, bool(req.get("progress")), run)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.info("control client went away: %s", exc)


async def _undo(ws: Workspace, args: dict, cut: list[CutOff]) -> dict:
    """`memfs undo`: N operations (default), `commits` N commits, or `to` a moment. A bare
    `steps` is what an older CLI sends: commits."""
    disk_too = bool(args.get("disk_too"))
    if args.get("to") is not None:
        return (await ws.undo_to(str(args["to"]), disk_too=disk_too, cut_off=cut)).to_json()
    if args.get("commits") is not None or args.get("steps") is not None:
        n = int(args["commits"] if args.get("commits") is not None else args["steps"])
        return (await ws.undo_commits(n, disk_too=disk_too, cut_off=cut)).to_json()
    return (await ws.undo_operations(int(args.get("ops", 1)), disk_too=disk_too,
                                     cut_off=cut)).to_json()


async def _left_behind(store: StoreBackend, old: str, new: str) -> list[list]:
    """`procs` of a restore's or a switch's answer, as an undo's: the processes whose
    changes the move took out of the tree (the CLI names those still running). Store reads:
    a worker thread."""
    procs = await trio.to_thread.run_sync(undo.procs_left_behind, store, old, new)
    return [list(p) for p in procs]


async def _dispatch(ws: Workspace, backing: Backing, ops: MemfsOperations, op: str,
                    args: dict) -> object:
    store = ws.store
    if ws.stopped and op not in READ_ONLY_OPS:
        where = ws.served_by.mountpoint if ws.served_by else "MNT"
        raise MemfsError(f"memfs is unmounting {where} and takes no more changes",
                         f"wait for it to exit, then `memfs mount {where}` mounts it again")
    if op == "ping":
        return {"pid": os.getpid(),
                "mountpoint": ws.served_by.mountpoint if ws.served_by else None}
    if op == "status":
        await backing.refresh_status()
        await ws.refresh_policy()
        return ws.status()
    if op == "requests":
        return dict(ops.requests)
    if op == "sync":
        await ws.sync()
        await backing.refresh_status()
        await ws.refresh_policy()
        return ws.status()
    if op == "log":  # store reads in a worker thread: on PostgreSQL each is a round trip
        log_of = await trio.to_thread.run_sync(store.log, args.get("branch"),
                                               int(args.get("n", 20)))
        return [c.to_json() for c in log_of]
    if op == "branch_list":
        return {"current": ws.branch, "branches": await trio.to_thread.run_sync(store.branches)}
    result: object
    cut: list[CutOff] = []  # the writers an undo, restore or switch cut off
    if op == "undo":
        result = await _undo(ws, args, cut)
    elif op == "restore":
        head, old_head = await ws.restore(args["rev"], cut_off=cut)
        result = {"head": head, "old_head": old_head,
                  "procs": await _left_behind(store, old_head, head)}
    elif op == "checkpoint":
        made = await ws.checkpoint(args["name"], args.get("at"), force=bool(args.get("force")))
        result = {**made.checkpoint.to_json(), "moved_from": made.moved_from}
    elif op == "checkpoint_delete":
        result = (await ws.delete_checkpoint(args["name"])).to_json()
    elif op == "mark":
        m = await ws.mark(args["name"])
        result = {"name": m.name, "commit": m.commit, "branch": m.branch, "time": m.time_ns / 1e9}
    elif op == "branch_create":
        result = {"branch": args["name"], "commit": await ws.create_branch(args["name"], args.get("at"))}
    elif op == "branch_switch":
        was = ws.branch
        head = await ws.switch_branch(args["name"], cut_off=cut)
        left = await trio.to_thread.run_sync(store.head, was)  # with what the switch committed
        result = {"branch": args["name"], "head": head,
                  "procs": await _left_behind(store, left, head)}
    elif op in ("gc", "du"):
        lifecycle = ws.lifecycle
        assert lifecycle is not None  # the daemon installs one before serving
        result = await lifecycle.collect(dry_run=op == "du" or bool(args.get("dry_run")),
                                         trigger="manual" if op == "gc" else "du")
    elif op == "takeover":
        assert ws.hosts is not None  # installed before serving
        result = await ws.hosts.takeover(args["branch"])
    elif op.startswith("backing_"):
        if op == "backing_after_batch":  # an agent's tool batch ended: an operation boundary
            await _batch_mark(ws, args.get("agent"))
        result = await backing.control(op, args)
    else:
        raise MemfsError(f"unknown control request {op!r}", "upgrade the CLI and daemon together")
    if op in ("undo", "restore", "branch_switch", "takeover"):
        await backing.pass_all()  # disk-only nodes are not in any commit: show them again
    if op in ("undo", "restore", "branch_switch") and isinstance(result, dict):
        result = {**result, "cut_off": [c.to_json() for c in cut]}
    await ops.drain_invalidations()
    return result
