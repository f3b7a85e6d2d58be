"""Backing directories on a full store (issue 15 meets issue 13), through a real mount.

A store root on a 32 MiB tmpfs bound to a backing directory on the host's disk: a take-in that
cannot be stored changes nothing in the workspace (no empty file, no store version unlinked,
no conflict made of it) and says the store is full with the remedy; a conflict found while the
store is full cannot keep its disk side, so the pass refuses by name, leaves no scratch in
`<root>/conflicts`, and the daemon keeps serving (it used to die in its first pass at start,
every start, so the files that would free the space could not be deleted); once space is
back, the same pass takes disk in.

Both backends (tests/conftest.py BOTH_BACKENDS): on a store in PostgreSQL what fills is this
host's root (its caches, spill files, conflict copies and host.db), filled by another program;
the refusal names that root and its caches, never `memfs gc` (refused there), and the way back
is freeing that filesystem.

And the other disk: a backing directory on the small tmpfs, whose materialize has no room.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers.backing_mount import states
from helpers.mount import REPO, memfs_cmd
from helpers.space import MiB, fill, fsync_path, write_until_enospc

from memfs.testing import COMMIT_GATE_ENV

pytestmark = pytest.mark.mount

TEXT = b"a line of text written on disk\n" * (4 * MiB // 31)  # text: taken in, not disk-only


def fill_through_the_mount(m) -> list[Path]:
    """A program in the mount writes until memfs refuses for space (it keeps the headroom its
    own commits and journal need, so what fails next is memfs's, not SQLite's). A refusal
    can come while space the store gives back once a commit lands is still counted (seen
    under the whole suite's load: 6 MB writable after the fsync), so it writes again until
    what is left is less than one take-in."""
    big = m.mnt / "scratch"
    big.mkdir(exist_ok=True)
    fillers: list[Path] = []
    for attempt in range(5):
        fillers.append(big / f"fill{attempt}.bin")
        _, exc = write_until_enospc(fillers[-1], random.Random(7 + attempt))
        assert exc.errno == 28, repr(exc)
        fsync_path(big)
        writable = m.status()["space"]["writable"]
        if writable < len(TEXT):
            return fillers
    pytest.fail(f"{writable} B still writable after {len(fillers)} fills: the store is not full")


def fill_the_store(m, small_fs: Path, store_backend: str) -> list[Path]:
    """The embedded store fills from the mount. On PostgreSQL the mount's bytes go to the
    server, so another program fills this host's root up to what memfs keeps for its own
    writes (the headroom, 2 MiB here: host.db's journal is written there), and a little more:
    less than one take-in fits."""
    if store_backend == "sqlite":
        return fill_through_the_mount(m)
    filler = fill(small_fs, "host-filler")
    os.truncate(filler, filler.stat().st_size - 3 * MiB)
    fillers = [filler]
    writable = m.status()["space"]["writable"]
    assert writable < len(TEXT), f"{writable} B still writable: the host's root is not full"
    return fillers


def make_room(m, fillers: list[Path], store_backend: str) -> None:
    """The documented way back: delete in the mount, then `memfs gc` (the embedded store); on
    PostgreSQL, free the host's filesystem (the filler was another program's)."""
    for filler in fillers:
        filler.unlink()
    if store_backend == "sqlite":
        m.cli("gc")


def full_message(out, store_backend: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "full" in text and "Errno" not in text and "Traceback" not in text, text
    # "full" with MiB free said why (user trial: "full (18.4 MiB free ...)", no more)
    assert "kept for the commits' own metadata" in text and "waiting in memory" in text, text
    assert re.search(r"[\d.]+ [KMG]?i?B writable", text), text
    if store_backend == "sqlite":
        assert "memfs gc" in text, text  # what happened, and the remedy
    else:  # gc is refused there: the host's root and its caches are what to free
        assert "this host's root is full" in text and "/cache" in text, text
        assert "memfs gc" not in text, text
    return text


@pytest.fixture
def small_backed(small_fs: Path, mount_factory, tmp_path: Path, store_backend: str):
    disk = tmp_path / "proj"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    # The automatic run gives space back while these tests read the full state (it has its own
    # tests in test_lifecycle_fulldisk.py); the way back here is the documented `memfs gc`.
    # A store in PostgreSQL runs no GC.
    if store_backend == "sqlite":
        m.cli("config", "gc-auto", "off")
    m.cli("attach", "work", str(disk), "--watch", "off")
    assert (m.work / "a.txt").read_text() == "a1\n"
    return m, disk


def test_a_take_in_that_does_not_fit_changes_nothing(small_fs, small_backed,
                                                     store_backend) -> None:
    m, disk = small_backed
    (disk / "a.txt").write_bytes(TEXT)  # a tracked file changed on disk
    (disk / "new.txt").write_bytes(TEXT)  # a file seen for the first time
    fillers = fill_the_store(m, small_fs, store_backend)

    full_message(m.cli("sync", check=False), store_backend)
    # Neither was taken: the store's version is still there, no empty file stands in.
    assert (m.work / "a.txt").read_text() == "a1\n"
    assert not (m.work / "new.txt").exists()
    fsync_path(m.work)
    assert m.cli("show", "HEAD:work/a.txt").stdout == "a1\n"
    listed = states(m)
    assert listed["work/a.txt"][0] not in ("synced", "conflict"), listed
    assert listed.get("work/new.txt", ("",))[0] != "conflict", listed
    assert (disk / "a.txt").read_bytes() == TEXT  # disk untouched
    assert m.proc.poll() is None

    # Space back: the next sync takes both in, as disk has them.
    make_room(m, fillers, store_backend)
    m.cli("sync")
    assert (m.work / "a.txt").read_bytes() == TEXT
    assert (m.work / "new.txt").read_bytes() == TEXT
    listed = states(m)
    assert listed["work/a.txt"] == ("synced", None) and listed["work/new.txt"] == ("synced", None)


def test_a_conflict_found_on_a_full_store_leaves_the_daemon_serving(small_fs, small_backed,
                                                                   store_backend) -> None:
    m, disk = small_backed
    (m.work / "a.txt").write_text("the mount's side\n")
    fsync_path(m.work)
    (disk / "a.txt").write_bytes(TEXT)  # both changed: a conflict, disk's side to be kept
    fillers = fill_the_store(m, small_fs, store_backend)
    other = fill(small_fs)  # and another program takes the headroom memfs kept

    m.kill()
    m.remount()  # the first pass at start finds the conflict with no room for disk's side
    deadline = time.monotonic() + 20
    while not (m.status().get("backing", {}).get("work") or {}).get("last_error"):
        assert m.proc.poll() is None, f"the daemon died at start:\n{m.log_text()}"
        assert time.monotonic() < deadline, "the first pass never reported"
        time.sleep(0.1)
    assert m.proc.poll() is None
    full_message(m.cli("ls", "--states", check=False), store_backend)
    conflicts = m.root / "conflicts"
    assert not [p for p in conflicts.iterdir() if p.name.endswith(".tmp")] \
        if conflicts.exists() else True
    # The mount is usable: the user can delete what fills the disk.
    assert (m.work / "a.txt").read_text() == "the mount's side\n"

    other.unlink()
    make_room(m, fillers, store_backend)
    assert states(m)["work/a.txt"] == ("conflict", "both-changed")
    kept = [p for p in conflicts.iterdir() if not p.name.startswith(".")]
    assert [p.read_bytes() for p in kept] == [TEXT]  # disk's side, kept in full
    assert m.proc.poll() is None


def test_an_attach_that_cannot_take_everything_in_exits_1(small_fs, mount_factory,
                                                          tmp_path: Path, store_backend) -> None:
    """`memfs attach` on a full store printed the pass's `error: ... full` and exited 0, where
    `memfs sync` with the same error exits 1: a script's `memfs attach ... && make` went on
    with files not taken in. The binding is made either way; the sync after the remedy takes
    the rest."""
    disk = tmp_path / "proj"
    disk.mkdir()
    (disk / "big.txt").write_bytes(TEXT)
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    if store_backend == "sqlite":
        m.cli("config", "gc-auto", "off")
    fillers = fill_the_store(m, small_fs, store_backend)
    full_message(m.cli("attach", "work", str(disk), "--watch", "off", check=False),
                 store_backend)
    assert m.status()["backing"]["work"]["dir"] == str(disk)
    assert not (m.work / "big.txt").exists()
    make_room(m, fillers, store_backend)
    m.cli("sync")
    assert (m.work / "big.txt").read_bytes() == TEXT


@pytest.mark.embedded_only  # the backing directory's disk is full, not the store's
def test_a_materialize_the_backing_disk_has_no_room_for_exits_1(small_fs, mount_factory,
                                                               tmp_path: Path) -> None:
    """The other disk full: the backing directory's. The write is refused (ENOSPC, no scratch
    left behind, disk's files as they were) and the path stays owed, but `memfs materialize`
    exited 0 with `skipped ... (refused): No space left on device — check the backing
    directory`: a script's `memfs materialize && git commit` went on without the file."""
    disk = small_fs / "proj"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m = mount_factory(root=tmp_path / "root", name="mnt")
    m.cli("attach", "work", str(disk), "--watch", "off")
    (m.work / "big.txt").write_bytes(TEXT * 10)  # 40 MiB of text on a 32 MiB disk
    res = m.cli("materialize", check=False)
    text = res.stdout + res.stderr
    assert res.returncode == 1, text
    assert "big.txt" in text and "full" in text and "free space" in text, text
    assert sorted(os.listdir(disk)) == ["a.txt"]  # no scratch file left
    assert states(m)["work/big.txt"][0] == "workspace-draft"  # still owed
    (m.work / "big.txt").write_bytes(TEXT)  # 4 MiB: fits
    m.cli("materialize")
    assert (disk / "big.txt").read_bytes() == TEXT


@pytest.mark.embedded_only
def test_a_materialize_onto_a_read_only_backing_disk_says_so(small_fs, mount_factory,
                                                             tmp_path: Path) -> None:
    """A backing disk remounted read-only: materialize was refused with "Read-only file
    system — check the backing directory, then retry", a remedy that fits every error and
    names none. It names the read-only filesystem and what makes it writable again."""
    import subprocess

    disk = small_fs / "proj"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m = mount_factory(root=tmp_path / "root", name="mnt")
    m.cli("attach", "work", str(disk), "--watch", "off")
    (m.work / "new.txt").write_text("new\n")
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        res = m.cli("materialize", check=False)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    text = res.stdout + res.stderr
    assert res.returncode == 1, text
    assert "new.txt" in text and "read-only" in text and "remount it read-write" in text, text
    assert states(m)["work/new.txt"][0] == "workspace-draft"  # still owed
    m.cli("materialize")
    assert (disk / "new.txt").read_text() == "new\n"


@pytest.mark.embedded_only
def test_an_auto_materialize_the_backing_disk_has_no_room_for_shows_in_status(
        small_fs, mount_factory, tmp_path: Path) -> None:
    """With --auto-materialize nobody reads materialize's output: a write the backing disk
    refused left `memfs status` saying only `disk owes 1 change(s)`. It says which file, why
    and what to do, until a round writes it."""
    disk = small_fs / "proj"
    disk.mkdir()
    m = mount_factory(root=tmp_path / "root", name="mnt")
    m.cli("attach", "work", str(disk), "--watch", "off", "--auto-materialize")
    (m.work / "big.txt").write_bytes(TEXT * 10)  # 40 MiB of text on a 32 MiB disk

    def last() -> dict:
        return m.status()["backing"]["work"]["auto_materialize"]["last"] or {}

    deadline = time.monotonic() + 30
    while not last().get("disk_errors"):
        assert time.monotonic() < deadline, f"no round met the full disk: {last()}"
        time.sleep(0.1)
    assert [e["path"] for e in last()["disk_errors"]] == ["big.txt"]
    text = m.cli("status").stdout
    assert "auto-materialize" in text and "big.txt" in text and "full" in text, text
    assert "memfs materialize" in text, text
    assert sorted(os.listdir(disk)) == []  # no scratch left behind
    (m.work / "big.txt").write_bytes(TEXT)  # fits: the next round writes it
    deadline = time.monotonic() + 30
    while not (disk / "big.txt").exists() or last().get("disk_errors"):
        assert time.monotonic() < deadline, f"not written: {last()}"
        time.sleep(0.1)
    assert (disk / "big.txt").read_bytes() == TEXT
    assert "could not write" not in m.cli("status").stdout


@pytest.mark.embedded_only  # on PostgreSQL the commit's chunks go to the server: nothing is
# counted twice on this host's disk
def test_a_take_in_waits_for_a_commit_in_flight_before_it_is_refused(
        small_fs, mount_factory, tmp_path) -> None:
    """A write through the mount waits for a group commit that is writing (its chunks are on
    the disk and still pending, counted twice) before it is refused for space; a take-in from
    the backing directory did not: `memfs sync` said the store was full and took nothing, with
    room for the file once that commit ended."""
    gate = tmp_path / "commit-gate"
    disk = tmp_path / "proj"
    disk.mkdir()
    m = mount_factory(root=small_fs / "root", name="small-mnt",
                      env={COMMIT_GATE_ENV: str(gate)}, extra_args=("--commit-interval",
                                                                    "600000"))
    m.cli("config", "gc-auto", "off")
    m.cli("attach", "work", str(disk), "--watch", "off")
    (m.mnt / "scratch").mkdir()
    held = m.mnt / "scratch" / "held.bin"
    held.write_bytes(random.Random(3).randbytes(10 * MiB))  # pending: the commit to hold
    writable = m.status()["space"]["writable"]
    assert writable > 16 * MiB, writable
    with open(small_fs / "other-program", "wb") as f:  # leaves 14 MiB writable
        f.write(b"\0" * (writable - 14 * MiB))
    m.status()  # figures read afresh after 0.5 s
    time.sleep(0.6)
    assert 13 * MiB < m.status()["space"]["writable"] < 15 * MiB
    (disk / "new.txt").write_bytes(TEXT * 2)  # 8 MiB: fits, but not beside 10 counted twice
    gate.touch()
    committer = threading.Thread(target=fsync_path, args=(held,))
    committer.start()
    try:
        wait_for(lambda: Path(f"{gate}.waiting").exists(), "a commit at the gate")
        time.sleep(0.6)  # the space figures, cached 0.5 s, are read with its chunks on disk
        sync = subprocess.Popen(memfs_cmd(m.root, "sync"), text=True, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.5)
    finally:
        gate.unlink(missing_ok=True)
        committer.join(60)
    out, _ = sync.communicate(timeout=120)
    assert sync.returncode == 0, out
    assert (m.work / "new.txt").read_bytes() == TEXT * 2
    assert states(m)["work/new.txt"] == ("synced", None)


def wait_for(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
