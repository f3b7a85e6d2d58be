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
from pathlib import Path

import pytest
from test_backing_unit import _open

from memfs.backing import Binding
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
