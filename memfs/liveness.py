"""Who serves a store root and whether it is alive: the daemon's record, the mount table, and
what a dead daemon leaves behind.

The daemon (memfs.fs.daemon) holds an flock on `<root>/daemon.lock` while it runs and keeps a
small JSON record in it, rewritten every HEARTBEAT seconds: its pid and mountpoint, and how much
was not yet durable at that moment. A clean exit with nothing pending empties the file. So a
record whose lock nobody holds is a daemon that died (SIGKILL, OOM, a crash), and the record
says what that cost: everything fsynced and committed is in the store; the changes pending at
its last sign of life, and any made after it, are lost.

No state is kept here: every function reads the files and /proc afresh, from any thread.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from memfs.errors import MemfsError

HEARTBEAT = 0.5  # seconds between the daemon's record updates: the bound on what it leaves out
LOCK_NAME = "daemon.lock"
FSNAME = "memfs"  # the mount's source is "memfs:<root>" (or plain "memfs" for an odd root)


@dataclass(frozen=True)
class DaemonRecord:
    """What daemon.lock says about the daemon that holds (or held) it."""

    pid: int
    mountpoint: str
    started: float  # wall clock
    seen: float  # the last update: the daemon was alive then
    commit_interval_ms: int
    head: str | None = None  # the durable head at `seen`
    pending: int = 0  # changes not yet durable at `seen`
    pending_since: float | None = None  # wall time of the oldest of them
    ended: float | None = None  # set by an exit that left changes not durable
    last_commit_error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_text(cls, text: str) -> DaemonRecord | None:
        """The record in `text`; None for an empty file (no daemon, or a clean exit)."""
        if not text.strip():
            return None
        raw = json.loads(text)
        fields = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        fields.setdefault("started", 0.0)
        fields.setdefault("seen", fields["started"])
        fields.setdefault("commit_interval_ms", 100)
        return cls(**fields)

    def identity(self) -> dict:
        """What `memfs status` shows of a live daemon."""
        return {"pid": self.pid, "mountpoint": self.mountpoint, "started": self.started}


def mount_source(root: Path) -> str:
    """The fsname the daemon mounts with, so the mount table names the store it serves. A root
    FUSE's option parser or the mount table would garble keeps the plain name."""
    text = str(root)
    return FSNAME if re.search(r"[,\\\s]", text) else f"{FSNAME}:{text}"


def lock_path(root: Path) -> Path:
    return root / LOCK_NAME


def read_record(root: Path) -> DaemonRecord | None:
    """The record in root's daemon.lock, or None. A torn read of a rewrite is retried."""
    for _ in range(5):
        try:
            return DaemonRecord.from_text(lock_path(root).read_text())
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError):
            time.sleep(0.01)
    return None


def lock_held(root: Path) -> bool:
    """Does a live process hold root's daemon lock? A shared probe, released at once: a daemon
    starting in that instant retries its own lock (daemon.RootLock), so it is never refused."""
    try:
        fd = os.open(lock_path(root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock, if it got one
    return False


# -- the mount table -------------------------------------------------------------------------

@dataclass(frozen=True)
class MountEntry:
    source: str
    point: str
    fstype: str
    options: str

    @property
    def is_memfs(self) -> bool:
        return self.fstype == "fuse.memfs"

    @property
    def store_root(self) -> Path | None:
        """The root a memfs mount serves, when its source names it."""
        prefix = FSNAME + ":"
        if self.is_memfs and self.source.startswith(prefix):
            return Path(self.source[len(prefix):])
        return None


def _unescape(field: bytes) -> str:
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def canonical(path: str | os.PathLike[str]) -> str:
    """An absolute path with its parent resolved, never stat'ing the path itself (a dead mount
    answers ENOTCONN, a stuck one would hang)."""
    p = os.path.abspath(os.path.expanduser(os.fspath(path)))
    parent, name = os.path.split(p)
    return os.path.join(os.path.realpath(parent), name) if name else p


def mount_entry(path: str | os.PathLike[str]) -> MountEntry | None:
    """The topmost mount at exactly `path`, from /proc/self/mounts."""
    target = canonical(path)
    found = None
    with open("/proc/self/mounts", "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and _unescape(parts[1]) == target:
                found = MountEntry(_unescape(parts[0]), target, _unescape(parts[2]),
                                   _unescape(parts[3]))
    return found


def store_of_cwd() -> Path | None:
    """The root served by the memfs mount the current directory is in (the innermost mount
    holding it), so a command run inside a mount of another store acts on that store, as git
    finds its repository; None outside one, or when the directory is gone (a dead mount)."""
    try:
        here = os.getcwd()
    except OSError:
        return None
    best: MountEntry | None = None
    with open("/proc/self/mounts", "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 4:
                continue
            point = _unescape(parts[1])
            if (here == point or here.startswith(point.rstrip("/") + "/")) and \
                    (best is None or len(point) >= len(best.point)):
                best = MountEntry(_unescape(parts[0]), point, _unescape(parts[2]),
                                  _unescape(parts[3]))
    return best.store_root if best is not None else None


def answers(point: str, timeout: float = 3.0) -> str:
    """"ok", "dead" (ENOTCONN: its daemon is gone) or "hung" (no answer within `timeout`). A
    statfs, because the kernel answers it only by asking the daemon (a stat may come from
    the attribute cache of a dead mount), in a helper thread so a stuck daemon cannot hang the
    caller."""
    result: list[str] = []

    def probe() -> None:
        try:
            os.statvfs(point)
            result.append("ok")
        except OSError as exc:
            result.append("dead" if exc.errno == errno.ENOTCONN else "ok")

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else "hung"


def same_root(named: Path | None, root: Path) -> bool:
    """Is a mount whose source names `named` (None: it names no root) one of `root`'s?"""
    return named is None or os.path.realpath(named) == os.path.realpath(root)


# -- a dead daemon ---------------------------------------------------------------------------

def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"


@dataclass(frozen=True)
class DurableHead:
    """The store's last durable commit on the current branch; `time`: when it became the
    head — its commit's time, or, when an undo or restore moved the head to it later, that
    move's (the commit's own time made a daemon killed just after an undo look as if it had
    lost the minutes since that older commit)."""

    id: str
    time: float
    by: str = ""  # what set it: the reflog's reason for a move, else the commit's message


def durable_head(root: Path) -> DurableHead | None:
    from memfs.store import open_store

    try:
        store = open_store(root, create=False)
    except (MemfsError, OSError, sqlite3.Error):
        return None
    try:
        branch = store.current_branch()
        head = store.head(branch)
        commit = store.commit(head)
        became, by = commit.time_ns / 1e9, commit.message
        for move in store.reflog(limit=20):
            if move["branch"] == branch:  # the newest move of this branch's head
                if move["new"] == head and move["time"] >= became:
                    became, by = move["time"], move["reason"]
                break
        return DurableHead(head, became, by)
    finally:
        store.close()


@dataclass(frozen=True)
class DeadDaemon:
    """A daemon that ended without a clean exit, and what it left: its record, the store's
    last durable commit, and whether its mountpoint is still a dead mount (Transport endpoint
    is not connected)."""

    root: Path
    record: DaemonRecord
    stale_mount: bool
    durable: DurableHead | None

    @property
    def what(self) -> str:
        r = self.record
        if r.ended is not None:
            return (f"the memfs daemon (pid {r.pid}) that served {r.mountpoint} exited at "
                    f"{clock(r.ended)} with changes not durable")
        text = (f"the memfs daemon (pid {r.pid}) that served {r.mountpoint} died without "
                f"unmounting (killed or crashed; last seen alive at {clock(r.seen)})")
        if self.stale_mount:
            text += f"; {r.mountpoint} is a dead mount (Transport endpoint is not connected)"
        return text

    @property
    def loss(self) -> str:
        """What the death means for data, as exactly as the record knows it. It died before
        its next record was due (HEARTBEAT after `seen`): that bounds the window."""
        r, d = self.record, self.durable
        kept = "everything fsynced is in the store" + (
            f", up to its last durable commit {d.id[:12]} ({clock(d.time)})" if d else "")
        if r.ended is not None:
            why = f" ({r.last_commit_error})" if r.last_commit_error else ""
            return f"{kept}; {r.pending} change(s) it could not commit{why} are lost"
        died_by = r.seen + HEARTBEAT
        if d is not None and d.id != r.head and d.time > died_by and r.head:
            # Not its commit: the head moved after it died (a takeover, an undo, a restore).
            return (f"everything fsynced is in the store (its durable head when last seen: "
                    f"{r.head[:12]}); the branch has moved since it died: its head is now "
                    f"{d.id[:12]}, set at {clock(d.time)} by "
                    + (f"`{d.by}`" if d.by else "another command")
                    + " (`memfs log` and `memfs reflog` show what came after it)")
        if d is not None and d.id != r.head:  # it committed after its last record
            return (f"{kept}; changes made after that commit are lost (it died at most "
                    f"{max(0.0, died_by - d.time):.1f} s after it)")
        if r.pending and r.pending_since is not None:
            return (f"{kept}; {r.pending} change(s) made from {clock(r.pending_since)} on were "
                    f"not yet durable when it was last seen and are lost, with any made after "
                    f"(at most {died_by - r.pending_since:.1f} s of changes)")
        return (f"{kept}; nothing was pending when it was last seen, so only changes made in "
                f"its last {HEARTBEAT:g} s, and not fsynced, can be lost")

    @property
    def remedy(self) -> str:
        if self.stale_mount:
            return (f"`memfs mount {self.record.mountpoint}` cleans the dead mount and mounts "
                    f"again (or `fusermount3 -u {self.record.mountpoint}` only cleans it)")
        return f"`memfs mount {self.record.mountpoint}` mounts again"

    def to_json(self) -> dict:
        return {"state": "dead", **self.record.to_json(), "stale_mount": self.stale_mount,
                "durable_head": self.durable.id if self.durable else None,
                "loss": self.loss, "remedy": self.remedy}


def dead_daemon(root: Path) -> DeadDaemon | None:
    """The daemon of `root` that died without a clean exit, or None (one runs, or none ran,
    or the last one exited cleanly)."""
    record = read_record(root)
    if record is None or lock_held(root):
        return None
    entry = mount_entry(record.mountpoint)
    stale = bool(entry and entry.is_memfs and same_root(entry.store_root, root)
                 and answers(entry.point) == "dead")
    return DeadDaemon(root, record, stale, durable_head(root))
