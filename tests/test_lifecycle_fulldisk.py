"""A full disk through a real mount (a 32 MiB tmpfs holds the store): a write that cannot be
stored fails at write(), fsync() or close(), never later, and nothing acknowledged is lost;
statfs tells the store filesystem's real figures; status says plainly that commits fail, why
and what to do; umount refuses and leaves the mount usable; freeing space lets the pending
commits through without a restart.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.mount import REPO, memfs_cmd
from helpers.space import MiB, fill, fsync_path, write_until_enospc
from helpers.store import store_check

from memfs.testing import COMMIT_GATE_ENV

pytestmark = pytest.mark.mount

def wait_for(cond, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_writes_fail_at_write_and_what_was_accepted_is_kept(small_fs, mount_factory) -> None:
    """Without any fsync: the write that does not fit fails, everything before it is stored
    (close and a later fsync succeed) and survives a SIGKILL."""
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    accepted, exc = write_until_enospc(m.work / "big", random.Random(1))
    assert exc.errno == errno.ENOSPC, repr(exc)
    assert len(accepted) >= 8 * MiB, f"only {len(accepted) >> 20} MiB accepted"
    fsync_path(m.work)  # everything accepted fits: the commit goes through
    assert m.status()["pending"] == 0
    assert m.proc.poll() is None
    # A plain dd is refused at write() too (no commit can fail later for it).
    res = subprocess.run(["dd", "if=/dev/urandom", f"of={m.work / 'dd'}", "bs=1M", "count=16"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "No space left" in res.stderr, res.stderr
    m.kill()
    store_check(m.root)
    m.remount()
    assert hashlib.sha256((m.work / "big").read_bytes()).digest() == \
        hashlib.sha256(accepted).digest()


def test_statfs_is_the_store_filesystems_own(small_fs, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    (m.work / "some").write_bytes(os.urandom(4 * MiB))
    fsync_path(m.work)
    mine, host = os.statvfs(m.mnt), os.statvfs(small_fs)
    assert mine.f_blocks * mine.f_frsize == host.f_blocks * host.f_frsize
    used = (mine.f_blocks - mine.f_bfree) * mine.f_frsize
    host_used = (host.f_blocks - host.f_bfree) * host.f_frsize
    assert abs(used - host_used) <= 64 << 10, (used, host_used)
    assert mine.f_bavail <= host.f_bavail  # the commits' headroom is not offered
    assert (mine.f_files, mine.f_ffree) == (host.f_files, host.f_ffree)
    # Pending bytes count as used at once, before any commit stores them.
    with open(m.work / "pending", "wb") as f:
        f.write(os.urandom(3 * MiB))
        now = os.statvfs(m.mnt)
        grew = (now.f_blocks - now.f_bfree) * now.f_frsize - used
        assert grew >= 3 * MiB - (64 << 10), grew


def test_close_fails_when_what_it_wrote_no_longer_fits(small_fs, mount_factory) -> None:
    """Writes let in with room to spare; then someone fills the disk before the commit: the
    close() reports ENOSPC. Once the space is back the same changes commit by themselves."""
    m = mount_factory(root=small_fs / "root", name="small-mnt",
                      extra_args=("--commit-interval", "600000"))
    data = os.urandom(3 * MiB)
    f = open(m.work / "late", "wb", buffering=0)
    f.write(data)
    filler = fill(small_fs)
    with pytest.raises(OSError) as exc:
        f.close()
    assert exc.value.errno == errno.ENOSPC, repr(exc.value)
    assert m.status()["pending"] > 0
    filler.unlink()
    wait_for(lambda: m.status()["pending"] == 0, what="the pending commit after space came back")
    m.kill()
    m.remount()
    assert (m.work / "late").read_bytes() == data


def test_full_store_status_umount_and_recovery(small_fs, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    # This test is about what a full store says and refuses. The automatic run a failing
    # commit starts gives the reserve and SQLite's WAL back (some 200 KiB here), which may let
    # the failed commit through by itself while this test reads the failing state (seen under
    # load): that run is the subject of test_the_automatic_run_makes_room_without_being_asked
    # and the one after it.
    m.cli("config", "gc-auto", "off")
    keep = os.urandom(2 * MiB)
    (m.work / "keep.bin").write_bytes(keep)
    fsync_path(m.work)
    d = m.work / "names"
    d.mkdir()
    # Someone else fills the disk; fill again until a commit of metadata alone fails.
    fillers, n = [], 0
    for attempt in range(5):
        fillers.append(fill(small_fs, f"filler{attempt}"))
        for _ in range(500):
            (d / f"an-empty-file-with-a-long-name-{n:05d}").touch()
            n += 1
        try:
            fsync_path(d)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, repr(exc)
            break
    else:
        pytest.fail("commits never failed on a full disk")
    # New data is refused at once while commits fail for lack of space.
    with pytest.raises(OSError) as exc:
        (m.work / "more").write_bytes(b"x" * 10000)
    assert exc.value.errno == errno.ENOSPC
    # A failed commit gives back what it had written (its pack tail, SQLite's pages): someone
    # else takes that too, so the disk is still full when status is read.
    fillers.append(fill(small_fs, "filler-again"))
    st = m.cli_json("status")
    assert st["commit_failure"]["errno"] == errno.ENOSPC
    text = m.cli("status").stdout
    assert "FAILING" in text and "full" in text and "memfs gc" in text, text
    # umount refuses, says why and what to do, and the mount stays usable.
    res = m.cli("umount", str(m.mnt), check=False)
    assert res.returncode != 0
    assert "stays mounted" in res.stderr and "full" in res.stderr and "delete" in res.stderr, \
        res.stderr
    assert m.proc.poll() is None
    assert (m.work / "keep.bin").read_bytes() == keep
    assert len(os.listdir(d)) == n
    # Space comes back: the failed commits go through without a restart.
    for f in fillers:
        f.unlink()
    wait_for(lambda: m.cli_json("status")["commit_failure"] is None, what="commits to recover")
    fsync_path(d)
    assert m.status()["pending"] == 0
    (m.work / "more").write_bytes(b"x" * 10000)
    m.umount()
    store_check(m.root)
    m.remount()
    assert len(os.listdir(m.work / "names")) == n
    assert (m.work / "keep.bin").read_bytes() == keep


def test_reserve_is_held_and_counted_as_used(small_fs, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    (m.work / "x").write_bytes(b"x")
    fsync_path(m.work)
    wait_for(lambda: m.status()["space"]["reserve"] > 0, what="the space reserve")
    assert os.stat(m.root / "reserve").st_blocks * 512 == m.status()["space"]["reserve"]
    subprocess.run(memfs_cmd(m.root, "status"), cwd=REPO, check=True, capture_output=True)


def free_in(m) -> int:
    sv = os.statvfs(m.mnt)
    return sv.f_bavail * sv.f_frsize


def test_deleting_files_and_memfs_gc_make_room_again(small_fs, mount_factory) -> None:
    """The issue's sequence: fill the store by writing through the mount (dd conv=fsync
    style: all of it committed, so all of it in history), rm the big file, `memfs gc`: the
    space comes back (its history goes, the disk being under the floor) and new writes fit,
    without a restart."""
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    m.cli("config", "gc-auto", "off")  # this test is about `memfs gc` (the next: automatic)
    m.cli("config", "space-floor", "40%")  # 5% of 32 MiB is under the commits' headroom
    keep = os.urandom(2 * MiB)
    (m.work / "keep.bin").write_bytes(keep)
    accepted, exc = write_until_enospc(m.work / "big", random.Random(2), fsync=True)
    assert exc.errno == errno.ENOSPC
    os.unlink(m.work / "big")
    fsync_path(m.work)
    low = free_in(m)
    res = m.cli_json("gc")
    assert res["returned"] >= len(accepted) * 8 // 10, res
    assert res["pressure"] and res["commits_dropped"] >= 1
    assert free_in(m) >= low + len(accepted) * 8 // 10
    again = os.urandom(len(accepted) // 2)
    (m.work / "again").write_bytes(again)
    fsync_path(m.work)
    st = m.cli_json("status")
    assert st["gc"]["last"]["returned"] == res["returned"]
    assert "gc       last run" in m.cli("status").stdout
    m.kill()
    store_check(m.root)
    m.remount()
    assert (m.work / "keep.bin").read_bytes() == keep
    assert (m.work / "again").read_bytes() == again
    assert not (m.work / "big").exists()


def test_status_says_writes_are_refused_and_what_to_do(small_fs, mount_factory,
                                                       tmp_path) -> None:
    """A user's `dd` into the mount fails with ENOSPC at write() while every commit goes
    through: `memfs status` must still say plainly that writes are refused, why and what to
    do (it showed only `space 812.0 KiB writable`), and stop saying so once rm + `memfs gc`
    made room."""
    gate = tmp_path / "commit-gate"
    m = mount_factory(root=small_fs / "root", name="small-mnt",
                      env={COMMIT_GATE_ENV: str(gate)})
    m.cli("config", "gc-auto", "off")  # `memfs gc` is the remedy this test takes
    m.cli("config", "space-floor", "40%")
    res = dd_with_a_commit_held(m, gate)  # the refusal said is a real one, commit or not
    assert res.returncode != 0 and "No space left" in res.stderr, res.stderr
    st = m.cli_json("status")
    assert st["commit_failure"] is None  # nothing failed to commit: only writes are refused
    refused = st["space"]["refused"]
    assert refused is not None and refused["bytes"] > st["space"]["writable"], st["space"]
    text = m.cli("status").stdout
    assert "writes   REFUSED" in text and "full" in text, text
    assert "delete files in the mount" in text and "memfs gc" in text, text
    os.unlink(m.work / "big")
    m.cli("gc")
    assert m.cli_json("status")["space"]["refused"] is None
    assert "REFUSED" not in m.cli("status").stdout
    (m.work / "again").write_bytes(os.urandom(4 * MiB))
    fsync_path(m.work)
    assert m.cli_json("status")["space"]["refused"] is None


def dd_with_a_commit_held(m, gate: Path) -> subprocess.CompletedProcess:
    """A `dd` that fills the store through the mount and meets a group commit in flight with
    fresh space figures, as it did in one CI run of six (refused for bytes counted twice, a
    refusal that then cleared itself): dd is stopped after 4 MiB, the commit of them is held
    at the gate (memfs.testing.commit_gate) until the cached figures went stale, and dd goes
    on for a second before the gate opens."""
    big = m.work / "big"
    dd = subprocess.Popen(["dd", "if=/dev/urandom", f"of={big}", "bs=1M", "count=64",
                           "conv=fsync"], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: big.exists() and big.stat().st_size >= 4 * MiB, what="4 MiB written")
        dd.send_signal(signal.SIGSTOP)
        gate.touch()
        wait_for(lambda: Path(f"{gate}.waiting").exists(), what="a commit at the gate")
        time.sleep(0.6)  # the space figures, cached 0.5 s, are read with its chunks on disk
        dd.send_signal(signal.SIGCONT)
        time.sleep(1.0)
    finally:
        dd.send_signal(signal.SIGCONT)
        gate.unlink(missing_ok=True)
    _, err = dd.communicate(timeout=120)
    return subprocess.CompletedProcess(dd.args, dd.returncode, "", err)


def test_a_refusal_room_came_back_for_is_not_said_again_when_another_program_fills_it(
        small_fs, mount_factory, tmp_path) -> None:
    """Status said 'writes REFUSED since T' for a write refused at T, stopped once rm and
    `memfs gc` made room, and said it again, since T, when another program later filled the
    disk with no write through memfs refused meanwhile: that refusal had been answered."""
    gate = tmp_path / "commit-gate"
    m = mount_factory(root=small_fs / "root", name="small-mnt",
                      env={COMMIT_GATE_ENV: str(gate)})
    m.cli("config", "gc-auto", "off")
    m.cli("config", "space-floor", "40%")
    res = dd_with_a_commit_held(m, gate)
    assert res.returncode != 0 and "No space left" in res.stderr, res.stderr
    assert m.cli_json("status")["space"]["refused"] is not None
    os.unlink(m.work / "big")
    m.cli("gc")
    assert m.cli_json("status")["space"]["refused"] is None  # room came back
    filler = fill(small_fs, "other-program")  # nothing is written through memfs meanwhile
    try:
        time.sleep(0.6)  # the space figures status reads are cached for 0.5 s
        assert m.cli_json("status")["space"]["refused"] is None
    finally:
        filler.unlink()


def test_the_automatic_run_makes_room_without_being_asked(small_fs, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    m.cli("config", "space-floor", "40%")
    accepted, _ = write_until_enospc(m.work / "big", random.Random(3), fsync=True)
    os.unlink(m.work / "big")
    fsync_path(m.work)
    wait_for(lambda: free_in(m) >= len(accepted) * 8 // 10, timeout=60,
             what="the automatic GC to give the space back")
    assert m.status()["gc"]["last"]["trigger"] != "manual"


def test_failed_commits_go_through_once_gc_frees_history(small_fs, mount_factory) -> None:
    """History holds a deleted file; someone else fills the disk so commits fail; the GC the
    failure starts drops that history and the pending commit goes through, no restart."""
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    (m.work / "old").write_bytes(os.urandom(10 * MiB))
    fsync_path(m.work)
    os.unlink(m.work / "old")
    fsync_path(m.work)
    m.cli("config", "gc-auto", "off")  # first: that a plain `memfs gc` does it
    fillers = []
    d = m.work / "names"
    d.mkdir()
    for attempt in range(5):
        fillers.append(fill(small_fs, f"filler{attempt}"))
        for i in range(300):
            (d / f"name-{attempt}-{i:04d}").touch()
        try:
            fsync_path(d)
        except OSError:
            break
    else:
        pytest.fail("commits never failed on a full disk")
    assert m.cli_json("status")["commit_failure"] is not None
    m.cli("gc")
    wait_for(lambda: m.cli_json("status")["commit_failure"] is None, what="the failed commits")
    assert m.status()["pending"] == 0
    n = len(os.listdir(d))
    # And by itself: the same again, with gc-auto on.
    m.cli("config", "gc-auto", "on")
    (m.work / "old2").write_bytes(os.urandom(4 * MiB))
    for f in fillers:
        f.unlink()
    fsync_path(m.work)
    os.unlink(m.work / "old2")
    fsync_path(m.work)
    fill(small_fs, "filler-again")
    for i in range(300):
        (d / f"late-{i:04d}").touch()
    wait_for(lambda: m.status()["pending"] == 0 and m.cli_json("status")["commit_failure"] is None,
             timeout=60, what="the automatic GC to let the commit through")
    m.kill()
    m.remount()
    assert len(os.listdir(m.work / "names")) == n + 300


def test_gc_gives_back_a_rewritten_packs_space_while_the_daemon_reads_from_it(
        small_fs, mount_factory) -> None:
    """A pack GC rewrites (mostly dead) or removes is unlinked, but the daemon held it open for
    reading (a file read back from the store): its space stayed taken on the filesystem until
    the next GC, while `memfs gc` said it gave it back. The filesystem itself must show it."""
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    m.cli("config", "gc-auto", "off")
    m.cli("config", "space-floor", "40%")  # 5% of 32 MiB is under the commits' headroom
    keep = os.urandom(64 << 10)
    (m.work / "keep.bin").write_bytes(keep)
    (m.work / "big").write_bytes(os.urandom(20 * MiB))
    fsync_path(m.work)
    m.umount()
    m.remount()
    assert (m.work / "keep.bin").read_bytes() == keep  # the daemon reads the pack now
    os.unlink(m.work / "big")
    fsync_path(m.work)
    before = os.statvfs(small_fs)
    res = m.cli_json("gc")
    assert res["returned"] >= 16 * MiB and res["packs_rewritten"] + res["packs_removed"], res
    after = os.statvfs(small_fs)
    freed = (after.f_bavail - before.f_bavail) * after.f_frsize
    assert freed >= 16 * MiB, f"gc said {res['returned']} B, the filesystem got {freed} B back"
    assert (m.work / "keep.bin").read_bytes() == keep
    m.kill()
    store_check(m.root)
    m.remount()
    assert (m.work / "keep.bin").read_bytes() == keep


def test_a_write_that_fits_once_the_commit_in_flight_is_counted_once_is_not_refused(
        small_fs, mount_factory, tmp_path) -> None:
    """While a group commit writes, its chunks are on the disk and still pending in memory:
    counted twice, the free space looked short and a `dd` that fits was refused (ENOSPC at
    write(), and status's refusal then cleared itself once the commit ended). The commit is
    held at a gate with its chunks on disk; a write that fits once they are counted once
    waits for it and goes through, and all of it is kept."""
    gate = tmp_path / "commit-gate"
    m = mount_factory(root=small_fs / "root", name="small-mnt",
                      env={COMMIT_GATE_ENV: str(gate)})
    m.cli("config", "gc-auto", "off")
    writable = m.status()["space"]["writable"]
    first = os.urandom(writable * 6 // 10)
    second = os.urandom(writable // 5)  # fits beside `first`, not beside it twice
    src = tmp_path / "second.src"
    src.write_bytes(second)
    gate.touch()
    (m.work / "first").write_bytes(first)  # the commit loop takes it to the gate
    wait_for(lambda: Path(f"{gate}.waiting").exists(), what="the commit to reach its gate")
    time.sleep(0.6)  # the space figures, cached 0.5 s, are now read with the chunks on disk
    dd = subprocess.Popen(["dd", f"if={src}", f"of={m.work / 'second'}", "bs=128K",
                           "conv=fsync"], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # long enough for dd to meet the commit in flight
        waited = dd.poll() is None  # its write waits for the commit: dd cannot end
    finally:
        gate.unlink()
    _, err = dd.communicate(timeout=60)
    assert dd.returncode == 0, err
    assert waited, "dd ended while the commit was held"
    assert m.status()["space"]["refused"] is None
    m.kill()
    store_check(m.root)
    m.remount()
    assert (m.work / "first").read_bytes() == first
    assert (m.work / "second").read_bytes() == second
