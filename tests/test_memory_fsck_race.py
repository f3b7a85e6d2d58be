"""Review: `memfs fsck` of memory beside a running prune (the daemon's automatic gc).

MemoryStore.check reads every generation without the store's lock, and a generation the
prune renames to .rm-<gen> between check's listing and its read is reported as damage.
"""

from __future__ import annotations

import threading
from pathlib import Path

from test_memory_retention import LATER, versions

from memfs.consolidate.memory_retention import collect_memory, memory_fsck
from memfs.store.retention import Policy


def test_fsck_beside_a_prune_reports_no_damage(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    versions(root, 400)
    assert memory_fsck(root) == []
    done = threading.Event()
    pruned = []

    def prune() -> None:
        try:
            pruned.append(collect_memory(root, Policy(), now_ns=LATER))
        finally:
            done.set()

    t = threading.Thread(target=prune)
    t.start()
    seen: list[str] = []
    while not done.is_set():
        seen += memory_fsck(root)
    t.join()
    assert pruned and pruned[0].dropped > 300
    assert memory_fsck(root) == []
    assert seen == [], f"fsck beside a prune reported {len(seen)} problem(s): {seen[:3]}"
