"""Mount lifecycle commands: init, mount, umount (status_cmd has `memfs status`).

They tell the truth about a daemon that died: the kernel's mount table, the daemon's record
in `<root>/daemon.lock` and its control socket together say whether a store is served, by
whom, and at which mountpoint; a mount whose daemon is gone (Transport endpoint is not
connected) is named as such, with what was lost, and `memfs mount` cleans it when it is ours.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from memfs.cli.gc_cmds import add_policy_flags, policy_from_flags
from memfs.cli.main import add_json_flag, emit
from memfs.cli.status_cmd import owed_text
from memfs.control import NoDaemon, call
from memfs.errors import MemfsError
from memfs.liveness import (
    DeadDaemon,
    MountEntry,
    answers,
    canonical,
    dead_daemon,
    lock_held,
    mount_entry,
    read_record,
    same_root,
)
from memfs.rootdir import resolve_root
from memfs.store import StoreBackend, open_store
from memfs.store.backend import (
    read_location,
    redact,
)
from memfs.store.retention import Policy

FUSE_CONF = Path("/etc/fuse.conf")
MOUNT_WAIT = 30.0  # seconds `memfs mount` waits for the daemon's mount to appear
OWN_OPTIONS = ("fsname", "subtype")
EXIT_WAIT = 60.0  # seconds `memfs umount` waits for the daemon's final commit and exit


def _millis(text: str) -> int:
    """--commit-interval MS: 0 or more (a negative delay was taken as 0, silently)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 or more milliseconds "
                                         "(0 commits at once, the default is 100)")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="create the store (idempotent)")
    p.add_argument("--store", metavar="URL",
                   help="keep the store in PostgreSQL at URL (postgresql://USER@HOST/DB; "
                        "default $MEMFS_STORE, else embedded in the root); the root records it")
    add_policy_flags(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("mount", help="mount the store at MOUNTPOINT")
    p.add_argument("mountpoint")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("--commit-interval", type=_millis, default=100, metavar="MS",
                   help="group-commit delay in milliseconds (default 100)")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--bind", action="append", default=[], metavar="NAME=DIR",
                   help="bind store mount NAME to backing directory DIR first (as `memfs attach`)")
    p.add_argument("--allow-other", action="store_true",
                   help="let other users use the mount (a non-root user needs user_allow_other "
                        "in /etc/fuse.conf)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="FUSE mount options, passed through (man mount.fuse3)")
    add_json_flag(p)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("umount", help="commit everything and unmount")
    p.add_argument("mountpoint")
    add_json_flag(p)
    p.set_defaults(func=cmd_umount)


def _root(args) -> Path:
    return resolve_root(args.root)


def _created(root: Path, url: str | None) -> StoreBackend:
    """The store at `root`, created if missing; a root that cannot be made (a read-only or
    virtual filesystem, no permission) is refused by name, not as a traceback."""
    try:
        return open_store(root, url=url)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise MemfsError(f"cannot create the store at {root}: {why}",
                         "choose a directory on a writable filesystem you own: "
                         "memfs init --root DIR (or set MEMFS_ROOT)") from None


def cmd_init(args) -> int:
    root = _root(args)
    given = policy_from_flags(args, Policy())  # a bad value is refused before anything is made
    store = _created(root, args.store)
    try:
        if given is not None:
            store.set_policy(policy_from_flags(args, store.policy()))
        head = store.head()
    finally:
        store.close()
    loc = read_location(root)
    where = redact(loc.url) if loc else "embedded"
    emit(args, {"root": str(root), "head": head, "store": where},
         f"memfs store ready at {root}" + (f" (store: {where})" if loc else ""))
    return 0


# -- mount -----------------------------------------------------------------------------------

def cmd_mount(args) -> int:
    root = _root(args)
    mnt = Path(canonical(args.mountpoint))
    binds = [_parse_bind(b) for b in args.bind]
    extra = [o.strip() for opts in args.options for o in opts.split(",") if o.strip()]
    own = [o for o in extra if o.split("=", 1)[0] in OWN_OPTIONS]
    if own:
        raise MemfsError(f"-o {','.join(own)}: memfs sets {' and '.join(OWN_OPTIONS)} itself "
                         "(the mount table names the store it serves)",
                         "leave them out; other FUSE options pass through")
    allow_other = args.allow_other or "allow_other" in extra
    _refuse_if_served(root, mnt)
    cleaned = _clean_dead_mounts(root, mnt)
    _check_mountpoint(root, mnt)
    _note_hidden(mnt)
    if allow_other:
        _check_allow_other()
    interval = args.commit_interval / 1000.0
    if binds:
        from memfs.cli.reconcile_cmds import attach_before_mount

        open_store(root).close()
        for name, directory in binds:
            attach_before_mount(root, name, directory)
    if args.foreground:
        from memfs.fs.daemon import run_daemon
        from memfs.fs.logs import setup_logging

        setup_logging(root, args.debug)
        return run_daemon(root, mnt, interval, args.debug, allow_other, extra)
    return _spawn_daemon(args, root, mnt, allow_other, extra, cleaned)


def _refuse_if_served(root: Path, mnt: Path) -> None:
    """A root is served by one daemon: say where, and what to do about this mountpoint."""
    try:
        holder = call(root, "ping", stall=5)
    except NoDaemon:
        if lock_held(root):
            rec = read_record(root)
            who = f"pid {rec.pid}, for {rec.mountpoint}" if rec else "starting"
            raise MemfsError(
                f"a memfs daemon ({who}) holds the store at {root} but does not answer",
                f"it may still be starting: retry in a moment; see {root / 'daemon.log'}"
            ) from None
        return
    where = holder.get("mountpoint") or "?"
    if where == str(mnt):
        raise MemfsError(f"{mnt} is already mounted: memfs (pid {holder['pid']}) serves the "
                         f"store at {root} there", f"use it; `memfs umount {mnt}` ends it")
    remedy = f"use {where}, or `memfs umount {where}` first"
    problem = _mountpoint_problem(mnt)
    if problem is not None:
        remedy += f"; also, {problem.message} ({problem.remedy})"
    raise MemfsError(f"the store at {root} is already served by memfs (pid {holder['pid']}) at "
                     f"{where}", remedy)


def _clean_dead_mounts(root: Path, mnt: Path) -> list[dict]:
    """Unmount what a dead daemon of this root left: its own mountpoint, and a dead memfs mount
    of this store at `mnt`. Each is reported with what the death cost."""
    cleaned: list[dict] = []
    dead = dead_daemon(root)
    if dead is not None and dead.stale_mount:
        _unmount_dead(Path(dead.record.mountpoint))
        cleaned.append(_cleaned(dead.record.mountpoint, dead))
    entry = mount_entry(mnt)
    if entry is not None and entry.is_memfs and answers(entry.point) == "dead":
        if not same_root(entry.store_root, root):
            raise MemfsError(
                f"{mnt} is a dead memfs mount of another store ({entry.store_root})",
                f"`memfs --root {entry.store_root} mount {mnt}` mounts that store again there; "
                f"`fusermount3 -u {mnt}` only frees it")
        _unmount_dead(mnt)
        cleaned.append(_cleaned(str(mnt), dead if dead and dead.record.mountpoint == str(mnt)
                                else None))
    return cleaned


def _cleaned(point: str, dead: DeadDaemon | None) -> dict:
    loss = dead.loss if dead else "what it had not committed is lost; everything fsynced is kept"
    who = f" left by the memfs daemon (pid {dead.record.pid}) that died" if dead else ""
    print(f"memfs: cleaned up the dead mount at {point}{who}: {loss}", file=sys.stderr)
    return {"mountpoint": point, "pid": dead.record.pid if dead else None, "loss": loss}


def _unmount_dead(point: Path) -> None:
    """A dead FUSE mount holds nothing: unmount it, lazily if a shell still sits in it."""
    last = ""
    for flags in ("-u", "-uz"):
        res = subprocess.run(["fusermount3", flags, str(point)], capture_output=True, text=True)
        if res.returncode == 0:
            return
        last = res.stderr.strip()
    raise MemfsError(f"could not unmount the dead mount at {point}: {last}",
                     f"unmount it as its owner or as root: fusermount3 -uz {point}")


def _mountpoint_problem(mnt: Path) -> MemfsError | None:
    """Why memfs cannot mount at `mnt`, with the remedy for that case, or None."""
    if not os.path.lexists(mnt):
        return MemfsError(f"mountpoint {mnt} does not exist", f"create it: mkdir -p {mnt}")
    if not mnt.is_dir():
        kind = "a broken symlink" if not mnt.exists() else "a file"
        return MemfsError(f"mountpoint {mnt} is {kind}, not a directory",
                          "mount on a directory: an empty one, e.g. `mkdir ~/memfs`")
    entry = mount_entry(mnt)
    if entry is not None:
        return _mounted_problem(mnt, entry)
    if os.geteuid() != 0 and not os.access(mnt, os.W_OK | os.X_OK):
        return MemfsError(f"you may not write to {mnt} (fusermount3 requires it)",
                          "mount on a directory you own")
    return None


def _mounted_problem(mnt: Path, entry: MountEntry) -> MemfsError:
    if entry.is_memfs:
        return MemfsError(f"{mnt} is already a memfs mount (of {entry.store_root or 'a store'})",
                          f"use it, or `memfs umount {mnt}` first")
    state = answers(entry.point) if entry.fstype.startswith("fuse") else "ok"
    if state == "dead":
        return MemfsError(f"{mnt} is a dead {entry.fstype} mount (its daemon is gone)",
                          f"free it: fusermount3 -u {mnt}")
    return MemfsError(f"{mnt} is already a mount point ({entry.fstype} from {entry.source})",
                      "mount memfs somewhere else, or unmount that first")


def _check_mountpoint(root: Path, mnt: Path) -> None:
    problem = _mountpoint_problem(mnt)
    if problem is not None:
        raise problem
    real_root, real_mnt = root.resolve(), mnt.resolve()
    if real_root == real_mnt or real_mnt in real_root.parents:
        # The daemon would reach its own store through its own mount and hang.
        raise MemfsError(f"the store root {root} is inside the mountpoint {mnt}",
                         "put the store elsewhere (--root or MEMFS_ROOT) or mount somewhere else")


def _note_hidden(mnt: Path) -> None:
    """A mount over a directory with files in it hides them until the unmount, as any mount
    does; said once, on stderr, since a newcomer who mounts over a project thinks it gone."""
    try:
        names = sorted(os.listdir(mnt))
    except OSError:
        return
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        one = len(names) == 1
        print(f"memfs: note: {mnt} is not empty: its {len(names)} "
              f"entr{'y' if one else 'ies'} ({shown}) {'is' if one else 'are'} hidden while "
              f"memfs is mounted there, not changed; `memfs umount {mnt}` shows "
              f"{'it' if one else 'them'} again (to work on "
              "a directory's files through memfs, mount elsewhere and `memfs attach NAME DIR`)",
              file=sys.stderr)


def _check_allow_other() -> None:
    """fusermount3 refuses allow_other to a non-root user unless /etc/fuse.conf allows it; say
    so before a daemon starts, with the line to add."""
    if os.geteuid() == 0:
        return
    try:
        lines = FUSE_CONF.read_text().splitlines()
    except OSError:
        lines = []
    if "user_allow_other" not in (line.strip() for line in lines):
        raise MemfsError(
            f"--allow-other is not allowed for a non-root user: {FUSE_CONF} has no "
            "`user_allow_other` line",
            f"ask root to add the line `user_allow_other` to {FUSE_CONF}, or mount without "
            "--allow-other (only you can use the mount)")


def _parse_bind(text: str) -> tuple[str, str]:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise MemfsError(f"--bind {text!r} is not NAME=DIR", "e.g. --bind work=~/project")
    return name, os.path.expanduser(directory)


def _spawn_daemon(args, root: Path, mnt: Path, allow_other: bool, extra: list[str],
                  cleaned: list[dict]) -> int:
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / "daemon.log"
    cmd = [sys.executable, "-m", "memfs", "--root", str(root), "mount", str(mnt), "--foreground",
           "--commit-interval", str(args.commit_interval)]
    cmd += ["--allow-other"] if allow_other else []
    cmd += ["-o", ",".join(extra)] if extra else []
    with open(logfile, "ab") as out:
        start = out.tell()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True)
        except OSError as exc:
            raise MemfsError(f"could not start the memfs daemon ({sys.executable}): {exc}",
                             "run memfs with a Python this user may execute, or mount with "
                             "--foreground") from None
    deadline = time.monotonic() + MOUNT_WAIT
    while time.monotonic() < deadline:
        entry = mount_entry(mnt)
        if entry is not None and entry.is_memfs and proc.poll() is None:
            emit(args, {"mountpoint": str(mnt), "pid": proc.pid, "root": str(root),
                        "cleaned": cleaned},
                 f"memfs mounted at {mnt} (pid {proc.pid}, store {root})")
            return 0
        if proc.poll() is not None:
            raise _early_exit(logfile, start)
        time.sleep(0.05)
    raise MemfsError(f"{mnt} did not appear within {MOUNT_WAIT:g} s (daemon pid {proc.pid})",
                     f"see {logfile}; `kill {proc.pid}` stops it")


# What libfuse/fusermount3 print when they refuse a mount, and the remedy for each.
FUSE_REMEDIES = (
    ("unknown option", "check the -o options given (man mount.fuse3 lists them)"),
    ("user_allow_other", f"ask root to add the line `user_allow_other` to {FUSE_CONF}, or mount "
                         "without --allow-other"),
    ("/dev/fuse", "this user may not open /dev/fuse: ask root to make it crw-rw-rw- (Debian's "
                  "default), or mount as root"),
    ("mountpoint", "mount on an empty directory you own"),
)


def _early_exit(logfile: Path, start: int) -> MemfsError:
    """The daemon's own refusal ("memfs: …") and FUSE's reason, from this run's log lines."""
    with open(logfile, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    fuse = [ln for ln in lines if ln.startswith(("fuse: ", "fusermount3: "))]
    said = [ln.removeprefix("memfs: ") for ln in lines if ln.startswith("memfs: ")]
    if said:
        what, _, remedy = said[-1].partition(" — ")
        what += "".join(f"; {ln}" for ln in fuse)
        fitting = [fix for ln in fuse for key, fix in FUSE_REMEDIES if key in ln]
        remedy = fitting[0] if fitting else remedy
        return MemfsError(what, f"{remedy + '; ' if remedy else ''}full log: {logfile}")
    shown = fuse or lines[-5:]
    return MemfsError("the memfs daemon exited before mounting:\n  " + "\n  ".join(shown),
                      f"full log: {logfile}")


# -- umount ----------------------------------------------------------------------------------

def cmd_umount(args) -> int:
    root = _root(args)
    mnt = Path(canonical(args.mountpoint))
    entry = mount_entry(mnt)
    if entry is None:
        raise _not_mounted(root, mnt)
    if not entry.is_memfs:
        raise MemfsError(f"{mnt} is a {entry.fstype} mount, not memfs",
                         f"unmount it with its own tool: umount {mnt} (fusermount3 -u for FUSE)")
    owner = root if same_root(entry.store_root, root) else entry.store_root
    assert owner is not None
    state = answers(entry.point)
    if state == "dead":
        return _umount_dead(args, owner, mnt)
    if state == "hung":
        rec = read_record(owner)
        pid = rec.pid if rec else "PID"
        raise MemfsError(f"the memfs daemon serving {mnt} does not answer (pid {pid})",
                         f"see {owner / 'daemon.log'}; `kill {pid}` commits and stops it; "
                         f"`fusermount3 -uz {mnt}` detaches the mount without a commit")
    return _umount_live(args, owner, mnt)


def _not_mounted(root: Path, mnt: Path) -> MemfsError:
    if not os.path.lexists(mnt):
        what = f"{mnt} does not exist"
    else:
        what = f"{mnt} is not a mount point: nothing to unmount"
    try:
        served = call(root, "ping", stall=5).get("mountpoint")
    except (NoDaemon, MemfsError):
        served = None
    if served:
        return MemfsError(what, f"memfs serves the store at {root} at {served}: "
                                f"`memfs umount {served}`")
    dead = dead_daemon(root)
    if dead is not None and dead.record.mountpoint == str(mnt):
        return MemfsError(f"{what}: the daemon that served it (pid {dead.record.pid}) died "
                          f"and its mount is already gone; {dead.loss}",
                          f"`memfs mount {mnt}` mounts the store again")
    return MemfsError(what, f"no memfs daemon serves the store at {root} (`memfs status`)")


def _umount_dead(args, owner: Path, mnt: Path) -> int:
    """Its daemon is gone: unmount the husk, and say what the death cost, never a commit."""
    dead = dead_daemon(owner)
    _unmount_dead(mnt)
    loss = dead.loss if dead else "what it had not committed is lost; everything fsynced is kept"
    pid = f" (pid {dead.record.pid})" if dead else ""
    text = (f"unmounted the dead mount at {mnt}: its memfs daemon{pid} had died, so nothing "
            f"was committed now; {loss}")
    emit(args, {"unmounted": str(mnt), "committed": False, "dead": True, "loss": loss}, text)
    return 0


def _umount_live(args, owner: Path, mnt: Path) -> int:
    pid = _serving_pid(owner, mnt)
    behind: dict[str, dict] = {}
    if pid is not None:
        try:
            behind = _disk_behind(call(owner, "sync"))
        except MemfsError as exc:  # nothing was unmounted: the mount stays usable
            raise MemfsError(f"{mnt} stays mounted: could not commit what is pending: "
                             f"{exc.message}",
                             f"{exc.remedy + '; ' if exc.remedy else ''}then `memfs umount` "
                             "again (the daemon keeps retrying meanwhile)") from None
    res = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        raise _busy_or(mnt, res.stderr.strip())
    if pid is None:
        emit(args, {"unmounted": str(mnt), "committed": None},
             f"unmounted {mnt}; its daemon serves another store (its socket is not under "
             f"{owner}), which commits what is pending as it exits")
        return 0
    deadline = time.monotonic() + EXIT_WAIT
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        emit(args, {"unmounted": str(mnt), "committed": None, "pid": pid},
             f"unmounted {mnt}; the daemon (pid {pid}) is still committing after "
             f"{EXIT_WAIT:g} s: `memfs status` says when it is done")
        return 1
    left = read_record(owner)
    if left is not None and left.ended is not None:
        why = f": {left.last_commit_error}" if left.last_commit_error else ""
        raise MemfsError(f"unmounted {mnt}, but the daemon exited with {left.pending} change(s) "
                         f"it could not commit{why}",
                         "they are lost; everything fsynced before is in the store "
                         f"(see {owner / 'daemon.log'})")
    emit(args, {"unmounted": str(mnt), "committed": True, "pid": pid, "disk_owed": behind},
         f"unmounted {mnt}; everything was committed (daemon pid {pid} exited)"
         + _behind_text(behind))
    return 0


def _disk_behind(status: object) -> dict[str, dict]:
    """mount -> what its backing directory still owes, from the last status before the
    unmount: a draft in a bound mount is committed to the store, not yet written to disk."""
    backing = status.get("backing") if isinstance(status, dict) else None
    out = {}
    for mount, b in sorted((backing or {}).items()):
        o = b.get("owed") or {}
        if o.get("changes") or o.get("workspace_deletions") or o.get("conflicts"):
            out[mount] = {"dir": b.get("dir"), **o}
    return out


def _behind_text(behind: dict[str, dict]) -> str:
    """The lines that say which backing directories are behind the store, and the remedy."""
    return "".join(f"\nnote: {b['dir']} is behind {mount}: {owed_text(b)}; "
                   f"{_behind_remedy(mount, b)}" for mount, b in behind.items())


def _behind_remedy(mount: str, b: dict) -> str:
    """What writes each kind out: a bare materialize leaves deletions (they need
    --apply-deletions) and skips conflicts (a path sync or a forced materialize decides)."""
    parts = []
    if b.get("changes") or b.get("workspace_deletions"):
        flag = "--apply-deletions " if b.get("workspace_deletions") else ""
        parts.append(f"they are kept in the store (`memfs mount`, then "
                     f"`memfs materialize {flag}{mount}` writes them out)")
    if b.get("conflicts"):
        parts.append(f"each conflict stays until you choose a side (`memfs ls --states "
                     f"{mount}` names them; `memfs sync {mount}/PATH` takes disk's, "
                     f"`memfs materialize --force {mount}/PATH` writes the store's)")
    return "; ".join(parts)


def _serving_pid(owner: Path, mnt: Path) -> int | None:
    """The pid of the daemon serving `mnt` for the store at `owner`; None for a live memfs
    mount whose source names no store (its daemon cannot be asked to commit first)."""
    try:
        return call(owner, "ping", stall=10)["pid"]
    except NoDaemon:
        entry = mount_entry(mnt)
        if entry is not None and entry.store_root is not None:
            raise MemfsError(f"the memfs daemon serving {mnt} (store {owner}) does not answer "
                             "on its control socket", f"see {owner / 'daemon.log'}; "
                             f"`fusermount3 -u {mnt}` unmounts it without asking it to commit "
                             "first (it still commits as it exits)") from None
        return None


def _busy_or(mnt: Path, stderr: str) -> MemfsError:
    if "busy" in stderr.lower():
        return MemfsError(f"{mnt} is busy: a program has a file or its working directory in it "
                          f"({stderr})",
                          f"close it (`fuser -vm {mnt}` lists them), then retry; nothing was "
                          "unmounted and the daemon keeps committing")
    return MemfsError(f"could not unmount {mnt}: {stderr}",
                      f"as its owner or root: fusermount3 -u {mnt}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
