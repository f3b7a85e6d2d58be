"""The bridge without a mount: store-side digests, damaged intent, intent kept per commit.

These drive memfs.backing on a real store and a real backing directory inside trio,
with no FUSE: what they check does not depend on the kernel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import xxhash
from helpers.backing import attached as _attached
from helpers.backing import close as _close
from helpers.backing import open_backing as _open

from memfs.backing import Binding, ref_digest
from memfs.store import Store
from memfs.store.chunks import CHUNK_SIZE
from memfs.workspace.workspace import DIR, FILE


@pytest.mark.trio
async def test_store_digest_streams_chunks_and_holes(tmp_path: Path):
    ws, b = _open(tmp_path / "root")
    top = ws.create(ws.root, b"m", DIR, 0o755, 0, 0)
    f = ws.create(top, b"big", FILE, 0o644, 0, 0)
    data = os.urandom(CHUNK_SIZE + 4321)
    ws.write(f, 0, data)
    ws.truncate(f, 3 * CHUNK_SIZE + 7)  # a hole at the end reads as zeros
    expected = xxhash.xxh3_128_hexdigest(data + bytes(3 * CHUNK_SIZE + 7 - len(data)))
    assert b.view.digest_now(f) == expected  # dirty: the live bytes
    await ws.commit()
    assert not f.dirty and f.ref.startswith("m:")
    assert ref_digest(ws.store, f.ref, f.size()) == expected  # committed: streamed chunks
    small = ws.create(top, b"small", FILE, 0o644, 0, 0)
    ws.write(small, 0, b"abc")
    ws.truncate(small, 10)
    await ws.commit()
    assert b.view.digest_now(small) == xxhash.xxh3_128_hexdigest(b"abc" + bytes(7))
    _close(ws, b)


@pytest.mark.trio
async def test_damaged_intent_reads_unverified_until_a_path_sync(tmp_path: Path):
    ws, b, disk = await _attached(tmp_path, {"a.txt": "a1\n", "b.txt": "b1\n"})
    await ws.commit()
    head = ws.head
    _close(ws, b)
    # The intent object of the head commit goes missing: damaged, never "no intent".
    store = Store.open(tmp_path / "root")
    with store.transaction() as tx:
        tx.conn.execute("UPDATE commit_intents SET data = ? WHERE commit_id = ?",
                        (json.dumps({"work": "0" * 40}), head))
    store.close()
    (disk / "a.txt").write_text("a2 on disk\n")
    os.unlink(disk / "b.txt")
    ws, b = _open(tmp_path / "root")
    assert b.intent.tables["work"].damaged
    res = await b.run_pass("work")
    assert res.taken == [] and res.removed == []
    assert sorted(res.unverified) == ["a.txt", "b.txt"]
    work = ws.children(ws.root)[b"work"]
    assert ws.read(ws.children(work)[b"a.txt"], 0, 100) == b"a1\n"
    assert b"b.txt" in ws.children(work)  # a damaged intent never reads as "deleted"
    assert b.listing("work").entries[0].state == "unverified"
    # A path sync of a.txt replaces that entry and takes disk; b.txt stays unverified.
    res = (await b.sync("work/a.txt")).mounts["work"]
    assert res.taken == ["a.txt"]
    assert ws.read(ws.children(work)[b"a.txt"], 0, 100) == b"a2 on disk\n"
    res = await b.run_pass("work")
    assert res.unverified == ["b.txt"]
    _close(ws, b)


@pytest.mark.trio
async def test_intent_is_kept_with_each_commit_and_rewinds(tmp_path: Path):
    ws, b, disk = await _attached(tmp_path, {"a.txt": "a1\n"})
    await ws.commit()
    before = ws.head
    work = ws.children(ws.root)[b"work"]
    b.note_removed(ws.unlink(work, b"a.txt"), b"work/a.txt")  # what an `rm` in the mount does
    await ws.commit()
    assert b.intent.tables["work"].get("a.txt").tombstone
    assert (await b.run_pass("work")).removed == []
    assert b.listing("work").entries[0].state == "workspace-deleted"
    await ws.restore(before)
    assert not b.intent.tables["work"].get("a.txt").tombstone  # rewound with the tree
    assert (await b.run_pass("work")).removed == []
    assert b.listing("work").to_json()["entries"] == [{"path": "a.txt", "state": "synced",
                                             "conflict": None}]
    _close(ws, b)


@pytest.mark.trio
async def test_a_large_take_is_applied_in_batches(tmp_path: Path):
    import memfs.backing.applier as backing_mod

    root, disk = tmp_path / "root", tmp_path / "disk"
    disk.mkdir()
    for i in range(10):
        (disk / f"f{i}.txt").write_text(f"file {i}\n")
    ws, b = _open(root)
    old = backing_mod.BATCH_FILES
    backing_mod.BATCH_FILES = 3  # our own knob, so ten files make four batches
    try:
        res = await b.attach(Binding("work", str(disk)))
    finally:
        backing_mod.BATCH_FILES = old
    assert len(res.first_pass.taken) == 10
    assert len(ws.store.log(limit=50)) >= 5  # init, then a commit per batch
    work = ws.children(ws.root)[b"work"]
    assert ws.read(ws.children(work)[b"f7.txt"], 0, 100) == b"file 7\n"
    _close(ws, b)


@pytest.mark.trio
async def test_attach_refuses_the_store_root(tmp_path: Path):
    from memfs.errors import MemfsError

    ws, b = _open(tmp_path / "root")
    with pytest.raises(MemfsError, match="overlaps"):
        await b.attach(Binding("work", str(tmp_path)))
    _close(ws, b)


@pytest.mark.trio
async def test_path_sync_takes_nothing_when_another_branch_is_selected(tmp_path: Path):
    ws, b, disk = await _attached(tmp_path, {"a.txt": "a1\n"})
    await ws.create_branch("other", None)
    work = ws.children(ws.root)[b"work"]
    ws.write(ws.children(work)[b"a.txt"], 0, b"a-draft\n")
    (disk / "a.txt").write_text("a-disk\n")
    # Asked on main, but "other" is selected by the time the pass gathers.
    await ws.switch_branch("other")
    res = await b.run_pass("work", "a.txt", path_sync=True, asked_on="main")
    assert "nothing was taken" in res.refused
    await ws.switch_branch("main")
    work = ws.children(ws.root)[b"work"]
    assert ws.read(ws.children(work)[b"a.txt"], 0, 100) == b"a-draft\n"
    _close(ws, b)
