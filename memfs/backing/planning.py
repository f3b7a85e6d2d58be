"""A pass's plans, remembered: plan_pass and plan_sync are pure, so inputs equal to the last
pass's over the same scope give that pass's plans.

Owns, on the trio loop: mount -> scope -> (the inputs, the pass plan, the sync plan) of the
last pass, at most PLANS_KEPT scopes per mount (on-access passes each have a scope of their
own; the whole mount's plans stay). An entry is good exactly while its inputs are equal:
they are compared by identity first (the journal, the store view and the walk hand out the
same objects while nothing changed) and by value otherwise. On a quiet tree, comparing them
costs a few ms where deciding 100k paths again cost 0.4 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memfs.reconcile.intent import IntentTable
from memfs.reconcile.observe import Observation
from memfs.reconcile.plan import PassPlan, SyncPlan, plan_pass, plan_sync
from memfs.reconcile.rule import Content, Pending, _Absent

PLANS_KEPT = 32  # scopes per mount whose last plans are kept


@dataclass
class PlanInputs:
    """Everything plan_pass and plan_sync read."""

    scope: str
    path_sync: bool
    branch: str
    branch_now: str
    obs: Observation
    view: Mapping[str, Content]
    evidence: Mapping[str, str | _Absent]
    table: IntentTable
    pending: Mapping[str, Pending]
    modes: Mapping[str, int]
    specials: Mapping[str, str]  # the walk's symlinks and special files (StoreFiles.specials)
    # The table's paths under the scope (BranchIntent.paths_under), or None: plan_pass reads
    # them from `table` then. Derived from it, and compared too (a scope's few paths).
    intent_paths: list[str] | None = None

    def same(self, other: PlanInputs) -> bool:
        return (self.scope == other.scope and self.path_sync == other.path_sync
                and self.branch == other.branch and self.branch_now == other.branch_now
                and (self.table is other.table or self.table == other.table)
                and self.pending == other.pending and self.obs.same_disk(other.obs)
                and (self.view is other.view or self.view == other.view)
                and (self.evidence is other.evidence or self.evidence == other.evidence)
                and (self.modes is other.modes or self.modes == other.modes)
                and self.specials == other.specials
                and _same_paths(self.intent_paths, other.intent_paths))


def _same_paths(a: list[str] | None, b: list[str] | None) -> bool:
    return a is b or (a is not None and b is not None and set(a) == set(b))


class Planner:
    def __init__(self) -> None:
        self.last: dict[str, dict[str, tuple[PlanInputs, PassPlan, SyncPlan]]] = {}

    def forget(self, mount: str) -> None:
        self.last.pop(mount, None)

    def forget_scope(self, mount: str, scope: str) -> None:
        """A scope's plans dropped: a pass that changed the tree under them (its next view
        differs, so they would not be reused) lets its decisions and the walk's records it
        holds go before the next walk, not after the next plan."""
        self.last.get(mount, {}).pop(scope, None)

    def plan(self, mount: str, given: PlanInputs) -> tuple[PassPlan, SyncPlan]:
        """plan_pass and plan_sync (which refuses a path sync when the branch it gathered on
        is not the one it was asked on, `branch_now`), or the last pass's when equal."""
        plans = self.last.setdefault(mount, {})
        last = plans.get(given.scope)
        if last is not None and last[0].same(given):
            # The newer inputs are kept (equal, so the same plans): the older ones' journal
            # snapshot goes (P over rows rewritten since: memfs.store.journal_snapshot).
            plans[given.scope] = (given, last[1], last[2])
            return last[1], last[2]
        plan = plan_pass(given.obs, given.view, given.evidence, given.table, given.pending,
                         branch=given.branch, modes=given.modes, specials=given.specials,
                         intent_paths=given.intent_paths)
        sp = plan_sync(plan, given.obs, given.view,
                       path=given.scope if given.path_sync else None,
                       branch_now=given.branch_now, specials=given.specials)
        if len(plans) >= PLANS_KEPT:
            for other in [k for k in plans if k]:
                del plans[other]
        plans[given.scope] = (given, plan, sp)
        return plan, sp


__all__ = ["PLANS_KEPT", "PlanInputs", "Planner"]
