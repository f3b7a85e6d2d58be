"""A bound mount's taken-in files are not kept as nodes (issue 13 item 5): once a large pass's
take-in is committed, the nodes the kernel never asked for are unloaded, and the next passes
read those files from the committed tree (StoreView's Unbuilt). The reconciler's guarantees
hold on them as on loaded nodes: a draft is never overwritten, a deletion never resurrected,
a disk edit of an untouched file is taken."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.backing import close, open_backing

from memfs.backing import Binding
from memfs.backing.passes import TRIM_AFTER
from memfs.backing.storeview import Unbuilt
from memfs.store.trees import FILE
from memfs.workspace.workspace import Workspace

FILES = TRIM_AFTER + 200  # a large pass: its take-in is unloaded once committed
PER_DIR = 100


def tree(disk: Path, n: int = FILES) -> None:
    for i in range(n):
        d = disk / f"d{i // PER_DIR:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i % PER_DIR:02d}.txt").write_text(f"file {i}\n")


def node(ws: Workspace, path: str):
    n = ws.root
    for part in path.split("/"):
        n = ws.children(n)[part.encode()]
    return n


def loaded_files(ws: Workspace) -> int:
    return sum(1 for n in ws.nodes.values() if n.kind == FILE)


async def attached_and_unloaded(tmp_path: Path):
    disk = tmp_path / "disk"
    tree(disk)
    ws, b = open_backing(tmp_path / "root")
    res = await b.attach(Binding("work", str(disk)))
    assert len(res.first_pass.taken) == FILES  # type: ignore[union-attr]
    await ws.commit()
    await b.run_pass("work")  # the mount's next pass: the committed take-in goes
    return ws, b, disk


@pytest.mark.trio
async def test_a_committed_take_in_leaves_no_file_nodes(tmp_path: Path) -> None:
    """Without the unloading every taken-in file keeps a node (about 0.5 KB each); the pass
    after reads the files from their committed rows, and a read loads them again."""
    ws, b, _disk = await attached_and_unloaded(tmp_path)
    try:
        assert loaded_files(ws) < PER_DIR, f"{loaded_files(ws)} file nodes still loaded"
        nodes, _ = b.view.nodes("work")
        assert len(nodes) == FILES
        assert all(isinstance(n, Unbuilt) for n in nodes.values())
        again = await b.run_pass("work")
        assert again.taken == [] and again.conflicts == []  # type: ignore[union-attr]
        assert ws.read(node(ws, "work/d11/f99.txt"), 0, 100) == b"file 1199\n"
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_unbuilt_files_keep_the_guarantees(tmp_path: Path) -> None:
    """After the unloading: a disk edit of a file nobody touched is taken; a draft made in the
    workspace is kept against a disk edit (a conflict); a file deleted in the workspace is not
    brought back by a pass."""
    ws, b, disk = await attached_and_unloaded(tmp_path)
    try:
        (disk / "d00/f01.txt").write_text("disk edit\n")
        ws.write(node(ws, "work/d01/f01.txt"), 0, b"draft!!!!!\n")
        (disk / "d01/f01.txt").write_text("disk edit too\n")
        ws.unlink(node(ws, "work/d02"), b"f02.txt")
        res = await b.run_pass("work")
        assert res.taken == ["d00/f01.txt"]  # type: ignore[union-attr]
        assert res.conflicts == ["d01/f01.txt"]  # type: ignore[union-attr]
        assert ws.read(node(ws, "work/d00/f01.txt"), 0, 100) == b"disk edit\n"
        assert ws.read(node(ws, "work/d01/f01.txt"), 0, 100) == b"draft!!!!!\n"
        assert b"f02.txt" not in ws.children(node(ws, "work/d02"))
        assert (disk / "d02/f02.txt").exists()  # the deletion waits for a materialize
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_a_decision_on_an_unbuilt_file_is_checked_against_its_node(tmp_path: Path) -> None:
    """A pass decides on an Unbuilt file and applies on the node loaded since: the same
    committed ref and mode is the same file; a write since (a draft) or a chmod is not."""
    ws, b, _disk = await attached_and_unloaded(tmp_path)
    try:
        nodes, _ = b.view.nodes("work")
        a, c, m = nodes["d03/f03.txt"], nodes["d04/f04.txt"], nodes["d05/f05.txt"]
        assert isinstance(a, Unbuilt) and isinstance(c, Unbuilt)
        assert b.view.same_as_decided("work", "d03/f03.txt", a, 0) == (
            True, node(ws, "work/d03/f03.txt"))
        ws.write(node(ws, "work/d04/f04.txt"), 0, b"x")
        assert b.view.same_as_decided("work", "d04/f04.txt", c, 0)[0] is False
        ws.setattr(node(ws, "work/d05/f05.txt"), mode=0o600)
        await ws.commit()
        assert b.view.same_as_decided("work", "d05/f05.txt", m, 0)[0] is False
        assert b.view.same_as_decided("work", "d06/none.txt", None, None) == (True, None)
        assert b.view.same_as_decided("work", "d06/f06.txt", None, None)[0] is False
        assert b.view.same_as_decided("work", "d06/none.txt", m, 0) == (False, None)
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_nodes_the_kernel_holds_stay_loaded(tmp_path: Path) -> None:
    """What the kernel holds (a counted lookup) is never unloaded: its directory stays."""
    disk = tmp_path / "disk"
    tree(disk)
    ws, b = open_backing(tmp_path / "root")
    await b.attach(Binding("work", str(disk)))
    await ws.commit()
    held = node(ws, "work/d07/f07.txt")
    ws.kernel_refs = lambda: lambda nid: nid == held.id
    await b.run_pass("work")
    try:
        assert ws.nodes.get(held.id) is held and node(ws, "work/d07/f07.txt") is held
        assert loaded_files(ws) <= PER_DIR
    finally:
        close(ws, b)


def test_unbuilt_is_small() -> None:
    """What a pass keeps per unloaded file, instead of a node (232 bytes with its slots)."""
    import sys

    from memfs.store.trees import Entry

    u = Unbuilt(Entry("f", FILE, 0o644, 0, 0, 1, 1, 9, "c:" + "0" * 32, {}, None, None))
    assert sys.getsizeof(u) <= 64


@pytest.mark.trio
async def test_a_directory_the_kernel_forgets_in_a_bound_mount_is_unloaded(tmp_path: Path) -> None:
    """A bound mount's directory the kernel forgot unloads as any other (its files are read
    from their rows by the next pass), unless it shows a disk-only file: those are the
    backing layer's nodes, known by id."""
    disk = tmp_path / "disk"
    tree(disk, 300)
    (disk / "d01" / "bin.dat").write_bytes(b"\0\1\2binary")  # disk-only: not taken in
    ws, b = open_backing(tmp_path / "root")
    try:
        await b.attach(Binding("work", str(disk)))
        await ws.commit()
        d0, d1 = node(ws, "work/d00"), node(ws, "work/d01")
        assert loaded_files(ws) == 301
        ws.forget(d0.id)
        ws.forget(d1.id)
        assert d0._children is None and d1._children is not None
        res = await b.run_pass("work")
        assert res.taken == [] and res.conflicts == []  # type: ignore[union-attr]
        nodes, _ = b.view.nodes("work")
        assert isinstance(nodes["d00/f05.txt"], Unbuilt) and len(nodes) == 300
        assert ws.read(node(ws, "work/d00/f05.txt"), 0, 100) == b"file 5\n"
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_a_directory_the_kernel_holds_keeps_its_listing(tmp_path: Path) -> None:
    """An open directory (a listing under way: readdir's snapshot names its nodes) keeps
    its children loaded; the directories below it that nothing holds still go."""
    disk = tmp_path / "disk"
    tree(disk)
    ws, b = open_backing(tmp_path / "root")
    await b.attach(Binding("work", str(disk)))
    await ws.commit()
    work, d08 = node(ws, "work"), node(ws, "work/d08")
    kids = dict(ws.children(d08))
    ws.kernel_refs = lambda: lambda nid: nid in (work.id, d08.id)
    await b.run_pass("work")
    try:
        assert work._children is not None and d08._children is not None
        assert all(ws.children(d08)[n] is k for n, k in kids.items())
        assert node(ws, "work/d09")._children is None
        assert loaded_files(ws) == PER_DIR
    finally:
        close(ws, b)
