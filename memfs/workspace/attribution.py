"""Which operation a change belongs to: the requesting process's group, session and command.

A FUSE request carries the caller's pid. From /proc/<pid>/stat we take its process group and
session and walk its parents while they stay in that group: the last one is the group's
*top* (normally the group leader), and the one right below it on the way is the *command*
(the top itself when it asked). With job control every command line a person types is a
group of its own; a script, or an agent's runner starting one shell per tool call, runs its
commands in its own group, so the command below the top tells them apart. How the records
are read back into operations is memfs.store.opspan's rule.

The current operation is a context variable: each trio task (a FUSE request, a reconciler
pass) sets its own, and `Workspace._touch` reads it, so only a request that really changed
the tree is ever named, and a failed one never is.

Loop thread only. /proc/<pid>/stat and the command lines are read once per new pid per
group commit (the caches are dropped at each commit, so a pid the kernel reuses later, or a
process that has exec'ed since, is read again).
"""

from __future__ import annotations

import contextvars
import functools
import os
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memfs.store.history import OpRecord

CURRENT: contextvars.ContextVar[OpRecord | None] = contextvars.ContextVar("memfs_operation",
                                                                          default=None)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "fish",
                    "tcsh", "csh", "yash", "posh"})
MAX_CHAIN = 64
LABEL_MAX = 200


@dataclass(frozen=True)
class Proc:
    pid: int
    comm: str
    ppid: int
    pgid: int
    sid: int
    start: int  # clock ticks after boot: with the pid, names one process for its whole life


def read_proc(pid: int) -> Proc | None:
    """/proc/<pid>/stat, or None if the process is gone or not ours to see."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    try:
        head, _, rest = raw.rpartition(b")")
        comm = head.partition(b"(")[2].decode("utf-8", "replace")
        f = rest.split()
        return Proc(pid, comm, int(f[1]), int(f[2]), int(f[3]), int(f[19]))
    except (IndexError, ValueError):
        return None


def read_tgid(tid: int) -> int:
    """The process a thread belongs to: the kernel names the requesting thread, and two
    threads of one program are one process, not two commands."""
    try:
        with open(f"/proc/{tid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return tid


def _exe(pid: int) -> tuple[int, int]:
    """(device, inode) of the program a process runs, (0, 0) if not ours to see."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def read_cmdline(pid: int, fallback: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(8192)
    except OSError:
        return fallback
    args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    if not args:
        return fallback
    text = " ".join(a if a and not any(ch in a for ch in " \t'\"\\$") else shlex.quote(a)
                    for a in args)
    return text if len(text) <= LABEL_MAX else text[:LABEL_MAX - 1] + "…"


class Attribution:
    """Builds the OpRecord of each request; owns the /proc caches and the mark epoch."""

    def __init__(self) -> None:
        self._procs: dict[int, Proc | None] = {}
        self._ops: dict[tuple[int, int], OpRecord] = {}
        self._cmdlines: dict[tuple[int, int], str] = {}
        self._exes: dict[int, tuple[int, int]] = {}  # top pid -> its program (Attribution._execed)
        # Epoch: a daemon start plus the marks since; part of every group's identity.
        self._run = f"{time.time_ns():x}"
        self._marks = 0
        self._serial = 0
        self.unattributed = self.system("memfs", "changes")

    # -- per request -----------------------------------------------------------------------
    def of_request(self, pid: int, uid: int) -> OpRecord:
        op = self._ops.get((pid, uid))
        if op is not None and op.top_self and op.top_shell and self._execed(op):
            op = None  # the shell ran its last command in its own place (bash -c 'a; b')
        if op is None:
            op = self._ops[(pid, uid)] = self._build(pid, uid)
        return op

    def _execed(self, op: OpRecord) -> bool:
        """Has the shell `op` was built for exec'd another program since? Its pid and start
        stay, so only the program tells: bash runs the last command of `bash -c 'a; b'` in
        its own process, and that command's changes read as the shell's own (one operation:
        undo took back `a` with `b`). Asked only for a shell's own requests, which are few
        (a builtin's redirection); the program's requests then have an op of their own."""
        if _exe(op.pid) == self._exes.get(op.pid):
            return False
        self._procs.pop(op.pid, None)  # read again: comm, and the command line below
        for key in [k for k in self._cmdlines if k[0] == op.pid]:
            del self._cmdlines[key]
        return True

    def forget_processes(self) -> None:
        """At each group commit: a pid seen again is read again (it may be another process,
        or the same one after an exec)."""
        self._procs.clear()
        self._ops.clear()
        self._cmdlines.clear()
        self._exes.clear()

    def mark(self) -> None:
        """`memfs mark` / after-batch: every operation after this is a new one."""
        self._marks += 1
        self._ops.clear()

    def system(self, kind: str, label: str) -> OpRecord:
        """An operation of memfs itself (a reconciler pass, a materialize, an attach): each
        call is a new one, named by the daemon's own process."""
        self._serial += 1
        key = f"{kind}:{self._run}.{self._serial}"
        me = os.getpid()
        return OpRecord(kind, key, key, "", label, label, me, os.getpgid(0), os.getsid(0),
                        os.getuid(), kind)

    # -- building --------------------------------------------------------------------------
    def _proc(self, pid: int) -> Proc | None:
        if pid not in self._procs:
            self._procs[pid] = read_proc(pid)
        return self._procs[pid]

    def _chain(self, me: Proc) -> list[Proc]:
        """me, then its parents while they stay in my process group and session."""
        chain = [me]
        p = me
        while len(chain) < MAX_CHAIN and p.ppid > 0:
            parent = self._proc(p.ppid)
            if parent is None or parent.pgid != me.pgid or parent.sid != me.sid:
                break
            chain.append(parent)
            p = parent
        return chain

    def _cmdline(self, p: Proc) -> str:
        key = (p.pid, p.start)
        text = self._cmdlines.get(key)
        if text is None:
            text = self._cmdlines[key] = read_cmdline(p.pid, p.comm)
        return text

    def _build(self, tid: int, uid: int) -> OpRecord:
        pid = read_tgid(tid)
        me = self._proc(pid)
        if me is None:  # gone already, or in no namespace we can read: an operation alone
            key = f"pid:{pid}:{self._run}.{self._marks}"
            return OpRecord("process", key, key, "top", f"pid {pid}", f"pid {pid}", pid, 0, 0,
                            uid, "?", True, False)
        chain = self._chain(me)
        top = chain[-1]
        cmd = chain[-2] if len(chain) > 1 else top
        # The top's program is part of the group: a shell that exec'd its last command is
        # that command's group from then on (pid and start stay the same).
        exe = self._exes[top.pid] = _exe(top.pid)
        group = (f"{me.sid}:{me.pgid}:{top.pid}@{top.start}" + (f"~{exe[1]:x}" if exe[1] else "")
                 + f"#{self._run}.{self._marks}")
        command = "top" if cmd is top else f"{cmd.pid}@{cmd.start}"
        leader, label = self._cmdline(top), self._cmdline(cmd)
        if cmd is not top and label == leader and cmd is not me:
            label = self._cmdline(me)  # a subshell, `( cd x && git status )`: say what ran
        return OpRecord(
            "process", f"{group}/{command}", group, command, label, leader, pid, me.pgid,
            me.sid, uid, me.comm, cmd is top, top.comm in SHELLS)


@contextmanager
def acting(op: OpRecord, *, keep: bool = False) -> Iterator[OpRecord]:
    """Changes made in this task until the block ends belong to `op` (with `keep`, an
    operation already set, such as a materialize around its pass, stays)."""
    if keep and CURRENT.get() is not None:
        yield CURRENT.get()  # type: ignore[misc]
        return
    token = CURRENT.set(op)
    try:
        yield op
    finally:
        CURRENT.reset(token)


def labelled(kind: str, describe: Callable[[Any], str]):
    """For a Backing method taking (self, subject, ...): its tree changes are memfs's own
    operation of `kind`, named `describe(subject)` ("reconciler: disk changes in work"). An
    operation already set in the task stays (a materialize's pass is the materialize's)."""
    def deco(fn):
        @functools.wraps(fn)
        async def wrapper(self, subject, *args, **kwargs):
            op = self.ws.attribution.system(kind, describe(subject))
            with acting(op, keep=True):
                return await fn(self, subject, *args, **kwargs)

        return wrapper

    return deco
