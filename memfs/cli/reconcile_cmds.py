"""Backing-directory commands: attach, detach, sync, materialize, ls --states, after-batch,
events.

Each asks the running daemon (so the mount shows the result at once) and, when none serves the
root, opens the store directly, runs the same code on a workspace without a mount, and commits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from memfs.cli.main import add_json_flag, emit
from memfs.control import PROGRESS_EVERY, NoDaemon, Shown, call, describe
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attach", help="bind store mount NAME to the backing directory DIR")
    p.add_argument("name")
    p.add_argument("dir")
    p.add_argument("--watch", default="on-access",
                   choices=["fs-events", "on-access", "on-agent-action", "off"],
                   help="when disk is observed besides sync (default on-access)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="follow symlinks to files inside the directory")
    p.add_argument("--max-file-size", type=int, default=None, metavar="BYTES",
                   help="larger files are disk-only, never taken into the store")
    p.add_argument("--ignore", action="append", default=[], metavar="GLOB",
                   help="leave matching paths alone (repeatable)")
    p.add_argument("--scan-deadline", type=float, default=20.0, metavar="SECONDS",
                   help="on-agent-action: how long `memfs after-batch` waits for its scan "
                        "(default 20)")
    p.add_argument("--auto-materialize", action="store_true",
                   help="write drafts back to DIR after each group commit (as a bare "
                        "`memfs materialize`: no deletions, no forcing)")
    add_json_flag(p)
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("detach", help="unbind store mount NAME from its backing directory")
    p.add_argument("name")
    add_json_flag(p)
    p.set_defaults(func=cmd_detach)

    p = sub.add_parser("sync", help="take disk's changes in (a PATH: take disk there)")
    p.add_argument("path", nargs="?", help="MOUNT[/PATH], or a path through the mountpoint")
    p.add_argument("--accept-root", action="store_true",
                   help="take a replaced backing directory on purpose")
    p.add_argument("--reopen", action="store_true",
                   help="first reopen the journal after a failed write (no restart needed)")
    add_json_flag(p)
    p.set_defaults(func=cmd_sync)

    p = sub.add_parser("materialize", help="write what disk owes (drafts) to backing dirs")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="MOUNT[/PATH] (named paths may be forced); default: what disk owes")
    p.add_argument("--force", action="store_true",
                   help="named paths: overwrite a disk copy that differs; any call: write "
                        "over the branch disk is pinned to (the pin moves)")
    p.add_argument("--apply-deletions", action="store_true",
                   help="also remove files deleted in the workspace")
    add_json_flag(p)
    p.set_defaults(func=cmd_materialize)

    p = sub.add_parser("after-batch",
                       help="an agent's tool batch ended: scan the on-agent-action mounts")
    p.add_argument("--agent", default=None, metavar="NAME", help="the agent whose batch ended")
    add_json_flag(p)
    p.set_defaults(func=cmd_after_batch)

    p = sub.add_parser("events", help="reconciler events (scans, conflicts, refusals)")
    p.add_argument("--follow", action="store_true", help="keep printing new events until ^C")
    add_json_flag(p)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("ls", help="backed entries with their reconciler states")
    p.add_argument("path", nargs="?", help="MOUNT[/PATH] (default: every backed mount)")
    p.add_argument("--states", action="store_true", help="show each entry's state (default)")
    add_json_flag(p)
    p.set_defaults(func=cmd_ls)


# How `ls --states` marks an incomplete region's path, as `ls -F` does: a directory `name/`,
# a symlink `name@` (it used to show every region with a slash, a disk symlink as a directory).
REGION_MARKS = {"dir": "/", "symlink": "@"}


def _ask(args, op: str, **kw) -> dict:
    """The daemon's answer, or the same request run on the store directly."""
    root = resolve_root(args.root)
    try:
        return call(root, op, **kw)  # type: ignore[return-value]
    except NoDaemon:
        return _direct(root, op, kw)


def _direct(root: Path, op: str, kw: dict) -> dict:
    import trio

    from memfs.backing import Backing
    from memfs.store import open_store
    from memfs.workspace.workspace import Workspace

    async def run() -> dict:
        ws = Workspace(open_store(root, create=False), 0.0)
        backing = Backing(ws)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_show_direct, backing, describe(op, kw))
                result = await backing.control(op, kw)
                await ws.commit(op.replace("backing_", ""))
                nursery.cancel_scope.cancel()
            return result
        finally:
            backing.close()
            if ws.read_only is None:  # the lease this command's workspace claimed goes back
                ws.store.release(ws.branch)  # (on a shared store; it held it until expiry)
            ws.store.close()

    return trio.run(run)


async def _show_direct(backing, what: str) -> None:
    """A daemon-less command's own long work, shown as the daemon's progress lines are
    (`memfs mount --bind` of a large directory takes it in here, before the daemon starts)."""
    import trio

    shown, started = Shown(), time.monotonic()
    try:
        while True:
            await trio.sleep(PROGRESS_EVERY)
            shown.show({"request": what, "seconds": time.monotonic() - started,
                        "doing": [p.text() for p in backing.running()]})
    finally:
        shown.done()


def attach_before_mount(root: Path, name: str, directory: str) -> dict:
    """`memfs mount --bind NAME=DIR`: bind on the store itself, before the daemon starts
    (which then passes over every binding), with attach's defaults."""
    return _direct(root, "backing_attach", dict(
        mount=name, dir=os.path.abspath(directory), watch="on-access", follow_symlinks=False,
        max_file_size=None, ignore=[]))


def _store_path(root: Path, path: str | None) -> str | None:
    """MOUNT[/PATH] as given, or a path through the running mount's mountpoint, taken by its
    spelling after the mountpoint: not normalized, so an alias ('//', '.', '..') reaches the
    daemon's one parser (memfs.backing.paths.parse_store_path) and is refused there as it would be
    in MOUNT/PATH form."""
    if path is None or not path.startswith("/"):
        return path
    try:
        holder = json.loads((root / "daemon.lock").read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    mnt = str(holder.get("mountpoint") or "").rstrip("/")
    if mnt and path.startswith(mnt + "/"):
        return path[len(mnt) + 1:]
    where = ("it is the mountpoint itself, not a mount in it" if mnt and path.rstrip("/") == mnt
             else f"it is not under the mountpoint {mnt}" if mnt else
             "no memfs mount is running, so no absolute path names a store path")
    raise MemfsError(f"{path}: {where}",
                     "name it as MOUNT/PATH (e.g. work/src/a.txt)"
                     + (f", or as a path under {mnt}" if mnt else ""))


def _from_cwd(root: Path, given: list[str | None], call_it):
    """Run `call_it()`; a relative path whose first name is no bound mount, given from a
    directory inside the running mount, was meant from there (`memfs ls --states sub` in
    MNT/p): the refusal names the store path it likely meant, not `memfs attach sub DIR`
    (which would bind a new mount)."""
    try:
        return call_it()
    except MemfsError as exc:
        here = _cwd_in_mount(root)
        for path in given:
            if not here or not path or path.startswith("/"):
                continue
            if here.split("/")[0] == path.split("/")[0]:  # the refused mount is here's own:
                continue  # from the store root already (`sync work/x` in MNT/work)
            if exc.message == f"mount {path.split('/')[0]!r} is not bound to a backing directory":
                raise MemfsError(exc.message, f"paths go from the store root: {here}/{path} "
                                 f"(or {os.path.join(os.getcwd(), path)})") from None
        raise


def _cwd_in_mount(root: Path) -> str | None:
    """The current directory as a store path, when it is inside the running mount."""
    try:
        mnt = json.loads((root / "daemon.lock").read_text() or "{}").get("mountpoint")
        cwd = os.getcwd()
    except (OSError, ValueError):
        return None
    if not mnt or not os.path.ismount(mnt) or not cwd.startswith(mnt.rstrip("/") + "/"):
        return None
    return cwd[len(mnt.rstrip("/")) + 1:]


def cmd_attach(args) -> int:
    d = os.path.abspath(args.dir)
    res = _ask(args, "backing_attach", mount=args.name, dir=d, watch=args.watch,
               follow_symlinks=args.follow_symlinks, max_file_size=args.max_file_size,
               ignore=args.ignore, scan_deadline=args.scan_deadline,
               auto_materialize=args.auto_materialize)
    emit(args, res, f"{args.name} is bound to {d} (watch {args.watch})\n" + _summary(res["pass"]))
    return 1 if _pass_failed(res["pass"]) else 0  # bound, but not all taken in: as sync


def cmd_detach(args) -> int:
    res = _ask(args, "backing_detach", mount=args.name)
    emit(args, res, f"{args.name} is no longer bound; its files stay in the store")
    return 0


def cmd_sync(args) -> int:
    root = resolve_root(args.root)
    path = _store_path(root, args.path)
    res = _from_cwd(root, [args.path], lambda: _ask(
        args, "backing_sync", path=path, accept_root=args.accept_root, reopen=args.reopen))
    lines = [f"{m}: {_summary(r)}" for m, r in sorted(res["mounts"].items())]
    if "reopened" in res:
        was = res["reopened"]["was_refusing"]
        lines.insert(0, "journal reopened" + (f" (it was refusing: {was})" if was else ""))
    emit(args, res, "\n".join(lines) or "no mount is bound to a backing directory")
    return 1 if any(_pass_failed(r) for r in res["mounts"].values()) else 0


def _pass_failed(r: dict) -> bool:
    """A pass that could not look at disk, was refused, or could not take disk in (a full
    store): the command says so and exits 1."""
    return "unavailable" in r or "refused" in r or "error" in r


def cmd_materialize(args) -> int:
    root = resolve_root(args.root)
    paths = [_store_path(root, p) for p in args.paths]
    res = _from_cwd(root, list(args.paths), lambda: _ask(
        args, "backing_materialize", paths=paths, force=args.force,
        apply_deletions=args.apply_deletions))
    lines = []
    for mount, r in sorted(res["mounts"].items()):
        if r.get("unavailable") or r.get("refused") or r.get("incomplete"):
            lines.append(f"{mount}: {r.get('unavailable') or r.get('refused') or r['incomplete']}"
                         + (f" — {r['remedy']}" if r.get("remedy") else ""))
            continue
        lines += [f"wrote    {mount}/{p}" for p in r["written"]]
        lines += [f"removed  {mount}/{p}" for p in r["removed"]]
        lines += [f"removed  {mount}/{p}/ (left empty)" for p in r.get("removed_dirs", [])]
        lines += [f"left     {mount}/{p} (deleted in the workspace; --apply-deletions removes it)"
                  for p in r["deletions_left"]]
        lines += [f"skipped  {mount}/{s['path']} ({s['state']}): {s['reason']} — {s['remedy']}"
                  for s in r["skipped"]]
        lines += [f"FAILED   {mount}/{f['path']}: {f['message']} — {f['remedy']}"
                  for f in r["failed"]]
    emit(args, res, "\n".join(lines) or "nothing owed")
    bad = any(r.get("failed") or r.get("refused") or r.get("unavailable")
              or any(s["state"] == "disk-error" for s in r.get("skipped", []))
              for r in res["mounts"].values())
    return 1 if bad else 0


def cmd_after_batch(args) -> int:
    res = _ask(args, "backing_after_batch", agent=args.agent)
    if not res["mounts"]:
        text = "no mount is attached with --watch on-agent-action"
    elif res["missed"]:
        miss = res.get("miss") or {}
        text = f"scan {res['scan']} missed its deadline: {miss.get('why', 'late')}"
    else:
        o = res["outcome"] or {}
        text = (f"scanned {', '.join(res['mounts'])}"
                + ("" if o.get("finished", True) else f" (not finished: {o.get('error')})")
                + "".join(f"\nincomplete {p}/ ({why})" for p, why in o.get("incomplete", [])))
    emit(args, res, text)
    return 1 if res["missed"] or not (res["outcome"] or {}).get("finished", True) else 0


def _event_line(e: dict) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
    rest = " ".join(f"{k}={v}" for k, v in e.items()
                    if k not in ("seq", "time", "event") and v not in (None, [], ""))
    return f"{e['seq']:>6} {when} {e['event']:<18} {rest}".rstrip()


def cmd_events(args) -> int:
    """The daemon's recent events; --follow polls every 0.5 s (one JSON object a line with
    --json) until interrupted. Without a daemon there are none: events live in its memory."""
    res = _ask(args, "backing_events", after=0)
    if not args.follow:
        emit(args, res, "\n".join(_event_line(e) for e in res["events"]) or "(no events)")
        return 0
    after = 0
    try:
        while True:
            for e in res["events"]:
                print(json.dumps(e) if args.json else _event_line(e), flush=True)
            after = max(after, res["last"])
            time.sleep(0.5)
            res = _ask(args, "backing_events", after=after)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        sys.stderr.close()
        return 0


def cmd_ls(args) -> int:
    root = resolve_root(args.root)
    path = _store_path(root, args.path)
    res = _from_cwd(root, [args.path], lambda: _ask(args, "backing_states", path=path))
    lines = []
    for m in res["mounts"]:
        if not m["available"]:
            u = m["unavailable"]
            lines.append(f"{m['mount']}: unavailable: {u['error']} — {u['remedy']}")
            continue
        for e in m["entries"]:
            kind = f" ({e['conflict']})" if e["conflict"] else ""
            if "size" in e:
                kind = f" ({e['size']} bytes, {e['mime']})"
            if e.get("note"):
                kind += f" ({e['note']})"
            lines.append(f"{e['state']:<32} {m['mount']}/{e['path']}{kind}")
        for r in m["regions"]:
            mark = REGION_MARKS.get(r.get("kind", ""), "")
            lines.append(f"{'incomplete':<32} {m['mount']}/{r['path']}{mark} ({r['reason']})")
    emit(args, res, "\n".join(lines) or "(nothing)")
    # As sync and materialize: a mount that could not be observed is a failure to list it.
    return 1 if any(not m["available"] for m in res["mounts"]) else 0


def _discarded(d: dict) -> str:
    """One discarded workspace change: `a.txt (workspace-deleted, restored)`, and what disk's
    file replaced where the workspace kept a symlink or special file there."""
    if d["op"] == "replaced":  # a symlink the workspace kept where disk has a directory
        return f"{d['path']} (the workspace's {d.get('over')}, replaced by disk's directory)"
    over = f", in place of the workspace's {d['over']}" if d.get("over") else ""
    return f"{d['path']} ({d['was']}, {d['op']}{over})"


def _summary(r: dict) -> str:
    if "unavailable" in r:
        return f"unavailable: {r['unavailable']} — {r['remedy']}"
    if r.get("refused"):
        return f"refused: {r['refused']}"
    if "error" in r:
        return f"error: {r['error']} — {r.get('remedy', '')}"
    parts = [f"{len(r.get('taken', []))} taken", f"{len(r.get('removed', []))} removed",
             f"{len(r.get('conflicts', []))} new conflict(s)"]
    if r.get("discarded"):
        parts.append("discarded: " + ", ".join(_discarded(d) for d in r["discarded"]))
    if r.get("skipped"):
        parts.append("not taken this pass: " + ", ".join(r["skipped"]) + " (open for writing "
                     "in the mount, changed there meanwhile, or the pass was overtaken by an "
                     "undo or a branch switch — close it and sync again)")
    if r.get("regions"):
        parts.append(_regions(r["regions"]))
    return ", ".join(parts)


def _regions(regions: list[dict]) -> str:
    """What was not looked at, and why (a count alone left a newcomer guessing)."""
    shown = [f"{g['path']} ({g['reason']})" for g in regions[:3]]
    more = f" and {len(regions) - 3} more" if len(regions) > 3 else ""
    return (f"{len(regions)} incomplete region(s), not taken in: {', '.join(shown)}{more} "
            "(`memfs ls --states` lists them)")


__all__ = ["register"]
