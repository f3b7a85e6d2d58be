"""Store commands: restore, branch, fsck (mount_cmds has init, mount and umount; status_cmd
status; history_cmds has log, reflog, undo, diff, show, checkpoint and mark).

Each asks the running daemon first (so the mount sees the change at once) and opens the
store directly when no daemon serves the root.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memfs.cli.answer import ask
from memfs.cli.cutoff_text import cut_off_lines, still_running_lines
from memfs.cli.main import add_json_flag, emit
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root
from memfs.store import StoreBackend as Store
from memfs.store import open_store, undo


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("restore", help="move the branch to REV (commit, checkpoint, branch)")
    p.add_argument("rev")
    add_json_flag(p)
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("branch", help="list, create or switch branches")
    p.add_argument("action", nargs="?", default="list", choices=["list", "create", "switch"])
    p.add_argument("name", nargs="?")
    p.add_argument("--at", help="revision to branch from (default: the head)")
    add_json_flag(p)
    p.set_defaults(func=cmd_branch)

    p = sub.add_parser("takeover", help="move BRANCH's writer lease here once its host's "
                                        "lease expired (a store shared in PostgreSQL)")
    p.add_argument("branch")
    add_json_flag(p)
    p.set_defaults(func=cmd_takeover)

    p = sub.add_parser("fsck", help="check every commit's objects, chunks and link counts, "
                       "and every memory generation")
    add_json_flag(p)
    p.set_defaults(func=cmd_fsck)


def _root(args) -> Path:
    return resolve_root(args.root)


def _ask(args, op: str, direct, **kw):
    """The daemon's answer, or `direct(store)` (memfs.cli.answer)."""
    return ask(_root(args), op, direct, **kw)


def cmd_restore(args) -> int:
    if ":" in args.rev:  # REV:PATH is `show`'s spelling of one file; restore moves the branch
        rev, _, path = args.rev.partition(":")
        raise MemfsError(
            f"memfs restore moves the whole branch to a revision; {args.rev!r} names one file",
            f"to take back one file, copy it out of the read-only history: cp -p "
            f"MNT/.memfs/history/ID/{path} MNT/{path} (ID: `memfs log -n 1 {rev}`), or "
            f"memfs show {args.rev} > FILE; the copy is an operation `memfs undo` takes back")
    def direct(store: Store) -> dict:
        from memfs.store import history

        target = history.resolve(store, args.rev)
        old = store.head(store.current_branch())
        store.reset_head(store.current_branch(), target, f"restore {args.rev}")
        return {"head": target, "old_head": old, "cut_off": [],  # no daemon: nothing open
                "procs": [list(p) for p in undo.procs_left_behind(store, old, target)]}

    res = _ask(args, "restore", direct, rev=args.rev)
    text = f"head is now {res['head'][:12]}"
    if res["old_head"] != res["head"]:  # what the branch held until now stays one command away
        text += (f" (it was {res['old_head'][:12]})\n  to go back: memfs restore "
                 f"{res['old_head'][:12]}")
    emit(args, res, "\n".join([text, *still_running_lines(res, "restore"),
                               *cut_off_lines(res, _root(args))]))
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
        old = store.head(store.current_branch())
        store.set_current_branch(args.name)
        head = store.head(args.name)
        return {"branch": args.name, "head": head, "cut_off": [],
                "procs": [list(p) for p in undo.procs_left_behind(store, old, head)]}

    res = _ask(args, "branch_switch", direct_switch, name=args.name)
    emit(args, res, "\n".join([f"switched to {args.name} ({res['head'][:12]})",
                               *still_running_lines(res, "switch"),
                               *cut_off_lines(res, _root(args))]))
    return 0


def cmd_takeover(args) -> int:
    """In a daemon: the lease, then the branch shown writable from its last durable commit.
    Without one: the lease is this root's, so the next `memfs mount` here writes the branch."""
    def direct(store: Store) -> dict:
        claim = store.takeover(args.branch)
        was = store.current_branch()
        store.set_current_branch(args.branch)
        return {"branch": args.branch, "head": store.head(args.branch),
                "switched_from": None if was == args.branch else was, **claim.to_json(),
                "cut_off": []}  # no daemon: nothing open

    res = _ask(args, "takeover", direct, branch=args.branch)
    text = (f"this host now writes branch {args.branch} (from {res['head'][:12]}, "
            "its last durable commit)")
    if res["switched_from"]:  # the mount showed another branch: say so, and the way back
        text += (f"\n  the mount now shows {args.branch}; it showed {res['switched_from']} "
                 f"(committed): memfs branch switch {res['switched_from']} goes back")
    emit(args, res, "\n".join([text, *cut_off_lines(res, _root(args))]))
    return 0


def cmd_fsck(args) -> int:
    from memfs.consolidate.memory_retention import memory_fsck

    root = _root(args)
    store = open_store(root, create=False)
    try:
        problems = store.fsck()
    finally:
        store.close()
    problems += memory_fsck(root)
    emit(args, {"ok": not problems, "problems": problems},
         "store is consistent" if not problems else "\n".join(problems))
    return 0 if not problems else 1
