"""Bounded daemon memory: a deleted-but-open file's data spills to disk and reads back exactly;
what the kernel forgot is unloaded (live tree and views of history) and loads again the same;
trees of any depth commit, undo, check and collect."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from helpers.proc import rss
from helpers.require import require_tool
from helpers.wait import wait_for
from helpers.workspace import deep_workspace, new_ws, walk

from memfs.store import chunks
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.gc import Collector
from memfs.store.trees import BLK, CHR, DIR, FIFO, FILE, LINK, SOCK
from memfs.workspace.workspace import Workspace

MiB = 1 << 20


def test_a_spilled_file_reads_and_changes_exactly_like_memory(tmp_path: Path) -> None:
    ws = new_ws(tmp_path / "root")
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    f = ws.create(work, b"tmp", FILE, 0o644, 0, 0)
    base = random.Random(0).randbytes(3 * MiB + 123)
    ws.write(f, 0, base)
    trio.run(ws.commit)  # some of it committed chunks, the rest changed below
    model = bytearray(base)
    ws.unlink(work, b"tmp")  # still "open": the node lives on, detached
    rng = random.Random(1)
    spills = 0
    for step in range(300):
        op = rng.random()
        if op < 0.6:
            off = rng.randrange(0, len(model) + 2 * MiB)
            data = rng.randbytes(rng.choice([10, 4096, CHUNK_SIZE, 700_000]))
            ws.write(f, off, data)
            if off > len(model):
                model += bytes(off - len(model))
            model[off:off + len(data)] = data
        elif op < 0.7:
            size = rng.randrange(0, len(model) + MiB)
            ws.truncate(f, size)
            model = model[:size] + bytearray(max(0, size - len(model)))
        else:
            off = rng.randrange(0, len(model) + 1)
            n = rng.randrange(0, 3 * MiB)
            assert ws.read(f, off, n) == bytes(model[off:off + n]), f"step {step}"
        if ws.wants_spill(f) or rng.random() < 0.1:
            trio.run(ws.spill, f)
            spills += 1
            assert f.data.dirty_bytes() == 0
    assert spills > 5
    assert ws.read(f, 0, len(model) + 10) == bytes(model)
    spill = f.data.spill
    assert spill is not None and spill.present
    ws.forget(f.id)
    assert spill.fd == -1, "the scratch file outlived the node"


def _tree(ws: Workspace, dirs: int, files: int) -> dict[str, bytes]:
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    out = {}
    for i in range(dirs):
        d = ws.create(work, f"d{i}".encode(), DIR, 0o755, 0, 0)
        for j in range(files):
            f = ws.create(d, f"f{j}".encode(), FILE, 0o644, 0, 0)
            data = f"{i}/{j}".encode() * 10
            ws.write(f, 0, data)
            out[f"work/d{i}/f{j}"] = data
    trio.run(ws.commit)
    return out


def test_forgotten_directories_unload_and_load_again_the_same(tmp_path: Path) -> None:
    ws = new_ws(tmp_path / "root")
    files = _tree(ws, 50, 40)
    ws.store.close()
    ws = new_ws(tmp_path / "root")
    for path, data in files.items():  # `cat` everything: every node loaded
        assert ws.read(walk(ws, path), 0, 1000) == data
    loaded = len(ws.nodes)
    assert loaded > 2000
    work = walk(ws, "work")
    held = walk(ws, "work/d3/f1")  # an open file keeps its directory loaded
    for d in list(ws.children(work).values()):  # the kernel forgets bottom-up
        for f in list(ws.children(d).values()):
            if f is not held:
                ws.forget(f.id)
        ws.forget(d.id, referenced=lambda i: i == held.id)
    ws.forget(work.id, referenced=lambda i: i == held.id)
    assert len(ws.nodes) < 100, f"{len(ws.nodes)} of {loaded} nodes kept after forget"
    assert ws.nodes[held.id] is held and walk(ws, "work/d3/f1") is held
    for path, data in files.items():
        assert ws.read(walk(ws, path), 0, 1000) == data


def test_a_dirty_directory_is_not_unloaded(tmp_path: Path) -> None:
    ws = new_ws(tmp_path / "root")
    _tree(ws, 2, 3)
    d = walk(ws, "work/d0")
    ws.write(walk(ws, "work/d0/f0"), 0, b"changed")
    ws.forget(d.id)
    assert walk(ws, "work/d0/f0").data.dirty, "an uncommitted change was unloaded"
    trio.run(ws.commit)
    assert ws.read(walk(ws, "work/d0/f0"), 0, 7) == b"changed"


def test_symlinks_and_special_files_unload_once_committed_and_load_back_the_same(
        tmp_path: Path) -> None:
    """A symlink, FIFO, socket or device made in this session stayed dirty (a device, FIFO
    or socket) or without its committed ref (a symlink) after its commit, so its directory
    never unloaded when the kernel forgot it. Loaded again from its row, each keeps its
    type, mode and rdev: 0,0, 1,3 and the largest numbers the kernel passes (12-bit major,
    20-bit minor)."""
    ws = new_ws(tmp_path / "root")
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    d = ws.create(work, b"dev", DIR, 0o755, 0, 0)
    made = {b"null": (CHR, 0o620, os.makedev(1, 3)), b"zero0": (CHR, 0o600, os.makedev(0, 0)),
            b"big": (CHR, 0o644, os.makedev(4095, (1 << 20) - 1)),
            b"disk": (BLK, 0o660, os.makedev(259, 70000)), b"pipe": (FIFO, 0o640, 0),
            b"sock": (SOCK, 0o755, 0)}
    for name, (kind, mode, rdev) in made.items():
        ws.create(d, name, kind, mode, 0, 0, rdev=rdev)
    ws.create(d, b"link", LINK, 0o777, 0, 0, target=b"null")
    trio.run(ws.commit)
    head = ws.head
    for child in list(ws.children(d).values()):
        ws.forget(child.id)
    ws.forget(d.id)
    assert d._children is None, "a committed directory of special files stayed loaded"
    kids = ws.children(d)
    assert {n: (c.kind, c.mode, c.rdev) for n, c in kids.items() if n != b"link"} == made
    assert kids[b"link"].kind == LINK and kids[b"link"].target == b"null"
    assert trio.run(ws.commit) is None and ws.head == head, "loading them back changed them"


def test_trees_of_any_depth_commit_undo_check_and_collect(tmp_path: Path) -> None:
    depth = sys.getrecursionlimit() * 2 + 100
    ws = deep_workspace(tmp_path / "root", depth)
    trio.run(ws.commit)
    trio.run(ws.undo, 1)  # remaps every loaded level
    trio.run(ws.restore, "HEAD")
    assert ws.store.fsck() == []
    report = Collector(ws.store).run()
    assert report.problems == [] and ws.store.fsck() == []


# -- through a mount ------------------------------------------------------------------------------

def daemon_nodes(m) -> int:
    return m.status()["nodes"]


def drop_kernel_caches() -> None:
    """What memory pressure does: the kernel drops unused dentries and inodes (FORGETs)."""
    try:
        Path("/proc/sys/vm/drop_caches").write_text("2")
    except OSError as exc:
        require_tool(f"cannot drop the kernel's dentry cache (needs root): {exc}")


@pytest.mark.mount
def test_walking_a_big_tree_and_all_history_holds_rss(mount_factory, tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = new_ws(root)
    _tree(ws, 100, 300)  # 30k files
    work = walk(ws, "work")
    for i in range(150):  # history: 150 commits to browse
        ws.write(ws.children(walk(ws, "work/d0"))[b"f0"], 0, str(i).encode())
        trio.run(ws.commit)
    ws.store.close()
    del ws, work
    m = mount_factory(root=root)
    m.require_real()
    start = daemon_nodes(m)
    before = rss(m.proc.pid)
    out = subprocess.run(["find", str(m.work), "-type", "f"], capture_output=True, text=True,
                         check=True).stdout
    assert len(out.splitlines()) == 30_000
    by_time = m.mnt / ".memfs" / "history" / "by-time"  # every commit, one directory a day
    views = [by_time / day / c for day in os.listdir(by_time) for c in os.listdir(by_time / day)]
    assert len(views) >= 150
    browsed = [os.listdir(v / "work" / "d0") for v in views if (v / "work" / "d0").is_dir()]
    assert len(browsed) >= 150  # all but the store's first commit (no work/ yet)
    walked = daemon_nodes(m)
    assert walked > 30_000
    drop_kernel_caches()
    deadline = time.monotonic() + 30
    while daemon_nodes(m) > start + 2000 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = daemon_nodes(m)
    assert after <= start + 2000, f"{after} nodes held after the kernel forgot {walked}"
    grown = rss(m.proc.pid) - before
    assert grown < 150 * MiB, f"daemon RSS grew {grown >> 20} MiB"
    assert (m.work / "d7" / "f9").read_bytes() == b"7/9" * 10


@pytest.mark.mount
def test_special_files_made_through_the_mount_unload_when_forgotten(mounted) -> None:
    """Devices, FIFOs and symlinks made by mknod, mkfifo and ln -s, once committed and
    forgotten by the kernel, leave the daemon (they stayed loaded for as long as it ran);
    stat shows each as before, its rdev read back from its row."""
    mounted.require_real()
    d = mounted.work / "dev"
    d.mkdir()
    for i in range(300):
        os.mknod(d / f"c{i}", 0o620 | stat.S_IFCHR, os.makedev(i * 13 % 4096, i * 3001))
        os.mknod(d / f"b{i}", 0o600 | stat.S_IFBLK, os.makedev(4095 - i, (1 << 20) - 1 - i))
        os.mkfifo(d / f"p{i}", 0o640)
        os.symlink(f"c{i}", d / f"l{i}")

    def seen() -> dict[str, tuple[int, int, str]]:
        return {n: (os.lstat(d / n).st_mode, os.lstat(d / n).st_rdev,
                    os.readlink(d / n) if n[0] == "l" else "") for n in os.listdir(d)}

    want = seen()
    assert want["c1"][1] == os.makedev(13, 3001) and want["b0"][1] == os.makedev(4095, 1048575)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)  # a group commit of all of it
    finally:
        os.close(fd)
    held = daemon_nodes(mounted)
    assert held > 1200
    drop_kernel_caches()
    assert wait_for(lambda: daemon_nodes(mounted) < held - 1000, timeout=30, every=0.2), \
        f"{daemon_nodes(mounted)} of {held} nodes held after the kernel forgot the directory"
    assert seen() == want
    assert mounted.cli("fsck", check=False).returncode == 0


def test_chunk_locations_cached_stay_bounded_when_written(tmp_path: Path, monkeypatch) -> None:
    """The chunk store caches where chunks are (an LRU): a commit adds every chunk it wrote, and
    that must respect the bound too (a take-in of 1M small files cached 1M locations)."""
    monkeypatch.setattr(chunks, "LOCATIONS_KEPT", 50, raising=False)
    ws = new_ws(tmp_path / "root")
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    for i in range(200):
        ws.write(ws.create(work, b"f%d" % i, FILE, 0o644, 0, 0), 0, b"chunk %d" % i)
    trio.run(ws.commit)
    assert len(ws.store.chunks._locations) <= 50
    for i in (0, 199):  # evicted or not, each reads back
        assert ws.read(ws.lookup(work, b"f%d" % i), 0, 100) == b"chunk %d" % i
