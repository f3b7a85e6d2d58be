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
from pathlib import Path

import pyfuse3
import trio

from memfs.control import MAX_LINE, encode_reply
from memfs.errors import MemfsError
from memfs.fs.operations import MemfsOperations
from memfs.rootdir import control_socket
from memfs.workspace.agent_memory import recover_reviews
from memfs.workspace.backing import Backing
from memfs.workspace.lifecycle import Lifecycle
from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.daemon")
STOP_DRAIN_LIMIT = 60  # seconds a stop waits for running backing work before cutting it
STOP_COMMIT_LIMIT = 60  # seconds a stop retries a failing last commit (a full disk)
READ_ONLY_OPS = ("ping", "status", "log", "branch_list", "backing_events", "backing_states")


class RootLock:
    """flock on <root>/daemon.lock; its content names the holder for the refusal message."""

    def __init__(self, root: Path, mountpoint: Path) -> None:
        self.path = root / "daemon.lock"
        root.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise MemfsError(
                f"the store at {root} is already served by another memfs daemon ({holder})",
                "use that mount, or `memfs umount` it first",
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}).encode(), 0)

    def release(self) -> None:
        os.ftruncate(self.fd, 0)
        os.close(self.fd)


def run_daemon(root: Path, mountpoint: Path, commit_interval: float, debug: bool = False) -> int:
    lock = RootLock(root, mountpoint)
    recover_reviews(root)
    ws = Workspace.open(root, commit_interval)
    store = ws.store
    Backing(ws)
    Lifecycle(ws)
    ops = MemfsOperations(ws)
    options = set(pyfuse3.default_options) | {"fsname=memfs", "subtype=memfs"}
    if os.getuid() == 0:
        options.add("allow_other")
    if debug:
        options.add("debug")
    pyfuse3.init(ops, str(mountpoint), options)
    mounted = True
    try:
        trio.run(_serve, ws, ops, root)
    except BaseException:
        log.exception("daemon stopped by an error")
        raise
    finally:
        try:
            pyfuse3.close(unmount=mounted)
        finally:
            if ws.backing is not None:
                ws.backing.close()
            store.close()
            sock = control_socket(root)
            if sock.exists():
                sock.unlink()
            lock.release()
    return 0


async def _serve(ws: Workspace, ops: MemfsOperations, root: Path) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ws.run)
        nursery.start_soon(ws.lifecycle.run)
        nursery.start_soon(_signals, ws)
        await nursery.start(_control_server, ws, ops, root)
        nursery.start_soon(_initial_passes, ws, ops)
        if ws.backing is not None:
            nursery.start_soon(ws.backing.run_watchers, ops.drain_invalidations)
        await pyfuse3.main()
        await _stop(ws)
        nursery.cancel_scope.cancel()


async def _stop(ws: Workspace) -> None:
    """The mount has ended. Backing work first: watchers stopped, queued work drained, new work
    refused (backing.stop). Then the workspace refuses changes, and what is pending is
    committed. A drain that outlasts STOP_DRAIN_LIMIT (a pass stuck on a hung disk) is no
    longer waited for before the commit (the write-ahead intents make that no worse than a
    crash); work already in a thread or a shielded scope still holds the process's exit."""
    if ws.backing is not None:
        log.info("mount ended; stopping backing work")
        with trio.move_on_after(STOP_DRAIN_LIMIT) as limit:
            await ws.backing.stop()
        if limit.cancelled_caught:
            log.warning("backing work still running after %d s; stopping anyway",
                        STOP_DRAIN_LIMIT)
            ws.backing.stopped = True
    log.info("committing what is pending")
    ws.stopped = True
    await ws.final_commit("unmount", STOP_COMMIT_LIMIT)


async def _initial_passes(ws: Workspace, ops: MemfsOperations) -> None:
    """Backed mounts are observed once at start (the mount shows disk's truth from the start)."""
    if ws.backing is not None and ws.backing.bindings:
        log.info("initial passes: %s", await ws.backing.pass_all())
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


async def _control_server(ws: Workspace, ops: MemfsOperations, root: Path,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    path = control_socket(root)
    if path.exists():
        path.unlink()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(16)
    task_status.started()
    async with trio.open_nursery() as nursery:
        while True:
            conn, _ = await sock.accept()
            nursery.start_soon(_handle_client, conn, ws, ops)


async def _handle_client(conn, ws: Workspace, ops: MemfsOperations) -> None:
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
                result = await _dispatch(ws, ops, req["op"], req.get("args") or {})
                reply = encode_reply(result)
            except Exception as exc:  # noqa: BLE001 - every failure is answered
                log.warning("control request failed: %s", exc)
                reply = encode_reply(error=exc)
            await stream.send_all(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.info("control client went away: %s", exc)


async def _dispatch(ws: Workspace, ops: MemfsOperations, op: str, args: dict) -> object:
    store = ws.store
    if ws.stopped and op not in READ_ONLY_OPS:
        raise MemfsError("memfs has stopped", "mount the store again (`memfs mount`)")
    if op == "ping":
        return {"pid": os.getpid()}
    if op == "status":
        return ws.status()
    if op == "sync":
        await ws.sync()
        return ws.status()
    if op == "log":
        return [c.to_json() for c in store.log(args.get("branch"), int(args.get("n", 20)))]
    if op == "branch_list":
        return {"current": ws.branch, "branches": store.branches()}
    result: object
    if op == "undo":
        result = {"head": await ws.undo(int(args.get("steps", 1)))}
    elif op == "restore":
        result = {"head": await ws.restore(args["rev"])}
    elif op == "checkpoint":
        result = {"commit": await ws.checkpoint(args["name"])}
    elif op == "branch_create":
        result = {"branch": args["name"], "commit": await ws.create_branch(args["name"], args.get("at"))}
    elif op == "branch_switch":
        result = {"branch": args["name"], "head": await ws.switch_branch(args["name"])}
    elif op in ("gc", "du"):
        result = await ws.lifecycle.collect(dry_run=op == "du" or bool(args.get("dry_run")),
                                            trigger="manual" if op == "gc" else "du")
    elif op.startswith("backing_") and ws.backing is not None:
        result = await ws.backing.control(op, args)
    else:
        raise MemfsError(f"unknown control request {op!r}", "upgrade the CLI and daemon together")
    if op in ("undo", "restore", "branch_switch") and ws.backing is not None:
        await ws.backing.pass_all()  # disk-only nodes are not in any commit: show them again
    await ops.drain_invalidations()
    return result
