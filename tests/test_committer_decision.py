"""Recovery's decision as a pure function of (receipt, current revisions, supplied plan).

One named row per case, like a reconciler table: every state, every per-scope position
(before / planned-after / foreign / missing), with no plan, the right plan and wrong plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memfs.consolidate.committer import Action, PlanFacts, ScopeStatus, classify, decide_recovery
from memfs.consolidate.receipts import (
    STATES,
    ChangeHash,
    Receipt,
    ScopeRevisions,
    SourceSnapshot,
)

W0, W1, WX = "w-before", "w-planned", "w-foreign"
G0, G1, GX = "g-before", "g-planned", "g-foreign"
HASH = "proposal-hash"
CHANGES = (ChangeHash("put", "editor", "c1"),)
WS = ScopeRevisions(W0, W1)
GL = ScopeRevisions(G0, G1)


def receipt(state: str = "committing", ws: bool = True, glob: bool = False) -> Receipt:
    scopes = {}
    if ws:
        scopes["workspace"] = WS
    if glob:
        scopes["global"] = GL
    if not ws:
        scopes["workspace"] = ScopeRevisions(W0, W0)  # addressed, unchanged: not touched
    return Receipt(
        review_id="r1", state=state, workspace="work", source=SourceSnapshot("s", 2, "h"),
        scopes=scopes, proposal_hash=HASH, changes=CHANGES, worker_attempt="a",
        consolidator_version="v", created_at="t", updated_at="t",
    )


def plan(ws: ScopeRevisions | None = WS, glob: ScopeRevisions | None = None,
         h: str = HASH, changes: tuple[ChangeHash, ...] = CHANGES) -> PlanFacts:
    scopes = {"workspace": ws}
    if glob is not None:
        scopes["global"] = glob
    return PlanFacts(h, changes, scopes)


@dataclass(frozen=True)
class Row:
    name: str
    receipt: Receipt
    current: dict
    plan: PlanFacts | None
    action: Action
    replay: tuple[str, ...] = ()


ROWS = [
    # finished receipts return idempotently, whatever memory holds and whatever plan is given
    *[Row(f"{s}-is-final", receipt(s), {"workspace": WX}, plan(h="other"), Action.NOTHING)
      for s in STATES if s != "committing"],
    # one scope (Workspace)
    Row("ws-before-no-plan", receipt(), {"workspace": W0}, None, Action.NEEDS_PLAN, ("workspace",)),
    Row("ws-before-right-plan", receipt(), {"workspace": W0}, plan(), Action.REPLAY,
        ("workspace",)),
    Row("ws-before-wrong-hash", receipt(), {"workspace": W0}, plan(h="other"), Action.REFUSE_PLAN),
    Row("ws-before-wrong-changes", receipt(), {"workspace": W0},
        plan(changes=(ChangeHash("put", "editor", "c2"),)), Action.REFUSE_PLAN),
    Row("ws-before-wrong-planned", receipt(), {"workspace": W0},
        plan(ws=ScopeRevisions(W0, "w-other")), Action.REFUSE_PLAN),
    Row("ws-before-plan-cannot-preview", receipt(), {"workspace": W0}, plan(ws=None),
        Action.REFUSE_PLAN),
    Row("ws-planned-no-plan", receipt(), {"workspace": W1}, None, Action.MARK_COMMITTED),
    Row("ws-planned-right-plan", receipt(), {"workspace": W1},
        plan(ws=ScopeRevisions(W1, "w-again")), Action.MARK_COMMITTED),
    Row("ws-planned-wrong-hash", receipt(), {"workspace": W1}, plan(h="other"),
        Action.REFUSE_PLAN),
    Row("ws-foreign-no-plan", receipt(), {"workspace": WX}, None, Action.TARGET_CONFLICT),
    Row("ws-foreign-right-plan", receipt(), {"workspace": WX}, plan(ws=ScopeRevisions(WX, "y")),
        Action.TARGET_CONFLICT),
    Row("ws-foreign-wrong-hash", receipt(), {"workspace": WX}, plan(h="x"), Action.REFUSE_PLAN),
    Row("ws-missing", receipt(), {}, None, Action.TARGET_CONFLICT),
    # Global only (Workspace addressed but unchanged)
    Row("g-before-right-plan", receipt(ws=False, glob=True), {"workspace": W0, "global": G0},
        plan(ws=ScopeRevisions(W0, W0), glob=GL), Action.REPLAY, ("global",)),
    Row("g-planned", receipt(ws=False, glob=True), {"workspace": W0, "global": G1}, None,
        Action.MARK_COMMITTED),
    Row("g-foreign", receipt(ws=False, glob=True), {"workspace": W0, "global": GX}, None,
        Action.TARGET_CONFLICT),
    Row("g-only-ws-moved-is-not-a-conflict", receipt(ws=False, glob=True),
        {"workspace": WX, "global": G1}, None, Action.MARK_COMMITTED),
    # two scopes behind one receipt
    Row("both-before-right-plan", receipt(glob=True), {"workspace": W0, "global": G0},
        plan(glob=GL), Action.REPLAY, ("workspace", "global")),
    Row("both-before-no-plan", receipt(glob=True), {"workspace": W0, "global": G0}, None,
        Action.NEEDS_PLAN, ("workspace", "global")),
    Row("ws-done-g-pending-right-plan", receipt(glob=True), {"workspace": W1, "global": G0},
        plan(ws=ScopeRevisions(W1, "w-again"), glob=GL), Action.REPLAY, ("global",)),
    Row("ws-done-g-pending-no-plan", receipt(glob=True), {"workspace": W1, "global": G0}, None,
        Action.NEEDS_PLAN, ("global",)),
    Row("ws-done-g-pending-wrong-g", receipt(glob=True), {"workspace": W1, "global": G0},
        plan(glob=ScopeRevisions(G0, "g-other")), Action.REFUSE_PLAN),
    Row("both-planned", receipt(glob=True), {"workspace": W1, "global": G1}, None,
        Action.MARK_COMMITTED),
    Row("ws-done-g-foreign", receipt(glob=True), {"workspace": W1, "global": GX}, plan(glob=GL),
        Action.TARGET_CONFLICT),
    Row("ws-pending-g-foreign", receipt(glob=True), {"workspace": W0, "global": GX},
        plan(glob=GL), Action.TARGET_CONFLICT),
    Row("ws-foreign-g-done", receipt(glob=True), {"workspace": WX, "global": G1}, None,
        Action.TARGET_CONFLICT),
    # a committing receipt that plans nothing is not a state the committer writes
    Row("committing-without-change", receipt(ws=False), {"workspace": W0}, None,
        Action.TARGET_CONFLICT),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_recovery_decision_table(row: Row) -> None:
    decision = decide_recovery(row.receipt, row.current, row.plan)
    assert decision.action is row.action, decision.reason
    assert decision.reason
    if row.action in (Action.REPLAY, Action.NEEDS_PLAN):
        assert decision.replay == row.replay


def test_row_names_are_unique() -> None:
    assert len({r.name for r in ROWS}) == len(ROWS)


def test_classify_judges_each_scope_on_its_own() -> None:
    r = receipt(glob=True)
    assert classify(r, {"workspace": W1, "global": G0}) == {
        "workspace": ScopeStatus.APPLIED, "global": ScopeStatus.PENDING}
    assert classify(r, {"workspace": WX}) == {
        "workspace": ScopeStatus.FOREIGN, "global": ScopeStatus.FOREIGN}
    assert classify(receipt(ws=False), {"workspace": WX}) == {}


def test_decision_is_deterministic() -> None:
    for row in ROWS:
        assert decide_recovery(row.receipt, row.current, row.plan) == decide_recovery(
            row.receipt, dict(row.current), row.plan)
