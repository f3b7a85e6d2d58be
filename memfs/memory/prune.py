"""Pruning memory generations the retention policy no longer keeps, crash-safely.

A pruned generation's tombstone goes to `generations/<scope>/.dropped/` (synced) before its
directory is renamed to `.rm-<gen>` (synced) and removed, so a prune killed at any point
leaves every kept generation whole and every dropped one either whole or hidden (the next
writer removes what is hidden). Runs in the caller's thread (memfs gc's), under the memory
root's exclusive lock, so no commit moves a scope's link meanwhile.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from memfs.memory.durable import crash_point
from memfs.memory.generation import canonical_json
from memfs.memory.retention import Dropped, GenRow, now_iso

if TYPE_CHECKING:
    from memfs.memory.store import MemoryStore

DROPPED_DIR = ".dropped"  # a scope's tombstones (memfs.memory.retention.Dropped)
HIDDEN = ".rm-"  # a pruned generation on its way out: never read, removed by the next writer
# Named points of a prune, in order, for SIGKILL tests (MEMFS_CRASH_AT).
PRUNE_CRASH_POINTS = ("prune-tombstoned", "prune-hidden", "pruned")


def prune(store: MemoryStore, ws: str | None,
          keep: Callable[[Sequence[GenRow], int], dict[int, str]],
          why: str, now_ns: int, dry_run: bool = False) -> list[Dropped]:
    """Drop the scope's generations `keep(rows, current_seq)` does not name (never the
    current one); returns their tombstones."""
    link, gens, is_global = store._scope(ws)
    if not store.root.is_dir():
        return []
    with store._writing():
        current = store._current_gen_name(link, is_global)
        if current is None:
            return []
        cur_seq = int(current[:8])
        if not dry_run:  # what a prune killed after hiding them left behind
            for entry in os.listdir(gens):
                if entry.startswith(HIDDEN):
                    store.ops.remove_tree(gens / entry)
        rows = store._rows(gens, cur_seq)
        kept = keep([r for _, r in rows], cur_seq)
        at = now_iso(now_ns)
        drop = [(name, Dropped(r.seq, r.revision, r.created, at, why))
                for name, r in rows if r.seq not in kept and r.seq != cur_seq]
        if dry_run or not drop:
            return [d for _, d in drop]
        _write_tombstones(store, gens, cur_seq, [d for _, d in drop])
        crash_point("prune-tombstoned")
        for name, _ in drop:
            store.ops.rename(gens / name, gens / f"{HIDDEN}{name}")
        store.ops.fsync_dir(gens)
        crash_point("prune-hidden")
        for name, _ in drop:
            store.ops.remove_tree(gens / f"{HIDDEN}{name}")
        crash_point("pruned")
        return [d for _, d in drop]


def _write_tombstones(store: MemoryStore, gens: Path, cur_seq: int,
                      dropped: list[Dropped]) -> None:
    """One synced file per prune, named in a synced directory, before anything goes."""
    d = gens / DROPPED_DIR
    if not d.is_dir():
        store.ops.mkdir(d)
        store.ops.fsync_dir(gens)
    tmp = d / f".tmp-{secrets.token_hex(6)}"
    store.ops.write_file(tmp, canonical_json([x.to_json() for x in dropped]))
    store.ops.rename(tmp, d / f"{cur_seq:08d}-{secrets.token_hex(6)}.json")
    store.ops.fsync_dir(d)
