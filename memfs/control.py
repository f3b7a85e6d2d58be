"""The control channel: one JSON request a line over a Unix socket, answered by one JSON reply
line, with progress lines before it while the request runs long.

A running daemon serves `<root>/control.sock`; the CLI tries it first and opens the store
directly only when no daemon answers, so an undo typed in a shell is seen through the
mount at once.

A request carrying `"progress": true` (every `call` here) is answered, if it has not finished
within PROGRESS_EVERY seconds, by a `{"progress": {...}}` line that often until its reply
(memfs.fs.longops); a request without it gets the reply alone, as before. So the client waits
as long as the daemon makes progress (an attach of 1M files takes minutes), and gives up only
when, for the stall window (MEMFS_CONTROL_STALL, default STALL seconds), no line arrives and
the daemon spends no CPU (`_Alive`: its loop may be busy a while without a line): the daemon
is then stopped or stuck, and the error says which and what to do. A short request's reply comes as soon as it is ready: no line is waited for.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from memfs.errors import MemfsError
from memfs.liveness import read_record
from memfs.rootdir import control_socket, socket_address

MAX_LINE = 64 << 20
PROGRESS_EVERY = 1.0  # seconds between the daemon's progress lines for a running request
STALL = 60.0  # seconds without a line from the daemon before the client gives up
LOOK_EVERY = 1.0  # seconds of silence between looks at whether the daemon is still at work
SHOW_EVERY = 30.0  # not a terminal: a progress line on stderr this often


# What a request is called in progress lines and status; ops not named here are short.
NAMES = {"backing_attach": "attach", "backing_sync": "sync", "backing_materialize":
         "materialize", "backing_states": "ls --states", "backing_after_batch": "after-batch",
         "backing_detach": "detach", "sync": "commit", "gc": "gc", "du": "du", "undo": "undo",
         "restore": "restore", "branch_switch": "branch switch", "takeover": "takeover"}


def describe(op: str, args: dict) -> str:
    """`attach work -> /src`, `sync work/a`: the request as the user typed it, roughly."""
    name = NAMES.get(op, str(op))
    if not isinstance(args, dict):  # a malformed request is answered, and named, too
        return name
    if op == "backing_attach":
        return f"{name} {args.get('mount')} -> {args.get('dir')}"
    if op in ("backing_sync", "backing_states") and args.get("path"):
        return f"{name} {args['path']}"
    if op == "backing_detach":
        return f"{name} {args.get('mount')}"
    return name


class NoDaemon(Exception):
    """Nobody serves this root's control socket."""


def _seconds_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise MemfsError(f"{name}={raw!r} is not a number of seconds above 0",
                         f"set it to, say, {default:g}, or unset it")
    return value


def stall_window() -> float:
    """How long the CLI waits for any line from the daemon (MEMFS_CONTROL_STALL)."""
    return _seconds_env("MEMFS_CONTROL_STALL", STALL)


def call(root: Path, op: str, stall: float | None = None, *, show_progress: bool = True,
         **args) -> object:
    """Send one request to the daemon and wait for its reply as long as progress lines come
    (none for `stall` seconds: a MemfsError saying why); raise NoDaemon if none runs,
    MemfsError on refusal. Progress goes to stderr (`show_progress`)."""
    stall = stall_window() if stall is None else stall
    path = control_socket(root)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(min(stall, LOOK_EVERY))
    shown = Shown() if show_progress else None
    last: dict | None = None
    try:
        try:
            with socket_address(path) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NoDaemon(str(path)) from exc
        sock.sendall(json.dumps({"op": op, "args": args, "progress": True}).encode() + b"\n")
        lines = _Lines(sock, _Alive(root, stall))
        while True:
            line = lines.next()
            if line is None:
                raise _closed(root, op, args, last)
            reply = json.loads(line)
            if "progress" not in reply:
                break
            last = reply["progress"]
            if shown is not None:
                shown.show(last)
    except TimeoutError:
        raise _stalled(root, op, args, stall, last) from None
    except KeyboardInterrupt:
        if last is not None:  # it ran long: say what goes on without us
            _interrupted(root, last)
        raise
    finally:
        sock.close()
        if shown is not None:
            shown.done()
    if not reply.get("ok"):
        raise MemfsError(reply.get("error", "request failed"), reply.get("remedy", ""))
    return reply.get("result")


class _Alive:
    """Whether the daemon is still at work: a line from it, or CPU time it has spent since
    (/proc/PID/stat). Its loop sends the lines, and plans a pass over every file of a mount
    without a pause: ~7 s at 200k files on a loaded machine, so tens of seconds at 1M, with
    no line meanwhile. A daemon that is stopped, deadlocked or waiting on a hung disk spends
    none; one spinning in a bug is waited for (Ctrl-C says what goes on)."""

    def __init__(self, root: Path, stall: float) -> None:
        self.root = root
        self.stall = stall
        self.pid: int | None = None
        self.cpu: int | None = None
        self.looked = False  # the record and /proc are read at the first silence only: a
        self.since = time.monotonic()  # short request's latency stays the socket's

    def heard(self) -> None:
        self.since = time.monotonic()

    def stalled(self) -> bool:
        if not self.looked:
            self.looked = True
            rec = read_record(self.root)
            self.pid = rec.pid if rec else None
            self.cpu = _cpu_ticks(self.pid)
        cpu = _cpu_ticks(self.pid)
        if cpu is not None and cpu != self.cpu:
            self.cpu = cpu
            self.since = time.monotonic()
        return time.monotonic() - self.since >= self.stall


def _cpu_ticks(pid: int | None) -> int | None:
    """utime + stime of the process (all its threads), or None if /proc cannot say."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


class _Lines:
    """Lines off the socket; TimeoutError once the daemon has been still for the stall
    window (`_Alive`), looked at every LOOK_EVERY seconds of silence."""

    def __init__(self, sock: socket.socket, alive: _Alive) -> None:
        self.sock = sock
        self.alive = alive
        self.buf = bytearray()

    def next(self) -> bytes | None:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 1]
                self.alive.heard()
                return line
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                if self.alive.stalled():
                    raise
                continue
            if not chunk:
                return None
            self.buf += chunk


def progress_text(p: dict) -> str:
    doing = "; ".join(p.get("doing") or []) or "running"
    return f"{p.get('request', '?')}: {doing}, {p.get('seconds', 0):.0f} s"


class Shown:
    """Progress on stderr: rewritten in place on a terminal; else a line every SHOW_EVERY
    seconds (MEMFS_PROGRESS_EVERY), so a log of a long run shows it was alive. Also what a
    daemon-less command shows of its own long work (memfs.cli.reconcile_cmds)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.every = _seconds_env("MEMFS_PROGRESS_EVERY", SHOW_EVERY)
        self.next = time.monotonic() + self.every
        self.drawn = False

    def show(self, p: dict) -> None:
        text = "memfs: " + progress_text(p)
        if self.tty:
            sys.stderr.write("\r\033[K" + text[:(os.get_terminal_size(2).columns or 80) - 1])
            sys.stderr.flush()
            self.drawn = True
        elif time.monotonic() >= self.next:
            self.next = time.monotonic() + self.every
            print(text, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _stalled(root: Path, op: str, args: dict, stall: float, last: dict | None) -> MemfsError:
    """Nothing for `stall` seconds: say which it is (stopped, gone, or silent) and the remedy."""
    what = repr(last["request"] if last else describe(op, args))
    was = f" (last heard: {progress_text(last)})" if last else ""
    rec = read_record(root)
    pid = rec.pid if rec else None
    state = _proc_state(pid) if pid else None
    after = (f"{what} goes on in the daemon once it runs again; `memfs status` shows whether "
             "it has finished")
    if state in ("T", "t"):
        return MemfsError(f"the memfs daemon of {root} (pid {pid}) is stopped (SIGSTOP, "
                          f"Ctrl-Z in its shell, or a debugger), so {what} made no progress "
                          f"for {stall:g} s{was}", f"`kill -CONT {pid}` resumes it; {after}")
    who = f"(pid {pid}) " if pid else ""
    return MemfsError(f"the memfs daemon of {root} {who}sent nothing and used no CPU for "
                      f"{stall:g} s while running {what}{was}",
                      f"it may be stuck: see {root / 'daemon.log'}; {after}; "
                      "MEMFS_CONTROL_STALL=SECONDS waits longer")


def _closed(root: Path, op: str, args: dict, last: dict | None) -> MemfsError:
    what = repr(last["request"] if last else describe(op, args))
    return MemfsError(f"the memfs daemon of {root} closed the connection without answering "
                      f"{what} (it may have just died)",
                      f"`memfs status` says whether it runs; see {root / 'daemon.log'}")


def _interrupted(root: Path, last: dict) -> None:
    print(f"\nmemfs: interrupted; the daemon goes on with {last['request']!r} "
          f"({progress_text(last)}): `memfs status` shows how far it has got and, once it "
          f"is done, how it ended (so does {root / 'daemon.log'})", file=sys.stderr, flush=True)


def encode_reply(result: object = None, error: BaseException | None = None) -> bytes:
    if error is None:
        body = {"ok": True, "result": result}
    elif isinstance(error, MemfsError):
        body = {"ok": False, "error": error.message, "remedy": error.remedy}
    else:
        body = {"ok": False, "error": f"{type(error).__name__}: {error}", "remedy": ""}
    return json.dumps(body, default=str).encode() + b"\n"
