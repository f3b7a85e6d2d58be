"""Seed 002's "settling before a write": every workspace change first settles a pending
adoption on its branch, so a later write can never pass for an old adoption's outcome.

A child process runs a real pass and is SIGKILLed after the adoption's tree commit and before
its completion (the point `backing:after-commit`). The test reopens the store as a restart
would and, before any pass, changes the adopted file the way a user would. With the settle, the
change is a plain draft over what disk agreed with; without it, the next pass would see a
pending adoption whose tree side is neither outcome and call the user's edit an interrupted
conflict.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
import xxhash
from helpers.backing import open_backing as _open

from memfs.backing import Backing, Binding
from memfs.errors import MemfsError
from memfs.store import Store
from memfs.workspace.nodes import Node
from memfs.workspace.workspace import Workspace

CHILD = textwrap.dedent("""
    import pathlib, sys, trio
    from memfs.store import Store
    from memfs.backing import Backing
    from memfs.workspace.workspace import Workspace
    ws = Workspace(Store.open(pathlib.Path(sys.argv[1])), 0.0)
    b = Backing(ws)
    trio.run(b.run_pass, "work")
""")


def _file(ws: Workspace, name: bytes):
    return ws.children(ws.children(ws.root)[b"work"])[name]


@pytest.mark.parametrize("change", ["write", "unlink", "rename-over"])
@pytest.mark.trio
async def test_a_change_after_a_crash_settles_the_pending_adoption_first(tmp_path: Path,
                                                                        change: str):
    root, disk = tmp_path / "root", tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    (disk / "b.txt").write_text("b1\n")
    ws, b = _open(root)
    await b.attach(Binding("work", str(disk), watch="off"))
    b.close()
    ws.store.close()
    (disk / "a.txt").write_text("a2 on disk\n")
    child = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True,
                           env=dict(os.environ, MEMFS_CRASH_AT="backing:after-commit"),
                           timeout=60)
    assert child.returncode == -9, child.stderr.decode()
    ws, b = _open(root)
    assert ("work", "a.txt") in b.settle.pending  # the crash left the adoption pending
    assert ws.read(_file(ws, b"a.txt"), 0, 100) == b"a2 on disk\n"  # and its tree side landed
    work = ws.children(ws.root)[b"work"]
    if change == "write":
        f = _file(ws, b"a.txt")
        ws.truncate(f, 0)
        ws.write(f, 0, b"a3 by the user\n")
    elif change == "unlink":
        b.note_removed(ws.unlink(work, b"a.txt"), b"work/a.txt")  # as the FUSE layer does
    else:
        ws.rename(work, b"b.txt", work, b"a.txt")
    assert b.settle.pending == {}
    assert b.journal.pending_intents("work") == []  # settled as done: the tree showed a2
    await ws.commit()
    res = await b.run_pass("work")
    assert res.conflicts == []
    state = b.states.mounts["work"].states.get("a.txt")
    if change == "unlink":
        assert state == ("workspace-deleted", None)
    else:
        assert state == ("workspace-draft", None)  # a draft over a2, which disk agreed with
    assert (disk / "a.txt").read_text() == "a2 on disk\n"
    b.close()
    ws.store.close()


# --- a change settling an adoption while a pass gathers ------------------------------

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
    b.settle.load(b.settle.read(b.bindings), ws.branch)  # as Backing.__init__ does
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
            # The user's editor has the file open, as any write through the mount does: the
            # kernel's reference keeps its node loaded (a large pass unloads what nothing
            # holds, and a write to a node no longer in the tree would be lost).
            ws.kernel_refs = lambda f=f: lambda nid: nid == f.id
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
