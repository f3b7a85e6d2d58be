"""The three-way rule: seed 002's cases as a table, then properties over the whole input space."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.reconcile.rule import (
    ABSENT,
    NO_EVIDENCE,
    NO_INTENT,
    Action,
    Conflict,
    ConflictKind,
    Content,
    Detail,
    DiskUnknown,
    PathIntent,
    Pending,
    State,
    decide,
)

A, B, C = "a" * 32, "b" * 32, "c" * 32
TA, TB, TC = Content(A), Content(B), Content(C)
PNG = Content("f" * 32, "binary")
BIG = Content(None, "oversize")
TOMB = PathIntent(tombstone=True)
ORIGIN = PathIntent(origin_store=True)
LINK = DiskUnknown("symlink (following is off)", link=True)

# (name, D, S, P, intent, action, state, detail-or-conflict-kind, record)
CASES = [
    # D = S: agreement, P := D
    ("agree, P unknown", TA, TA, NO_EVIDENCE, NO_INTENT, Action.AGREE, State.SYNCED, None, A),
    ("agree, P stale", TA, TA, B, NO_INTENT, Action.AGREE, State.SYNCED, None, A),
    ("agree, P current", TA, TA, A, NO_INTENT, Action.AGREE, State.SYNCED, None, None),
    ("agreed binary kept", PNG, PNG, PNG.digest, NO_INTENT, Action.AGREE, State.SYNCED, None, None),
    ("both absent after a file", ABSENT, ABSENT, A, NO_INTENT, Action.AGREE, None, None, ABSENT),
    ("both absent, nothing known", ABSENT, ABSENT, NO_EVIDENCE, NO_INTENT, Action.NOTHING, None,
     None, None),
    ("deletion applied on disk", ABSENT, ABSENT, A, TOMB, Action.AGREE, None, None, ABSENT),
    # P known, D = P != S: only the store changed
    ("draft kept", TA, TB, A, NO_INTENT, Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT,
     None),
    ("new workspace file after agreed absence", ABSENT, TB, ABSENT, NO_INTENT, Action.KEEP_STORE,
     State.WORKSPACE_DRAFT, Detail.DRAFT, None),
    ("workspace deletion kept", TA, ABSENT, A, TOMB, Action.KEEP_STORE, State.WORKSPACE_DELETED,
     Detail.WORKSPACE_DELETION, None),
    ("not in this branch", TA, ABSENT, A, NO_INTENT, Action.KEEP_STORE, State.NOT_IN_BRANCH,
     Detail.NOT_IN_BRANCH, None),
    # P known, S = P != D: only disk changed
    ("shell edit ingested", TB, TA, A, NO_INTENT, Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, B),
    ("shell rm removes the entry", ABSENT, TA, A, NO_INTENT, Action.ADOPT_DISK, None,
     Detail.REMOVE, ABSENT),
    ("binary over text: disk-only", PNG, TA, A, NO_INTENT, Action.ADOPT_DISK, State.DISK_ONLY,
     Detail.DISK_ONLY, ABSENT),
    ("new file after an agreed deletion", TB, ABSENT, ABSENT, TOMB, Action.ADOPT_DISK,
     State.SYNCED, Detail.INGEST, B),
    ("disk-only stays disk-only", PNG, ABSENT, ABSENT, NO_INTENT, Action.ADOPT_DISK,
     State.DISK_ONLY, Detail.DISK_ONLY, None),
    # P known, all differ: conflict
    ("both changed", TB, TC, A, NO_INTENT, Action.CONFLICT, State.CONFLICT,
     ConflictKind.BOTH_CHANGED, None),
    ("draft plus shell rm", ABSENT, TC, A, NO_INTENT, Action.CONFLICT, State.CONFLICT,
     ConflictKind.DELETED_ON_DISK, None),
    ("workspace rm plus shell edit", TB, ABSENT, A, TOMB, Action.CONFLICT, State.CONFLICT,
     ConflictKind.DELETED_IN_WORKSPACE, None),
    ("binary written over a draft", PNG, TC, A, NO_INTENT, Action.CONFLICT, State.CONFLICT,
     ConflictKind.BOTH_CHANGED, None),
    # P unknown: tombstone, then origin, then legacy mismatch, else new disk file
    ("tombstone never resurrects", TA, ABSENT, NO_EVIDENCE, TOMB, Action.KEEP_STORE,
     State.WORKSPACE_DELETED, Detail.WORKSPACE_DELETION, None),
    ("store origin, not yet on disk", ABSENT, TA, NO_EVIDENCE, ORIGIN, Action.KEEP_STORE,
     State.WORKSPACE_DRAFT, Detail.DRAFT, None),
    ("store origin collides", TB, TA, NO_EVIDENCE, ORIGIN, Action.CONFLICT, State.CONFLICT,
     ConflictKind.STORE_ORIGIN_COLLISION, None),
    ("legacy mismatch (field report)", TB, TA, NO_EVIDENCE, NO_INTENT, Action.CONFLICT,
     State.CONFLICT, ConflictKind.UNKNOWN_PROVENANCE, None),
    ("legacy entry disk lacks", ABSENT, TA, NO_EVIDENCE, NO_INTENT, Action.KEEP_STORE,
     State.DISK_MISSING_PROVENANCE_UNKNOWN, Detail.PROVENANCE_UNKNOWN, None),
    ("new text file ingested", TA, ABSENT, NO_EVIDENCE, NO_INTENT, Action.ADOPT_DISK,
     State.SYNCED, Detail.INGEST, A),
    ("new PNG listed disk-only", PNG, ABSENT, NO_EVIDENCE, NO_INTENT, Action.ADOPT_DISK,
     State.DISK_ONLY, Detail.DISK_ONLY, ABSENT),
    ("untracked oversize, head only", BIG, ABSENT, NO_EVIDENCE, NO_INTENT, Action.ADOPT_DISK,
     State.DISK_ONLY, Detail.DISK_ONLY, ABSENT),
    # unknown disk, damaged intent
    ("unreadable disk", DiskUnknown("unreadable"), TA, A, NO_INTENT, Action.UNVERIFIED,
     State.UNVERIFIED, None, None),
    ("damaged intent is unverified, never absent", TA, ABSENT, A, PathIntent(damaged=True),
     Action.UNVERIFIED, State.UNVERIFIED, None, None),
    # a disk symlink (never taken, written or removed) where the workspace made and removed
    # a file: nothing owed, not unverified forever; a file there still is unverified
    ("disk symlink, file made and removed in the workspace", LINK, ABSENT, NO_EVIDENCE, TOMB,
     Action.NOTHING, None, None, None),
    ("disk symlink, P absent, tombstone", LINK, ABSENT, ABSENT, TOMB, Action.NOTHING, None,
     None, None),
    ("disk symlink over a file disk agreed on, deleted in the workspace", LINK, ABSENT, A, TOMB,
     Action.UNVERIFIED, State.UNVERIFIED, None, None),
    ("disk symlink where the workspace has a file", LINK, TA, NO_EVIDENCE, ORIGIN,
     Action.UNVERIFIED, State.UNVERIFIED, None, None),
]


@pytest.mark.parametrize(
    "name,d,s,p,intent,action,state,sub,record", CASES, ids=[c[0] for c in CASES]
)
def test_rule_table(name, d, s, p, intent, action, state, sub, record):
    dec = decide(d, s, p, intent)
    assert dec.action == action, dec
    assert dec.state == state, dec
    if isinstance(sub, ConflictKind):
        assert dec.conflict == sub
        assert dec.record_conflict is not None and dec.record_conflict.kind == sub
    elif sub is not None:
        assert dec.detail == sub
    assert dec.record == record


def test_owed_and_requirements():
    assert decide(TA, TB, A).owes == "write" and not decide(TA, TB, A).requires
    dele = decide(TA, ABSENT, A, TOMB)
    assert dele.owes == "unlink" and dele.requires == {"apply_deletions"}
    blind = decide(TA, ABSENT, NO_EVIDENCE, TOMB)
    assert blind.requires == {"apply_deletions", "named", "force"}
    assert decide(ABSENT, TA, NO_EVIDENCE).requires == {"named"}
    assert decide(TB, TA, NO_EVIDENCE).requires == {"named", "force"}
    assert decide(ABSENT, TA, NO_EVIDENCE, ORIGIN).requires == frozenset()
    assert decide(TA, TA, A).owes is None


def test_conflict_is_sticky_until_convergence():
    c = PathIntent(conflict=Conflict("both-changed", B))
    still = decide(TB, TC, A, c)
    assert still.state == State.CONFLICT and not still.disk_changed_since_conflict
    moved = decide(Content("d" * 32), TC, A, c)
    assert moved.state == State.CONFLICT and moved.disk_changed_since_conflict
    # Even if disk goes back to P, the conflict stays: it is resolved only by the three exits.
    assert decide(TA, TC, A, c).state == State.CONFLICT
    conv = decide(TC, TC, A, c)
    assert conv.action == Action.AGREE and conv.clear_conflict and conv.record == C


def test_pending_disk_write_seen_records_nothing():
    """A disk intent is completed only by a push whose barriers succeed (seed 002)."""
    w = PathIntent(pending=Pending("write", A, B))
    seen = decide(TB, TB, A, w)
    assert seen.record is None and seen.owes == "write" and seen.state == State.SYNCED
    assert seen.resolve_pending is None
    not_done = decide(TA, TB, A, w)
    assert not_done.resolve_pending == "not-done" and not_done.state == State.WORKSPACE_DRAFT
    torn = decide(TC, TB, A, w)
    assert torn.action == Action.INTERRUPTED and torn.conflict == ConflictKind.INTERRUPTED
    assert torn.record_conflict == Conflict("interrupted", C)
    # The workspace removed the file since: the deletion is owed (rm), or nothing (not in branch).
    rm = decide(TB, ABSENT, A, PathIntent(tombstone=True, pending=Pending("write", A, B)))
    assert rm.state == State.WORKSPACE_DELETED and rm.owes == "unlink" and rm.record is None
    gone = decide(TB, ABSENT, A, w)
    assert gone.state == State.NOT_IN_BRANCH and gone.owes is None and gone.record is None


def test_pending_unlink_and_adoption():
    u = PathIntent(tombstone=True, pending=Pending("unlink", A, ABSENT))
    assert decide(ABSENT, ABSENT, A, u).state == State.WORKSPACE_DELETED
    assert decide(TA, ABSENT, A, u).resolve_pending == "not-done"
    assert decide(TB, ABSENT, A, u).action == Action.INTERRUPTED
    remade = decide(ABSENT, TC, A, u)  # made again in the workspace after the unlink
    assert remade.state == State.WORKSPACE_DRAFT and remade.owes == "write"
    adopt = PathIntent(pending=Pending("adopt", A, B))
    done = decide(TB, TB, A, adopt)
    assert done.resolve_pending == "done" and done.state == State.SYNCED
    redo = decide(TB, TA, A, adopt)
    assert redo.resolve_pending == "not-done" and redo.action == Action.ADOPT_DISK
    elsewhere = PathIntent(pending=Pending("adopt", A, B, on_this_branch=False))
    assert decide(TA, TA, A, elsewhere).resolve_pending is None


def test_forced_write_killed_before_its_effect_stays_unknown_provenance():
    """A named+forced write over a copy without evidence, killed after its intent: the copy's
    digest is the intent's `old`, but it must not read as agreed (no unforced overwrite)."""
    w = PathIntent(pending=Pending("write", B, C))
    dec = decide(TB, TA, NO_EVIDENCE, w)
    assert dec.resolve_pending == "not-done" and dec.conflict == ConflictKind.UNKNOWN_PROVENANCE
    assert {"named", "force"} <= dec.requires


def test_another_branchs_push_seen_on_disk():
    """A branch without the entry neither replays nor unlinks it, and reads no false conflict."""
    w = PathIntent(pending=Pending("write", A, B, on_this_branch=False))
    other = decide(TB, ABSENT, A, w)
    assert other.state == State.NOT_IN_BRANCH and other.owes is None and other.record is None
    assert other.resolve_pending is None
    # Not done (or disk moved on): decided from the evidence, and left pending for its branch.
    assert decide(TA, ABSENT, A, w).resolve_pending is None
    moved = decide(TC, TA, A, w)
    assert moved.action == Action.ADOPT_DISK and moved.resolve_pending is None
    assert moved.record_conflict is None  # no interrupted conflict on a branch that never pushed


# --- permission bits: the same rule on the mode, beside the content -------------------------

X, R = 0o755, 0o644


def _f(digest: str, mode: int) -> Content:
    return Content(digest, "text", mode)


MODE_CASES = [
    # (disk, store, P, P's mode) -> (action, state, detail, mode, take_mode, record_mode)
    ("agreed", _f(A, X), _f(A, X), A, X, Action.AGREE, State.SYNCED, None, None, False, None),
    ("chmod on disk", _f(A, R), _f(A, X), A, X,
     Action.ADOPT_DISK, State.SYNCED, Detail.MODE, R, True, R),
    ("chmod in the mount", _f(A, X), _f(A, R), A, X,
     Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.MODE, R, False, None),
    ("the same chmod on both", _f(A, R), _f(A, R), A, X,
     Action.AGREE, State.SYNCED, None, R, False, R),
    ("no mode on record: disk's taken", _f(A, R), _f(A, X), A, None,
     Action.ADOPT_DISK, State.SYNCED, Detail.MODE, R, True, R),
    ("no mode on record, equal: recorded", _f(A, X), _f(A, X), A, None,
     Action.AGREE, State.SYNCED, None, X, False, X),
    ("content in the mount, mode on disk", _f(A, R), _f(B, X), A, X,
     Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT, R, True, R),
    ("content on disk, mode in the mount", _f(B, X), _f(A, R), A, X,
     Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, R, False, X),
    ("content and mode on disk", _f(B, R), _f(A, X), A, X,
     Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, R, False, R),
    ("content and mode in the mount", _f(A, X), _f(B, R), A, X,
     Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT, R, False, None),
    ("a new disk file keeps its mode", _f(A, X), ABSENT, NO_EVIDENCE, None,
     Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, X, False, X),
    ("a new workspace file is written with its mode", ABSENT, _f(A, X), NO_EVIDENCE, None,
     Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT, X, False, None),
]


@pytest.mark.parametrize("case", MODE_CASES, ids=[c[0] for c in MODE_CASES])
def test_mode_cells(case):
    _, d, s, p, pm, action, state, detail, mode, take_mode, record_mode = case
    intent = PathIntent(origin_store=True) if d is ABSENT else NO_INTENT
    dec = decide(d, s, p, intent, pm)
    got = (dec.action, dec.state, dec.detail, dec.mode, dec.take_mode, dec.record_mode)
    assert got == (action, state, detail, mode, take_mode, record_mode), dec
    if dec.owes == "write":  # what is written: the store's mode, or the one it takes first
        assert dec.mode == (d.mode if dec.take_mode else s.mode)


def test_a_mode_changed_on_both_sides_is_a_conflict_until_the_modes_agree():
    dec = decide(_f(A, 0o600), _f(A, R), A, NO_INTENT, X)
    assert dec.state == State.CONFLICT and dec.conflict == ConflictKind.BOTH_CHANGED
    assert {"named", "force"} <= dec.requires and dec.mode == R
    recorded = PathIntent(conflict=dec.record_conflict)
    assert decide(_f(A, 0o600), _f(A, R), A, recorded, X).state == State.CONFLICT  # sticky
    converged = decide(_f(A, R), _f(A, R), A, recorded, X)
    assert converged.state == State.SYNCED and converged.clear_conflict


modes = st.one_of(st.none(), st.sampled_from([0o600, 0o644, 0o755]))


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from([A, B, C]), st.sampled_from([A, B, C]), st.sampled_from([A, B, C]),
       st.sampled_from([0o600, 0o644, 0o755]), st.sampled_from([0o600, 0o644, 0o755]), modes)
def test_mode_invariants(dc, sc, pc, dm, sm, pm):
    """The mode is never written over a disk chmod memfs has not seen (an unforced write owes
    the store's mode only where disk still has P's mode), and never taken over a mode the
    workspace changed (a mode is taken only where the store still has P's mode, or none is on
    record)."""
    dec = decide(_f(dc, dm), _f(sc, sm), pc, NO_INTENT, pm)
    if dec.owes == "write" and "force" not in dec.requires and dec.mode != dm:
        assert pm == dm and dec.mode == sm, dec
    if dec.take_mode or (dec.action == Action.ADOPT_DISK and dec.mode == dm != sm):
        assert pm is None or pm == sm, dec
    if dec.record_mode is not None:
        assert dec.record_mode == dm, dec  # P's mode is what disk has, agreed


def test_a_restored_copy_is_the_workspaces_side():
    """An undo or restore brought back the agreed copy A while disk changed it: a conflict,
    never disk taken over the rewind (nor a draft written over disk's change)."""
    restored = PathIntent(restored=True)
    gone = decide(ABSENT, TA, A, restored)
    assert gone.state == State.CONFLICT and gone.conflict == ConflictKind.DELETED_ON_DISK
    edited = decide(TB, TA, A, restored)
    assert edited.conflict == ConflictKind.BOTH_CHANGED and {"named", "force"} <= edited.requires
    assert decide(TA, TA, A, restored).state == State.SYNCED  # disk unchanged: agreed
    assert decide(TB, TA, A).action == Action.ADOPT_DISK  # unmarked: only disk changed


def test_not_done_adoption_is_decided_from_its_prior():
    """Seed 002: an adoption's intent carries the prior its decision resolved. Killed after
    the intent, another branch agreed with disk (P moved to disk's B); this branch's tree still
    holds A: decided from the moved P it would be a draft owed to disk (a write over the edit
    being adopted); from its prior A it is adopted, as it would have been without the crash."""
    w = PathIntent(pending=Pending("adopt", A, B, prior=A))
    dec = decide(TB, TA, B, w)
    assert dec.action == Action.ADOPT_DISK and dec.resolve_pending == "not-done" and not dec.owes
    legacy = PathIntent(pending=Pending("adopt", A, B))  # no prior recorded: P as it stands
    assert decide(TB, TA, B, legacy).state == State.WORKSPACE_DRAFT


# --- properties over the whole input space -------------------------------------------------

digests = st.sampled_from([A, B, C])
contents = st.builds(Content, digests, st.sampled_from(["text", "binary", "oversize"]))
disks = st.one_of(st.just(ABSENT), contents, st.just(BIG), st.just(DiskUnknown("unreadable")),
                  st.just(LINK))
stores = st.one_of(st.just(ABSENT), contents)
evidence = st.one_of(st.just(NO_EVIDENCE), st.just(ABSENT), digests)
pendings = st.one_of(
    st.none(),
    st.builds(Pending, st.sampled_from(["write", "unlink", "adopt"]),
              st.one_of(st.just(ABSENT), digests), st.one_of(st.just(ABSENT), digests),
              st.booleans(), st.one_of(st.none(), st.just(ABSENT), digests)),
)
conflicts = st.one_of(st.none(), st.builds(Conflict, st.sampled_from([k.value for k in ConflictKind]),
                                           st.one_of(st.none(), digests)))
intents = st.builds(PathIntent, st.booleans(), st.booleans(), conflicts, pendings, st.booleans(),
                    st.booleans())


def _val(side):
    return ABSENT if side is ABSENT else getattr(side, "digest", None)


@settings(max_examples=2000, deadline=None)
@given(disks, stores, evidence, intents)
def test_rule_invariants(d, s, p, intent):
    dec = decide(d, s, p, intent)
    dv, sv = _val(d), _val(s)
    effective_p = p
    pend = intent.pending
    if pend is not None and dec.resolve_pending == "done":
        effective_p = pend.new
    if pend is not None and dec.resolve_pending == "not-done" and pend.op == "adopt" \
            and pend.prior is not None:
        effective_p = pend.prior  # the tree never took the step: decided from its prior
    if pend is not None and not pend.on_this_branch:
        assert dec.resolve_pending is None  # another branch's intent is its branch's to settle
    if pend is not None and not pend.on_this_branch and pend.op != "adopt" and dv == pend.new:
        effective_p = pend.new
        assert dec.record is None  # not completed here
        assert not (dec.owes == "write" and sv == pend.new)  # nor replayed
    # Nothing is decided from what could not be seen, except that nothing is owed at a disk
    # symlink where the workspace has no file and P no agreed file.
    if intent.damaged or isinstance(d, DiskUnknown):
        nothing = (not intent.damaged and isinstance(d, DiskUnknown) and d.link and s is ABSENT
                   and p in (NO_EVIDENCE, ABSENT) and intent.pending is None
                   and intent.conflict is None)
        want = Action.NOTHING if nothing else Action.UNVERIFIED
        assert dec.action == want and dec.record is None and dec.owes is None, dec
        return
    # Never drop a draft: taking disk over the store needs the store to be what disk agreed on,
    # or a path the store never had and never deleted.
    if dec.action == Action.ADOPT_DISK:
        p_used = effective_p
        assert (p_used is not NO_EVIDENCE and sv == p_used) or (
            p_used is NO_EVIDENCE and s is ABSENT and not intent.tombstone
        ), dec
        # Never resurrect a deletion: with a tombstone, disk content is new only if disk had
        # agreed with the deletion first.
        if intent.tombstone and s is ABSENT and d is not ABSENT:
            assert p_used is ABSENT
    # Never overwrite unseen edits: an unforced write or unlink is owed only where disk is
    # what the evidence says it last agreed with (or disk lacks a workspace-created file).
    if dec.owes and "force" not in dec.requires and dec.detail != Detail.PENDING_WRITE_SEEN:
        assert (effective_p is not NO_EVIDENCE and dv == effective_p) or (
            d is ABSENT and (intent.origin_store or "named" in dec.requires)
        ), dec
    # A recorded P is always what disk holds (agreement) or ABSENT for a store dropping its copy.
    if dec.record is not None:
        assert dec.record == dv or (dec.record is ABSENT and dec.state == State.DISK_ONLY), dec
    # Agreement is only ever claimed on equal, hashed content.
    if dec.state == State.SYNCED and dec.detail not in (Detail.INGEST, Detail.PENDING_WRITE_SEEN):
        assert dv is not None and dv == sv
    # What is owed is what the store holds now: a write of its content, an unlink of its absence
    # (a crash after an effect, then the workspace changing the path again, found by the
    # through-the-daemon kill matrix).
    assert dec.owes != "write" or isinstance(s, Content), dec
    assert dec.owes != "unlink" or s is ABSENT, dec
    # A conflict always says how it is resolved from the workspace side.
    if dec.state == State.CONFLICT:
        assert dec.conflict is not None and {"named", "force"} <= dec.requires
