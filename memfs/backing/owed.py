"""What disk owes each mount (`backing.<mount>.owed` in status), by the evidence alone.

plan.count_owed over the live tree's digests, the journal's evidence, the branch intent and the
pending write-ahead intents. No disk is read, so it answers while a root is unavailable; a
draft whose write failed or was refused is still a draft, so it still counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfs.backing.gather import EvidenceMemo, convert_evidence
from memfs.backing.intent import BranchIntent
from memfs.backing.storeview import StoreView
from memfs.reconcile.plan import count_owed, pending_from_journal
from memfs.store.journal import Journal


@dataclass(frozen=True)
class Owed:
    changes: int
    workspace_deletions: int
    conflicts: int

    def to_json(self) -> dict[str, int]:
        return {"changes": self.changes, "workspace_deletions": self.workspace_deletions,
                "conflicts": self.conflicts}


class OwedCounter:
    def __init__(self, ws_branch, journal: Journal, view: StoreView,  # noqa: ANN001
                 intent: BranchIntent) -> None:
        self._branch = ws_branch
        self.journal = journal
        self.view = view
        self.intent = intent
        self._evidence: dict[str, EvidenceMemo] = {}

    def count(self, mount: str) -> Owed:
        nodes, _ = self.view.nodes(mount)
        s_view = self.view.view(nodes)
        got = self.journal.pass_inputs(mount)  # remembered while the journal is unchanged
        ev = self._evidence[mount] = convert_evidence(got.evidence, self._evidence.get(mount))
        pending = pending_from_journal(got.pending, self._branch())
        c = count_owed(s_view, ev.evidence, self.intent.table(mount), pending, got.modes)
        return Owed(c.pending_changes, c.pending_workspace_deletions, c.conflicts)


__all__ = ["Owed", "OwedCounter"]
