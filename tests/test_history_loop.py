"""The history operations never make the trio loop wait for the store's writer
(docs/architecture.md, "What the trio loop may wait for").

A GC holds the store's writer lock across its transactions, several on a full disk
(`Store.exclusive`), and another process may hold SQLite's write lock. Undo, restore, branch
switch and create, checkpoint and mark wrote the store on the loop (the head move in the same
loop turn as the tree replacement, the last settle round's commit on the loop): every FUSE
request waited for the holder. Now their store steps run in a worker thread while new changes
are held off (memfs.workspace.hold), and reads go on.

In-process tests here hold `Store.exclusive` from another thread and check that a ticker on the
loop kept running; the real-mount tests (a second process holding SQLite's write lock, a writer
hammering the tree during an undo or a branch switch) are in test_fs_history_hold.py.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from helpers.backing import held_by_another_thread
from helpers.workspace import new_ws, walk

from memfs.store.trees import DIR, FILE
from memfs.workspace.nodes import WorkspaceError
from memfs.workspace.workspace import Workspace

HOLD = 1.5
STALL = 0.5  # the longest gap a free loop shows under the shared machine's load


def content(ws: Workspace, path: str) -> bytes:
    f = walk(ws, path)
    return ws.read(f, 0, f.size() + 1)


async def two_states(ws: Workspace) -> str:
    """work/doc.txt 'one' at the returned commit, then 'two' (committed)."""
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    doc = ws.create(work, b"doc.txt", FILE, 0o644, 0, 0)
    ws.write(doc, 0, b"one\n")
    first = await ws.commit()
    assert first is not None
    ws.write(doc, 0, b"two\n")
    await ws.commit()
    return first


async def while_the_writer_is_held(ws: Workspace, op: Callable[[], Awaitable[object]],
                                   during: Callable[[], None] | None = None,
                                   ) -> tuple[float, float, list[object]]:
    """Run `op` while another thread holds the store's writer for HOLD seconds (as a GC on a
    full disk does); returns the loop's longest gap, how long `op` took and its result.
    `during` runs on the loop while `op` waits for the holder."""
    gap = 0.0
    got: list[object] = []

    async def ticker(task_status=trio.TASK_STATUS_IGNORED) -> None:  # noqa: ANN001
        nonlocal gap
        last = time.monotonic()
        task_status.started()
        while True:
            await trio.sleep(0.01)
            now = time.monotonic()
            gap = max(gap, now - last)
            last = now

    with held_by_another_thread(ws.store.exclusive(), HOLD):
        t0 = time.monotonic()
        async with trio.open_nursery() as n:
            await n.start(ticker)  # ticking before the operation starts

            async def run() -> None:
                got.append(await op())

            n.start_soon(run)
            if during is not None:
                await trio.sleep(HOLD / 3)
                assert not got, "the operation did not wait for the store's writer"
                during()
            while not got:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
        took = time.monotonic() - t0
    return gap, took, got


@pytest.mark.parametrize("which", ["undo", "restore", "switch", "branch", "checkpoint",
                                   "checkpoint-delete", "mark"])
def test_history_operations_do_not_stall_the_loop(tmp_path: Path, which: str) -> None:
    """Each history operation waits for a GC's `Store.exclusive` in a worker thread: the loop
    keeps running (a read is answered meanwhile, from the tree as it was), and the operation
    completes once the holder lets go. Fails before the change: the loop stalled for HOLD."""
    ws = new_ws(tmp_path / "root")

    async def main() -> None:
        first = await two_states(ws)
        ws.store.create_branch("side", first)
        if which == "checkpoint-delete":
            await ws.checkpoint("cp")
        ops: dict[str, Callable[[], Awaitable[object]]] = {
            "undo": lambda: ws.undo(1),
            "restore": lambda: ws.restore(first),
            "switch": lambda: ws.switch_branch("side"),
            "branch": lambda: ws.create_branch("other", None),
            "checkpoint": lambda: ws.checkpoint("cp"),
            "checkpoint-delete": lambda: ws.delete_checkpoint("cp"),
            "mark": lambda: ws.mark("m"),
        }
        seen: list[bytes] = []
        gap, took, _ = await while_the_writer_is_held(
            ws, ops[which], lambda: seen.append(content(ws, "work/doc.txt")))
        assert gap < STALL, f"{which} stalled the loop {gap:.2f} s"
        assert took >= HOLD * 0.9, f"{which} did not wait for the store's writer"
        assert seen == [b"two\n"], "a read during the operation sees the tree as it was"
        if which in ("undo", "restore", "switch"):
            assert content(ws, "work/doc.txt") == b"one\n"
            assert ws.head == ws.store.head(ws.branch) == first
        if which == "switch":
            assert ws.branch == ws.store.current_branch() == "side"
        if which == "branch":
            assert ws.store.branches()["other"] == ws.head
        if which == "checkpoint":
            assert [c[0] for c in ws.store.checkpoints()] == ["cp"]
        if which == "checkpoint-delete":
            assert ws.store.checkpoints() == []

    trio.run(main)


def test_a_change_during_an_undo_waits_and_lands_after_it(tmp_path: Path) -> None:
    """A change asked for while an undo waits for the store's writer waits too (no change may
    land between the head move and the tree replacement) and then lands on the undone tree;
    a change that skipped the wait would be refused, never silently lost."""
    ws = new_ws(tmp_path / "root")

    async def main() -> None:
        first = await two_states(ws)
        seen: list[tuple[str, bytes, bool]] = []  # what the change found when it went on
        refused: list[int] = []

        async def change() -> None:
            await ws.before_change()  # as every FUSE request that changes the tree does
            seen.append((ws.head, content(ws, "work/doc.txt"), ws.hold.held))
            ws.create(walk(ws, "work"), b"after.txt", FILE, 0o644, 0, 0)

        async def both() -> object:  # run once the holder has the store's writer
            async with trio.open_nursery() as n:
                result: list[object] = []

                async def run_undo() -> None:
                    result.append(await ws.undo(1))

                n.start_soon(run_undo)
                await trio.sleep(0.2)  # the undo is in its thread, waiting for the holder
                assert ws.hold.held, "the undo does not hold changes off while it waits"
                try:
                    ws.create(walk(ws, "work"), b"skipped.txt", FILE, 0o644, 0, 0)
                except WorkspaceError as exc:
                    refused.append(exc.errno)
                n.start_soon(change)
            return result[0]

        gap, _, got = await while_the_writer_is_held(ws, both)
        assert gap < STALL
        assert got == [first]
        assert seen == [(first, b"one\n", False)], "the change went on before the tree was replaced"
        assert refused == [errno.EIO], "a change that skipped the wait was not refused"
        assert b"after.txt" in ws.children(walk(ws, "work"))
        assert b"skipped.txt" not in ws.children(walk(ws, "work"))
        assert content(ws, "work/doc.txt") == b"one\n"
        await ws.commit()
        assert ws.store.head(ws.branch) == ws.head != first  # committed on the undone tree

    trio.run(main)


def test_a_failed_head_move_leaves_the_tree_and_lets_changes_go_on(tmp_path: Path) -> None:
    """The head move fails in its thread (here: an undo past the first commit, refused by the
    plan; a full disk fails the transaction the same way): the tree is as before, the error is
    the same as before the change, and changes are no longer held off."""
    ws = new_ws(tmp_path / "root")

    async def main() -> None:
        await two_states(ws)
        head = ws.head
        with pytest.raises(Exception) as err:
            await ws.undo_commits(50)
        assert "first commit" in str(err.value)
        assert not ws.hold.held
        assert ws.head == ws.store.head(ws.branch) == head
        assert content(ws, "work/doc.txt") == b"two\n"
        await ws.before_change()  # returns at once
        ws.write(walk(ws, "work/doc.txt"), 0, b"six\n")
        await ws.commit()
        assert content(ws, "work/doc.txt") == b"six\n"

    trio.run(main)


@pytest.mark.trio
async def test_a_pass_during_an_undo_decides_on_the_undone_tree(tmp_path: Path) -> None:
    """A backing pass that gathers while an undo holds changes off waits before it decides,
    sees the tree was replaced, gathers again and takes disk's new file into the undone tree
    (it neither decides on the old tree, which the undo replaces, nor is refused)."""
    from helpers.backing import attached, close

    from memfs.backing.results import PassDone

    ws, b, disk = await attached(tmp_path, {"a.txt": "a\n"})
    try:
        before = ws.head
        ws.create(walk(ws, "work"), b"mine.txt", FILE, 0o644, 0, 0)
        await ws.commit()
        (disk / "b.txt").write_text("from disk\n")
        results: list[object] = []

        async def undo_then_pass() -> object:
            async with trio.open_nursery() as n:
                n.start_soon(ws.undo_commits, 1)
                while not ws.hold.held:
                    await trio.sleep(0.01)
                results.append(await b.run_pass("work"))
            return results[0]

        gap, _, _ = await while_the_writer_is_held(ws, undo_then_pass)
        assert gap < STALL
        done = results[0]
        assert isinstance(done, PassDone) and done.incomplete is None, done
        assert done.taken == ["b.txt"]
        kids = ws.children(walk(ws, "work"))
        assert b"mine.txt" not in kids and b"b.txt" in kids
        assert content(ws, "work/b.txt") == b"from disk\n"
        assert ws.store.commit(ws.head).parent == before  # the take-in, on the undone tree
    finally:
        close(ws, b)
