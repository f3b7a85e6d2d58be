"""Storage lifecycle commands: `memfs gc`, `memfs du`, `memfs config` (the retention policy),
and what `memfs status` says about commits failing, space, the policy and the last GC.

They work on either backend (a store in PostgreSQL: memfs.store.pg.gc). GC and du ask the running daemon (it collects beside the live mount, memfs.workspace
.lifecycle); with none, they open the store and take its daemon lock themselves, so no daemon
can start in the middle. The policy is kept in the store (memfs.store.retention), so `memfs
config` writes it there directly, beside a running daemon too: the daemon reads it at each
status and GC.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import threading
from datetime import datetime
from pathlib import Path

from memfs.cli.main import add_json_flag, emit
from memfs.control import NoDaemon, call
from memfs.errors import MemfsError
from memfs.rootdir import resolve_root
from memfs.store import gc, open_store
from memfs.store.retention import Policy, PolicyError
from memfs.store.space import Space, size_text
from memfs.workspace.lifecycle import memory_step, summary


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gc", help="drop history the retention policy lets go and give the "
                       "space it held back")
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    add_json_flag(p)
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("du", help="how much of the store is live data, history, reclaimable")
    add_json_flag(p)
    p.set_defaults(func=cmd_du)

    p = sub.add_parser("config", help="show or set the retention policy (what history is kept)",
                       description="Settings: " + "; ".join(
                           f"{k}: {why}" for k, (_, why) in Policy.SETTINGS.items()))
    p.add_argument("key", nargs="?", help="a setting, e.g. keep-all")
    p.add_argument("value", nargs="?", help="its new value, e.g. 2d, forever, 0, 10%%, off")
    add_json_flag(p)
    p.set_defaults(func=cmd_config)


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    """`memfs init --keep-all 2d ...`: the same settings as `memfs config`."""
    for key, (_, why) in Policy.SETTINGS.items():
        p.add_argument(f"--{key}", metavar="VALUE", help=why)


def policy_from_flags(args: argparse.Namespace, policy: Policy) -> Policy | None:
    """The policy with the flags given applied (None if none was given); PolicyError if a
    value is bad, before anything is written."""
    changed = False
    for key in Policy.SETTINGS:
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            policy, changed = policy.with_setting(key, value), True
    return policy if changed else None


def cmd_config(args) -> int:
    root = resolve_root(args.root)
    store = open_store(root, create=False)
    shared = store.kind == "postgresql"  # no space floor there (docs/lifecycle.md)
    try:
        policy = store.policy()
        if args.key is not None and args.key not in Policy.SETTINGS:
            raise PolicyError(f"no setting {args.key!r}",
                              f"the settings are: {', '.join(Policy.SETTINGS)}")
        was = policy.setting_text(args.key) if args.key is not None else None
        if args.value is not None:
            policy = policy.with_setting(args.key, args.value)
            store.set_policy(policy)
    finally:
        store.close()
    doc = {k: policy.setting_text(k) for k in Policy.SETTINGS}
    if args.key is not None and args.value is not None:
        # A change says what it was and what it means (`keep-all 0` was taken without a word,
        # and the next collection thinned the day's history).
        emit(args, {args.key: doc[args.key], "was": was},
             f"{args.key}: {was} -> {doc[args.key]}\n{policy.summary(shared=shared)}\n"
             "`memfs gc --dry-run` shows what the next collection would drop under it"
             + ("\nnote: recorded, but no space floor applies on PostgreSQL: the server's "
                "disk is not this host's to measure"
                if shared and args.key == "space-floor" else ""))
        return 0
    if args.key is not None:
        emit(args, {args.key: doc[args.key]}, doc[args.key])
        return 0
    width = max(map(len, doc))
    lines = [f"{k:<{width}}  {v:<8}  {_meaning(k, shared)}" for k, v in doc.items()]
    emit(args, doc, "\n".join(lines + ["", policy.summary(shared=shared)]))
    return 0


def _meaning(key: str, shared: bool) -> str:
    """What a setting does, on this root's kind of store."""
    if shared and key == "space-floor":
        return "not on PostgreSQL: the server's disk is not this host's to measure"
    return Policy.SETTINGS[key][1]


def pins_lines(pins: dict | None) -> list[str]:
    """A shared store: this host's pins failing to publish, and its last lapse (docs/lifecycle.md,
    "On a store in PostgreSQL")."""
    lines: list[str] = []
    if not pins:
        return lines
    if pins.get("failing"):
        lines.append("pins     FAILING: what this host shows and holds open cannot be published "
                     f"for other hosts' garbage collection ({pins['failing']})")
        lines.append("         what to do: make sure the PostgreSQL server answers this host; "
                     "until then new views of history fail (EIO) and undo, restore and "
                     "switch may be refused")
    lapse = pins.get("last_lapse")
    if lapse:
        when = datetime.fromtimestamp(lapse["at"]).strftime("%Y-%m-%d %H:%M:%S")
        gone = (f"; {lapse['commits_gone']} commit(s) it showed were dropped meanwhile, and "
                "their views are gone here" if lapse["commits_gone"] else
                "; nothing it showed was dropped meanwhile")
        lines.append(f"pins     LAPSED at {when} ({pins['lapses']} time(s) since the mount): "
                     f"not renewed within {lapse['ttl']:.0f} s (this daemon paused, or cut off "
                     f"from the server), so other hosts' GC kept nothing of them{gone}")
    return lines


def status_lines(st: dict) -> list[str]:
    """What `memfs status` says about commits failing, space and the retention policy."""
    lines = []
    failure = st.get("commit_failure")
    if failure:
        since = datetime.fromtimestamp(failure["since"]).strftime("%H:%M:%S")
        lines.append(f"commits  FAILING since {since} ({failure['attempts']} attempt(s)): "
                     f"{failure['reason']}")
        lines.append(f"         what to do: {failure['remedy']}")
    lines += pins_lines(st.get("pins"))
    sp = st.get("space")
    if sp and sp.get("refused"):
        r = sp["refused"]
        since = datetime.fromtimestamp(r["since"]).strftime("%H:%M:%S")
        lines.append(f"writes   REFUSED since {since} (No space left on device): a write of "
                     f"{size_text(r['bytes'])} does not fit in the {size_text(sp['writable'])} "
                     f"writable; {r['reason']}")
        lines.append(f"         what to do: {r['remedy']}")
    if sp:
        used = sp["size"] - sp["free"]
        where = ("this host's root filesystem (the store is the server's)"
                 if sp.get("of") == "host" else "the store's filesystem")
        lines.append(f"space    {size_text(sp['writable'])} writable; {where}: "
                     f"{size_text(used)} used of {size_text(sp['size'])}, "
                     f"{size_text(sp['pending_bytes'])} waiting in memory")
    if st.get("retention"):
        lines.append(f"history  {st['retention']['summary']}")
    g = st.get("gc") or {}
    if g.get("running"):
        r = g["running"]
        total = f" {r['done']}/{r['total']}" if r["total"] else ""
        lines.append(f"gc       RUNNING ({r['trigger']}): {r['phase']}{total}")
    if g.get("last"):
        last = g["last"]
        when = datetime.fromtimestamp(last["started"]).strftime("%Y-%m-%d %H:%M")
        lines.append(f"gc       last run {when} ({last['trigger']}): gave back "
                     f"{size_text(last['returned'])}, dropped {last['commits_dropped']} "
                     f"commit(s) in {last['seconds']:.1f} s")
    return lines


# -- gc and du ------------------------------------------------------------------------------------
def _collect(args, op: str, dry_run: bool) -> dict:
    root = resolve_root(args.root)
    stop = threading.Event()
    if not args.json and sys.stderr.isatty():
        threading.Thread(target=_show_progress, args=(root, stop), daemon=True).start()
    try:
        return call(root, op, show_progress=False, dry_run=dry_run)  # its own lines
    except NoDaemon:
        return _collect_here(root, dry_run, "manual" if op == "gc" else "du")
    finally:
        stop.set()


def _show_progress(root: Path, stop: threading.Event) -> None:
    """While the daemon collects: its phase on stderr, once a second."""
    shown = None
    while not stop.wait(1.0):
        try:
            st = call(root, "status", stall=5, show_progress=False)
            running = (st.get("gc") or {}).get("running")
        except (NoDaemon, MemfsError, OSError):
            return
        if running and (running["phase"], running["done"]) != shown:
            shown = (running["phase"], running["done"])
            total = f" {running['done']}/{running['total']}" if running["total"] else ""
            print(f"gc: {running['phase']}{total}", file=sys.stderr)


def _collect_here(root: Path, dry_run: bool, trigger: str) -> dict:
    store = open_store(root, create=False)
    lock = os.open(root / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MemfsError(f"a memfs daemon holds {root} but does not answer its control "
                             "socket", "see <root>/daemon.log; once it has stopped, run "
                             "`memfs gc` again") from None
        if store.kind != "sqlite":
            from memfs.store.pg.gc import PgCollector

            doc = PgCollector(store, dry_run=dry_run, trigger=trigger).run().to_json()
        else:
            doc = gc.Collector(store, dry_run=dry_run, trigger=trigger,
                               all_for_space=True).run().to_json()
        doc["memory"] = memory_step(root, store.policy(), dry_run)
        return doc
    finally:
        os.close(lock)
        store.close()


def cmd_gc(args) -> int:
    doc = _collect(args, "gc", args.dry_run)
    lines = [f"gc: {summary(doc)}"]
    if doc["pressure"]:
        dry = doc["dry_run"]
        lines.append(f"    the disk {'is' if dry else 'was'} under the space floor: "
                     f"{doc['dropped_for_space']} commit(s) the windows keep "
                     f"{'would go' if dry else 'went'} too, oldest first")
    lines += _uncommitted_lines(doc)
    shared = doc.get("backend") == "postgresql"
    if doc["dry_run"]:
        todo = "; `memfs gc` does it" if doc["commits_dropped"] or doc["reclaimable_bytes"] \
            else ""
        lines.append(f"    the store takes {size_text(doc['store_before'])}; "
                     f"{size_text(doc['free_after'])} free{todo}")
    elif shared:
        lines.append(f"    objects {doc['objects_freed']}, chunks {doc['chunks_freed']} "
                     "deleted from the database (its room is reused for new rows)")
        lines.append(f"    the database takes {size_text(doc['store_after'])} (was "
                     f"{size_text(doc['store_before'])})")
    else:
        lines.append(f"    objects {doc['objects_freed']}, chunks {doc['chunks_freed']}; packs "
                     f"{doc['packs_rewritten']} rewritten, {doc['packs_removed']} removed, "
                     f"{size_text(doc['bytes_punched'])} punched out")
        lines.append(f"    the store takes {size_text(doc['store_after'])} (was "
                     f"{size_text(doc['store_before'])}); {size_text(doc['free_after'])} free")
    lines += [f"    problem: {p}" for p in doc["problems"] + doc.get("memory", {}).get(
        "problems", [])]
    emit(args, doc, "\n".join(lines))
    return 0


def _uncommitted_lines(doc: dict) -> list[str]:
    """What the run could not see: changes in the mount that did not commit before it
    marked (a full disk even with the reserve given to them). What they free (an rm) is
    still live to this run."""
    n = doc.get("uncommitted") or 0
    if not n:
        return []
    return [f"    {n} change(s) in the mount were not committed yet, so what they free (an rm) "
            "was not collected: the automatic run (gc-auto) collects it once they are in; or "
            "run `memfs gc` again then (`pending` in `memfs status` at 0)"]


def cmd_du(args) -> int:
    doc = _collect(args, "du", True)
    space = Space.of(resolve_root(args.root))
    out = {"live": doc["live_bytes"], "history": doc["history_bytes"],
           "reclaimable": doc["reclaimable_bytes"], "store": doc["store_before"],
           "commits": doc["commits"], "droppable_commits": doc["commits_dropped"],
           "filesystem": space.to_json()}
    rows = [("live data", out["live"], "what branch heads and checkpoints name"),
            ("history", out["history"], f"kept only by older commits ({out['commits']} "
             "in all)"),
            ("reclaimable", out["reclaimable"], f"named by nothing kept; `memfs gc` gives it "
             f"back ({out['droppable_commits']} commit(s) would go)"),
            ("store", out["store"], "the PostgreSQL database (pg_database_size)"
             if doc.get("backend") == "postgresql" else
             "on disk: store.db, its WAL and the packs")]
    lines = [f"{name:<12} {size_text(n):>10}  {why}" for name, n, why in rows]
    lines.append(f"{'filesystem':<12} {size_text(space.avail):>10}  free of "
                 f"{size_text(space.size)}")
    emit(args, out, "\n".join(lines))
    return 0
