"""The consolidation commit barrier: recheck, receipt first, one CAS per scope, recovery.

A review's proposal reaches memory only here, in this order, under the review lock:

1. final recheck — the frozen source Session (turn count and hash) and the target revisions
   (Workspace always, Global when the proposal addresses it). Any difference finishes the
   review as `source-changed` or `target-conflict`; memory is not touched.
2. plan — the one generation algorithm (`memfs.memory.preview`) gives each scope's planned
   after revision. Nothing to change → a `no-change` receipt and no swap.
3. a durable `committing` receipt: the intent, written before any memory write.
4. exactly one MemoryStore CAS per scope touched, Workspace first, then Global.
5. the receipt is marked `committed`.

Two scopes, one receipt: the store swaps Workspace and Global separately, so a crash can
fall between them. The receipt keeps before and planned-after for each scope, and recovery
judges each scope on its own (`classify`): at before → still to do, at planned-after → done,
anything else → someone else wrote it. It finishes forward (replays what is still to do)
only when no scope was overwritten by anyone else; otherwise it stops as `target-conflict`
and records what each scope holds. It never rolls a scope back and never writes over a
revision it did not plan.

The memory generation is the authority; the receipt is the intent and the audit summary.
Recovery never calls a model: the plan it replays is rebuilt from the worker Session and must
match the receipt's proposal hash and revisions exactly, or it is refused with nothing written.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from memfs.consolidate.lock import review_lock
from memfs.consolidate.proposal import Proposal, parse_proposal
from memfs.consolidate.receipts import (
    COMMITTED,
    COMMITTING,
    FINAL_STATES,
    NO_CHANGE,
    SCOPES,
    SOURCE_CHANGED,
    TARGET_CONFLICT,
    ChangeHash,
    Receipt,
    ReceiptError,
    ScopeRevisions,
    SourceSnapshot,
    check_review_id,
    now,
    read_receipt,
    remove_temp_files,
    scan_receipts,
    write_receipt,
)
from memfs.errors import MemfsError
from memfs.memory.durable import crash_point
from memfs.memory.errors import InvalidRecord, SessionError, StaleRevision
from memfs.memory.generation import content_hash
from memfs.memory.preview import (
    Change,
    GlobalPreview,
    Put,
    WorkspacePreview,
    preview_global_change,
    preview_workspace_changes,
)
from memfs.memory.records import normalize_global_content, normalize_record_content
from memfs.memory.sessions import FrozenSession, SessionStore, is_visible, turns_hash
from memfs.memory.shared import open_memory_store
from memfs.memory.shared_sessions import open_session_store
from memfs.memory.store import MemoryStore

DEFAULT_CONSOLIDATOR_VERSION = "memfs-consolidator/2"
GLOBAL_NAME = "global"  # the `name` of a replace-global change hash

# Named points, in commit order, where MEMFS_CRASH_AT kills the process (crash tests).
CRASH_POINTS = (
    "commit-before-receipt",
    "receipt-before-rename",
    "commit-after-receipt",
    "commit-between-scopes",
    "commit-after-swap",
    "commit-after-committed",
)


# --- What is committed -------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A validated proposal reduced to what the barrier needs: its hash and its changes.

    `workspace_changes` are canonical (name-sorted deletes, then name-sorted puts);
    `global_content` is the replace-global body, or None when Global is not addressed.
    """

    proposal_hash: str
    workspace_changes: tuple[Change, ...] = ()
    global_content: str | None = None

    @property
    def addresses_global(self) -> bool:
        return self.global_content is not None

    def change_hashes(self) -> tuple[ChangeHash, ...]:
        """(op, name, content hash) per change — identities only, never a body."""
        out = []
        for change in self.workspace_changes:
            if isinstance(change, Put):
                digest = content_hash(normalize_record_content(change.content))
                out.append(ChangeHash("put", change.name, digest))
            else:
                out.append(ChangeHash("delete", change.name, None))
        if self.global_content is not None:
            digest = content_hash(normalize_global_content(self.global_content))
            out.append(ChangeHash("replace-global", GLOBAL_NAME, digest))
        return tuple(out)


def plan_from_proposal(proposal: Proposal) -> Plan:
    """The plan of a parsed proposal (a `no-change` proposal plans nothing)."""
    return Plan(proposal.hash, tuple(proposal.workspace_changes), proposal.global_content)


@dataclass(frozen=True)
class Review:
    """One review ready to commit: what was frozen when it started, and its final plan.

    `workspace_revision` / `global_revision` are the target revisions frozen with the source;
    `global_revision` is required when the plan addresses Global.
    """

    review_id: str
    source: SourceSnapshot
    workspace: str
    workspace_revision: str
    plan: Plan
    worker_attempt: str
    global_revision: str | None = None
    consolidator_version: str = DEFAULT_CONSOLIDATOR_VERSION


def snapshot_of(frozen: FrozenSession) -> SourceSnapshot:
    """What a receipt keeps of a frozen session: its id, turn count and content hash."""
    return SourceSnapshot(frozen.id, frozen.turn_count, frozen.content_hash)


# --- The commit --------------------------------------------------------------------------


def commit_review(root: Path, review: Review, lock_timeout: float | None = 120.0) -> Receipt:
    """Run the barrier for `review`; return its receipt in a final state.

    Idempotent per review id: a finished receipt is returned as it is (if it is for the
    same proposal); a `committing` one left by a crash is recovered with this plan.
    Raises MemfsError only when nothing was written (bad input, a plan the generation
    algorithm refuses, a busy lock) or when recovery refuses the plan.
    """
    check_review_id(review.review_id)
    if review.plan.addresses_global and review.global_revision is None:
        raise MemfsError("the plan replaces Global but no frozen Global revision was given",
                         "freeze Global with the source and pass its revision")
    with review_lock(root, lock_timeout):
        existing = read_receipt(root, review.review_id)
        if existing is not None:
            if existing.proposal_hash != review.plan.proposal_hash:
                raise MemfsError(
                    f"review {review.review_id} already has a receipt for another proposal",
                    "start a new review; a review id names exactly one proposal",
                )
            if existing.state in FINAL_STATES:
                return existing
            result = _recover_locked(root, existing, review.plan)
            if result.action == Action.REFUSE_PLAN:
                raise MemfsError(f"review {review.review_id} is committing and its recovery "
                                 f"refused this plan: {result.detail}",
                                 "recover it with the plan its worker session holds")
            return result.receipt or existing
        return _commit_locked(root, review)


def _commit_locked(root: Path, review: Review) -> Receipt:
    memory = open_memory_store(root)
    plan = review.plan
    at = now()
    receipt = Receipt(
        review_id=review.review_id, state=COMMITTING, workspace=review.workspace,
        source=review.source, scopes={}, proposal_hash=plan.proposal_hash,
        changes=plan.change_hashes(), worker_attempt=review.worker_attempt,
        consolidator_version=str(review.consolidator_version), created_at=at, updated_at=at,
    )

    # 1. Final recheck: the source first (a changed source makes the target moot).
    observed_source = _current_source(root, review.source)
    if observed_source != review.source:
        seen = {"source.turn_count": str(observed_source.turn_count),
                "source.content_hash": observed_source.content_hash} if observed_source else {
                "source": "missing"}
        return _finish(root, receipt, SOURCE_CHANGED, "commit",
                       "the source session changed after it was frozen", seen)

    frozen = {"workspace": review.workspace_revision}
    ws_gen = memory.workspace_generation(review.workspace)
    current = {"workspace": ws_gen.revision}
    glob_gen = None
    if plan.addresses_global:
        glob_gen = memory.global_generation()
        frozen["global"] = str(review.global_revision)
        current["global"] = glob_gen.revision
    receipt = _with_scopes(receipt, {s: ScopeRevisions(frozen[s], None) for s in frozen})
    moved = sorted(s for s in frozen if current[s] != frozen[s])
    if moved:
        return _finish(root, receipt, TARGET_CONFLICT, "commit",
                       f"{' and '.join(moved)} memory changed after the review froze it",
                       {s: current[s] for s in moved})

    # 2. Plan with the one generation algorithm (raises InvalidRecord before any write).
    ws_preview = preview_workspace_changes(ws_gen, plan.workspace_changes)
    glob_preview = preview_global_change(glob_gen, plan.global_content) if glob_gen else None
    scopes = {"workspace": ScopeRevisions(ws_gen.revision, ws_preview.revision)}
    if glob_preview is not None:
        scopes["global"] = ScopeRevisions(glob_preview.before_revision, glob_preview.revision)
    receipt = _with_scopes(receipt, scopes)
    if not receipt.touched_scopes:
        return _finish(root, receipt, NO_CHANGE, "commit", "the proposal changes nothing")

    # 3. Receipt first: the durable intent precedes every memory write.
    crash_point("commit-before-receipt")
    receipt = receipt.finished(
        COMMITTING, "commit",  # read after a kill too: true whichever scopes were swapped
        "intent recorded; swapping memory (if no review is running, `memfs recover` finishes it)")
    write_receipt(root, receipt)
    crash_point("commit-after-receipt")

    # 4 and 5. One CAS per touched scope, then `committed`.
    return _apply(root, memory, receipt, {"workspace": ws_preview, "global": glob_preview},
                  receipt.touched_scopes, "commit")


def _apply(root: Path, memory: MemoryStore, receipt: Receipt,
           previews: Mapping[str, WorkspacePreview | GlobalPreview | None],
           todo: tuple[str, ...], by: str) -> Receipt:
    """Swap in each scope of `todo` (in SCOPES order) by one CAS from its before revision."""
    for i, scope in enumerate(todo):
        if i:
            crash_point("commit-between-scopes")
        rev = receipt.scopes[scope]
        preview = previews[scope]
        try:
            if scope == "workspace":
                assert isinstance(preview, WorkspacePreview)
                got = memory.commit_workspace(receipt.workspace, preview, rev.before)
            else:
                assert isinstance(preview, GlobalPreview)
                got = memory.commit_global(preview.content, rev.before)
        except StaleRevision:
            observed = _current_revisions(memory, receipt)
            done = [s for s in receipt.touched_scopes if observed[s] == receipt.scopes[s].planned_after]
            note = f"; {' and '.join(done)} already swapped in" if done else ""
            return _finish(root, receipt, TARGET_CONFLICT, by,
                           f"{scope} memory changed before its swap{note}", observed)
        if got != rev.planned_after:  # the store and the preview disagree: never hide it
            raise MemfsError(f"{scope} commit produced {got[:16]}, planned {rev.planned_after}",
                             "report this as a bug; the receipt stays `committing` for recovery")
    crash_point("commit-after-swap")
    final = _finish(root, receipt, COMMITTED, by, "swapped in")
    crash_point("commit-after-committed")
    return final


def _finish(root: Path, receipt: Receipt, state: str, by: str, detail: str,
            observed: dict[str, str] | None = None) -> Receipt:
    final = receipt.finished(state, by, detail, observed or {})
    write_receipt(root, final)
    return final


def _with_scopes(receipt: Receipt, scopes: dict[str, ScopeRevisions]) -> Receipt:
    return replace(receipt, scopes=scopes)


def _current_source(root: Path, source: SourceSnapshot) -> SourceSnapshot | None:
    try:
        frozen = open_session_store(root).freeze(source.session_id)
    except SessionError:
        return None
    return snapshot_of(frozen)


def _current_revisions(memory: MemoryStore, receipt: Receipt) -> dict[str, str]:
    out = {}
    if "workspace" in receipt.scopes:
        out["workspace"] = memory.workspace_generation(receipt.workspace).revision
    if "global" in receipt.scopes:
        out["global"] = memory.global_generation().revision
    return out


# --- Recovery: the decision (pure) -------------------------------------------------------


class ScopeStatus(enum.StrEnum):
    PENDING = "pending"  # still at its before revision
    APPLIED = "applied"  # at its planned-after revision
    FOREIGN = "foreign"  # at a revision this review did not plan


class Action(enum.StrEnum):
    NOTHING = "nothing"  # already final: return it as it is
    MARK_COMMITTED = "mark-committed"  # every touched scope is at planned-after
    REPLAY = "replay"  # CAS the pending scopes with the supplied plan
    TARGET_CONFLICT = "target-conflict"  # a scope holds a revision nobody planned here
    NEEDS_PLAN = "needs-plan"  # a replay is due but no plan was supplied: leave it
    REFUSE_PLAN = "refuse-plan"  # the supplied plan is not the receipt's: change nothing


@dataclass(frozen=True)
class PlanFacts:
    """What a supplied plan claims: its hash, change hashes, and per scope the revisions
    it produces when previewed from the *current* generation (None where it cannot)."""

    proposal_hash: str
    changes: tuple[ChangeHash, ...]
    scopes: Mapping[str, ScopeRevisions | None] = field(default_factory=dict)


@dataclass(frozen=True)
class RecoveryDecision:
    action: Action
    statuses: Mapping[str, ScopeStatus]
    replay: tuple[str, ...] = ()
    reason: str = ""


def classify(receipt: Receipt, current: Mapping[str, str | None]) -> dict[str, ScopeStatus]:
    """Each touched scope of the receipt judged against its current revision."""
    out = {}
    for scope in receipt.touched_scopes:
        rev, cur = receipt.scopes[scope], current.get(scope)
        out[scope] = (ScopeStatus.PENDING if cur == rev.before
                      else ScopeStatus.APPLIED if cur == rev.planned_after
                      else ScopeStatus.FOREIGN)
    return out


def decide_recovery(receipt: Receipt, current: Mapping[str, str | None],
                    plan: PlanFacts | None) -> RecoveryDecision:
    """What recovery does with one receipt. Pure: no disk, no clock, no model."""
    if receipt.state in FINAL_STATES:
        return RecoveryDecision(Action.NOTHING, {}, reason=f"already {receipt.state}")
    statuses = classify(receipt, current)
    if plan is not None:
        if plan.proposal_hash != receipt.proposal_hash:
            return RecoveryDecision(Action.REFUSE_PLAN, statuses,
                                    reason="the plan's proposal hash is not the receipt's")
        if tuple(plan.changes) != receipt.changes:
            return RecoveryDecision(Action.REFUSE_PLAN, statuses,
                                    reason="the plan's change hashes are not the receipt's")
    if not statuses:
        return RecoveryDecision(Action.TARGET_CONFLICT, statuses,
                                reason="the receipt plans no change; it cannot be committing")
    foreign = [s for s, st in statuses.items() if st is ScopeStatus.FOREIGN]
    if foreign:
        return RecoveryDecision(Action.TARGET_CONFLICT, statuses,
                                reason=f"{' and '.join(foreign)} holds a revision this review "
                                "did not plan; nothing is overwritten")
    pending = tuple(s for s in SCOPES if statuses.get(s) is ScopeStatus.PENDING)
    if not pending:
        return RecoveryDecision(Action.MARK_COMMITTED, statuses,
                                reason="every scope is at its planned revision")
    if plan is None:
        return RecoveryDecision(Action.NEEDS_PLAN, statuses, pending,
                                reason=f"{' and '.join(pending)} not swapped yet; replaying "
                                "needs the review's final plan from its worker session")
    for scope in pending:
        if plan.scopes.get(scope) != receipt.scopes[scope]:
            return RecoveryDecision(Action.REFUSE_PLAN, statuses,
                                    reason=f"the plan's {scope} revisions are not the receipt's")
    return RecoveryDecision(Action.REPLAY, statuses, pending,
                            reason=f"replaying {' and '.join(pending)} from the same plan")


# --- Recovery: the effects ---------------------------------------------------------------

PlanSource = Callable[[Receipt], Plan | None]


@dataclass(frozen=True)
class RecoveryOutcome:
    review_id: str
    action: str  # an Action value, or "plan-unavailable"
    state: str  # the receipt's state afterwards
    detail: str
    receipt: Receipt | None = None

    def to_json(self) -> dict:
        return {"review_id": self.review_id, "action": self.action, "state": self.state,
                "detail": self.detail}


@dataclass(frozen=True)
class RecoveryReport:
    outcomes: list[RecoveryOutcome]
    damaged: list[tuple[Path | str, str]]  # a receipt file or row that could not be read
    temp_files_removed: int

    @property
    def changed(self) -> bool:
        return bool(self.temp_files_removed) or any(
            o.action in (Action.MARK_COMMITTED, Action.REPLAY, Action.TARGET_CONFLICT)
            for o in self.outcomes)

    @property
    def unresolved(self) -> list[RecoveryOutcome]:
        return [o for o in self.outcomes if o.state == COMMITTING]

    def to_json(self) -> dict:
        return {
            "outcomes": [o.to_json() for o in self.outcomes],
            "damaged": [{"path": str(p), "error": why} for p, why in self.damaged],
            "temp_files_removed": self.temp_files_removed,
            "changed": self.changed,
            "unresolved": len(self.unresolved),
        }


def recover_receipts(root: Path, plan_for: PlanSource | None = None,
                     lock_timeout: float | None = 120.0) -> RecoveryReport:
    """Bring every `committing` receipt under `root` to its one right end (daemon start,
    `memfs recover`). Idempotent: a second run changes nothing. `plan_for` rebuilds a
    review's plan when a replay is due (default: from its worker session)."""
    source = plan_for if plan_for is not None else worker_plan_source(root)
    with review_lock(root, lock_timeout):
        scan = scan_receipts(root)
        remove_temp_files(root, scan.temp_files)
        outcomes = []
        for receipt in scan.receipts:
            try:
                outcomes.append(_recover_locked(root, receipt, None, source))
            except MemfsError as exc:  # e.g. a damaged generation: report it, go on
                outcomes.append(RecoveryOutcome(receipt.review_id, "error", receipt.state,
                                                str(exc), receipt))
    return RecoveryReport(outcomes, scan.damaged, len(scan.temp_files))


def recover_review(root: Path, review_id: str, plan: Plan | None,
                   lock_timeout: float | None = 120.0) -> RecoveryOutcome:
    """Recover one review with an explicitly supplied plan (checked whatever the case)."""
    with review_lock(root, lock_timeout):
        receipt = read_receipt(root, review_id)
        if receipt is None:
            raise ReceiptError(f"no receipt for review {review_id}", "list them with `memfs receipts`")
        return _recover_locked(root, receipt, plan)


def _recover_locked(root: Path, receipt: Receipt, plan: Plan | None,
                    source: PlanSource | None = None) -> RecoveryOutcome:
    def outcome(action: str, r: Receipt, detail: str) -> RecoveryOutcome:
        return RecoveryOutcome(receipt.review_id, str(action), r.state, detail, r)

    if receipt.state in FINAL_STATES:
        return outcome(Action.NOTHING, receipt, f"already {receipt.state}")
    memory = open_memory_store(root)
    current = _current_revisions(memory, receipt)
    statuses = classify(receipt, current)
    plan_note = ""
    if plan is None and source is not None and ScopeStatus.PENDING in statuses.values():
        try:
            plan = source(receipt)
        except (MemfsError, OSError) as exc:
            plan_note = f" ({exc})"
    facts, previews = _plan_facts(memory, receipt, plan) if plan else (None, {})
    decision = decide_recovery(receipt, current, facts)
    if decision.action is Action.NOTHING:
        return outcome(decision.action, receipt, decision.reason)
    if decision.action in (Action.NEEDS_PLAN, Action.REFUSE_PLAN):
        return outcome(decision.action, receipt, decision.reason + plan_note)
    if decision.action is Action.MARK_COMMITTED:
        done = _finish(root, receipt, COMMITTED, "recover", "found swapped in; marked committed",
                       current)
        return outcome(decision.action, done, decision.reason)
    if decision.action is Action.TARGET_CONFLICT:
        done = _finish(root, receipt, TARGET_CONFLICT, "recover", decision.reason, current)
        return outcome(decision.action, done, decision.reason)
    done = _apply(root, memory, receipt, previews, decision.replay, "recover")
    return outcome(decision.action if done.state == COMMITTED else Action.TARGET_CONFLICT,
                   done, done.detail if done.state != COMMITTED else decision.reason)


def _plan_facts(memory: MemoryStore, receipt: Receipt, plan: Plan
                ) -> tuple[PlanFacts, dict[str, WorkspacePreview | GlobalPreview | None]]:
    """Preview `plan` from the current generations, as the commit did from its before."""
    scopes: dict[str, ScopeRevisions | None] = {}
    previews: dict[str, WorkspacePreview | GlobalPreview | None] = {}
    try:
        wp = preview_workspace_changes(memory.workspace_generation(receipt.workspace),
                                       plan.workspace_changes)
        scopes["workspace"], previews["workspace"] = ScopeRevisions(wp.before_revision,
                                                                    wp.revision), wp
    except InvalidRecord:
        scopes["workspace"] = None
    if plan.addresses_global:
        try:
            gp = preview_global_change(memory.global_generation(), plan.global_content)
            scopes["global"], previews["global"] = ScopeRevisions(gp.before_revision,
                                                                  gp.revision), gp
        except InvalidRecord:
            scopes["global"] = None
    try:
        changes = plan.change_hashes()
    except InvalidRecord:
        changes = ()
    return PlanFacts(plan.proposal_hash, changes, scopes), previews


def worker_plan_source(root: Path) -> PlanSource:
    """Rebuild a review's plan from its worker session alone (never a model call).

    The final draft comes from the worker's `replay_final_proposal` and is parsed again with
    the closed parser against the receipt's frozen source prefix, so it hashes as it did.
    """

    def plan_for(receipt: Receipt) -> Plan | None:
        from memfs.consolidate.worker import load_worker_session, replay_final_proposal

        raw = replay_final_proposal(load_worker_session(root, receipt.worker_attempt))
        frozen = frozen_prefix(open_session_store(root), receipt.source)
        memory = open_memory_store(root)
        current = memory.workspace_generation(receipt.workspace)
        deleted = [c.name for c in receipt.changes if c.op == "delete"]
        if any(name not in current.records for name in deleted):
            # Workspace already swapped (only Global is left to replay): its deletes are
            # done, so stand-ins let the parser accept them; only the hash is compared.
            records = {**{n: "(deleted)\n" for n in deleted}, **current.records}
            current = replace(current, records=records)
        raw = {"changes": raw["changes"], "final": True}
        return plan_from_proposal(parse_proposal(raw, frozen, current))

    return plan_for


def frozen_prefix(sessions: SessionStore, source: SourceSnapshot) -> FrozenSession:
    """The source session exactly as the receipt froze it, even if turns were added since."""
    turns = sessions.turns(source.session_id)[: source.turn_count]
    if len(turns) != source.turn_count or turns_hash(turns) != source.content_hash:
        raise SessionError(f"session {source.session_id!r} no longer holds the frozen prefix",
                           "the review cannot be replayed; its receipt stays committing")
    return FrozenSession(source.session_id, source.turn_count, source.content_hash,
                         frozenset(t.index for t in turns if is_visible(t)),
                         sessions.workspace(source.session_id))
