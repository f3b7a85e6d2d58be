"""Store commands: init, mount, umount, status, log, undo, checkpoint, branch, fsck.

Each asks the running daemon first (so the mount sees the change at once) and opens the
store directly when no daemon serves the root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from memfs.cli.gc_cmds import add_policy_flags, policy_from_flags, status_lines
from memfs.cli.main import add_json_flag, emit
from memfs.control import NoDaemon, call
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root
from memfs.store import Store
from memfs.store.gc import last_run
from memfs.store.retention import Policy


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="create the store (idempotent)")
    add_policy_flags(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("mount", help="mount the store at MOUNTPOINT")
    p.add_argument("mountpoint")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("--commit-interval", type=int, default=100, metavar="MS",
                   help="group-commit delay in milliseconds (default 100)")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--bind", action="append", default=[], metavar="NAME=DIR",
                   help="bind store mount NAME to backing directory DIR first (as `memfs attach`)")
    add_json_flag(p)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="commit everything and unmount")
    p.add_argument("mountpoint")
    add_json_flag(p)
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser("status", help="branch, head, what is not yet durable, mounts")
    add_json_flag(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("log", help="commits of the current branch, newest first")
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--branch")
    add_json_flag(p)
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("reflog", help="undo/restore moves of branch heads, newest first")
    p.add_argument("-n", type=int, default=20)
    add_json_flag(p)
    p.set_defaults(func=cmd_reflog)

    p = sub.add_parser("undo", help="move the branch back N commits (default 1)")
    p.add_argument("steps", nargs="?", type=_positive, default=1)
    add_json_flag(p)
    p.set_defaults(func=cmd_undo)

    p = sub.add_parser("restore", help="move the branch to REV (commit, checkpoint, branch)")
    p.add_argument("rev")
    add_json_flag(p)
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("checkpoint", help="name the current state")
    p.add_argument("name")
    add_json_flag(p)
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser("branch", help="list, create or switch branches")
    p.add_argument("action", nargs="?", default="list", choices=["list", "create", "switch"])
    p.add_argument("name", nargs="?")
    p.add_argument("--at", help="revision to branch from (default: the head)")
    add_json_flag(p)
    p.set_defaults(func=cmd_branch)

    p = sub.add_parser("fsck", help="check that every commit's objects and chunks exist")
    add_json_flag(p)
    p.set_defaults(func=cmd_fsck)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of commits")
    return n


def _root(args) -> Path:
    return resolve_root(args.root)


def _ask(args, op: str, direct, **kw):
    """The daemon's answer, or `direct(store)` when no daemon serves the root."""
    root = _root(args)
    try:
        return call(root, op, **kw)
    except NoDaemon:
        store = Store.open(root, create=False)
        try:
            return direct(store)
        finally:
            store.close()


def cmd_init(args) -> int:
    root = _root(args)
    policy_from_flags(args, Policy())  # a bad value is refused before anything is created
    store = Store.open(root)
    try:
        policy = policy_from_flags(args, store.policy())
        if policy is not None:
            store.set_policy(policy)
        head = store.head()
    finally:
        store.close()
    emit(args, {"root": str(root), "head": head}, f"memfs store ready at {root}")
    return 0


def cmd_mount(args) -> int:
    root = _root(args)
    mnt = Path(args.mountpoint).absolute()
    binds = [_parse_bind(b) for b in args.bind]
    try:
        holder = call(root, "ping", timeout=5)
        raise MemfsError(f"the store at {root} is already served by memfs (pid {holder['pid']})",
                         "use that mount, or `memfs umount` it first")
    except NoDaemon:
        pass
    if not mnt.is_dir():
        raise MemfsError(f"mountpoint {mnt} is not a directory", f"create it: mkdir -p {mnt}")
    if os.path.ismount(mnt):
        raise MemfsError(f"{mnt} is already a mount point", f"unmount it first: memfs umount {mnt}")
    real_root, real_mnt = root.resolve(), mnt.resolve()
    if real_root == real_mnt or real_mnt in real_root.parents:
        # The daemon would reach its own store through its own mount and hang.
        raise MemfsError(f"the store root {root} is inside the mountpoint {mnt}",
                         "put the store elsewhere (--root or MEMFS_ROOT) or mount somewhere else")
    interval = max(0, args.commit_interval) / 1000.0
    if binds:
        from memfs.cli.reconcile_cmds import attach_before_mount

        Store.open(root).close()
        for name, directory in binds:
            attach_before_mount(root, name, directory)
    if args.foreground:
        from memfs.fs.daemon import run_daemon
        from memfs.fs.logs import setup_logging

        setup_logging(root, args.debug)
        return run_daemon(root, mnt, interval, args.debug)
    return _spawn_daemon(args, root, mnt)


def _parse_bind(text: str) -> tuple[str, str]:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise MemfsError(f"--bind {text!r} is not NAME=DIR", "e.g. --bind work=~/project")
    return name, os.path.expanduser(directory)


def _spawn_daemon(args, root: Path, mnt: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / "daemon.log"
    cmd = [sys.executable, "-m", "memfs", "--root", str(root), "mount", str(mnt), "--foreground",
           "--commit-interval", str(args.commit_interval)]
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.ismount(mnt):
            emit(args, {"mountpoint": str(mnt), "pid": proc.pid, "root": str(root)},
                 f"memfs mounted at {mnt} (pid {proc.pid}, store {root})")
            return 0
        if proc.poll() is not None:
            tail = logfile.read_text(errors="replace").splitlines()[-5:]
            raise MemfsError("the memfs daemon exited before mounting:\n  " + "\n  ".join(tail),
                             f"full log: {logfile}")
        time.sleep(0.05)
    raise MemfsError(f"{mnt} did not appear within 30 s", f"see {logfile}")


def cmd_umount(args) -> int:
    root = _root(args)
    mnt = Path(args.mountpoint).absolute()
    pid = None
    try:
        pid = call(root, "ping")["pid"]
        call(root, "sync")
    except NoDaemon:
        pass
    except MemfsError as exc:  # nothing was unmounted: the mount stays usable
        raise MemfsError(f"{mnt} stays mounted: {exc.message}",
                         f"{exc.remedy}; then `memfs umount` again" if exc.remedy else
                         "see `memfs status`, then `memfs umount` again") from None
    res = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        raise MemfsError(f"could not unmount {mnt}: {res.stderr.strip()}",
                         "close the shells and programs using it (see `fuser -m`), then retry")
    if pid:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
    emit(args, {"unmounted": str(mnt)}, f"unmounted {mnt}; everything was committed")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def cmd_status(args) -> int:
    def direct(store: Store) -> dict:
        from memfs.store.trees import decode_dir

        head = store.head()
        tree = store.commit(head).tree
        mounts = sorted(e.name for e in decode_dir(store.read_object(tree)))
        policy = store.policy()
        return {"root": str(store.root), "branch": store.current_branch(), "head": head,
                "pending": 0, "durable": True, "mounts": mounts, "daemon": None,
                "retention": {**policy.to_json(), "summary": policy.summary()},
                "gc": {"running": None, "last": last_run(store)}}

    st = _ask(args, "status", direct)
    lines = [f"root     {st['root']}", f"branch   {st['branch']}", f"head     {st['head'][:12]}",
             f"pending  {st['pending']} change(s) not yet durable",
             *status_lines(st),
             f"mounts   {', '.join(st['mounts']) or '(none)'}"]
    refusing = [b["journal"] for b in (st.get("backing") or {}).values() if b.get("journal")]
    if refusing:  # one journal serves every mount: said once
        lines.append(f"journal  REFUSING: {refusing[0]['error']} — {refusing[0]['remedy']}")
    for mount, b in sorted((st.get("backing") or {}).items()):
        states = ", ".join(f"{n} {k}" for k, n in sorted(b.get("states", {}).items()))
        where = b.get("dir", "?") if b.get("available", True) else (
            f"{b.get('dir', '?')} UNAVAILABLE: {b.get('unavailable')}")
        o = b.get("owed") or {}
        owes = (f"; disk owes {o.get('changes', 0)} change(s), {o.get('workspace_deletions', 0)}"
                f" deletion(s), {o.get('conflicts', 0)} conflict(s)") if o else ""
        sc = b.get("scans") or {}
        scans = (f"; {sc.get('count', 0)} after-batch scan(s)"
                 f"{', running late' if sc.get('running_late') else ''}") if sc else ""
        lines.append(f"backed   {mount} -> {where} (watch {b.get('watch')}; {states or 'no files'}"
                     f"{'; ' + str(len(b['conflicts'])) + ' conflict(s)' if b.get('conflicts') else ''}"
                     f"{owes}{scans})")
    emit(args, st, "\n".join(lines))
    return 0


def cmd_log(args) -> int:
    commits = _ask(args, "log", lambda s: [c.to_json() for c in s.log(args.branch, args.n)],
                   n=args.n, branch=args.branch)
    lines = []
    for c in commits:
        when = datetime.fromtimestamp(c["time"]).strftime("%Y-%m-%d %H:%M:%S")
        who = ", ".join(sorted({f"{p['comm']}[{p['pid']}]" for p in c["processes"]}))
        lines.append(f"{c['id'][:12]}  {when}  {c['message']}" + (f"  by {who}" if who else ""))
    emit(args, commits, "\n".join(lines))
    return 0


def cmd_reflog(args) -> int:
    store = Store.open(_root(args), create=False)  # a read: safe beside a running daemon (WAL)
    try:
        moves = store.reflog(args.n)
    finally:
        store.close()
    lines = [f"{datetime.fromtimestamp(m['time']).strftime('%Y-%m-%d %H:%M:%S')}  {m['branch']}  "
             f"{(m['old'] or '-')[:12]} -> {m['new'][:12]}  {m['reason']}" for m in moves]
    emit(args, moves, "\n".join(lines) or "no undo or restore yet")
    return 0


def cmd_undo(args) -> int:
    def direct(store: Store) -> dict:
        branch = store.current_branch()
        target = store.resolve(f"{store.head(branch)}~{args.steps}")
        store.reset_head(branch, target, f"undo {args.steps}")
        return {"head": target}

    res = _ask(args, "undo", direct, steps=args.steps)
    emit(args, res, f"undid {args.steps} commit(s); head is now {res['head'][:12]}"
                    " (to go back: `memfs reflog`, then `memfs restore <old>`)")
    return 0


def cmd_restore(args) -> int:
    def direct(store: Store) -> dict:
        target = store.resolve(args.rev)
        store.reset_head(store.current_branch(), target, f"restore {args.rev}")
        return {"head": target}

    res = _ask(args, "restore", direct, rev=args.rev)
    emit(args, res, f"head is now {res['head'][:12]}")
    return 0


def cmd_checkpoint(args) -> int:
    res = _ask(args, "checkpoint", lambda s: {"commit": s.checkpoint(args.name)}, name=args.name)
    emit(args, {"name": args.name, **res}, f"checkpoint {args.name} at {res['commit'][:12]}")
    return 0


def cmd_branch(args) -> int:
    if args.action == "list":
        res = _ask(args, "branch_list",
                   lambda s: {"current": s.current_branch(), "branches": s.branches()})
        lines = [("* " if n == res["current"] else "  ") + f"{n}  {h[:12]}"
                 for n, h in sorted(res["branches"].items())]
        emit(args, res, "\n".join(lines))
        return 0
    if not args.name:
        raise MemfsError(f"`memfs branch {args.action}` needs a NAME", "e.g. memfs branch create try")
    if args.action == "create":
        res = _ask(args, "branch_create",
                   lambda s: {"branch": args.name, "commit": s.create_branch(args.name, args.at)},
                   name=args.name, at=args.at)
        emit(args, res, f"created branch {args.name} at {res['commit'][:12]}")
        return 0

    def direct_switch(store: Store) -> dict:
        store.set_current_branch(args.name)
        return {"branch": args.name, "head": store.head(args.name)}

    res = _ask(args, "branch_switch", direct_switch, name=args.name)
    emit(args, res, f"switched to {args.name} ({res['head'][:12]})")
    return 0


def cmd_fsck(args) -> int:
    store = Store.open(_root(args), create=False)
    try:
        problems = store.fsck()
    finally:
        store.close()
    emit(args, {"ok": not problems, "problems": problems},
         "store is consistent" if not problems else "\n".join(problems))
    return 0 if not problems else 1
