"""Review findings on the backing-directory work, each proved through a real mount first.

Every test here failed before its fix (noted per test) and passes with it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
import xxhash
from helpers.png import make_png
from test_backing_mount import ACCESS, states
from test_backing_triggers import wait_for

from memfs.backing import Backing, Binding
from memfs.errors import MemfsError
from memfs.store import Store
from memfs.workspace.nodes import Node
from memfs.workspace.workspace import Workspace


def test_disk_only_file_rewritten_in_place_with_its_mtime_kept_reads_new_bytes(
        mounted, tmp_path: Path):
    """A disk-only file is disk's truth, read through a contained fd at each read. A same-size
    rewrite whose mtime is put back (`touch -r`, a tool keeping timestamps) leaves the node in
    place, so the kernel's page cache must not survive the next open. Failed with
    keep_cache=True for every open (the old bytes came back from the cache)."""
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    old = make_png(8, 8)
    (disk / "pic.png").write_bytes(old)
    m.cli("attach", "work", str(disk), "--watch", "off")
    assert (m.work / "pic.png").read_bytes() == old  # the kernel now holds its pages
    st = os.stat(disk / "pic.png")
    new = bytearray(old)
    new[-20] ^= 0xFF  # same size, other bytes
    (disk / "pic.png").write_bytes(bytes(new))
    os.utime(disk / "pic.png", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (m.work / "pic.png").read_bytes() == bytes(new)
    # An on-access mount (the open observes first) reads them too.
    m.cli("detach", "work")
    m.cli("attach", "work", str(disk))
    assert (m.work / "pic.png").read_bytes() == bytes(new)
    (disk / "pic.png").write_bytes(old)
    os.utime(disk / "pic.png", ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(ACCESS)  # past the attach pass's once-a-second window
    assert (m.work / "pic.png").read_bytes() == old


def test_a_write_through_a_descriptor_held_across_a_disk_adoption_is_not_lost(
        mounted, tmp_path: Path):
    """An agent holds a file open for writing; the user edits the same file on disk; a pass
    takes disk's bytes in (a new node, so the kernel shows them); then the agent writes. Its
    write lands on the replaced (unlinked) node: nothing in the tree, no draft, no conflict,
    and the write returned success. Both sides changed the file, so the rule's answer is a
    conflict with both kept: a pass leaves a node open for writing in place. Failed before
    (the tree showed only disk's bytes, no conflict)."""
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("one\n")
    m.cli("attach", "work", str(disk), "--watch", "off")
    with open(m.work / "a.txt", "r+") as held:
        (disk / "a.txt").write_text("two, from the user on disk\n")
        m.cli("sync")  # the pass takes disk's edit in
        held.seek(0, os.SEEK_END)
        held.write("agent's line\n")
        held.flush()
        os.fsync(held.fileno())
    m.cli("sync")
    # Both sides changed the file: the agent's bytes in the tree, disk's on disk, a conflict.
    assert (m.work / "a.txt").read_text() == "one\nagent's line\n"
    assert (disk / "a.txt").read_text() == "two, from the user on disk\n"
    assert states(m, "work/a.txt")["work/a.txt"][0] == "conflict"
    # Closed again (opened, and made by create, both released): disk's next edit is taken.
    with open(m.work / "a.txt", "a"), open(m.work / "n.txt", "w") as n:
        n.write("new\n")
    m.cli("sync", "work/a.txt")  # the conflict resolved toward disk
    (disk / "a.txt").write_text("three\n")
    m.cli("sync")
    assert (m.work / "a.txt").read_text() == "three\n"


FILES = 2000  # enough that a full pass's gather (in its thread) takes a while


def _digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


async def _crash_left_adoption(ws: Workspace, b: Backing, disk: Path, name: str) -> Node:
    """The state a crash after an adoption's tree commit leaves (test_backing_settle makes it
    with a real SIGKILL): P says the old bytes, disk and the committed tree the new ones, and
    the adoption's intent is pending."""
    f = ws.children(ws.children(ws.root)[b"work"])[name.encode()]
    old = ws.read(f, 0, 1 << 10)
    new = b"new from disk " + name.encode() + b"\n"
    (disk / name).write_bytes(new)
    ws.truncate(f, 0)
    ws.write(f, 0, new)
    await ws.commit()
    root = b.journal.root("work")
    b.journal.begin_intent("work", name, "adopt", old=_digest(old), new=_digest(new),
                           branch=ws.branch, root=root)
    b.settle.load(b.bindings, ws.branch)  # as Backing.__init__ does at a restart
    assert ("work", name) in b.settle.pending
    return f


async def _pass_into(b: Backing, out: dict) -> None:
    try:
        out["res"] = await b.run_pass("work")
    except MemfsError as exc:
        out["error"] = exc.message


@pytest.mark.trio
async def test_a_user_edit_while_a_pass_gathers_settles_the_adoption_once(tmp_path: Path):
    """A restart left an adoption pending (the tree shows its new value). A pass gathers the
    pending intents and the evidence in its thread; meanwhile a user's write settles the
    adoption (done: P := new) on the loop. The pass must not decide from what it read before
    that: with the stale intent and stale P the user's edit read as a conflict (interrupted,
    or both-changed), and a settle landing after the plan made the pass fail ('intent N is not
    pending'). Timing varies under load, so the write is tried at spread delays within one
    pass's gather; before the fix most rounds failed."""
    root, disk = tmp_path / "root", tmp_path / "disk"
    disk.mkdir()
    for i in range(FILES):
        (disk / f"f{i:05d}.txt").write_text(f"old {i}\n")
    ws = Workspace(Store.open(root), 0.0)
    b = Backing(ws)
    try:
        await b.attach(Binding("work", str(disk), watch="off"))
        t0 = time.monotonic()
        await b.run_pass("work")
        took = time.monotonic() - t0  # one quiet pass: the window to aim the write into
        bad = []
        for k in range(8):
            name = f"f{k:05d}.txt"
            f = await _crash_left_adoption(ws, b, disk, name)
            out: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pass_into, b, out)
                await trio.sleep(took * (k + 1) / 10)
                ws.truncate(f, 0)
                ws.write(f, 0, b"the user's edit\n")
            conflicts = out["res"].conflicts if "res" in out else []
            if "error" in out or name in conflicts:
                bad.append((k, out.get("error"), conflicts))
            await ws.commit()
            again = await b.run_pass("work")
            if name in again.conflicts or \
                    b.states.mounts["work"].states.get(name) != ("workspace-draft", None):
                bad.append((k, "after", b.states.mounts["work"].states.get(name)))
        assert bad == [], "\n".join(map(repr, bad))
    finally:
        b.close()
        ws.store.close()




def test_auto_materialize_writes_a_draft_once_the_root_is_back(mounted, tmp_path: Path):
    """A draft made while the backing root is away (an unplugged drive) gets an auto round
    that finds the root unavailable. When the root comes back with nothing else changing,
    the draft must still reach disk: before the fix the round counted the tree as covered
    and nothing ran again until the next change."""
    m = mounted
    m.require_real()
    disk, away = tmp_path / "disk", tmp_path / "away"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk), "--auto-materialize", "--watch", "off")
    disk.rename(away)
    t0 = time.time()
    (m.work / "a.txt").write_text("draft while away\n")
    assert wait_for(lambda: (m.status()["backing"]["work"]["auto_materialize"]["last"] or
                          {"time": 0})["time"] > t0, 15)
    assert m.status()["backing"]["work"]["auto_materialize"]["last"]["refused"]
    away.rename(disk)
    assert wait_for(lambda: (disk / "a.txt").read_text() == "draft while away\n", 15)
