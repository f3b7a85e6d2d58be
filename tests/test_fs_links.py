"""Hard links, special files and link counts through a real mount, beside a native directory.

One inode under several names shares everything (data, mode, owner, times, xattrs) and keeps
it through commit, restart, undo, restore, branch switch and the history views; FIFOs,
sockets and devices are kept with their type and st_rdev; directories count 2 + subdirs.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from helpers.store import stored_chunks

pytestmark = pytest.mark.mount


def ino_nlink(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_ino, st.st_nlink


def shared(a: Path, b: Path) -> bool:
    """Same inode, and every attribute stat shows agrees."""
    sa, sb = os.lstat(a), os.lstat(b)
    keys = ("st_ino", "st_mode", "st_uid", "st_gid", "st_size", "st_nlink", "st_mtime_ns",
            "st_ctime_ns")
    return all(getattr(sa, k) == getattr(sb, k) for k in keys)


def committed_head(m) -> str:
    """fsync a directory (a group commit of everything before it), then the head it made."""
    fd = os.open(m.work, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return m.status()["head"]


def fsck(m) -> None:
    res = m.cli("fsck", check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hard_link_shares_one_inode_across_dirs_and_store_mounts(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    (w / "a").mkdir()
    (w / "b").mkdir()
    (mounted.mnt / "other").mkdir()  # a second store mount: one filesystem to the kernel
    f = w / "a" / "f"
    f.write_bytes(b"one")
    os.link(f, w / "b" / "g")
    os.link(w / "b" / "g", mounted.mnt / "other" / "h")
    names = [f, w / "b" / "g", mounted.mnt / "other" / "h"]
    assert {ino_nlink(p) for p in names} == {(os.lstat(f).st_ino, 3)}
    with open(w / "b" / "g", "ab") as fh:
        fh.write(b" two")
    os.chmod(mounted.mnt / "other" / "h", 0o640)
    os.chown(f, 1234, 5678)
    os.setxattr(w / "b" / "g", "user.k", b"v")
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    for p in names:
        assert p.read_bytes() == b"one two"
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o640
        assert os.getxattr(p, "user.k") == b"v"
        assert shared(p, f)
    assert os.lstat(f).st_uid == 1234 and os.lstat(f).st_mtime_ns == 2_000_000_000

    mounted.remount()  # commit, restart: one inode still, all of it kept
    assert len({os.lstat(p).st_ino for p in names}) == 1
    for p in names:
        assert p.read_bytes() == b"one two" and os.lstat(p).st_nlink == 3
        assert os.getxattr(p, "user.k") == b"v" and shared(p, f)
    # Found from the other end first (the first name's directory not loaded yet).
    mounted.remount()
    os.chmod(mounted.mnt / "other" / "h", 0o600)
    assert stat.S_IMODE(os.lstat(f).st_mode) == 0o600 and shared(f, mounted.mnt / "other" / "h")
    fsck(mounted)


def test_unlink_rename_and_open_unlinked(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    (w / "d").mkdir()
    f, g = w / "f", w / "d" / "g"
    f.write_bytes(b"data")
    os.link(f, g)
    os.rename(f, g)  # two names of one inode: POSIX says rename does nothing
    assert f.exists() and g.exists() and os.lstat(f).st_nlink == 2
    f.unlink()
    assert g.read_bytes() == b"data" and os.lstat(g).st_nlink == 1
    os.link(g, f)
    with open(g, "r+b") as fh:
        f.unlink()
        g.unlink()
        assert os.fstat(fh.fileno()).st_nlink == 0
        fh.write(b"DATA")
        fh.seek(0)
        assert fh.read() == b"DATA"
    assert sorted(os.listdir(w)) == ["d"] and os.listdir(w / "d") == []
    # A link replaced by rename loses one name; the other keeps the inode.
    f.write_bytes(b"x")
    os.link(f, g)
    (w / "y").write_bytes(b"y")
    os.rename(w / "y", g)
    assert os.lstat(f).st_nlink == 1 and f.read_bytes() == b"x" and g.read_bytes() == b"y"
    mounted.remount()
    assert os.lstat(f).st_nlink == 1 and f.read_bytes() == b"x" and g.read_bytes() == b"y"
    fsck(mounted)


def test_links_survive_undo_restore_branch_switch_and_show_in_views(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    (w / "a").mkdir()
    f, g = w / "a" / "f", w / "g"
    f.write_bytes(b"v1")
    os.link(f, g)
    mounted.cli("checkpoint", "linked")
    head = mounted.status()["head"]
    f.unlink()
    g.write_bytes(b"v2")
    mounted.cli("undo", "--to", "linked")  # the test process is one operation
    assert f.read_bytes() == g.read_bytes() == b"v1"
    assert os.lstat(f).st_ino == os.lstat(g).st_ino and os.lstat(f).st_nlink == 2
    for view in (mounted.mnt / ".memfs" / "history" / head / "work",
                 mounted.mnt / ".memfs" / "branches" / "main" / "work"):
        vf, vg = view / "a" / "f", view / "g"
        assert vf.read_bytes() == b"v1" and shared(vf, vg) and os.lstat(vg).st_nlink == 2
        with pytest.raises(OSError) as exc:  # a view's file is not the live tree's to link
            os.link(vf, w / "from-history")
        assert exc.value.errno == errno.EXDEV
    mounted.cli("branch", "create", "side")
    g.unlink()
    (w / "new").write_bytes(b"n")
    os.link(w / "new", w / "a" / "new2")
    mounted.cli("branch", "switch", "side")
    assert shared(f, g) and os.lstat(f).st_nlink == 2 and not (w / "new").exists()
    mounted.cli("branch", "switch", "main")
    assert os.lstat(f).st_nlink == 1 and not g.exists() and shared(w / "new", w / "a" / "new2")
    mounted.cli("restore", "linked")
    assert shared(f, g) and g.read_bytes() == b"v1"
    fsck(mounted)


def test_linked_content_stays_deduplicated(mounted) -> None:
    mounted.require_real()
    w = mounted.work
    payload = os.urandom(3 << 20)
    (w / "big").write_bytes(payload)
    mounted.umount()
    before = stored_chunks(mounted.root)
    mounted.start()
    os.link(w / "big", w / "big2")
    (w / "copy").write_bytes(payload)  # same bytes under another inode: same chunks
    mounted.umount()
    assert stored_chunks(mounted.root) == before
    mounted.start()
    assert (w / "big2").read_bytes() == payload


def test_special_files_are_kept_with_type_mode_owner_and_rdev(mounted, native_dir: Path) -> None:
    mounted.require_real()
    w = mounted.work

    def make(root: Path) -> None:
        os.mkfifo(root / "fifo", 0o640)
        os.mknod(root / "null", 0o620 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(root / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 200))
        os.mknod(root / "plain", 0o644 | stat.S_IFREG)
        os.chown(root / "fifo", 1001, 1002)

    def seen(root: Path) -> dict:
        out = {}
        for name in sorted(os.listdir(root)):
            st = os.lstat(root / name)
            out[name] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                         st.st_rdev, st.st_size, st.st_nlink)
        return out

    make(native_dir)
    make(w)
    want = seen(native_dir)
    assert seen(w) == want
    # FUSE mounts are nodev (as fusermount3 makes every one): the kernel keeps a device node
    # but refuses to open it, before memfs is asked.
    with pytest.raises(PermissionError):
        open(w / "null", "rb")
    done: list[bytes] = []
    reader = threading.Thread(target=lambda: done.append((w / "fifo").read_bytes()))
    reader.start()
    (w / "fifo").write_bytes(b"through the pipe")
    reader.join(10)
    assert done == [b"through the pipe"]
    head = committed_head(mounted)
    mounted.remount()
    assert seen(w) == want
    assert seen(mounted.mnt / ".memfs" / "history" / head / "work") == want
    for name in list(want):
        os.unlink(w / name)
    mounted.cli("undo", "--to", head)
    assert seen(w) == want
    fsck(mounted)


def test_unix_socket_binds_and_connects_through_the_mount(mounted) -> None:
    mounted.require_real()
    path = str(mounted.work / "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    conn, _ = server.accept()
    client.sendall(b"ping")
    assert conn.recv(4) == b"ping"
    conn.sendall(b"pong")
    assert client.recv(4) == b"pong"
    for s in (conn, client, server):
        s.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    mounted.remount()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)  # kept, as ext4 keeps a socket's name
    os.unlink(path)


def test_directory_link_counts_follow_every_change(mounted, native_dir: Path) -> None:
    mounted.require_real()
    w = mounted.work

    def counts(root: Path) -> dict[str, int]:
        out = {".": os.lstat(root).st_nlink}
        for dirpath, dirnames, _ in os.walk(root):
            for d in dirnames:
                p = Path(dirpath) / d
                out[str(p.relative_to(root))] = os.lstat(p).st_nlink
        return out

    def steps(root: Path) -> None:
        for d in ("a", "a/b", "a/c", "d"):
            os.mkdir(root / d)
        (root / "a" / "file").write_text("f")
        os.rename(root / "a" / "c", root / "d" / "c")
        os.rmdir(root / "a" / "b")
        os.mkdir(root / "e")
        os.rename(root / "e", root / "d" / "c")  # replaces an empty directory

    steps(native_dir)
    steps(w)
    assert counts(w) == counts(native_dir)
    head = committed_head(mounted)
    mounted.remount()
    assert counts(w) == counts(native_dir)
    os.mkdir(w / "a" / "later")
    mounted.cli("undo", "--to", head)
    assert counts(w) == counts(native_dir)
    mounted.cli("branch", "create", "other")
    os.mkdir(w / "x")
    os.mkdir(w / "x" / "y")
    assert os.lstat(w).st_nlink == counts(native_dir)["."] + 1
    mounted.cli("branch", "switch", "other")
    assert counts(w) == counts(native_dir)
    assert counts(mounted.mnt / ".memfs" / "history" / head / "work") == counts(native_dir)
    fsck(mounted)


def test_no_change_carries_an_earlier_time_than_the_one_before(mounted) -> None:
    """memfs and the kernel (touch's UTIME_NOW) stamp from one clock: over thousands of
    create / touch / write / rename steps, no file's mtime or ctime ever goes back."""
    mounted.require_real()
    d = mounted.work / "clock"
    d.mkdir()
    backwards = []
    for i in range(1500):
        p = d / f"f{i % 50}"
        steps = []
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        steps.append(("create", os.fstat(fd)))
        os.utime(p, None)  # touch: the kernel's "now"
        steps.append(("touch", os.stat(p)))
        os.write(fd, b"x")
        steps.append(("write", os.fstat(fd)))
        os.close(fd)
        os.utime(p, None)
        steps.append(("touch", os.stat(p)))
        os.rename(p, d / "moved")
        steps.append(("rename", os.stat(d / "moved")))
        os.rename(d / "moved", p)
        for (a, sa), (b, sb) in zip(steps, steps[1:], strict=False):
            if sb.st_mtime_ns < sa.st_mtime_ns or sb.st_ctime_ns < sa.st_ctime_ns:
                backwards.append((i, a, b, sa.st_mtime_ns - sb.st_mtime_ns,
                                  sa.st_ctime_ns - sb.st_ctime_ns))
    assert not backwards, f"{len(backwards)} steps went back in time, e.g. {backwards[:5]}"


def test_git_clone_local_and_cp_al_hard_link_through_the_mount(mounted) -> None:
    """The tools that hard-link (git clone --local, cp -al) work as on a native directory."""
    mounted.require_real()
    w = mounted.work
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def git(*args: str, cwd: Path) -> str:
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                              text=True).stdout

    (w / "src").mkdir()
    git("init", "-q", cwd=w / "src")
    for i in range(3):
        (w / "src" / f"f{i}").write_text(f"{i}\n")
        git("add", f"f{i}", cwd=w / "src")
        git("commit", "-qm", f"c{i}", cwd=w / "src")
    git("clone", "-q", "--local", "src", "clone", cwd=w)
    shared_objects = [p for p in (w / "clone" / ".git" / "objects").rglob("*")
                      if p.is_file() and os.lstat(p).st_nlink == 2]
    assert len(shared_objects) >= 9  # 3 commits, 3 trees, 3 blobs, each also in src
    git("fsck", "--strict", cwd=w / "clone")
    assert git("log", "--oneline", cwd=w / "clone").count("\n") == 3
    subprocess.run(["cp", "-al", str(w / "src"), str(w / "copy")], check=True)
    assert os.lstat(w / "copy" / "f0").st_ino == os.lstat(w / "src" / "f0").st_ino
    mounted.remount()
    git("fsck", "--strict", cwd=w / "clone")
    assert os.lstat(w / "copy" / "f1").st_nlink == 2
    fsck(mounted)
