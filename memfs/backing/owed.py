"""What disk owes each mount (`backing.<mount>.owed` in status), by the evidence alone.

plan.count_owed over the live tree's digests, the journal's evidence, the branch intent and the
pending write-ahead intents. No disk is read, so it answers while a root is unavailable; a
draft whose write failed or was refused is still a draft, so it still counts. A change no
materialize carries is counted apart, `not_carried`: one to a hard-linked file (made in the
mount: `cp -a`, `tar -x`), and a symlink, FIFO, socket or device made in the mount (with the
workspace deletion of disk's file there, as `ln -sf` over a synced file leaves: materialize
keeps disk's file while the link stands). Counted as owed, each kept "disk owes" above 0 for
good. The paths come from the walk the count already asks for (StoreView.not_carried).

Status renders the last counts (`last`); it never computes them, because status is read by
every `stat` of `.memfs/status`. `refresh()` recounts: on the loop it takes the store view
(remembered while the tree does not move; a draft is hashed once per `ver`) and the branch
intent; in a worker thread it reads the journal's snapshot (its lock may be held across a
pass's fsync) and counts. It runs after every pass and materialize, and before status is
answered (the control socket's `status`, the open of `.memfs/status`), so a draft written a
moment ago is counted. Owns `last` and the evidence conversion it counted from, on the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import trio

from memfs.backing.gather import EvidenceMemo, convert_evidence
from memfs.backing.intent import BranchIntent
from memfs.backing.storeview import StoreView
from memfs.errors import MemfsError
from memfs.reconcile.intent import IntentTable
from memfs.reconcile.plan import count_owed, pending_from_journal
from memfs.reconcile.rule import Content
from memfs.store.journal import Journal


@dataclass(frozen=True)
class Owed:
    changes: int
    workspace_deletions: int
    conflicts: int
    not_carried: int = 0  # changes no materialize carries (a hard or symbolic link, a FIFO)

    def to_json(self) -> dict[str, int]:
        return {"changes": self.changes, "workspace_deletions": self.workspace_deletions,
                "conflicts": self.conflicts}


def _count(journal: Journal, mount: str, s_view: Mapping[str, Content], table: IntentTable,
           branch: str, last: EvidenceMemo | None,
           passes: EvidenceMemo | None, uncarried: frozenset[str]) -> tuple[Owed, EvidenceMemo]:
    """Worker thread: the journal's snapshot (remembered while unchanged) and the count; P
    converted as this counter or the last whole pass last converted it, if the same rows.
    `uncarried`: the paths whose changes no materialize carries (not owed)."""
    got = journal.pass_inputs(mount)
    ev = convert_evidence(got.evidence, passes, last, share_alike=True)
    c = count_owed(s_view, ev.evidence, table, pending_from_journal(got.pending, branch),
                   got.modes, uncarried)
    return Owed(c.pending_changes, c.pending_workspace_deletions, c.conflicts,
                c.not_carried), ev


class OwedCounter:
    def __init__(self, branch: Callable[[], str], journal: Journal, view: StoreView,
                 intent: BranchIntent,
                 pass_evidence: Callable[[str], EvidenceMemo | None] = lambda mount: None,
                 ) -> None:
        self._branch = branch
        self._pass_evidence = pass_evidence  # a mount's last whole pass's converted P
        self.journal = journal
        self.view = view
        self.intent = intent
        self.last: dict[str, Owed] = {}
        self._evidence: dict[str, EvidenceMemo] = {}
        # Counts made from an older view never replace newer ones: two refreshes may
        # overlap (a status request and an open of .memfs/status).
        self._asked = 0
        self._stored: dict[str, int] = {}

    def forget(self, mount: str) -> None:
        self.last.pop(mount, None)
        self._evidence.pop(mount, None)
        self._stored.pop(mount, None)

    async def refresh(self, mounts: Iterable[str]) -> None:
        """Recount these mounts (see the module docstring); a journal that refuses leaves
        the last counts (status then says the journal refuses, and shows no counts)."""
        for mount in list(mounts):
            await self.count(mount)

    async def count(self, mount: str) -> Owed | None:
        self._asked += 1
        asked = self._asked
        nodes, _ = self.view.nodes(mount)
        s_view = self.view.view(nodes)
        try:
            owed, ev = await trio.to_thread.run_sync(
                _count, self.journal, mount, s_view, self.intent.table(mount), self._branch(),
                self._evidence.get(mount), self._pass_evidence(mount),
                self.view.not_carried(nodes))
        except MemfsError:
            return self.last.get(mount)
        if self._stored.get(mount, 0) < asked:
            self._stored[mount] = asked
            self._evidence[mount] = ev
            self.last[mount] = owed
        return self.last[mount]


__all__ = ["Owed", "OwedCounter"]
