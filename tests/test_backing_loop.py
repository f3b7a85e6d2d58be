"""The trio loop never waits for a lock another thread may hold across I/O (docs/architecture.md,
"What the trio loop may wait for"): the backing journal's lock (held across each write's
fsync by a pass's thread), the store's writer lock (held across a group commit's fdatasync)
and the memory store's flock (held by a review's commit).

Each test holds the lock from another thread for HOLD seconds and checks that a ticker task on
the loop kept running meanwhile: with the loop blocked it would stall for the whole hold.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest
import trio
from helpers.backing import attached, close, held_by_another_thread

from memfs.backing import Binding

HOLD = 1.5
STALL = 0.5  # the longest gap a free loop shows under the shared machine's load


class Ticker:
    """Records the longest gap between its ticks while it runs."""

    def __init__(self) -> None:
        self.gap = 0.0

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        last = time.monotonic()
        while True:
            await trio.sleep(0.01)
            now = time.monotonic()
            self.gap = max(self.gap, now - last)
            last = now


async def _with_ticker(fn) -> Ticker:  # noqa: ANN001
    ticker = Ticker()
    async with trio.open_nursery() as nursery:
        await nursery.start(ticker.run)
        await fn()
        nursery.cancel_scope.cancel()
    return ticker


@pytest.mark.trio
async def test_status_renders_without_the_journal(tmp_path: Path):
    """`.memfs/status` is rendered at every stat: it used to count what disk owes there,
    reading the journal on the loop (and hashing drafts). Now it renders the last count, and
    the count is refreshed in a worker thread before status is answered."""
    ws, b, disk = await attached(tmp_path, {"a.txt": "a\n"})
    try:
        work = ws.children(ws.root)[b"work"]
        ws.write(ws.children(work)[b"a.txt"], 0, b"draft\n")
        await b.refresh_status()
        assert b.status_json()["work"]["owed"]["changes"] == 1  # type: ignore[index]
        with held_by_another_thread(b.journal._lock, HOLD):
            t0 = time.monotonic()
            st = b.status_json()
            assert time.monotonic() - t0 < STALL
            assert st["work"]["owed"]["changes"] == 1  # type: ignore[index]
            ticker = await _with_ticker(b.refresh_status)
        assert ticker.gap < STALL, f"the loop stalled {ticker.gap:.2f} s"
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_a_disk_only_read_does_not_wait_for_the_journal(tmp_path: Path):
    """A FUSE read of a disk-only file asked the journal for the recorded root, on the loop,
    waiting for any pass's journal write."""
    ws, b, disk = await attached(tmp_path, {}, max_file_size=0)
    try:
        (disk / "big.bin").write_bytes(b"disk only\n")
        await b.run_pass("work")
        node = ws.children(ws.children(ws.root)[b"work"])[b"big.bin"]
        assert node.id in ws.disk_only
        got: list[bytes] = []

        async def read() -> None:
            got.append(await b.read_disk(node, 0, 100))

        with held_by_another_thread(b.journal._lock, HOLD):
            t0 = time.monotonic()
            ticker = await _with_ticker(read)
            took = time.monotonic() - t0
        assert got == [b"disk only\n"]
        assert ticker.gap < STALL and took < HOLD, f"waited {took:.2f} s"
    finally:
        close(ws, b)


@pytest.mark.trio
async def test_attach_and_detach_write_the_binding_off_the_loop(tmp_path: Path):
    """attach and detach wrote the binding through the store's writer lock on the loop,
    which a group commit holds across fdatasync."""
    ws, b, disk = await attached(tmp_path, {"a.txt": "a\n"})
    other = tmp_path / "other"
    other.mkdir()
    try:
        with held_by_another_thread(b.store._write_lock, HOLD):
            ticker = await _with_ticker(lambda: b.attach(Binding("notes", str(other))))
        assert ticker.gap < STALL, f"attach stalled the loop {ticker.gap:.2f} s"
        assert "notes" in b.bindings and "notes" in ws.store.bindings()
        with held_by_another_thread(b.store._write_lock, HOLD):
            ticker = await _with_ticker(lambda: b.detach("notes"))
        assert ticker.gap < STALL, f"detach stalled the loop {ticker.gap:.2f} s"
        assert "notes" not in ws.store.bindings()
    finally:
        close(ws, b)


def test_memory_reads_do_not_wait_for_a_commit(tmp_path: Path):
    """The FUSE layer's getattr of a `.memfs/memory` file reads the current generation under
    flock(LOCK_SH); a review committing holds LOCK_EX across its fsyncs, so every stat of a
    memory file waited for it, on the loop. While a commit holds the lock the read takes the
    generation the link names (complete and fsynced) without it."""
    from memfs.memory.store import MemoryStore

    store = MemoryStore(tmp_path / "memory")
    store.put_record("work", "notes", "first\n")
    fd = os.open(tmp_path / "memory" / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a commit in progress (another open file: conflicts)
    got: list[str] = []
    try:
        t = threading.Thread(target=lambda: got.append(store.read_record("work", "notes")))
        t.start()
        t.join(timeout=HOLD)
        assert not t.is_alive(), "the read waited for the commit's lock"
    finally:
        os.close(fd)
        t.join()
    assert got == ["first\n"]
