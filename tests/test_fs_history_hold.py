"""Undo and branch switch through a real mount, while the store's writer is taken and while
writers keep changing the tree (docs/architecture.md, "What the trio loop may wait for").

An undo's head move waits for whoever holds the store's writer (a GC, another process with
SQLite's write lock): in a worker thread, while the mount keeps answering reads; changes asked
for meanwhile wait (`changes_held` in .memfs/status) and land on the undone tree. A change is
either in the state the operation leaves behind (the old head, in history) or after it, never
half there and never lost in between.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers.files import write_durably
from helpers.mount import REPO, memfs_cmd

pytestmark = pytest.mark.mount

STALL = 1.0  # the longest a free daemon takes to answer one request under the shared load
WINDOW = 2.0  # how long reads are timed while the undo waits


def status(m) -> dict:  # noqa: ANN001
    with open(m.mnt / ".memfs" / "status") as f:
        return json.load(f)


def timed(fn, *args):  # noqa: ANN001, ANN201
    """(seconds fn(*args) took, its result)"""
    t0 = time.monotonic()
    got = fn(*args)
    return time.monotonic() - t0, got


def test_reads_are_answered_while_an_undo_waits_for_the_store_writer(mounted) -> None:
    """Another process holds SQLite's write lock on store.db (as a second writer, or a GC's
    transactions, would): `memfs undo` waits for it, and meanwhile lookups, opens, reads,
    listings and status through the mount are answered at once, from the tree as it was; a
    mkdir asked for meanwhile waits, then lands on the undone tree. Before the change the
    undo's head move ran on the loop: every request waited for the lock."""
    m = mounted
    m.require_real()
    doc = m.work / "doc.txt"
    (m.work / "other").mkdir()
    write_durably(doc, b"one\n")
    head1 = status(m)["head"]
    write_durably(doc, b"two\n")
    db = sqlite3.connect(m.root / "store.db", timeout=0, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held by this process
    released = 0.0
    worst = 0.0
    made: list[float] = []
    mkdir = threading.Thread(
        target=lambda: (os.mkdir(m.work / "other" / "during"), made.append(time.monotonic())))
    undo = subprocess.Popen(memfs_cmd(m.root, "undo", "--to", head1, "--json"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the undo holds changes off: it is in its store step
            took, st = timed(status, m)
            worst = max(worst, took)
            held = st.get("changes_held")
            if held and held["by"] == "undo":
                break
            assert worst < STALL, f"status took {worst:.2f} s while the undo started"
            assert undo.poll() is None, f"the undo did not wait: {undo.communicate()}"
            assert time.monotonic() < deadline, "the undo never held changes off"
            time.sleep(0.02)
        mkdir.start()
        i = 0
        end = time.monotonic() + WINDOW
        while time.monotonic() < end:
            i += 1
            took, data = timed(doc.read_bytes)
            assert data == b"two\n", "the tree changed before the undo ended"
            worst = max(worst, took)
            for fn, arg in ((os.path.lexists, m.work / f"missing-{i}"), (os.listdir, m.work),
                            (os.stat, m.work / "other"), (status, m)):
                worst = max(worst, timed(fn, arg)[0])
            time.sleep(0.02)
        assert undo.poll() is None, "the undo did not wait for the store's writer"
        assert not made, "a mkdir landed while the undo held changes off"
        said = m.cli("status").stdout
        assert "changes  waiting" in said and "for the undo to move the head" in said, said
    finally:
        db.execute("ROLLBACK")
        db.close()
        released = time.monotonic()
    out, err = undo.communicate(timeout=60)
    mkdir.join(timeout=60)
    assert undo.returncode == 0, f"{out}{err}"
    assert worst < STALL, f"a request through the mount waited {worst:.2f} s for the undo"
    assert made and made[0] >= released, "the mkdir did not wait for the undo"
    assert json.loads(out)["head"] == head1
    assert doc.read_bytes() == b"one\n"
    assert sorted(os.listdir(m.work / "other")) == ["during"]
    assert status(m)["changes_held"] is None
    m.cli("sync")
    assert status(m)["head"] != head1, "the mkdir made after the undo is committed on it"


def test_reads_are_answered_while_many_changes_wait(mounted) -> None:
    """Each change that waits for an undo keeps one of pyfuse3's worker tasks: with the
    default 99, 150 writers in parallel (a `make -j`, an agent's tool batch) took them all,
    and reads of the tree waited for the undo too. The pool is larger now (daemon.MAX_TASKS),
    so reads go on while 150 changes wait, and every one lands after the undo."""
    m = mounted
    m.require_real()
    doc = m.work / "doc.txt"
    parents = [m.work / f"p{i}" for i in range(150)]
    for p in parents:
        p.mkdir()  # one parent each: the kernel serializes mkdirs in one directory
    write_durably(doc, b"one\n")
    head1 = status(m)["head"]
    write_durably(doc, b"two\n")
    db = sqlite3.connect(m.root / "store.db", timeout=0, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    made: list[float] = []
    threads = [threading.Thread(target=lambda p=p: (os.mkdir(p / "during"),
                                                    made.append(time.monotonic())))
               for p in parents]
    undo = subprocess.Popen(memfs_cmd(m.root, "undo", "--to", head1, "--json"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worst = 0.0
    try:
        deadline = time.monotonic() + 30
        while not (status(m).get("changes_held") or {}).get("by") == "undo":
            assert undo.poll() is None, f"the undo did not wait: {undo.communicate()}"
            assert time.monotonic() < deadline, "the undo never held changes off"
            time.sleep(0.02)
        for t in threads:
            t.start()
        time.sleep(1.0)  # every mkdir has reached the daemon and waits
        end = time.monotonic() + WINDOW
        while time.monotonic() < end:
            took, data = timed(doc.read_bytes)
            worst = max(worst, took, timed(os.listdir, m.work)[0])
            assert worst < STALL, f"a read waited {worst:.2f} s while 150 changes waited"
            assert data == b"two\n"
            time.sleep(0.02)
        assert not made, "a mkdir landed while the undo held changes off"
    finally:
        db.execute("ROLLBACK")
        db.close()
        released = time.monotonic()
    out, err = undo.communicate(timeout=60)
    for t in threads:
        t.join(timeout=60)
    assert undo.returncode == 0, f"{out}{err}"
    assert len(made) == 150 and min(made) >= released
    assert all((p / "during").is_dir() for p in parents)


class Writers:
    """Two sequential writers: one mkdirs work/d/N, one appends `L<N>` lines to work/f (open,
    write, fsync, close each time, as a logging shell would). Each records what returned; an
    append whose write or fsync answered ESTALE (its descriptor cut off by the replacement,
    memfs.workspace.cutoff) is in `refused`."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.stop = threading.Event()
        self.dirs: list[int] = []
        self.lines: list[tuple[int, float, float]] = []  # (N, open started, close ended)
        self.refused: list[int] = []  # appends cut off by the undo or switch (ESTALE)
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,))
                        for f in (self._mkdirs, self._appends)]

    def _guard(self, fn) -> None:  # noqa: ANN001
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def _mkdirs(self) -> None:
        n = 0
        while not self.stop.is_set():
            os.mkdir(self.work / "d" / str(n))
            self.dirs.append(n)
            n += 1

    def _appends(self) -> None:
        n = 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            fd = os.open(self.work / "f", os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, f"L{n}\n".encode())
                os.fsync(fd)
            except OSError as exc:
                if exc.errno != errno.ESTALE:
                    raise
                self.refused.append(n)
            finally:
                os.close(fd)
            self.lines.append((n, t0, time.monotonic()))
            n += 1

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        base = (len(self.dirs), len(self.lines))
        while len(self.dirs) < base[0] + count or len(self.lines) < base[1] + count:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "the writers stopped making progress"
            time.sleep(0.01)

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def lines_of(path: Path) -> list[int]:
    text = path.read_text()
    assert text.startswith("base\n") and text.endswith("\n"), f"a torn file: {text[-40:]!r}"
    out = []
    for line in text.splitlines()[1:]:
        assert line.startswith("L") and line[1:].isdigit(), f"a half-applied line {line!r}"
        out.append(int(line[1:]))
    return out


@pytest.mark.parametrize("how", ["undo", "switch"])
def test_writers_during_an_undo_or_a_switch_lose_nothing(mounted, how: str) -> None:
    """While two writers keep changing the tree, an undo (or a branch switch) takes place
    between two of their changes: everything before is in the state it leaves behind (the old
    head, shown under .memfs/), everything after is in the live tree, nothing is in both or
    half in one. The one append whose open came before the tree's replacement and whose write
    came after is refused with ESTALE (its descriptor is cut off: the file it opened was
    replaced), and only that one; no append is lost without an error. What each fsync made
    durable survives a SIGKILL."""
    m = mounted
    m.require_real()
    (m.work / "d").mkdir()
    write_durably(m.work / "f", b"base\n")
    m.cli("sync")
    head1 = status(m)["head"]
    if how == "switch":
        m.cli("branch", "create", "side")
    with Writers(m.work) as w:
        w.wait_for(20)
        t0 = time.monotonic()
        if how == "undo":
            res = m.cli_json("undo", "--to", head1)
            before = m.mnt / ".memfs" / "history" / res["old_head"] / "work"  # type: ignore[index]
        else:
            m.cli("branch", "switch", "side")
            before = m.mnt / ".memfs" / "branches" / "main" / "work"
        t1 = time.monotonic()
        w.wait_for(20)
    assert not w.errors, w.errors
    m.cli("sync")
    if how == "undo":
        assert status(m)["head"] != head1  # the writers' changes after it are committed

    # mkdir: one request each, so exactly a prefix before and the rest after
    old = sorted(int(n) for n in os.listdir(before / "d"))
    new = sorted(int(n) for n in os.listdir(m.work / "d"))
    assert old == list(range(len(old))) and old, f"not a prefix before: {old}"
    assert new == list(range(len(old), len(w.dirs))), (
        f"a mkdir lost or doubled around the {how}: before {old[-3:]}, after {new[:3]}")

    # appends: whole lines, a prefix before and the rest after, but the one in flight
    old_lines, new_lines = lines_of(before / "f"), lines_of(m.work / "f")
    k = len(old_lines)
    assert old_lines == list(range(k)) and k, f"not a prefix before: {old_lines[-3:]}"
    assert new_lines and new_lines == list(range(new_lines[0], len(w.lines))), new_lines[:3]
    assert new_lines[0] in (k, k + 1), f"lines lost around the {how}: {k}..{new_lines[0]}"
    if new_lines[0] == k + 1:  # opened before the replacement, written after it
        _, opened, closed = w.lines[k]
        assert opened < t1 and closed > t0, f"line {k} lost though it did not straddle"
        assert w.refused == [k], f"line {k} was lost without an error (refused: {w.refused})"
    # A refusal is only ever the straddling append's: its write (then it is in neither
    # state) or its fsync (its write was committed before the replacement: the old head).
    assert len(w.refused) <= 1, f"more than the one straddling append refused: {w.refused}"
    for n in w.refused:
        _, opened, closed = w.lines[n]
        assert opened < t1 and closed > t0, f"line {n} refused though it did not straddle"

    # durable: each append was fsynced, each mkdir committed by the sync above
    m.kill()
    m.remount()
    assert lines_of(m.work / "f") == new_lines
    assert sorted(int(n) for n in os.listdir(m.work / "d")) == new
