"""The FUSE translation without the kernel: MemfsOperations driven in-process (helpers/
inprocess.py) over a real store. What a request becomes (an errno, attributes, a change in the
workspace) is decided here in milliseconds; the real-mount tests then show the kernel's part.
"""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pyfuse3
import pytest
from helpers.inprocess import Requests, fails_with


@pytest.fixture
def req(tmp_path: Path):
    r = Requests(tmp_path / "root")
    try:
        yield r
    finally:
        r.close()


@pytest.mark.trio
async def test_a_file_round_trips_with_the_umask_applied(req: Requests):
    await req.mkdir("work")
    attr = await req.create("work/a.txt", b"hello\n", mode=0o666)
    assert stat.S_IMODE(attr.st_mode) == 0o644  # 0o666 less the request's umask 022
    assert await req.read("work/a.txt") == b"hello\n"
    got = await req.lookup("work/a.txt")
    assert got.st_size == 6 and got.st_ino == attr.st_ino and got.st_nlink == 1
    await req.ws.commit()
    assert await req.read("work/a.txt") == b"hello\n"  # from the store now


@pytest.mark.trio
async def test_names_the_workspace_refuses_get_their_errno(req: Requests):
    await req.mkdir("work")
    missing = await req.lookup("work/missing")  # a negative entry the kernel may cache
    assert missing.st_ino == 0 and missing.entry_timeout > 0
    with fails_with(errno.EPERM):  # only store mounts (directories) at the mount root
        await req.create("loose.txt")
    await req.create("work/a.txt")
    with fails_with(errno.EEXIST):
        await req.create("work/a.txt")
    with fails_with(errno.ENAMETOOLONG):
        await req.create("work/" + "n" * 256)
    with fails_with(errno.ENOTDIR):
        await req.mkdir("work/a.txt/sub")


@pytest.mark.trio
async def test_the_control_tree_is_reserved_and_read_only(req: Requests):
    top = await req.lookup(".memfs")
    assert stat.S_ISDIR(top.st_mode)
    with fails_with(errno.EEXIST):
        await req.mkdir(".memfs")
    status = await req.lookup(".memfs/status")
    with fails_with(errno.EROFS):
        await req.ops.open(status.st_ino, 0o1, req.ctx)  # O_WRONLY
    with fails_with(errno.EBUSY):
        await req.rename(".memfs", "other")


@pytest.mark.trio
async def test_rename_and_unlink_reach_the_tree(req: Requests):
    await req.mkdir("work")
    await req.create("work/a.txt", b"a")
    await req.create("work/b.txt", b"b")
    await req.rename("work/a.txt", "work/b.txt")
    assert await req.read("work/b.txt") == b"a"
    assert (await req.lookup("work/a.txt")).st_ino == 0  # gone: a negative entry
    await req.create("work/c.txt", b"c")
    await req.rename("work/b.txt", "work/c.txt", pyfuse3.RENAME_EXCHANGE)
    assert await req.read("work/b.txt") == b"c" and await req.read("work/c.txt") == b"a"
    with fails_with(errno.EEXIST):
        await req.rename("work/b.txt", "work/c.txt", pyfuse3.RENAME_NOREPLACE)
    await req.unlink("work/b.txt")
    assert sorted(req.ws.children(req.ws.children(req.ws.root)[b"work"])) == [b"c.txt"]


@pytest.mark.trio
async def test_xattrs_keep_to_the_user_namespace(req: Requests):
    await req.mkdir("work")
    ino = (await req.create("work/a.txt")).st_ino
    await req.ops.setxattr(ino, b"user.tag", b"\x00\xff", req.ctx)
    assert await req.ops.getxattr(ino, b"user.tag", req.ctx) == b"\x00\xff"
    assert await req.ops.listxattr(ino, req.ctx) == [b"user.tag"]
    with fails_with(errno.ENOTSUP):
        await req.ops.setxattr(ino, b"trusted.tag", b"x", req.ctx)
    with fails_with(errno.EPERM):  # memfs's own names are answered, never stored
        await req.ops.setxattr(ino, b"user.memfs.state", b"synced", req.ctx)
    with fails_with(errno.ENODATA):  # not backed: no state to tell
        await req.ops.getxattr(ino, b"user.memfs.state", req.ctx)


@pytest.mark.trio
async def test_chmod_keeps_the_file_type_and_the_root_is_fixed(req: Requests):
    await req.mkdir("work")
    await req.create("work/run.sh")
    attr = await req.chmod("work/run.sh", 0o755)
    assert stat.S_ISREG(attr.st_mode) and stat.S_IMODE(attr.st_mode) == 0o755
    with fails_with(errno.EPERM):
        await req.chmod("", 0o700)


@pytest.mark.trio
async def test_a_hard_link_counts_both_names(req: Requests):
    await req.mkdir("work")
    ino = (await req.create("work/a.txt", b"x")).st_ino
    work = (await req.lookup("work")).st_ino
    attr = await req.ops.link(ino, work, b"b.txt", req.ctx)
    assert attr.st_ino == ino and attr.st_nlink == 2
    status = await req.lookup(".memfs/status")
    with fails_with(errno.EXDEV):  # .memfs files are generated, not stored
        await req.ops.link(status.st_ino, work, b"s", req.ctx)
