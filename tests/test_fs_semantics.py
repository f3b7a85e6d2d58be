"""POSIX semantics through a real mount: edge cases a filesystem must get right.

Each test drives a real mount with ordinary syscalls. A test that shows a known bug is marked
xfail(strict=True) with the bug in one line, so it turns into a failure once the bug is fixed.
Most tests share one mount (a directory each) to keep the file fast; a test that reads the
daemon's global status, remounts or kills the daemon gets its own (`mounted`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.mount import REPO, MemfsMount, NativeDir, fuse_missing_reason, memfs_cmd, native_mode
from helpers.require import require_tool, root_missing, setpriv_missing
from helpers.wait import wait_for

pytestmark = pytest.mark.mount

AT_FDCWD = -100
RENAME_EXCHANGE = 2
MiB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old: Path, new: Path, flags: int) -> None:
    rc = _libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def status(m) -> dict:
    with open(m.mnt / ".memfs" / "status") as f:
        return json.load(f)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemfsMount | NativeDir]:
    base = tmp_path_factory.mktemp("review")
    if native_mode():
        yield NativeDir(base)
        return
    require_tool(fuse_missing_reason())
    (base / "root").mkdir()
    m = MemfsMount(base / "root", base / "mnt", base / "daemon.log")
    try:
        m.start()
        yield m
    finally:
        m.close()


@pytest.fixture
def work(shared, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of its own on the shared mount."""
    d = shared.work / request.node.name[:120]
    d.mkdir()
    return d


# -- regressions: bugs found by this review and fixed in addcee9 ----------------------------------

def test_unlinked_uncommitted_data_is_released(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "scratch.bin"
    p.write_bytes(os.urandom(6 << 20))  # below DIRTY_BYTES_SOON: waits for the group commit
    p.unlink()
    fsync_dir(mounted.work)
    assert status(mounted)["pending_bytes"] == 0


def test_open_unlinked_file_data_is_released_on_close(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "tmpfile"
    with open(p, "w+b") as f:
        p.unlink()
        f.write(b"z" * (2 << 20))
        f.flush()
        f.seek(0)
        assert f.read(3) == b"zzz"
        os.fsync(f.fileno())
    fsync_dir(mounted.work)
    assert status(mounted)["pending_bytes"] == 0


def test_branch_view_follows_the_branch_head(mounted) -> None:
    mounted.require_real()
    view = mounted.mnt / ".memfs" / "branches" / status(mounted)["branch"] / "work"
    (mounted.work / "one").write_text("1")
    fsync_dir(mounted.work)
    assert sorted(os.listdir(view)) == ["one"]
    (mounted.work / "two").write_text("2")
    fsync_dir(mounted.work)
    assert sorted(os.listdir(view)) == ["one", "two"]


def test_sparse_write_far_past_eof(mounted) -> None:
    mounted.require_real()
    sv = os.statvfs(mounted.mnt)
    off = sv.f_bavail * sv.f_frsize + (1 << 30)  # past all free space; ext4 takes it
    fd = os.open(mounted.work / "sparse", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        assert os.pwrite(fd, b"end", off) == 3
        assert os.pread(fd, 4, off - 1) == b"\0end"
    finally:
        os.close(fd)


def test_fstat_of_unlinked_open_file_has_nlink_zero(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "gone"
    with open(p, "w+b") as f:
        f.write(b"abc")
        p.unlink()
        assert os.fstat(f.fileno()).st_nlink == 0


# -- review findings: open ones are xfail(strict); the rest were fixed in 271df95 -------------------

def test_open_unlinked_file_data_keeps_daemon_rss_bounded(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "spill"
    block = os.urandom(MiB)
    before = rss(mounted.proc.pid)
    with open(p, "w+b", buffering=0) as f:
        p.unlink()  # a temp file: sort, databases and editors spill like this
        for _ in range(320):
            f.write(block)
        grown = rss(mounted.proc.pid) - before
        f.seek(319 * MiB)
        assert f.read(MiB) == block
    assert grown < 160 * MiB, f"daemon RSS grew {grown >> 20} MiB for a 320 MiB unlinked file"


def test_o_trunc_of_empty_file_updates_mtime(work: Path, native_dir: Path) -> None:
    for d in (native_dir, work):
        p = d / "stamp"
        p.touch()
        os.utime(p, (1_000_000_000, 1_000_000_000))
        with open(p, "w"):  # `: > stamp`, as Makefile rules do
            pass
        assert os.stat(p).st_mtime > time.time() - 60, f"mtime not updated in {d}"


def test_undo_refuses_a_non_positive_count(tmp_path: Path) -> None:
    root = tmp_path / "root"
    subprocess.run(memfs_cmd(root, "init"), check=True, capture_output=True, cwd=REPO)
    for n in ("0", "-1"):
        res = subprocess.run(memfs_cmd(root, "undo", "--", n), capture_output=True, text=True,
                             cwd=REPO)
        assert res.returncode != 0, f"undo {n}: {res.stdout}"


# -- guards (sound today, not covered by tests/test_fs_*) ---------------------------------------

def test_unlinked_open_file_keeps_working(work: Path) -> None:
    p = work / "held"
    p.write_bytes(b"before")
    with open(p, "r+b") as f:
        p.unlink()
        assert not p.exists()
        f.seek(0, os.SEEK_END)
        f.write(b"-after")
        f.flush()
        f.seek(0)
        assert f.read() == b"before-after"
        os.ftruncate(f.fileno(), 3)
        assert os.fstat(f.fileno()).st_size == 3
        f.seek(0)
        assert f.read() == b"bef"
    assert os.listdir(work) == []


def test_rename_open_file_then_write_lands_at_new_name(work: Path) -> None:
    (work / "a").mkdir()
    src = work / "a" / "f"
    with open(src, "wb") as f:
        f.write(b"one")
        f.flush()
        os.rename(src, work / "g")
        f.write(b"two")
    assert (work / "g").read_bytes() == b"onetwo"
    assert not src.exists()


def test_rename_exchange_across_directories(work: Path) -> None:
    (work / "d1" / "sub").mkdir(parents=True)
    (work / "d2").mkdir()
    (work / "d1" / "sub" / "inner").write_text("inner")
    (work / "d2" / "file").write_text("file")
    renameat2(work / "d1" / "sub", work / "d2" / "file", RENAME_EXCHANGE)
    assert (work / "d1" / "sub").read_text() == "file"
    assert (work / "d2" / "file" / "inner").read_text() == "inner"
    with pytest.raises(OSError) as exc:  # a directory into its own subtree
        renameat2(work / "d2", work / "d2" / "file" / "inner", RENAME_EXCHANGE)
    assert exc.value.errno == errno.EINVAL
    with pytest.raises(OSError) as exc:
        renameat2(work / "d1" / "sub", work / "d1" / "missing", RENAME_EXCHANGE)
    assert exc.value.errno == errno.ENOENT


def test_rename_dir_over_nonempty_dir_and_into_itself(work: Path) -> None:
    (work / "a" / "x").mkdir(parents=True)
    (work / "b" / "y").mkdir(parents=True)
    with pytest.raises(OSError) as exc:
        os.rename(work / "a", work / "b")
    assert exc.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    with pytest.raises(OSError) as exc:
        os.rename(work / "a", work / "a" / "x" / "a")
    assert exc.value.errno == errno.EINVAL
    os.rmdir(work / "b" / "y")
    os.rename(work / "a", work / "b")
    assert os.listdir(work) == ["b"] and os.listdir(work / "b") == ["x"]


def test_readdir_while_deleting_visits_every_name_once(work: Path) -> None:
    names = {f"f{i:05d}" for i in range(1500)}
    for n in names:
        (work / n).touch()
    seen: list[str] = []
    with os.scandir(work) as it:  # `rm -rf`: delete each entry while the listing runs
        for e in it:
            seen.append(e.name)
            os.unlink(e.path)
    assert sorted(seen) == sorted(names)
    assert os.listdir(work) == []


def test_o_direct_aligned_io_round_trips(shared, work: Path) -> None:
    p = work / "direct"
    buf = mmap.mmap(-1, 8192)  # page-aligned
    buf.write(bytes(range(256)) * 32)
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        assert os.pwrite(fd, buf, 0) == 8192
        out = mmap.mmap(-1, 8192)
        assert os.preadv(fd, [out], 0) == 8192
        assert out[:] == buf[:]
    finally:
        os.close(fd)
    assert p.read_bytes() == bytes(range(256)) * 32
    assert shared.proc is None or shared.proc.poll() is None


def test_new_files_honour_umask_owner_and_setgid_dir(work: Path, native_dir: Path) -> None:
    require_tool(root_missing("chown to another group"))
    got = []
    for base in (native_dir, work):
        d = base / "shared"
        d.mkdir()
        os.chown(d, 0, 4321)
        os.chmod(d, 0o2775)
        old = os.umask(0o027)
        try:
            (d / "f").touch()
            (d / "sub").mkdir()
            os.symlink("f", d / "ln")
        finally:
            os.umask(old)
        got.append([(n, oct(st.st_mode), st.st_uid, st.st_gid)
                    for n in ("f", "sub", "ln") for st in [os.lstat(d / n)]])
    assert got[1] == got[0]


def test_mmap_shared_write_is_stored(mounted) -> None:
    mounted.require_real()
    p = mounted.work / "mapped"
    p.write_bytes(b"\0" * 8192)
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 8192) as mm:
        mm[100:105] = b"hello"
        mm[5000:5003] = b"end"
        mm.flush()
    mounted.umount()
    mounted.remount()
    data = p.read_bytes()
    assert data[100:105] == b"hello" and data[5000:5003] == b"end" and len(data) == 8192


def test_sigterm_during_a_write_keeps_every_acknowledged_byte(mounted) -> None:
    mounted.require_real()
    target = mounted.work / "stream.bin"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "done = 0\n"
        "try:\n"
        "    while True:\n"
        "        block = (done // 65536).to_bytes(8, 'big') * 8192\n"
        "        done += os.write(fd, block)\n"
        "        print(done, flush=True)\n"
        "except OSError as exc:\n"
        "    print('stopped', exc.errno, flush=True)\n"
    ), str(target)], stdout=subprocess.PIPE, text=True)
    acked = 0
    assert writer.stdout is not None
    for line in writer.stdout:
        acked = int(line)
        if acked >= 24 * MiB:
            mounted.proc.send_signal(signal.SIGTERM)
            break
    for line in writer.stdout:
        if line.startswith("stopped"):
            break
        acked = int(line)
    writer.wait(timeout=60)
    assert mounted.proc.wait(timeout=60) == 0
    mounted.remount()
    size = os.stat(target).st_size
    assert size >= acked, f"{acked} bytes acknowledged before SIGTERM, {size} kept"
    with open(target, "rb") as f:
        for i in range(0, acked, 65536):
            assert f.read(65536) == (i // 65536).to_bytes(8, "big") * 8192, f"block at {i}"
    assert mounted.cli_json("fsck")["ok"]


def test_mount_on_a_missing_mountpoint_says_what_to_do(tmp_path: Path) -> None:
    res = subprocess.run(memfs_cmd(tmp_path / "root", "mount", str(tmp_path / "nope")),
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode != 0
    assert "mkdir" in res.stderr + res.stdout


def test_control_socket_survives_bad_input(shared) -> None:
    import socket

    shared.require_real()
    path = shared.root / "control.sock"
    bad = [b"not json\n", b"\xff\xfe\n", b"[1,2]\n", b'{"op": 5}\n', b'{"op":"undo","args":[1]}\n',
           b'{"op":"undo","args":{"steps":"x"}}\n', b"[" * 100000 + b"\n", b'{"op":"nope"}\n',
           b"half a line"]
    for payload in bad:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(path))
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        if payload.endswith(b"\n"):
            assert json.loads(reply)["ok"] is False, payload[:40]
    assert shared.proc.poll() is None
    assert shared.cli_json("status")["branch"]
    (shared.work / "still").write_text("alive")
    assert (shared.work / "still").read_text() == "alive"


# -- more review findings (fixed in 271df95/7a5faa5 unless marked xfail) -------------------------

def test_sparse_file_reports_only_stored_blocks(work: Path, native_dir: Path) -> None:
    for d in (native_dir, work):
        p = d / "holes"
        with open(p, "wb") as f:
            f.truncate(1 << 30)
            f.seek(512 << 20)
            f.write(b"x" * 4096)
        assert os.stat(p).st_blocks * 512 < 8 * MiB, f"{d}: {os.stat(p).st_blocks} blocks"


def _blocks_files(d: Path) -> dict[str, int]:
    """Files whose st_blocks ext4 and tmpfs agree on (4 KiB pages), made in `d`; each name ->
    the st_blocks both report. Linux/ext4 figures: an empty file 0, a byte 8 (one 4 KiB block),
    5000 bytes 16, 3 MiB + 1 byte 6152, a byte written 10 MiB past the start of an empty file 8
    (the hole takes nothing), `truncate -s 1G` 0."""
    (d / "empty").write_bytes(b"")
    (d / "one").write_bytes(b"x")
    (d / "five-k").write_bytes(b"y" * 5000)
    (d / "three-m").write_bytes(os.urandom(3 * MiB + 1))
    with open(d / "seeked", "wb") as f:
        f.seek(10 * MiB)
        f.write(b"z")
    with open(d / "truncated", "wb") as f:
        f.truncate(1 << 30)
    os.symlink("one", d / "link")  # a short link's target lives in its inode: no block
    return {"empty": 0, "one": 8, "five-k": 16, "three-m": 6152, "seeked": 8, "truncated": 0,
            "link": 0}


def _du_k(p: Path) -> int:
    return int(subprocess.run(["du", "-k", str(p)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def test_st_blocks_counts_4k_blocks_holding_data_as_native(mounted, native_dir: Path) -> None:
    """memfs counted bytes (a 1-byte file had st_blocks 1, `du` 1K); native filesystems count
    the 4 KiB blocks that hold data, and du, ls -s and tar -S read that."""
    for d in (native_dir, mounted.work):
        want = _blocks_files(d)
        got = {name: int(subprocess.run(["stat", "-c", "%b", str(d / name)], capture_output=True,
                                        text=True, check=True).stdout) for name in want}
        assert got == want, d
        assert {name: _du_k(d / name) for name in want} == {n: b // 2 for n, b in want.items()}, d
        ls = subprocess.run(["ls", "-s", "--block-size=512", str(d / "one")], capture_output=True,
                            text=True, check=True).stdout
        assert ls.split()[0] == "8", ls
    mounted.require_real()
    fsync_dir(mounted.work)  # committed: the same figures, and again once reloaded
    assert {n: os.lstat(mounted.work / n).st_blocks for n in want} == want
    mounted.remount()
    assert {n: os.lstat(mounted.work / n).st_blocks for n in want} == want
    # Where memfs is coarser than ext4: 4 KiB written into the middle of a hole counts the
    # whole 1 MiB piece it lands in (2048 blocks; ext4 and tmpfs: 8), before and after commit.
    p = mounted.work / "middle"
    with open(p, "wb") as f:
        f.truncate(1 << 30)
        f.seek(512 * MiB)
        f.write(b"m" * 4096)
    assert os.stat(p).st_blocks == 2048
    assert _du_k(p) == 1024


def test_rename_whiteout_is_refused(work: Path) -> None:
    (work / "a").write_text("a")
    with pytest.raises(OSError) as exc:
        renameat2(work / "a", work / "b", 4)  # RENAME_WHITEOUT
    assert exc.value.errno in (errno.EINVAL, errno.EPERM)
    assert (work / "a").exists() and not (work / "b").exists()


def test_other_users_get_their_own_files_and_the_kernel_checks_modes(shared, work: Path) -> None:
    shared.require_real()
    require_tool(setpriv_missing("act as another user"))
    (work / "mine").write_text("root's")
    os.chmod(work / "mine", 0o644)
    (work / "pub").mkdir()
    os.chmod(work / "pub", 0o1777)
    os.chmod(work, 0o755)
    # The test's tmp path is root-only; the other user works relative to an inherited fd.
    code = (
        "import errno, os, sys\n"
        "d = int(sys.argv[1])\n"
        "os.umask(0o022)\n"
        "os.close(os.open('pub/theirs', os.O_CREAT | os.O_WRONLY, 0o666, dir_fd=d))\n"
        "st = os.stat('pub/theirs', dir_fd=d)\n"
        "print(st.st_uid, st.st_gid, oct(st.st_mode & 0o777))\n"
        "for name, fn in [('write', lambda: os.open('mine', os.O_WRONLY, dir_fd=d)),\n"
        "                 ('create', lambda: os.open('new', os.O_CREAT | os.O_WRONLY, dir_fd=d)),\n"
        "                 ('chmod', lambda: os.chmod('mine', 0o777, dir_fd=d)),\n"
        "                 ('chown', lambda: os.chown('pub/theirs', 0, 0, dir_fd=d))]:\n"
        "    try:\n"
        "        fn()\n"
        "        print(name, 'allowed')\n"
        "    except OSError as exc:\n"
        "        print(name, errno.errorcode[exc.errno])\n"
    )
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                              sys.executable, "-c", code, str(fd)], capture_output=True,
                             text=True, timeout=60, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    assert lines[0] == "65534 65534 0o644"
    assert lines[1:5] == ["write EACCES", "create EACCES", "chmod EPERM", "chown EPERM"]
    os.unlink(work / "mine")  # root may, and the sticky dir keeps nobody's file
    assert (work / "pub" / "theirs").stat().st_uid == 65534


def test_mount_root_belongs_to_the_daemon_user(tmp_path_factory: pytest.TempPathFactory) -> None:
    require_tool(setpriv_missing("run the workspace as another user"))
    base = Path("/tmp") / f"memfs-review-{os.getpid()}"
    base.mkdir(mode=0o777, exist_ok=True)
    os.chmod(base, 0o777)
    try:
        res = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
             "import sys\nfrom pathlib import Path\nfrom memfs.store import Store\n"
             "from memfs.workspace.workspace import Workspace\n"
             "ws = Workspace(Store.open(Path(sys.argv[1])))\n"
             "print(ws.root.uid, ws.root.gid)\n", str(base / "root")],
            capture_output=True, text=True, cwd=REPO, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["65534", "65534"]
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def test_sqlite_wal_database_and_binaries_work_in_the_mount(work: Path) -> None:
    import shutil
    import sqlite3

    db = work / "agent.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    with con:
        con.executemany("INSERT INTO t (v) VALUES (?)", [(f"row {i}",) for i in range(2000)])
    other = sqlite3.connect(db)  # a second connection shares the -shm mapping
    assert other.execute("SELECT count(*) FROM t").fetchone() == (2000,)
    with con:
        con.execute("DELETE FROM t WHERE k % 2 = 0")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (1000,)
    assert other.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    other.close()
    con.close()
    true = shutil.which("true")
    assert true
    shutil.copy2(true, work / "true")
    assert subprocess.run([str(work / "true")], timeout=30).returncode == 0


def test_odd_names_and_binary_xattrs_survive_a_commit(shared, work: Path) -> None:
    shared.require_real()
    names = [b"\xff\xfe-not-utf8", b"line\nbreak", b"\xc3\xa9" * 127, b" lead", b"-dash"]
    wb = os.fsencode(work)
    for n in names:
        with open(wb + b"/" + n, "wb") as f:
            f.write(n)
    os.setxattr(work / "-dash", "user.bin", bytes(range(256)))
    fsync_dir(work)
    branch = status(shared)["branch"]
    view = os.fsencode(shared.mnt / ".memfs" / "branches" / branch / "work" / work.name)
    assert sorted(os.listdir(view)) == sorted(names)
    for n in names:
        with open(view + b"/" + n, "rb") as f:
            assert f.read() == n
    assert os.getxattr(view + b"/-dash", "user.bin") == bytes(range(256))


def test_group_commit_makes_a_change_durable_without_fsync(mounted) -> None:
    mounted.require_real()
    (mounted.work / "quiet.txt").write_text("no fsync\n")
    start = time.monotonic()
    while not status(mounted)["durable"]:
        assert time.monotonic() - start < 2.0, "not durable 2 s after a change (interval 100 ms)"
        time.sleep(0.02)
    mounted.kill()
    mounted.remount()
    assert (mounted.work / "quiet.txt").read_text() == "no fsync\n"


def test_commit_records_the_process_that_wrote_an_existing_file(mounted) -> None:
    mounted.require_real()
    target = mounted.work / "log.txt"
    target.write_text("first\n")
    fsync_dir(mounted.work)
    code = ("import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
            "os.write(fd, b'appended\\n')\nos.fsync(fd)\nprint(os.getpid())\n")
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                         text=True, check=True)
    pid = int(out.stdout)
    newest = mounted.cli_json("log", "-n", "1")[0]
    assert target.read_text() == "first\nappended\n"
    assert pid in [p["pid"] for p in newest["processes"]], newest


@pytest.mark.xfail(strict=True, reason="each write() costs an extra GETXATTR(security."
                   "capability) round trip: FUSE clears SB_NOSEC and pyfuse3 cannot ask for "
                   "FUSE_CAP_HANDLE_KILLPRIV_V2")
def test_small_writes_cost_one_request_each(mount_factory, memfs_root: Path) -> None:
    m = mount_factory(root=memfs_root, extra_args=("--debug",))
    m.require_real()
    fd = os.open(m.work / "appends", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        for _ in range(200):
            os.write(fd, b"x" * 100)
    finally:
        os.close(fd)
    # The daemon's debug log is written as it goes: wait until it shows every write.
    assert wait_for(lambda: m.log_text(tail=10 << 20).count("opcode: WRITE") >= 200)
    log = m.log_text(tail=10 << 20)
    getxattrs = log.count("opcode: GETXATTR")
    assert log.count("opcode: WRITE") >= 200
    assert getxattrs <= 20, f"{getxattrs} GETXATTR requests for 200 writes"


def test_undo_restores_directory_modes_and_drops_new_store_mounts(mounted) -> None:
    mounted.require_real()
    d = mounted.work / "dir"
    d.mkdir()
    os.chmod(d, 0o700)
    fsync_dir(mounted.work)
    head = status(mounted)["head"]
    os.chmod(d, 0o755)
    (mounted.mnt / "notes").mkdir()  # a new store mount at the root
    fsync_dir(mounted.mnt / "notes")
    assert os.stat(d).st_mode & 0o777 == 0o755 and "notes" in os.listdir(mounted.mnt)
    mounted.cli("restore", head)
    assert os.stat(d).st_mode & 0o777 == 0o700, "stale attributes of a kept directory"
    assert "notes" not in os.listdir(mounted.mnt), "stale name at the mount root"
    assert not (mounted.mnt / "notes").exists()


def test_full_disk_during_a_metadata_commit(small_fs: Path, mount_factory) -> None:
    m = mount_factory(root=small_fs / "root", name="small-mnt")
    # The automatic GC a failing commit starts gives SQLite's WAL back, which may let the
    # commit through before the fsync asks for it (tests/test_lifecycle_fulldisk.py tests
    # that run); here the fsync must meet the full disk.
    m.cli("config", "gc-auto", "off")
    filler = small_fs / "filler"
    with open(filler, "wb") as f:  # someone else fills the store's filesystem
        try:
            while True:
                f.write(b"\0" * MiB)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    d = m.work / "names"
    d.mkdir()
    for i in range(3000):
        (d / f"an-empty-file-with-a-long-name-{i:05d}").touch()
    with pytest.raises(OSError) as exc:
        fsync_dir(d)
    assert exc.value.errno == errno.ENOSPC, f"fsync on a full disk: {exc.value!r}"
    assert m.proc.poll() is None
    filler.unlink()
    fsync_dir(d)
    m.kill()
    m.remount()
    assert len(os.listdir(m.work / "names")) == 3000
    assert m.cli_json("fsck")["ok"]


def _listed(target: str) -> bool:
    """Is `target` (a resolved path) a mount point? Read from /proc, never by stat: a stat of
    a mount whose daemon is stuck would hang the test."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].encode().decode("unicode_escape") == target for line in f)


@pytest.mark.parametrize("inside", ["root-is-mountpoint", "root-under-mountpoint"])
def test_mount_refuses_a_store_root_hidden_by_its_own_mount(tmp_path: Path, inside: str) -> None:
    require_tool(fuse_missing_reason())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    target = os.path.realpath(mnt)  # resolved now: later a stat of it may hang
    root = mnt if inside == "root-is-mountpoint" else mnt / "root"
    proc = subprocess.Popen(memfs_cmd(root, "mount", target, "--foreground"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while proc.poll() is None and not _listed(target) and time.monotonic() < deadline:
            time.sleep(0.05)
        mounted_it = _listed(target)
    finally:
        if proc.poll() is None:
            proc.kill()  # first: a stuck daemon's requests are killable, then the mount is dead
        proc.wait(timeout=30)
        if _listed(target):
            subprocess.run(["fusermount3", "-uz", target], capture_output=True, timeout=30)
    assert not mounted_it, "mounted over its own store root"
    assert proc.returncode != 0


def test_history_and_branch_views_are_distinct_directories(shared, work: Path) -> None:
    shared.require_real()
    (work / "sub").mkdir()
    fsync_dir(work)
    st = status(shared)
    rel = Path("work") / work.name / "sub"
    in_history = shared.mnt / ".memfs" / "history" / st["head"] / rel
    in_branch = shared.mnt / ".memfs" / "branches" / st["branch"] / rel
    code = ("import os, sys\nos.chdir(sys.argv[1])\nos.listdir(sys.argv[2])\n"
            "print(os.getcwd())\n")
    out = subprocess.run([sys.executable, "-c", code, str(in_history), str(in_branch)],
                         capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == str(in_history), "the cwd moved to another view"


def test_the_memfs_name_is_reserved_only_at_the_mount_root(shared, work: Path) -> None:
    shared.require_real()
    top = shared.mnt / ".memfs"
    attempts = {
        "mkdir": (lambda: os.mkdir(top), {errno.EEXIST}),
        "rmdir": (lambda: os.rmdir(top), {errno.EBUSY, errno.ENOTEMPTY, errno.EROFS,
                                          errno.EPERM}),
        "rename onto": (lambda: os.rename(work, top), {errno.EBUSY, errno.ENOTEMPTY,
                                                        errno.EEXIST}),
        "rename away": (lambda: os.rename(top, shared.mnt / "x"), {errno.EBUSY, errno.EROFS}),
        "create inside": (lambda: open(top / "new", "w"), {errno.EROFS, errno.EPERM,
                                                           errno.EACCES}),
    }
    for what, (fn, allowed) in attempts.items():
        with pytest.raises(OSError) as exc:
            fn()
        assert exc.value.errno in allowed, f"{what}: {exc.value!r}"
    assert ".memfs" not in os.listdir(shared.mnt) and work.exists()
    (work / ".memfs").mkdir()  # below the root it is an ordinary name
    (work / ".memfs" / "f").write_text("ordinary")
    assert os.listdir(work / ".memfs") == ["f"] and ".memfs" in os.listdir(work)
