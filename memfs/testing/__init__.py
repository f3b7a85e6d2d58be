"""Test support inside the package, in one home: crash points, fault hooks, test shims.

Every hook here is inert unless a test arms it, from the environment of the process under
test (a daemon started by a test) or, in-process, through FAULT_HOOKS. Production code calls
these functions at the named points; nothing else in memfs reads a MEMFS_TEST_* variable or
MEMFS_CRASH_AT.

- `crash_point(name)`: MEMFS_CRASH_AT=<name> SIGKILLs the process there (ordering tests:
  kills prove what was durable when), and a FAULT_HOOKS callable registered under the name
  runs there (race tests: an edit made exactly between a check and its use).
- `push_delay()`: MEMFS_TEST_PUSH_DELAY=<s>, seconds a materialize's push sleeps before each
  effect (switching the branch mid-push).
- `push_gate()`: while MEMFS_TEST_PUSH_GATE names a file that exists, a materialize's push
  waits before each effect, having added a line to `<file>.waiting`: a test knows how many
  pushes are inside their wait, changes what it wants meanwhile, and removes the file to let
  them go on (what a fixed delay only hopes for on a loaded machine).
- `commit_gate()`: the same gate, MEMFS_TEST_COMMIT_GATE, in a group commit's thread once its
  chunks are on disk and before the transaction commits: a write made meanwhile meets the
  space figures of a commit in flight.
- `pins_gate()`: the same gate, MEMFS_TEST_PINS_GATE, at the start of each publish of this
  host's pins (memfs.store.pg.pins.publish_checked), before it takes a connection: another
  host's commit made meanwhile is heard while a branch switch's publish is in flight.
- `scan_delay()`: MEMFS_TEST_SCAN_DELAY=<s>, seconds each after-batch scan sleeps first
  (coalescing and deadline misses).
- `walk_delay()`: MEMFS_TEST_WALK_DELAY=<s>, seconds a pass's walk sleeps after each directory
  (a long attach in a small tree: the control channel's progress lines and stall window).
- `plan_spin()`: MEMFS_TEST_PLAN_SPIN=<s>, seconds a pass's plan keeps the trio loop busy (on
  the CPU, no checkpoint), as planning a pass over 1M files does: no progress line meanwhile.
- `journal_fault()`: while MEMFS_TEST_JOURNAL_FAULT names a file that exists, the next journal
  write commits and then fails as SQLite does when the WAL's fsync fails after its frames were
  written; the file is removed, so a test arms exactly one failure at the moment it chooses.
- `pass_fault()`: while MEMFS_TEST_PASS_FAULT names a file that exists, every backing pass
  fails at its start with EIO, as a failing disk's read would (a daemon started so meets it
  in its first pass); removing the file ends it.
- `pins_fault(conn)`: while MEMFS_TEST_PINS_FAULT names a file that exists, the server ends
  the connection of every publish of this host's pins (memfs.store.pg.pins.publish_checked)
  at its start (`pg_terminate_backend` of its own backend): the publish meets a real lost
  connection at the moment that matters, while the host's other connections go on working;
  removing the file is the server back.

Any thread; FAULT_HOOKS is written only by tests, before the code under test runs.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import time
from collections.abc import Callable

CRASH_ENV = "MEMFS_CRASH_AT"
PUSH_DELAY_ENV = "MEMFS_TEST_PUSH_DELAY"
PUSH_GATE_ENV = "MEMFS_TEST_PUSH_GATE"
COMMIT_GATE_ENV = "MEMFS_TEST_COMMIT_GATE"
PINS_GATE_ENV = "MEMFS_TEST_PINS_GATE"
GATE_LIMIT = 120.0  # s a push waits at a gate a test forgot to open
SCAN_DELAY_ENV = "MEMFS_TEST_SCAN_DELAY"
WALK_DELAY_ENV = "MEMFS_TEST_WALK_DELAY"
PLAN_SPIN_ENV = "MEMFS_TEST_PLAN_SPIN"
JOURNAL_FAULT_ENV = "MEMFS_TEST_JOURNAL_FAULT"
PASS_FAULT_ENV = "MEMFS_TEST_PASS_FAULT"
PINS_FAULT_ENV = "MEMFS_TEST_PINS_FAULT"

FAULT_HOOKS: dict[str, Callable[[], None]] = {}


def crash_point(name: str) -> None:
    """A named point: killed here if MEMFS_CRASH_AT names it; a registered hook runs here."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    hook = FAULT_HOOKS.get(name)
    if hook is not None:
        hook()


def _seconds(env: str) -> float:
    return float(os.environ.get(env) or 0)


def push_delay() -> float:
    return _seconds(PUSH_DELAY_ENV)


def push_gate() -> None:
    """Wait while the push gate's file exists (module docstring); worker thread."""
    _gate(PUSH_GATE_ENV)


def commit_gate() -> None:
    """Wait while the commit gate's file exists (module docstring); commit thread."""
    _gate(COMMIT_GATE_ENV)


def pins_gate() -> None:
    """Wait while the pins gate's file exists (module docstring); the publishing thread."""
    _gate(PINS_GATE_ENV)


def _gate(env: str) -> None:
    gate = os.environ.get(env)
    if not gate or not os.path.exists(gate):
        return
    with open(gate + ".waiting", "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + GATE_LIMIT
    while os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


def scan_delay() -> float:
    return _seconds(SCAN_DELAY_ENV)


def walk_delay() -> float:
    return _seconds(WALK_DELAY_ENV)


def plan_spin() -> None:
    end = time.monotonic() + _seconds(PLAN_SPIN_ENV)
    while time.monotonic() < end:
        pass


def journal_fault() -> None:
    """The one injected journal failure (module docstring), consumed as it fires."""
    trigger = os.environ.get(JOURNAL_FAULT_ENV)
    if not trigger:
        return
    try:
        os.unlink(trigger)
    except FileNotFoundError:
        return
    exc = sqlite3.OperationalError("disk I/O error (injected)")
    exc.sqlite_errorcode = 10  # type: ignore[attr-defined]  # SQLITE_IOERR
    raise exc


def pass_fault() -> None:
    """The injected pass failure (module docstring), while its file exists."""
    trigger = os.environ.get(PASS_FAULT_ENV)
    if trigger and os.path.exists(trigger):
        raise OSError(errno.EIO, "Input/output error (injected)", trigger)


def pins_fault(conn) -> None:  # conn: a psycopg connection (psycopg is an optional extra)
    """The injected lost connection of a pins publish (module docstring), while its file
    exists; raises psycopg's OperationalError, as the server's end of it."""
    trigger = os.environ.get(PINS_FAULT_ENV)
    if trigger and os.path.exists(trigger):
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")


__all__ = ["COMMIT_GATE_ENV", "CRASH_ENV", "FAULT_HOOKS", "JOURNAL_FAULT_ENV", "PASS_FAULT_ENV",
           "PINS_FAULT_ENV", "PINS_GATE_ENV", "PLAN_SPIN_ENV", "PUSH_DELAY_ENV", "PUSH_GATE_ENV",
           "SCAN_DELAY_ENV", "WALK_DELAY_ENV", "commit_gate", "crash_point", "journal_fault",
           "pass_fault", "pins_fault", "pins_gate", "plan_spin", "push_delay", "push_gate",
           "scan_delay", "walk_delay"]
