"""Memory generations under the store's retention policy: the step of `memfs gc` (and the
daemon's automatic runs) that prunes them, and `memfs fsck`'s look at memory.

It lives here, beside the receipts, because what it keeps depends on them: every revision a
live (`committing`) receipt names, and what any receipt names for `keep-receipts` after it
was last written (memfs.memory.retention decides; memfs.memory.store or .shared prunes).

It holds the review lock across the read of the receipts and the prune, so a review cannot
write a receipt naming a generation the prune is about to drop: the committer holds the same
lock from its receipt to its last swap. A receipt that does not read (damaged) could name
anything: then nothing is pruned, and the run says why.

Threads: the caller's (a GC worker thread, or the CLI); it blocks on locks and the disk.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memfs.consolidate.lock import review_lock
from memfs.consolidate.receipts import COMMITTING, SCOPES, Receipt, scan_receipts
from memfs.memory.retention import GenRow, Naming, drop_reason, iso_ns, kept_generations
from memfs.memory.shared import open_memory_store
from memfs.store.retention import Policy

DRY_RUN_WAIT = 2.0  # seconds a dry run waits for the review lock


@dataclass
class MemoryGcReport:
    dry_run: bool
    generations: int = 0  # generations looked at, in every scope
    dropped: int = 0  # of those, dropped (or that would be, on a dry run)
    named_by_receipts: int = 0  # kept generations a receipt names
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def namings(receipts: list[Receipt]) -> dict[str | None, list[Naming]]:
    """scope (None: Global, else the workspace) -> what the receipts name in it."""
    out: dict[str | None, list[Naming]] = {}
    for r in receipts:
        at = iso_ns(r.updated_at)
        for scope in SCOPES:
            key = None if scope == "global" else r.workspace
            revs: set[str] = set()
            if scope in r.scopes:
                planned = r.scopes[scope]
                revs.add(planned.before)
                if planned.planned_after:
                    revs.add(planned.planned_after)
            if scope in r.observed:
                revs.add(r.observed[scope])
            out.setdefault(key, []).extend(
                Naming(rev, r.review_id, r.state == COMMITTING, at) for rev in sorted(revs))
    return out


def collect_memory(root: Path, policy: Policy, *, dry_run: bool = False,
                   now_ns: int | None = None) -> MemoryGcReport:
    """Prune every scope's generations to what `policy` and the receipts keep."""
    report = MemoryGcReport(dry_run)
    now = time.time_ns() if now_ns is None else now_ns
    store = open_memory_store(root)
    why = drop_reason(policy)
    # A dry run (`memfs du`, `gc --dry-run`) counts; it does not wait out a review committing
    # (up to the lock's 120 s): busy, it says so and the rest of the report stands.
    with review_lock(root, timeout=DRY_RUN_WAIT if dry_run else 120.0):
        scan = scan_receipts(root)
        if scan.damaged:
            report.problems.append(
                f"memory generations were not pruned: {len(scan.damaged)} receipt(s) do not "
                f"read ({scan.damaged[0][0]}: {scan.damaged[0][1]}), so what they name is "
                "unknown; `memfs receipts` lists them")
            return report
        try:
            named = namings(scan.receipts)
        except ValueError as exc:  # a receipt's time that does not parse
            report.problems.append(f"memory generations were not pruned: {exc}")
            return report
        for ws in [None, *store.workspaces()]:
            claims = named.get(ws, [])

            def keep(rows: list[GenRow], cur: int, claims: list[Naming] = claims
                     ) -> dict[int, str]:
                kept = kept_generations(rows, cur, claims, policy, now)
                report.generations += len(rows)
                report.named_by_receipts += sum(1 for w in kept.values()
                                                if w.startswith("receipt "))
                return kept

            report.dropped += len(store.prune(ws, keep, why, now, dry_run=dry_run))
    return report


def memory_fsck(root: Path) -> list[str]:
    """What `memfs fsck` finds wrong with the root's memory (its generations or rows)."""
    return open_memory_store(root).check()
