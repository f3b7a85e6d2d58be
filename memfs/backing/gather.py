"""A pass's worker-thread step: read the journal's snapshot, observe disk, hash store refs.

Pure of shared state: everything it needs is passed in and everything it learns is returned
(`Gathered`), and the loop stores it (the fingerprints on-access's fast path compares with,
the store refs' digests, the converted evidence). The only object it shares with the loop is
the mount's `WalkMemo`, which only the walk reads and writes, and a mount's passes run one at
a time (the mount's lock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from memfs.backing.binding import Binding
from memfs.backing.storeview import ChunkReader, RefKey, hash_refs
from memfs.reconcile.contained import RootId, ctime_trusted
from memfs.reconcile.observe import FileFact, Observation, WalkMemo, observe
from memfs.reconcile.rule import ABSENT, _Absent
from memfs.store.journal import Intent, Journal
from memfs.store.journal_snapshot import same_values

Evidence = dict[str, "str | _Absent"]


@dataclass(frozen=True)
class Seen:
    """When and how a pass looked: on-access trusts its fingerprints only on a ctime-keeping
    filesystem, on the root's device, for files older than the racy window before `at_ns`."""

    at_ns: int
    trusted: bool
    dev: int


@dataclass(frozen=True)
class EvidenceMemo:
    """P converted for the rule, with the journal rows it was converted from (the journal
    hands out the same read-only rows while it is unchanged, so identity says "the same")."""

    rows: Mapping[str, str | None]
    evidence: Evidence


@dataclass(frozen=True)
class Gathered:
    obs: Observation
    evidence: Evidence
    evidence_memo: EvidenceMemo
    pending: list[Intent]
    modes: Mapping[str, int]
    digests: dict[RefKey, str]  # store refs hashed here
    seen: Seen

    @property
    def files(self) -> Mapping[str, FileFact]:
        return self.obs.files


def convert_evidence(rows: Mapping[str, str | None], *known: EvidenceMemo | None,
                     share_alike: bool = False) -> EvidenceMemo:
    """P as the rule reads it (agreed absence as ABSENT), converted once per journal snapshot:
    a `known` conversion of these very rows (its caller's last, another owner's) is taken as
    it is, so owners reading one snapshot share one converted map, not a copy per file each.
    Rows with no agreed absence need no conversion: they are the map (a dict a file less).

    Rows made to hold the same values as a known conversion's (P over new fingerprint rows:
    memfs.store.journal_snapshot) reuse its converted map, over these rows, so the older rows
    go; with `share_alike` (a reader beside the passes, status) the known conversion itself."""
    for last in known:
        if last is not None and last.rows is rows:
            return last
    for last in known:
        if last is not None and same_values(last.rows, rows):
            if share_alike:
                return last
            return EvidenceMemo(rows, rows if last.evidence is last.rows  # type: ignore[arg-type]
                                else last.evidence)
    if None not in rows.values():  # no agreed absence (nearly always): the rows as they are
        return EvidenceMemo(rows, rows)  # type: ignore[arg-type]
    return EvidenceMemo(rows, {p: (ABSENT if d is None else d) for p, d in rows.items()})


def gather(journal: Journal, store: ChunkReader, b: Binding, scope: str,
           tracked_nodes: Collection[str], refs: list[RefKey], memo: WalkMemo,
           last_evidence: EvidenceMemo | None,
           on_walked: Callable[[int], None] | None = None) -> Gathered:
    """One snapshot of the journal; fingerprints of the scope only. Worker thread.
    `on_walked` counts the walk's entries (memfs.backing.progress)."""
    got = journal.pass_inputs(b.mount, scope)
    expected = RootId(*got.root) if got.root else None
    ev = convert_evidence(got.evidence, last_evidence)
    evidence = ev.evidence
    seen_at = time.time_ns()
    # Tracked: what needs a comparison (a store file, or P a digest). A disk-only file's P is
    # agreed absence: it is classified by its head alone, never hashed (a 4 GiB file was read
    # whole at every listing after the first).
    obs = observe(b.dir, expected_root=expected, scope=scope, cache=got.fingerprints,
                  tracked=lambda p: p in tracked_nodes or isinstance(evidence.get(p), str),
                  max_file_size=b.max_file_size, ignore=b.ignore,
                  follow_symlinks=b.follow_symlinks, memo=memo, on_walked=on_walked)
    seen = Seen(seen_at, ctime_trusted(b.dir), obs.root.dev)
    return Gathered(obs, evidence, ev, got.pending, got.modes, hash_refs(store, refs), seen)


__all__ = ["EvidenceMemo", "Gathered", "Seen", "convert_evidence", "gather"]
