"""Store commands: log, reflog, undo, restore, checkpoint, branch, fsck (mount_cmds has
init, mount, umount and status).

Each asks the running daemon first (so the mount sees the change at once) and opens the
store directly when no daemon serves the root.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from memfs.cli.main import add_json_flag, emit
from memfs.control import NoDaemon, call
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root
from memfs.store import Store


def register(sub: argparse._SubParsersAction) -> None:
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
