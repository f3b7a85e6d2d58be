"""Many hosts, one store in PostgreSQL: two daemons on one machine, each with its own root
(its own host identity, branch, journal and cache), sharing one database.

The writer lease of a branch is short here (MEMFS_LEASE_SECONDS=2) so expiry is quick; every
wait is on a condition with a deadline, never a bare sleep.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.mount import REPO, MemfsMount
from helpers.pg import host_root
from helpers.store import store_check

pytestmark = pytest.mark.mount
LEASE = {"MEMFS_LEASE_SECONDS": "2"}


def wait_for(pred: Callable[[], object], what: str, timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


@pytest.fixture
def hosts(mount_factory, pg_url: str, tmp_path: Path) -> tuple[MemfsMount, MemfsMount]:
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=LEASE)
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=LEASE)
    return a, b


def test_a_commit_on_one_host_is_seen_on_the_other_whose_copy_is_read_only(hosts) -> None:
    a, b = hosts
    write_synced(a.work / "notes.txt", b"from host a\n")
    wait_for(lambda: read(b.work / "notes.txt") == b"from host a\n", "host b to see a's file")
    # A change, not only a new name: b's kernel had the old bytes and attributes cached.
    write_synced(a.work / "notes.txt", b"changed on host a, longer than before\n")
    wait_for(lambda: read(b.work / "notes.txt") == b"changed on host a, longer than before\n",
             "host b to see a's change without a remount")
    with pytest.raises(OSError) as err:
        (b.work / "mine.txt").write_bytes(b"b was here")
    assert err.value.errno == errno.EROFS
    st = b.status()
    assert "written by host" in st["read_only"] and "host-a" in st["read_only"]
    assert "READ-ONLY" in b.cli("status").stdout
    # b works on a branch of its own, and a sees it under .memfs/branches/ at once.
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    write_synced(b.work / "mine.txt", b"b's own branch\n")
    assert b.status()["read_only"] is None
    assert (a.mnt / ".memfs/branches/b-work/work/mine.txt").read_bytes() == b"b's own branch\n"
    assert not (a.work / "mine.txt").exists()
    assert (b.work / "notes.txt").read_bytes() == b"changed on host a, longer than before\n"


def test_a_host_killed_mid_writer_is_taken_over_with_every_fsynced_file(
        mount_factory, pg_url: str, tmp_path: Path) -> None:
    # a's lease outlives a CLI's start on a loaded machine (2 s did not: at load 7 b's first
    # takeover started after a's lease had expired, and was not refused), so the refusal of
    # a live lease is what the first takeover meets.
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a",
                      env={"MEMFS_LEASE_SECONDS": "12"})
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=LEASE)
    files = {f"f{i:03d}": payload(i) for i in range(40)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(a.work)],
                            stdout=subprocess.PIPE, text=True)
    acked = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the writer prints a name once its fsync returned
        acked.append(line.strip())
        if len(acked) == 25:
            a.kill()  # SIGKILL while the writer is still writing
            break
    proc.kill()
    proc.wait()
    refused = b.cli("takeover", "main", check=False)
    assert refused.returncode != 0 and "lease is live" in refused.stderr
    wait_for(lambda: b.cli("takeover", "main", check=False).returncode == 0,
             "the dead host's lease to expire", timeout=30)
    for name in acked:
        assert (b.work / name).read_bytes() == files[name], name
    write_synced(b.work / "after.txt", b"host b goes on\n")
    store_check(b.root)
    # Host a comes back: b writes the branch now, so a sees it read-only, with b's commit.
    a.remount()
    assert (a.work / "after.txt").read_bytes() == b"host b goes on\n"
    assert a.status()["read_only"] is not None


def payload(i: int) -> bytes:
    """File i's bytes (the writer process makes the same)."""
    return f"file {i}\n".encode() * (100 + 797 * i)


WRITER = r"""
import os, sys
work = sys.argv[1]
for i in range(40):
    name = f"f{i:03d}"
    fd = os.open(os.path.join(work, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, f"file {i}\n".encode() * (100 + 797 * i))
    os.fsync(fd)
    os.close(fd)
    print(name, flush=True)
"""


def test_a_fenced_host_cannot_commit_after_its_lease_was_taken(hosts) -> None:
    a, b = hosts
    write_synced(a.work / "before.txt", b"a, before the pause\n")
    wait_for(lambda: read(b.work / "before.txt"), "host b to see a's file")
    os.kill(a.proc.pid, signal.SIGSTOP)  # a pause past the lease (a VM frozen, a GC stall)
    try:
        wait_for(lambda: b.cli("takeover", "main", check=False).returncode == 0,
                 "a's lease to expire", timeout=30)
        write_synced(b.work / "b.txt", b"b writes main now\n")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # Host a still believes it writes main until it next renews; whatever it does, nothing
    # of it lands: the write or the fsync is refused.
    refused = threading.Event()
    try:
        write_synced(a.work / "stale.txt", b"from a fenced host\n")
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EIO), exc
        refused.set()
    assert refused.is_set(), "a fenced host's fsync returned success"
    wait_for(lambda: read(a.work / "b.txt") == b"b writes main now\n",
             "host a to show b's commit")
    assert not (b.work / "stale.txt").exists()
    log = b.cli("log").stdout
    assert "stale" not in log
    store_check(b.root)


def test_a_paused_hosts_uncommitted_changes_are_said_dropped_not_pending(
        mount_factory, pg_url: str, tmp_path: Path) -> None:
    """Host a wrote a file but had not committed it yet when it was paused past its lease and
    taken over; on waking its due commit is refused (fenced), then it shows b's commits, so
    the change is gone. Status said "commits FAILING ... what is pending stays in memory and
    commits by itself once it is possible" beside "pending 0", for good, and the log called
    the change one "made here after the lease was lost". Status now names the loss, and no
    commit failure promises a retry of nothing."""
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=LEASE,
                      extra_args=("--commit-interval", "3000"))  # due while a is paused
    write_synced(a.work / "before.txt", b"a, before the pause\n")  # commits a's work/ too
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=LEASE)
    wait_for(lambda: read(b.work / "before.txt"), "host b to see a's file")
    (a.work / "unsynced.txt").write_bytes(b"written, never fsynced\n")
    os.kill(a.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    refused: list[int] = []

    def fsync_while_paused() -> None:  # queued in the kernel until a wakes
        try:
            write_synced(a.work / "queued.txt", b"fsynced by a fenced host\n")
        except OSError as exc:
            refused.append(exc.errno or 0)

    t = threading.Thread(target=fsync_while_paused)
    try:
        wait_for(lambda: b.cli("takeover", "main", check=False).returncode == 0,
                 "a's lease to expire", timeout=30)
        write_synced(b.work / "b.txt", b"b writes main now\n")
        t.start()
        time.sleep(max(0.0, 4.0 - (time.monotonic() - paused)))  # a's commit falls due
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    t.join(timeout=60)
    assert refused and refused[0] in (errno.EROFS, errno.EIO), refused
    wait_for(lambda: read(a.work / "b.txt") == b"b writes main now\n",
             "host a to show b's commit")
    st = wait_for(lambda: (s := a.status()).get("lost_changes") and s, "a to say what it lost")
    assert st["pending"] == 0 and not (a.work / "unsynced.txt").exists()
    assert st["commit_failure"] is None, st["commit_failure"]
    assert "never committed and are dropped" in st["lost_changes"], st["lost_changes"]
    assert "after the lease was lost" not in st["lost_changes"]
    text = a.cli("status").stdout
    assert "lost     " in text and "branch main were never committed" in text, text
    assert "commits by itself" not in text, text
    assert not (b.work / "unsynced.txt").exists() and not (b.work / "queued.txt").exists()
    store_check(b.root)


def test_postgresql_killed_mid_commit_loses_no_acknowledged_write(mount_factory, own_pg_cluster,
                                                                   tmp_path: Path) -> None:
    cluster = own_pg_cluster  # its own server: this test kills it
    a = mount_factory(root=host_root(tmp_path, "a", cluster.new_database()), name="a")
    stop = threading.Event()
    acked: dict[str, bytes] = {}
    failed: list[str] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            name, data = f"w{i:04d}", os.urandom(1 << 20) + i.to_bytes(4, "big")
            try:
                write_synced(a.work / name, data)
                acked[name] = data
            except OSError as exc:
                failed.append(f"{name}: {exc}")
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_for(lambda: len(acked) >= 5, "the first acknowledged writes")
        cluster.kill()  # mid-commit: the writer commits a MiB per fsync without pause
        # status says what is wrong in the store's words, not a disk's I/O error
        wait_for(lambda: (a.status().get("commit_failure") or {}).get("reason", "")
                 .startswith("the PostgreSQL store at"), "a commit failure in status",
                 timeout=30)
        failure = a.status()["commit_failure"]
        assert "unreachable" in failure["reason"], failure
        assert failure["remedy"].startswith("check that the server runs"), failure
        cluster.start()
        n = len(acked)
        wait_for(lambda: len(acked) >= n + 5, "writes acknowledged after the restart",
                 timeout=60)
    finally:
        stop.set()
        t.join(timeout=60)
    a.umount()
    store_check(a.root)
    a.remount()
    for name, data in acked.items():
        assert (a.work / name).read_bytes() == data, name
    assert len(acked) >= 10
    assert failed, "no fsync was refused while the server was down: the kill missed"


def test_one_host_takes_over_by_cli_without_a_daemon(pg_url: str, tmp_path: Path) -> None:
    """`memfs takeover` with no daemon keeps the lease for this root's next mount; a live
    lease is refused by name with the time it has left."""
    from memfs.store.backend import open_store

    a = open_store(host_root(tmp_path, "a", pg_url))
    assert a.claim("main").writable
    out = subprocess.run([sys.executable, "-m", "memfs", "--root",
                          str(host_root(tmp_path, "b", pg_url)), "takeover", "main"],
                         capture_output=True, text=True, cwd=REPO, env=dict(os.environ, **LEASE))
    assert out.returncode == 1 and "host-a" in out.stderr and "live" in out.stderr
    a.close()


def test_a_clean_unmount_gives_the_branch_back(hosts) -> None:
    """No takeover is needed after a clean exit: the next host that switches to the branch
    writes it, continuing from the last commit."""
    a, b = hosts
    write_synced(a.work / "last.txt", b"a's last words\n")
    a.umount()
    b.cli("branch", "create", "side")
    b.cli("branch", "switch", "side")
    b.cli("branch", "switch", "main")  # claims main again: free since a released it
    assert b.status()["read_only"] is None
    assert (b.work / "last.txt").read_bytes() == b"a's last words\n"
    write_synced(b.work / "next.txt", b"b goes on at once\n")


def test_writing_more_than_this_hosts_disk_holds_goes_through(small_fs: Path, mount_factory,
                                                              pg_url: str) -> None:
    """On a store in PostgreSQL the bytes written go to the server; this host's disk holds
    copies. Three times what that disk holds is written, fsynced and read back after a
    remount, and the cache leaves a quarter of this small disk free (it used to fill it with copies
    of what was written, and then every write was refused, ENOSPC, with the server far from
    full and nothing in the mount to delete)."""
    root = host_root(small_fs, "a", pg_url)
    m = mount_factory(root=root, name="small-mnt")
    sums = {}
    for i in range(24):  # 96 MiB on a 32 MiB filesystem, in 4 MiB files each fsynced
        data = os.urandom(4 << 20)
        write_synced(m.work / f"f{i:02}.bin", data)
        sums[f"f{i:02}.bin"] = hashlib.sha256(data).hexdigest()
    st = os.statvfs(small_fs)
    assert st.f_bavail * st.f_frsize >= 6 << 20, "the cache took the host's last quarter"
    assert m.status()["space"]["writable"] >= 4 << 20
    m.umount()
    m.remount()  # a new daemon: every read comes from the cache or the database
    for name, digest in sums.items():
        assert hashlib.sha256((m.work / name).read_bytes()).hexdigest() == digest, name
    st = os.statvfs(small_fs)
    assert st.f_bavail * st.f_frsize >= 6 << 20, "reading back filled the host's disk"
    store_check(root)


def test_a_command_without_a_daemon_gives_the_branch_back(mount_factory, pg_url: str,
                                                          tmp_path: Path) -> None:
    """`memfs attach` (or `sync`) with no daemon opens the workspace, which claims the
    branch's lease; the command kept it until it expired, so another host mounting in the
    next minute found the branch read-only, "written by host-a". A command gives back a
    lease it took, as a clean unmount does."""
    long = {"MEMFS_LEASE_SECONDS": "60"}  # expiry cannot be what frees it here
    root_a = host_root(tmp_path, "a", pg_url)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "f.txt").write_text("from a's disk\n")
    for args in (("init",), ("attach", "p", str(proj)), ("sync",)):
        out = subprocess.run([sys.executable, "-m", "memfs", "--root", str(root_a), *args],
                             capture_output=True, text=True, cwd=REPO,
                             env=dict(os.environ, **long), timeout=60)
        assert out.returncode == 0, f"{args}: {out.stdout}{out.stderr}"
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=long)
    assert b.status()["read_only"] is None, b.status()["read_only"]
    assert (b.mnt / "p" / "f.txt").read_text() == "from a's disk\n"
    write_synced(b.work / "b.txt", b"b writes main at once\n")


def _waiting_on(pg_url: str, table: str) -> Callable[[], bool]:
    import psycopg

    def waiting() -> bool:
        with psycopg.connect(pg_url, autocommit=True) as look:
            return look.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                "query LIKE %s", (f"%FROM {table}%",)).fetchone()[0] > 0  # type: ignore[index]
    return waiting


def _only_it_waits(pg_url: str, table: str, argv: list[str],
                   hot_is_served: Callable[[], None]) -> str:
    """Run `argv` while another session holds `table` locked: it waits for the lock, the
    mount serves another read meanwhile (`hot_is_served`), and it succeeds once the lock
    goes; its output."""
    import psycopg

    with psycopg.connect(pg_url) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        slow = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            wait_for(_waiting_on(pg_url, table), f"b's read of {table} to wait")
            hot_is_served()
            assert slow.poll() is None, f"{argv} did not wait for the locked {table}"
        finally:
            locker.rollback()
            out, _ = slow.communicate(timeout=60)
    assert slow.returncode == 0, argv
    return out


def test_a_locked_server_holds_only_the_reads_that_miss_this_hosts_caches(
        hosts, pg_url: str) -> None:
    """Host b's first listing of a directory and first read of a file ask the server in a
    worker thread: while another session holds the table locked, only that `ls` or `cat`
    waits, and a file b has read before is served meanwhile (the loaders ran on the FUSE loop,
    so every request of b's mount hung with the one that missed)."""

    a, b = hosts
    cold = os.urandom(2 << 20)
    (a.work / "cold").mkdir()
    write_synced(a.work / "cold" / "f.bin", cold)
    write_synced(a.work / "hot.txt", b"read on b first\n")
    wait_for(lambda: read(b.work / "hot.txt") == b"read on b first\n", "host b to see a's files")

    def hot_is_served() -> None:
        cat = subprocess.run(["cat", str(b.work / "hot.txt")], capture_output=True, timeout=20)
        assert cat.stdout == b"read on b first\n", cat

    for table, argv in (("objects", ["ls", str(b.work / "cold")]),
                        ("chunks", ["sha256sum", str(b.work / "cold" / "f.bin")])):
        out = _only_it_waits(pg_url, table, argv, hot_is_served)
        if table == "objects":
            assert out.split() == ["f.bin"]
        else:
            assert out.split()[0] == hashlib.sha256(cold).hexdigest()


def test_a_takeover_from_a_branch_of_ones_own_says_the_mount_moved(hosts) -> None:
    """Found in a user trial: host b worked on a branch of its own, host a died, `memfs
    takeover main` on b printed only "this host now writes branch main": b's mount had
    switched to main, and b's own files were gone from it with no word of where they went."""
    a, b = hosts
    write_synced(a.work / "from-a.txt", b"a\n")
    wait_for(lambda: read(b.work / "from-a.txt") == b"a\n", "host b to see a's file")
    b.cli("branch", "create", "mine")
    b.cli("branch", "switch", "mine")
    write_synced(b.work / "from-b.txt", b"b\n")
    a.kill()

    def taken():
        res = b.cli("takeover", "main", check=False)
        return res if res.returncode == 0 else None

    out = wait_for(taken, "the dead host's lease to expire", timeout=30).stdout
    assert out == ("this host now writes branch main (from "
                   f"{b.status()['head'][:12]}, its last durable commit)\n"
                   "  the mount now shows main; it showed mine (committed): memfs branch "
                   "switch mine goes back\n"), out
    assert (b.work / "from-a.txt").read_bytes() == b"a\n"
    assert not (b.work / "from-b.txt").exists()
    again = b.cli_json("takeover", "main")  # already on main: no switch, no word of one
    assert again["switched_from"] is None, again
    b.cli("branch", "switch", "mine")
    assert (b.work / "from-b.txt").read_bytes() == b"b\n", "the way back the remedy names"


def test_a_locked_server_holds_only_the_memfs_listing_that_asked(hosts, pg_url: str) -> None:
    """`.memfs/branches`, a commit looked up by id under `.memfs/history` and
    `.memfs/checkpoints` read the database in a worker thread: while another session holds
    the table they read locked, only that `ls` waits, and a file b has read before is served
    meanwhile (the reads ran on the FUSE loop, so the whole mount hung with them)."""

    a, b = hosts
    write_synced(a.work / "hot.txt", b"read on b first\n")
    wait_for(lambda: read(b.work / "hot.txt") == b"read on b first\n", "host b to see a's files")
    cid = a.cli_json("log", "-n", "1")[0]["id"]
    a.cli("checkpoint", "create", "before-lock")

    def hot_is_served() -> None:
        cat = subprocess.run(["cat", str(b.work / "hot.txt")], capture_output=True, timeout=20)
        assert cat.stdout == b"read on b first\n", cat

    memfs = b.mnt / ".memfs"
    cases = (("branches", ["ls", str(memfs / "branches")], "main"),
             ("commits", ["ls", str(memfs / "history" / cid[:10])], "work"),  # a prefix
             ("checkpoints", ["ls", str(memfs / "checkpoints")], "before-lock"))
    for table, argv, expect in cases:
        out = _only_it_waits(pg_url, table, argv, hot_is_served)
        assert expect in out.split(), (argv, out)
