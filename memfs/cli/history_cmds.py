"""History commands: log, reflog, undo, diff, show, checkpoint, mark.

Reads (log, reflog, diff, show, checkpoint list) open the store read-only, whether or not a
daemon runs (WAL lets them read beside it); `now` asks a running daemon to commit what is
pending first. Changes (undo, checkpoint create/delete, mark) go through the daemon so the
mount shows them at once, and open the store directly when none runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memfs.cli.answer import ask
from memfs.cli.cutoff_text import cut_off_lines, mountpoint, still_running_lines
from memfs.cli.history_text import (
    change_lines,
    commit_line,
    diff_text,
    gap_line,
    kind_name,
    listing_lines,
    span_json,
    span_line,
    when,
)
from memfs.cli.main import add_json_flag, emit
from memfs.control import NoDaemon, call
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root
from memfs.store import StoreBackend as Store
from memfs.store import history, open_store_readonly, undo
from memfs.store.history import History, parse_when
from memfs.store.opspan import walk
from memfs.store.store import UnknownRevision
from memfs.store.treediff import (
    DIR,
    FILE,
    LINK,
    TreeState,
    commit_state,
    diff_trees,
    file_pieces,
    find_entry,
    listing,
)
from memfs.store.undo import changed_only_times

NOW = "now"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("log", help="commits (or operations) of the current branch, newest first")
    p.add_argument("what", nargs="*", metavar="[REV] [--] [PATH]",
                   help="start at REV (default: the head); only commits that changed a PATH")
    p.add_argument("-n", type=_count, default=20, metavar="N", help="how many (default 20; 0: all)")
    p.add_argument("--branch")
    p.add_argument("--since", metavar="TIME", help="only newer than TIME (10:32, 5m, ISO ...)")
    p.add_argument("--ops", action="store_true", help="one entry per operation (what undo takes)")
    p.add_argument("--stat", action="store_true", help="paths changed, with sizes")
    p.add_argument("--paths", action="store_true", help="paths changed (A, M, D, R)")
    add_json_flag(p)
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("reflog", help="moves of branch heads and checkpoints, newest first")
    p.add_argument("-n", type=_count, default=20, metavar="N", help="how many (default 20)")
    add_json_flag(p)
    p.set_defaults(func=cmd_reflog)

    p = sub.add_parser("undo", help="undo the last operation (a command and its children)")
    p.add_argument("count", nargs="?", type=_positive, default=None, metavar="N",
                   help="how many operations (default 1)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--commits", type=_positive, metavar="N", help="the last N commits instead")
    how.add_argument("--to", metavar="TIME|REV", help="back to a moment or a revision")
    p.add_argument("--disk-too", action="store_true",
                   help="also take back edits a bound directory's reconciler took in (refused "
                        "otherwise: their older copies would be written over them on disk)")
    add_json_flag(p)
    p.set_defaults(func=cmd_undo)

    p = sub.add_parser("diff", help="what differs between two states: memfs diff [A] [B] [-- PATH...]")
    p.add_argument("--stat", action="store_true", help="paths and sizes only")
    add_json_flag(p)
    p.add_argument("spec", nargs=argparse.REMAINDER,
                   help="A (default: before the last operation), B (default: now), -- PATH...")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("show", help="a commit, or REV:PATH as it was (a file's bytes)")
    p.add_argument("what", metavar="REV[:PATH]")
    add_json_flag(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("checkpoint", help="checkpoint list | create NAME | delete NAME (or NAME)")
    p.add_argument("action", nargs="?", default="list", metavar="list|create|delete|NAME")
    p.add_argument("name", nargs="?")
    p.add_argument("--at", metavar="REV", help="name this revision instead of the current state")
    p.add_argument("--force", action="store_true", help="move an existing name")
    add_json_flag(p)
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser("mark", help="end the current operation here and name the point")
    p.add_argument("name")
    add_json_flag(p)
    p.set_defaults(func=cmd_mark)


def _count(text: str) -> int:
    """-n N: 0 or more (a negative count is a typo, not "all")."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative (0 lists all)")
    return n


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return n


# -- plumbing ------------------------------------------------------------------------------
def _root(args) -> Path:
    return resolve_root(args.root)


def _read(args) -> Store:
    return open_store_readonly(_root(args))


def _ask(args, op: str, direct, **kw):
    """The daemon's answer, or `direct(store)` (memfs.cli.answer)."""
    return ask(_root(args), op, direct, **kw)


def _commit_pending(args) -> None:
    """A running daemon commits what is pending first: `now` is the live tree, and the
    command that just ran is in the log (not 100 ms later)."""
    try:
        call(_root(args), "sync")
    except NoDaemon:
        pass


def _mountpoint(args) -> Path | None:
    return mountpoint(_root(args))


def _store_path(args, path: str) -> str:
    """A path from the store root (`work/a.txt`); `./x`, `../x` or an absolute path inside
    the mount are taken from where they point."""
    if not (path.startswith(("./", "../", "/")) or path in (".", "..")):
        return path.strip("/")
    mnt = _mountpoint(args)
    full = Path(os.path.abspath(path))
    if mnt is None or not (full == mnt or mnt in full.parents):
        raise MemfsError(f"{path} is not inside the memfs mount{f' at {mnt}' if mnt else ''}",
                         "name it from the store root, e.g. work/src/a.txt")
    return str(full.relative_to(mnt)) if full != mnt else ""


# -- log -------------------------------------------------------------------------------------
def _log_args(args, store: Store) -> tuple[str | None, list[str]]:
    """`memfs log [REV] [--] [PATH ...]` as git reads it: the first word is a revision if it
    names one, else it and the rest are paths (argparse drops the `--`)."""
    what = list(args.what)
    if not what or what[0].startswith(("./", "../", "/")):
        return None, [_store_path(args, p) for p in what]
    try:
        history.resolve(store, what[0])
        return what[0], [_store_path(args, p) for p in what[1:]]
    except UnknownRevision:
        first = what[0].strip("/")
        if "/" not in first and not find_entry(store, commit_state(store, store.head()), first):
            raise MemfsError(f"{what[0]!r} is neither a revision nor a path in the head",
                             "give a branch, checkpoint, mark or commit id (6+ hex digits), or a "
                             "path from the store root (work/a.txt; ./a.txt from inside the "
                             "mount)") from None
    return None, [_store_path(args, p) for p in what]


def cmd_log(args) -> int:
    _commit_pending(args)  # the command that just ran is in the log, not 100 ms later
    store = _read(args)
    try:
        rev, paths = _log_args(args, store)
        head = history.resolve(store, rev) if rev else store.head(args.branch)
        hist = History(store, head)
        since = parse_when(args.since) if args.since else None
        limit = args.n if args.n > 0 else None
        changes = args.stat or args.paths
        docs, lines = [], []
        def touched(newest, oldest):
            """What newest..oldest changed: to show (--stat, --paths), or to keep only the
            commits that changed a PATH; None when neither is asked."""
            if not (changes or paths):
                return None
            return diff_trees(store, _base(store, hist, oldest), commit_state(store, newest.id),
                              paths or None)

        entries = ((s, s.commits[0], s.commits[-1]) for s in _op_spans(store, hist, None, since)
                   ) if args.ops else ((c, c, c) for c in _commits(hist, None, since))
        for entry, newest, oldest in entries:
            ch = touched(newest, oldest)
            if paths and not ch:
                continue
            shown = ch if changes else None
            if args.ops:
                doc = span_json(entry, shown)
                lines.append(span_line(entry))
            else:
                doc = entry.to_json()
                if shown is not None:
                    doc["changes"] = [x.to_json() for x in shown]
                lines.append(commit_line(entry))
            lines += change_lines(shown, args.stat) if shown is not None else []
            _gaps(hist, entry.commits if args.ops else (entry,), doc, lines)
            docs.append(doc)
            if limit is not None and len(docs) >= limit:
                break
    finally:
        store.close()
    emit(args, docs, "\n".join(lines) or ("no commits" if not paths else
                                          f"no commits changed {' '.join(paths)}"))
    return 0


def _commits(hist: History, limit: int | None, since: int | None):
    for i, c in enumerate(hist):
        if (limit is not None and i >= limit) or (since is not None and c.time_ns < since):
            return
        yield c


def _op_spans(store: Store, hist: History, limit: int | None, since: int | None):
    """Operations as successive undos take them (memfs.store.opspan.walk)."""
    if limit is not None and limit < 1:
        return
    for n, s in enumerate(walk(hist.get, quiet=changed_only_times(store)), 1):
        if since is not None and s.commits[0].time_ns < since:
            return
        yield s
        if limit is not None and n >= limit:
            return


def _from_cwd(args, store: Store, trees: list[TreeState], path: str) -> str | None:
    """A path given from the store root that is really one from the current directory inside
    the mount: its store path, if one of `trees` holds it there (for the remedy)."""
    if path.startswith(("./", "../", "/")):
        return None
    try:
        here = _store_path(args, "./" + path)
    except MemfsError:  # not inside the mount
        return None
    if here == path.strip("/") or not any(find_entry(store, t, here) for t in trees):
        return None
    return here


def _absent_remedy(args, store: Store, trees: list[TreeState], given: str, path: str) -> str:
    """What to do about a path neither state holds: the store path meant from the current
    directory, or where to look when the path already starts at a mount of the store."""
    here = _from_cwd(args, store, trees, given)
    if here:
        return f"paths go from the store root: -- {here} (or -- ./{given} from here)"
    top, _, _ = path.partition("/")
    if any(find_entry(store, t, top) for t in trees):  # from the store root already: a typo?
        parent = path.rpartition("/")[0]
        return f"check the name: `memfs show HEAD:{parent}` lists what is there now"
    mounts = sorted({e for t in trees for e in _top_names(store, t)})
    return (f"name it from the store root, e.g. -- {mounts[0]}/{given}" if mounts else
            "name it from the store root, e.g. -- work/a.txt")


def _top_names(store: Store, state: TreeState) -> list[str]:
    return [e.name for e in listing(store, state, state.tree)]


def _base(store: Store, hist: History, c) -> TreeState | None:
    """The tree a commit's changes are read against: its parent's, or, when the retention
    policy dropped the parent, the nearest kept ancestor's (the gap's changes come with it)."""
    gap = hist.gap_below(c.id)
    return commit_state(store, gap.below if gap is not None else c.parent)


def _gaps(hist: History, commits, doc: dict, lines: list[str]) -> None:
    """After a commit (or an operation's commits), the dropped commits below each."""
    for c in commits:
        gap = hist.gap_below(c.id)
        if gap is not None:
            doc.setdefault("dropped_below", gap.to_json())
            lines.append(gap_line(gap))


def cmd_reflog(args) -> int:
    store = _read(args)
    try:
        moves = store.reflog(args.n)
    finally:
        store.close()
    lines = [f"{when(m['time'] * 1e9)}  {m['branch']}  {(m['old'] or '-')[:12]} -> "
             f"{(m['new'] or '(deleted)')[:12]}  {m['reason']}" for m in moves]
    emit(args, moves, "\n".join(lines) or "no undo, restore or checkpoint yet")
    return 0


# -- undo ------------------------------------------------------------------------------------
def cmd_undo(args) -> int:
    if args.to is not None:
        kw = {"to": args.to}
    elif args.commits is not None:
        kw = {"commits": args.commits}
    else:
        kw = {"ops": args.count or 1}
    disk_too = bool(args.disk_too)

    def direct(store: Store) -> dict:
        branch = store.current_branch()
        head = store.head(branch)
        if "to" in kw:
            plan = undo.plan_to(store, head, kw["to"], disk_too=disk_too)
        elif "commits" in kw:
            plan = undo.plan_commits(store, head, kw["commits"], disk_too=disk_too)
        else:
            plan = undo.plan_operations(store, head, kw["ops"], disk_too=disk_too)
        store.reset_head(branch, plan.target, plan.reason)
        return {**plan.to_json(), "cut_off": []}  # no daemon: no file is open in a mount

    res = _ask(args, "undo", direct, **kw, **({"disk_too": True} if disk_too else {}))
    n = res["commits"]
    commits = f"{n} commit{'s' if n != 1 else ''}"
    if "ops" in kw:
        done = f"undid {', '.join(f'`{w}`' for w in res.get('undone') or [])} ({commits})"
    elif "commits" in kw:
        done = f"undid {commits}"
    else:
        done = f"went back to {kw['to']} ({commits} undone)"
    lines = [f"{done}; head is now {res['head'][:12]}"]
    if res.get("also"):
        lines.append("  with it, changes made at the same time by: "
                     + ", ".join(f"`{o}`" for o in res["also"]))
    if res.get("quiet"):
        lines.append("  with it, after it, changing only times: "
                     + ", ".join(f"`{q}`" for q in dict.fromkeys(res["quiet"])))
    lines.append(f"  to redo: memfs restore {res['old_head'][:12]}")
    emit(args, res, "\n".join(lines + still_running_lines(res, "undo")
                              + cut_off_lines(res, _root(args))))
    return 0


# -- diff and show ---------------------------------------------------------------------------
def _split_spec(args) -> tuple[list[str], list[str]]:
    """(states, paths as given): what argparse left after `memfs diff` (it cannot tell `-- PATH` apart),
    with the flags that may follow the states."""
    revs, paths, seen_dashdash = [], [], False
    items = iter(args.spec)
    for item in items:
        if seen_dashdash:
            paths.append(item)
        elif item == "--":
            seen_dashdash = True
        elif item in ("--json", "--stat"):
            setattr(args, item[2:], True)
        elif item == "--root" or item.startswith("--root="):
            args.root = item.partition("=")[2] or next(items, None)
        elif item.startswith("-") and item != "-":
            raise MemfsError(f"memfs diff: unknown option {item}",
                             "memfs diff [A] [B] [--stat] [--json] [-- PATH ...]")
        else:
            revs.append(item)
    if len(revs) > 2:
        raise MemfsError(f"memfs diff takes at most two states, not {len(revs)}: "
                         f"{' '.join(revs)}", "put paths after `--`: memfs diff A B -- PATH")
    return revs, paths


def _state(store: Store, rev: str) -> tuple[str, TreeState]:
    """(commit id, tree) of a revision; `now` is the head (after the daemon committed)."""
    cid = store.head() if rev == NOW else history.resolve(store, rev)
    state = commit_state(store, cid)
    assert state is not None
    return cid, state


def cmd_diff(args) -> int:
    revs, given_paths = _split_spec(args)
    paths = [_store_path(args, p) for p in given_paths]
    _commit_pending(args)
    store = _read(args)
    try:
        if not revs:  # what the last operation changed: what `memfs undo` would take back
            s = next(walk(History(store, store.head()).get, quiet=changed_only_times(store)),
                     None)
            if s is None or s.target is None:
                raise MemfsError("nothing to compare: the store has one commit",
                                 "make a change first")
            revs = [s.target, NOW]
        a_id, a_tree = _state(store, revs[0])
        b_id, b_tree = _state(store, revs[1] if len(revs) > 1 else NOW)
        changes = diff_trees(store, a_tree, b_tree, paths or None)
        for given, p in zip(given_paths, paths, strict=True):
            if not find_entry(store, a_tree, p) and not find_entry(store, b_tree, p):
                raise MemfsError(f"{p} is in neither state",
                                 _absent_remedy(args, store, [a_tree, b_tree], given, p))
        doc = {"a": a_id, "b": b_id, "paths": paths, "changes": [c.to_json() for c in changes]}
        if args.json:
            emit(args, doc)
        elif args.stat:
            emit(args, doc, "\n".join(change_lines(changes, True)) or "no differences")
        else:
            _write_text(diff_text(store, changes))
    finally:
        store.close()
    return 0


def _write_text(chunks) -> None:
    out = sys.stdout
    wrote = False
    for text in chunks:
        out.write(text)
        wrote = True
    if not wrote:
        out.write("no differences\n")
    out.flush()


def cmd_show(args) -> int:
    rev, sep, path = args.what.partition(":")
    _commit_pending(args)
    store = _read(args)
    try:
        cid, tree = _state(store, rev or "HEAD")
        if not sep:
            return _show_commit(args, store, cid)
        rel = _store_path(args, path)
        e = find_entry(store, tree, rel)
        if e is None:
            here = _from_cwd(args, store, [tree], path)
            raise MemfsError(f"{rel or '/'} is not in {rev or 'HEAD'} ({cid[:12]})",
                             f"paths go from the store root: memfs show {rev or 'HEAD'}:{here} "
                             f"(or {rev or 'HEAD'}:./{path} from here)" if here else
                             f"see what it holds: memfs show {rev or 'HEAD'}:"
                             f"{rel.rpartition('/')[0]}")
        if e.kind == DIR:
            entries = listing(store, tree, e.ref)
            emit(args, {"commit": cid, "path": rel, "kind": "dir",
                        "entries": [{"name": x.name, "kind": x.kind, "size": x.size,
                                     "mode": f"{x.mode:o}"} for x in entries]},
                 "\n".join(listing_lines(entries)) or "(empty directory)")
        elif e.kind == LINK:
            emit(args, {"commit": cid, "path": rel, "kind": "link", "target": e.ref}, e.ref)
        elif e.kind == FILE:
            if args.json:
                raise MemfsError("--json shows commits and directories, not a file's bytes",
                                 f"memfs show {args.what} > FILE writes the bytes")
            out = sys.stdout.buffer
            for piece in file_pieces(store, e.ref, e.size):
                out.write(piece)
            out.flush()
        else:
            emit(args, {"commit": cid, "path": rel, "kind": e.kind},
                 f"{rel}: {kind_name(e.kind, e.ref)} (no bytes to show)")
    finally:
        store.close()
    return 0


def _show_commit(args, store: Store, cid: str) -> int:
    c = history.logged(store, cid)
    changes = diff_trees(store, commit_state(store, c.parent), commit_state(store, cid))
    doc = {**c.to_json(), "changes": [x.to_json() for x in changes]}
    emit(args, doc, "\n".join([commit_line(c)] + change_lines(changes, True)))
    return 0


# -- checkpoints and marks -----------------------------------------------------------------------
ACTIONS = ("list", "create", "delete")


def cmd_checkpoint(args) -> int:
    action, name = args.action, args.name
    if action not in ACTIONS:
        if name is not None:
            raise MemfsError(f"unknown checkpoint action {action!r}",
                             "use: memfs checkpoint list | create NAME | delete NAME")
        action, name = "create", action
    if action == "list":
        if name is not None:
            raise MemfsError("`memfs checkpoint list` takes no name",
                             f"to create one named {name!r}: memfs checkpoint create {name}")
        return _list_checkpoints(args)
    if not name:
        raise MemfsError(f"`memfs checkpoint {action}` needs a NAME",
                         f"e.g. memfs checkpoint {action} before-refactor")
    if action == "delete":
        res = _ask(args, "checkpoint_delete",
                   lambda s: history.delete_checkpoint(s, name).to_json(), name=name)
        emit(args, res, f"deleted checkpoint {name} (it named {res['commit'][:12]}; "
                        f"`memfs restore {res['commit'][:12]}` reaches that state while "
                        "history keeps it)")
        return 0

    def direct(store: Store) -> dict:
        cid = history.resolve(store, args.at) if args.at else store.head()
        cp, old = history.create_checkpoint(store, name, cid, store.current_branch(),
                                            force=args.force)
        return {**cp.to_json(), "moved_from": old}

    res = _ask(args, "checkpoint", direct, name=name, at=args.at, force=args.force)
    text = f"checkpoint {name} at {res['commit'][:12]}"
    if res.get("moved_from"):
        text = f"checkpoint {name} moved from {res['moved_from'][:12]} to {res['commit'][:12]}"
    emit(args, res, text)
    return 0


def _list_checkpoints(args) -> int:
    store = _read(args)
    try:
        rows = []
        for cp in history.checkpoints(store):
            try:
                made = history.logged(store, cp.commit)
                label, made_at = made.commit.message, made.time_ns
            except MemfsError:
                label, made_at = "(commit no longer kept)", None
            rows.append({**cp.to_json(), "label": label,
                         "commit_time": made_at / 1e9 if made_at else None})
    finally:
        store.close()
    lines = [f"{r['name']:<20} {r['commit'][:12]}  {when(r['time'] * 1e9)}  {r['branch']:<10} "
             f"{r['label']}" for r in rows]
    emit(args, rows, "\n".join(lines) or "no checkpoints (create one: memfs checkpoint create "
                                         "NAME)")
    return 0


def cmd_mark(args) -> int:
    def direct(store: Store) -> dict:
        m = history.add_mark(store, args.name, store.head(), store.current_branch(), args.name)
        return {"name": m.name, "commit": m.commit, "branch": m.branch, "time": m.time_ns / 1e9}

    res = _ask(args, "mark", direct, name=args.name)
    emit(args, res, f"marked {res['name']} at {res['commit'][:12]}: changes after this are a "
                    "new operation")
    return 0

