"""`memfs status`: what the daemon, the store and each bound mount say now, or what the store
and the daemon's record say when no daemon answers (a dead daemon is named, with what was lost
and the remedy). Runs in the CLI process; reads only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memfs.cli.gc_cmds import status_lines
from memfs.cli.main import add_json_flag, emit
from memfs.control import NoDaemon, call
from memfs.liveness import clock, dead_daemon, lock_held, read_record
from memfs.rootdir import resolve_root
from memfs.store import open_store
from memfs.store.gc import last_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="daemon, branch, head, what is not yet durable, mounts")
    add_json_flag(p)
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    """Exit 0, or 1 when a dead daemon left a dead mount behind (something to clean up)."""
    root = resolve_root(args.root)
    try:
        st = call(root, "status")
    except NoDaemon:
        st = _direct_status(root)
    lines = [_daemon_line(root, st.get("daemon")),
             f"root     {st['root']}", f"branch   {st['branch']}", f"head     {st['head'][:12]}",
             f"pending  {st['pending']} change(s) not yet durable",
             *_held_lines(st),
             *_request_lines(st),
             *status_lines(st),
             f"mounts   {', '.join(st['mounts']) or '(none)'}"]
    if st.get("read_only"):
        lines.append(f"writes   READ-ONLY here: {st['read_only']}")
    if st.get("lost_changes"):
        lines.append(f"lost     {st['lost_changes']}")
    lines += _backing_lines(st)
    emit(args, st, "\n".join(lines))
    daemon = st.get("daemon") or {}
    return 1 if daemon.get("state") == "dead" and daemon.get("stale_mount") else 0


def _held_lines(st: dict) -> list[str]:
    """A history operation finishing: changes wait (reads go on) until its head move is done,
    which a GC or another process holding the store's writer makes longer."""
    held = st.get("changes_held")
    if not held:
        return []
    return [f"changes  waiting {held['seconds']:.1f} s for the {held['by']} to move the head "
            "(reads go on; a GC or another process writing the store makes it longer)"]


def _request_lines(st: dict) -> list[str]:
    """The control requests running now (an attach, a sync) with how far their passes have
    got, and the last long ones finished: a CLI interrupted or timed out was told to look
    here (memfs.fs.longops)."""
    req = st.get("requests") or {}
    lines = []
    for r in req.get("running", []):
        if r["request"] in ("status", "ping"):
            continue  # this very status request
        left = " (its client left; it goes on)" if r["client_left"] else ""
        lines.append(f"running  {r['request']} for {r['seconds']:.0f} s{left}")
    for mount, b in sorted((st.get("backing") or {}).items()):
        p = b.get("running")
        if p:
            counts = f"{p['listed']:,} entries looked at"
            if p["to_take"] or p["phase"] in ("taking in", "committing"):
                counts = f"{p['taken']:,} of {p['to_take']:,} taken in, {counts}"
            where = mount + (f"/{p['scope']}" if p["scope"] else "")
            lines.append(f"pass     {where}: {p['phase']} ({counts}), {p['seconds']:.0f} s")
    for f in req.get("finished", [])[:3]:
        how = "ok" if f["ok"] else f"FAILED: {f['error']}"
        left = " (its client had left)" if f["client_left"] else ""
        lines.append(f"finished {f['request']} at {clock(f['started'] + f['seconds'])} after "
                     f"{f['seconds']:.0f} s: {how}{left}")
    return lines


def _direct_status(root: Path) -> dict:
    from memfs.store.trees import decode_dir

    held = lock_held(root)
    store = open_store(root, create=False)
    try:
        head = store.head()
        tree = store.commit(head).tree
        mounts = sorted(e.name for e in decode_dir(store.read_object(tree)))
        st = {"root": str(store.root), "branch": store.current_branch(), "head": head,
              "pending": 0, "durable": True, "mounts": mounts, "daemon": None}
        if bound := store.bindings():  # nothing reconciles them until a daemon runs
            # A process holding the lock is a daemon starting (or stuck): mounted, maybe.
            how = "unanswered" if held else "unmounted"
            st["backing"] = {m: {"dir": b.get("dir"), how: True}
                             for m, b in sorted(bound.items())}
        policy = store.policy()
        shared = store.kind != "sqlite"
        st["retention"] = {**policy.to_json(), "summary": policy.summary(shared=shared)}
        if shared:
            from memfs.store.pg.gc import last_run as pg_last_run

            st["gc"] = {"running": None, "last": pg_last_run(store)}
        else:
            st["gc"] = {"running": None, "last": last_run(store)}
    finally:
        store.close()
    if held:
        rec = read_record(root)
        st["daemon"] = {"state": "not answering", **(rec.identity() if rec else {})}
    else:
        dead = dead_daemon(root)
        st["daemon"] = dead.to_json() if dead else None
    return st


def _daemon_line(root: Path, d: dict | None) -> str:
    if d is None:
        return "daemon   none: the store is not mounted (`memfs mount DIR`)"
    state = d.get("state", "serving")
    if state == "dead":
        if d.get("ended") is not None:
            what = f"pid {d['pid']} exited at {clock(d['ended'])} with changes not durable"
        else:
            what = f"pid {d['pid']} DIED without unmounting (last seen {clock(d['seen'])})"
        stale = f"; {d['mountpoint']} is a dead mount" if d.get("stale_mount") else ""
        return f"daemon   {what}{stale}\n         {d['loss']}\n         {d['remedy']}"
    if state == "not answering":
        return (f"daemon   pid {d.get('pid', '?')} holds the store but does not answer "
                f"(starting, or stuck: see {root / 'daemon.log'})")
    return f"daemon   pid {d['pid']}, mounted at {d['mountpoint']} (since {clock(d['started'])})"


def _backing_lines(st: dict) -> list[str]:
    lines = []
    refusing = [b["journal"] for b in (st.get("backing") or {}).values() if b.get("journal")]
    if refusing:  # one journal serves every mount: said once
        lines.append(f"journal  REFUSING: {refusing[0]['error']} — {refusing[0]['remedy']}")
    for mount, b in sorted((st.get("backing") or {}).items()):
        if b.get("unmounted"):
            lines.append(f"backed   {mount} -> {b.get('dir', '?')} (not mounted: not "
                         "reconciled; a draft in the store reaches disk by `memfs mount` then "
                         f"`memfs materialize {mount}`)")
            continue
        if b.get("unanswered"):
            lines.append(f"backed   {mount} -> {b.get('dir', '?')} (its daemon does not answer "
                         "yet: what disk owes is not known here)")
            continue
        states = ", ".join(f"{n} {k}" for k, n in sorted(b.get("states", {}).items()))
        u = b.get("unavailable") or {}
        where = b.get("dir", "?") if b.get("available", True) else (
            f"{b.get('dir', '?')} UNAVAILABLE: {u.get('error', '?')} — {u.get('remedy', '')}")
        o = b.get("owed") or {}
        owes = f"; {owed_text(o)}" if o else ""
        if b.get("not_carried"):
            owes += (f"; not carried: {b['not_carried']} change(s) no materialize writes "
                     "(hard links, symbolic links or special files in the workspace; "
                     f"`memfs ls --states {mount}` names each and why)")
        sc = b.get("scans") or {}
        scans = (f"; {sc.get('count', 0)} after-batch scan(s)"
                 f"{', running late' if sc.get('running_late') else ''}") if sc else ""
        lines.append(f"backed   {mount} -> {where} (watch {b.get('watch')}; {states or 'no files'}"
                     f"{'; ' + str(len(b['conflicts'])) + ' conflict(s)' if b.get('conflicts') else ''}"
                     f"{owes}{scans})")
        lines += _auto_lines((b.get("auto_materialize") or {}).get("last") or {})
    return lines


def owed_text(o: dict) -> str:
    """What a backing directory owes, as status and umount's note both say it."""
    return (f"disk owes {o.get('changes', 0)} change(s), {o.get('workspace_deletions', 0)} "
            f"deletion(s), {o.get('conflicts', 0)} conflict(s)")


def _auto_lines(last: dict) -> list[str]:
    """The writes the last auto-materialize round could not make, with why and what to do."""
    errors = last.get("disk_errors") or []
    if not errors:
        return []
    first, more = errors[0], len(errors) - 1
    return [f"         auto-materialize at {clock(last['time'])} could not write "
            f"{first['path']}{f' and {more} more' if more else ''}: {first['reason']} — "
            f"{first['remedy']}"]
