"""Bounded daemon memory: a deleted-but-open file's data spills to disk and reads back exactly;
what the kernel forgot is unloaded (live tree and views of history) and loads again the same;
trees of any depth commit, undo, check and collect."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from helpers.proc import rss
from helpers.workspace import deep_workspace, new_ws, walk

from memfs.store import chunks
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.gc import Collector
from memfs.store.trees import DIR, FILE
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
        pytest.skip(f"cannot drop the kernel's dentry cache (needs root): {exc}")


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
