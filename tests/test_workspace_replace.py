"""Replacing the live tree by another commit's (undo, restore, branch switch), driven directly
(no mount): a node is kept only if it is exactly the committed entry, content included."""

from __future__ import annotations

import os
from pathlib import Path

import trio
from helpers.workspace import new_ws, walk

from memfs.store.trees import CHR, DIR, LINK


def test_restore_brings_back_a_symlinks_target_when_only_the_target_differs(
        tmp_path: Path) -> None:
    """A symlink replaced within one clock tick by one of the same length (ln -sfn aa l;
    ln -sfn bb l) has the same row but for its target: restore kept the newer node, target
    and all, as the comparison put the committed target in the node's row."""
    ws = new_ws(tmp_path / "root")
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    old = ws.create(work, b"l", LINK, 0o777, 0, 0, target=b"aa")
    dev = ws.create(work, b"dev", CHR, 0o600, 0, 0, rdev=os.makedev(1, 3))
    trio.run(ws.commit)
    first = ws.head
    times = {n.target or n.name: (n.mtime_ns, n.ctime_ns, n.atime_ns) for n in (old, dev)}
    ws.unlink(work, b"l")
    new = ws.create(work, b"l", LINK, 0o777, 0, 0, target=b"bb")
    new.mtime_ns, new.ctime_ns, new.atime_ns = times[b"aa"]  # as made in the same tick
    ws.unlink(work, b"dev")
    other = ws.create(work, b"dev", CHR, 0o600, 0, 0, rdev=os.makedev(1, 5))
    other.mtime_ns, other.ctime_ns, other.atime_ns = times[b"dev"]
    trio.run(ws.commit)
    assert ws.head != first

    trio.run(ws.restore, first)
    assert walk(ws, "work/l").target == b"aa"
    assert walk(ws, "work/dev").rdev == os.makedev(1, 3)
