"""Garbage collection meets hard links and special files (issue 13 with issue 12): GC marks
a kept commit's inode table and every row's content and sweeps a dropped commit's table; fsck
and GC walk one graph (memfs.store.refs); beside a live mount, every name of a linked inode
keeps its inode, link count and bytes."""

from __future__ import annotations

import os
import random
import stat
import threading
from pathlib import Path

import pytest
import trio
from helpers.gcstore import is_dropped, keep_nothing_by_age
from helpers.space import fsync_path
from helpers.store import store_check

from memfs.store import Store
from memfs.store.gc import Collector
from memfs.store.retention import Policy
from memfs.store.trees import CHR, DIR, FIFO, FILE, SOCK, decode_dir
from memfs.workspace.workspace import Workspace

MiB = 1 << 20
KEEP_NOTHING_BY_AGE = Policy(keep_all=0, hourly=0, daily=0)


def _commit(ws: Workspace) -> str:
    cid = trio.run(ws.commit)
    assert cid is not None
    return cid


def _has_object(store: Store, oid: str) -> bool:
    return bool(store._query("SELECT 1 FROM objects WHERE id = ?", (oid,)))


def _has_chunk(store: Store, cid: str) -> bool:
    return bool(store._query("SELECT 1 FROM chunks WHERE id = ?", (cid,)))


def _read(ws: Workspace, node) -> bytes:
    return ws.read(node, 0, node.size())


def test_gc_keeps_kept_commits_links_and_sweeps_dropped_inode_tables(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = Workspace(Store.open(root), commit_interval=0.05)
    store = ws.store
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    sub = ws.create(work, b"sub", DIR, 0o755, 0, 0)
    old, new, gone = os.urandom(3 * MiB), os.urandom(2 * MiB), os.urandom(MiB + 17)
    a = ws.create(work, b"a", FILE, 0o644, 0, 0)
    ws.write(a, 0, old)
    ws.link(a, sub, b"b")
    ws.create(work, b"fifo", FIFO, 0o644, 0, 0)
    ws.create(work, b"tty", CHR, 0o620, 0, 0, rdev=os.makedev(5, 0))
    ws.create(work, b"sock", SOCK, 0o755, 0, 0)
    c1 = _commit(ws)
    t1 = store.inode_table(c1)
    old_chunks = set(store.file_chunks(store.inodes(t1)[a.ikey].ref).values())
    ws.truncate(a, 0)
    ws.write(a, 0, new)  # through one name: the inode table's row changes, no directory does
    c2 = _commit(ws)
    t2 = store.inode_table(c2)
    assert t2 not in (None, t1)
    store.checkpoint("linked", c2)
    x = ws.create(work, b"x", FILE, 0o644, 0, 0)
    ws.write(x, 0, gone)
    ws.link(x, sub, b"y")
    c3 = _commit(ws)
    t3 = store.inode_table(c3)
    gone_chunks = set(store.file_chunks(store.inodes(t3)[x.ikey].ref).values())
    ws.unlink(work, b"x")
    ws.unlink(sub, b"y")
    head = _commit(ws)
    store.set_policy(KEEP_NOTHING_BY_AGE)

    report = Collector(store).run()

    assert report.problems == [], report.problems
    assert is_dropped(store, c1) and is_dropped(store, c3)
    assert not is_dropped(store, c2) and not is_dropped(store, head)
    assert store.fsck() == []
    # A dropped commit's inode table goes, and what only it named.
    assert not _has_object(store, t1) and not _has_object(store, t3)
    assert not store._query("SELECT 1 FROM commit_inodes WHERE commit_id IN (?, ?)", (c1, c3))
    assert not any(_has_chunk(store, c) for c in old_chunks | gone_chunks)
    # Who made a dropped commit stays with its tombstone (log and undo explain the gap).
    assert len(store._query("SELECT 1 FROM commit_ops WHERE commit_id IN (?, ?)", (c1, c3))) == 2
    # The kept commits' links: one inode under both names, its link count, its bytes.
    for cid in (c2, head):
        assert _has_object(store, store.inode_table(cid))
        view = ws.view(cid, "test")
        vwork = ws.children(view)[b"work"]
        va, vb = ws.children(vwork)[b"a"], ws.children(ws.children(vwork)[b"sub"])[b"b"]
        assert va is vb and va.nlink == 2
        assert _read(ws, va) == new
        kinds = {e.name: e for e in decode_dir(store.read_object(vwork.ref))}
        assert kinds["fifo"].kind == FIFO and kinds["sock"].kind == SOCK
        assert kinds["tty"].kind == CHR and int(kinds["tty"].ref) == os.makedev(5, 0)
    fresh = Workspace(store)  # the live tree read back from the store
    fwork = fresh.children(fresh.root)[b"work"]
    fa = fresh.children(fwork)[b"a"]
    assert fa is fresh.children(fresh.children(fwork)[b"sub"])[b"b"] and fa.nlink == 2
    assert _read(fresh, fa) == new
    store.close()


# -- through a mount -------------------------------------------------------------------------

@pytest.mark.mount
def test_gc_beside_a_live_mount_with_hard_links(mounted) -> None:
    """A writer rewrites one inode through its names, links new names and removes old ones,
    while `memfs gc` runs again and again; a second linked inode, all its names removed, is
    held open. Every name keeps the same inode, its link count and its bytes, before and
    after a remount, and fsck is clean."""
    mounted.require_real()
    keep_nothing_by_age(mounted)
    w = mounted.work
    pool = [random.Random(i).randbytes(150_000 + 999 * i) for i in range(4)]
    (w / "n0").write_bytes(pool[0])
    os.mkfifo(w / "fifo")
    held_bytes = os.urandom(MiB)
    (w / "h1").write_bytes(held_bytes)
    os.link(w / "h1", w / "h2")
    fsync_path(w)
    held = open(w / "h2", "rb")
    os.unlink(w / "h1")
    os.unlink(w / "h2")
    model = {"names": ["n0"], "data": pool[0]}
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        rng = random.Random(5)
        serial = 1
        try:
            while not stop.is_set():
                names = model["names"]
                r = rng.random()
                if r < 0.25:
                    name = f"n{serial}"
                    serial += 1
                    os.link(w / rng.choice(names), w / name)
                    names.append(name)
                elif r < 0.4 and len(names) > 1:
                    victim = names.pop(rng.randrange(len(names)))
                    os.unlink(w / victim)
                else:
                    data = rng.choice(pool)
                    (w / rng.choice(names)).write_bytes(data)
                    model["data"] = data
                if rng.random() < 0.2:
                    fsync_path(w)
        except OSError as exc:
            errors.append(repr(exc))

    t = threading.Thread(target=writer)
    t.start()
    try:
        dropped = 0
        for _ in range(6):
            res = mounted.cli_json("gc")
            errors += res["problems"]
            dropped += res["commits_dropped"]
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert dropped, "GC dropped nothing while the writer ran"
    assert held.read() == held_bytes, "an open inode whose names all went lost its bytes to GC"
    held.close()

    def check() -> None:
        names = model["names"]
        stats = [os.stat(w / n) for n in names]
        assert len({s.st_ino for s in stats}) == 1, "the names are no longer one inode"
        assert all(s.st_nlink == len(names) for s in stats), [s.st_nlink for s in stats]
        for n in names:
            assert (w / n).read_bytes() == model["data"], n
        assert stat.S_ISFIFO(os.stat(w / "fifo").st_mode)
        assert sorted(os.listdir(w)) == sorted([*names, "fifo"])

    fsync_path(w)
    check()
    assert mounted.cli_json("fsck")["ok"]
    mounted.umount()
    store_check(mounted.root)
    mounted.remount()
    check()


def test_each_commit_writes_the_inode_table_as_its_rows_are_now(tmp_path: Path) -> None:
    """A commit re-encodes only the inode-table rows it changes (memfs.workspace.inodes: git
    links every object it writes, so a repository's table holds a row per object) and keeps
    the others' encoding: the table each commit names must still hold every row as it is then,
    for content, metadata, link counts and rows dropped, over commits that change a few."""
    root = tmp_path / "root"
    ws = Workspace(Store.open(root), commit_interval=10)
    store = ws.store
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    files = []
    for i in range(6):
        f = ws.create(work, b"f%d" % i, FILE, 0o644, 0, 0)
        ws.write(f, 0, b"v0 %d" % i)
        ws.link(f, work, b"l%d" % i)
        files.append(f)
    rnd = random.Random(7)
    for step in range(8):
        _commit(ws)
        table = store.inodes(store.inode_table(ws.head))
        assert set(table) == {f.ikey for f in files}, step  # a victim's row is gone
        for f in files:
            e = table[f.ikey]
            assert (e.mode, e.size, e.nlink, e.ref) == (f.mode, f.size(), f.nlink, f.ref), step
        f = rnd.choice(files)
        match step % 4:
            case 0:
                ws.write(f, 0, b"v%d" % (step + 1))
            case 1:
                ws.setattr(f, mode=0o600 + step)
            case 2:
                ws.link(f, work, b"more%d" % step)
            case 3:
                victim = files.pop(rnd.randrange(len(files)))
                names = sorted(n for d, n in victim.links)
                for n in names:
                    ws.unlink(work, n)
    _commit(ws)
    store.close()
    again = Workspace(Store.open(root), commit_interval=10)  # read back from the store alone
    try:
        for f in files:
            node = again.lookup(again.lookup(again.root, b"work"), f.name)
            assert (node.mode, node.size(), node.nlink) == (f.mode, f.size(), f.nlink)
            assert _read(again, node) == _read(ws, f)
    finally:
        again.store.close()


def _row(store: Store, tree: str, name: str):
    return next(e for e in decode_dir(store.read_object(tree)) if e.name == name)


def _dir_ref(ws: Workspace, cid: str, name: bytes) -> str:
    return next(e.ref for e in decode_dir(ws.store.read_object(ws.store.commit(cid).tree))
                if e.name == name.decode())


def test_git_write_link_unlink_leaves_no_inode_table(tmp_path: Path) -> None:
    """git writes each object as a temporary file, links it to its name and unlinks the
    temporary one. The inode is then down to one name, loaded, and leaves the table: its
    directory holds a plain row again, in the same commit that drops the table's row (the
    table was a row per object that every commit stored whole again: 44 of 61 MB of a
    5k-file git add). Whether the commit lands between the link and the unlink or not; the
    view of the commit between still shows both names."""
    root = tmp_path / "root"
    ws = Workspace(Store.open(root), commit_interval=10)
    store = ws.store
    objs = ws.create(ws.root, b"objs", DIR, 0o755, 0, 0)
    for i in range(40):  # git's pattern, a commit every few objects
        tmp = ws.create(objs, b"tmp_%d" % i, FILE, 0o444, 0, 0)
        ws.write(tmp, 0, b"object %d " % i * 50)
        ws.link(tmp, objs, b"obj%d" % i)
        ws.unlink(objs, b"tmp_%d" % i)
        assert tmp.ikey is None and tmp.nlink == 1
        if i % 5 == 4:
            cid = _commit(ws)
            assert store.inode_table(cid) is None, i
    tree = _dir_ref(ws, ws.head, b"objs")
    assert all(_row(store, tree, f"obj{i}").kind == FILE for i in range(40))
    # A commit between the link and the unlink: the row is in that commit's table, and the
    # next commit drops it with the directory's plain row.
    tmp = ws.create(objs, b"tmp_x", FILE, 0o444, 0, 0)
    ws.write(tmp, 0, b"the linked one")
    ws.link(tmp, objs, b"objx")
    between = _commit(ws)
    table = store.inodes(store.inode_table(between))
    assert list(table) == [tmp.ikey] and table[tmp.ikey].nlink == 2
    ws.unlink(objs, b"tmp_x")
    after = _commit(ws)
    assert store.inode_table(after) is None
    assert _row(store, _dir_ref(ws, after, b"objs"), "objx").kind == FILE
    view = ws.lookup(ws.view(between), b"objs")
    for name in (b"tmp_x", b"objx"):
        node = ws.lookup(view, name)
        assert (node.nlink, _read(ws, node)) == (2, b"the linked one")
    # Linked again later: a new key, in the table again.
    ws.link(tmp, objs, b"objy")
    again = _commit(ws)
    assert list(store.inodes(store.inode_table(again))) == [tmp.ikey]
    store.close()
    store_check(root)
    back = Workspace(Store.open(root), commit_interval=10)  # read back from the store alone
    try:
        d = back.lookup(back.root, b"objs")
        for i in range(40):
            node = back.lookup(d, b"obj%d" % i)
            assert (node.nlink, node.ikey) == (1, None)
            assert _read(back, node) == b"object %d " % i * 50
        x, y = back.lookup(d, b"objx"), back.lookup(d, b"objy")
        assert x is y and x.nlink == 2 and _read(back, x) == b"the linked one"
        assert not any(n.startswith(b"tmp_") for n in back.children(d))
    finally:
        back.store.close()


def test_a_row_left_with_one_name_leaves_the_table_at_its_next_change(tmp_path: Path) -> None:
    """A row the table keeps with one name: its other name went while this name's directory
    was not loaded (as every git object's did before rows left the table). Its first change
    once that name is loaded moves it back to its directory; undo brings the linked state
    back whole, and a restore to after it the plain one."""
    root = tmp_path / "root"
    ws = Workspace(Store.open(root), commit_interval=10)
    a = ws.create(ws.root, b"a", DIR, 0o755, 0, 0)
    b = ws.create(ws.root, b"b", DIR, 0o755, 0, 0)
    f = ws.create(a, b"f", FILE, 0o644, 0, 0)
    ws.write(f, 0, b"shared bytes")
    ws.link(f, b, b"g")
    linked = _commit(ws)
    ws.store.close()
    ws = Workspace(Store.open(root), commit_interval=10)  # a/ not loaded: g's the one name
    ws.unlink(ws.lookup(ws.root, b"b"), b"g")
    one_name = _commit(ws)
    store = ws.store
    (row,) = store.inodes(store.inode_table(one_name)).values()
    assert row.nlink == 1
    ws.store.close()
    ws = Workspace(Store.open(root), commit_interval=10)
    store = ws.store
    node = ws.lookup(ws.lookup(ws.root, b"a"), b"f")
    assert node.ikey is not None and node.nlink == 1  # read as it is stored
    ws.setattr(node, mode=0o600)
    plain = _commit(ws)
    assert store.inode_table(plain) is None
    e = _row(store, _dir_ref(ws, plain, b"a"), "f")
    assert (e.kind, e.mode, e.nlink) == (FILE, 0o600, None)
    assert _read(ws, node) == b"shared bytes"
    try:
        trio.run(ws.undo_commits, 2)  # back to the commit with both names
        a2, b2 = ws.lookup(ws.root, b"a"), ws.lookup(ws.root, b"b")
        f2, g2 = ws.lookup(a2, b"f"), ws.lookup(b2, b"g")
        assert f2 is g2 and f2.nlink == 2 and f2.mode == 0o644
        assert _read(ws, f2) == b"shared bytes"
        undone = _commit(ws) if ws.root.dirty else ws.head
        assert store.inodes(store.inode_table(undone)) == store.inodes(store.inode_table(linked))
        trio.run(ws.restore, plain)
        f3 = ws.lookup(ws.lookup(ws.root, b"a"), b"f")
        assert (f3.ikey, f3.nlink, f3.mode) == (None, 1, 0o600)
        assert b"g" not in ws.children(ws.lookup(ws.root, b"b"))
        assert _read(ws, f3) == b"shared bytes"
    finally:
        store.close()
    store_check(root)
