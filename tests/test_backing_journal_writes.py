"""A pass's journal writes are a handful whatever the number of files it adopts.

Each journal write is a transaction synced to disk, and patches the journal's remembered
snapshots (copies of maps with one entry a file of the mount). A pass that wrote each
adoption's intent and its completion as a transaction of its own made two synced
transactions and two map copies a file: 20,000 files edited on disk under a 100k-file bound
mount took over twelve minutes to take in, the daemon copying 100k-entry maps 40,000 times.
Intents are now begun for a batch and completed for a pass in one transaction each.

Driven on a real store and a real backing directory inside trio, with no FUSE (as
tests/helpers/backing.py); the journal's statements are counted with SQLite's own trace
hook on its connection.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.backing import attached, close

FILES = 300


@pytest.mark.trio
async def test_adopting_many_edits_takes_a_few_journal_transactions(tmp_path: Path):
    ws, b, disk = await attached(tmp_path, {f"f{i:03d}.txt": f"v1 {i}\n"
                                            for i in range(FILES)})
    try:
        await ws.commit()
        await b.run_pass("work")  # P recorded for every file
        for i in range(FILES):
            (disk / f"f{i:03d}.txt").write_text(f"v2 {i}, edited on disk\n")
        commits: list[str] = []
        b.journal._conn.set_trace_callback(
            lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
        res = await b.run_pass("work")
        b.journal._conn.set_trace_callback(None)
        assert len(res.taken) == FILES
        assert len(commits) <= 10, f"{len(commits)} journal transactions for {FILES} files"
        work = ws.children(ws.root)[b"work"]
        assert ws.read(ws.children(work)[b"f007.txt"], 0, 100) == b"v2 7, edited on disk\n"
        assert not b.journal.pending_intents("work")
        ev = b.journal.evidence("work", "f007.txt")
        assert ev is not None and ev.digest is not None
    finally:
        close(ws, b)
