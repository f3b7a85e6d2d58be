"""The three-way rule: one pure function deciding a path from disk D, store S and evidence P.

Why one function: every trigger (attach, sync, a listing, a watcher event, materialize's
planning) must reach the same verdict for the same facts, and the rule's safety promises —
never overwrite an edit memfs has not seen, never resurrect a deletion, never drop a draft —
can then be tested over its whole input space. It reads no clock and no disk: observation
(`observe.py`) turns disk into a `Disk` value, the journal gives P, the branch gives intent.

    D = S                  agreement; record P := D
    P known, D = P != S    only the store changed: keep S (draft, workspace deletion, not in branch)
    P known, S = P != D    only disk changed: adopt disk (ingest, remove, or disk-only)
    P known, all differ    conflict, sticky until a path sync, a forced materialize or convergence
    P unknown              tombstone, then store origin, then legacy mismatch; else a new disk
                           file is ingested (text) or listed disk-only (binary, oversize)

Permission bits (`mode`, 0o777) are decided by the same rule, on their own, wherever both sides
hold the file (`_decide_mode`): equal, agreed; P's mode on disk, the workspace changed it (a
draft, written with the file); P's mode in the store, disk changed it (taken in); all three
differ, a conflict. A P with no mode on record (evidence older than modes) takes disk's mode,
never writes over it. Content and mode changed on different sides merge (disk's content with
the workspace's mode, or the reverse); both sides changing the mode is a conflict.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Literal


class _Absent:
    """The path holds nothing (disk, store), or disk and store agreed that it held nothing (P)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


class _NoEvidence:
    """No record of what disk last agreed with (P unknown): first sight, or a pre-evidence entry."""

    _instance: _NoEvidence | None = None

    def __new__(cls) -> _NoEvidence:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_EVIDENCE"

    def __reduce__(self) -> str:
        return "NO_EVIDENCE"


ABSENT = _Absent()
NO_EVIDENCE = _NoEvidence()

Kind = Literal["text", "binary", "oversize", "hardlink", "special"]
MODE_BITS = 0o777  # the permission bits the reconciler carries (docs/reconciliation.md: why)
# One int object per permission value (CPython shares only -5..256): a mode is kept per file
# in the walk's facts, the store view and their Contents, and 0o644 built anew each time cost
# 32 bytes a file a copy. MODES[m & MODE_BITS] is the shared one.
MODES = tuple(range(MODE_BITS + 1))


@dataclass(frozen=True, slots=True)
class Content:
    """File content by its xxh3-128 digest. `digest=None` is an untracked oversize file seen only
    by a bounded head read: it never compares equal to anything, so it can never read as agreed.
    `mode`: the file's permission bits (MODE_BITS), None where not known (not compared)."""

    digest: str | None
    kind: Kind = "text"
    mode: int | None = None

    def same(self, other: object) -> bool:
        return isinstance(other, Content) and self.digest is not None and self.digest == other.digest


@dataclass(frozen=True, slots=True)
class DiskUnknown:
    """Disk could not be observed at this path (unreadable, symlinked, ignored, special, swapped,
    outside the listed scope). It proves neither presence nor absence. `link`: what is there
    is a symlink, seen at this very path (memfs never takes one in, writes or removes it)."""

    reason: str
    link: bool = False


Disk = _Absent | Content | DiskUnknown
Store = _Absent | Content
Evidence = _NoEvidence | _Absent | str  # str: the digest disk and store last agreed on


@dataclass(frozen=True, slots=True)
class Conflict:
    """A recorded conflict and the disk side it was recorded with (a digest, or None: absent)."""

    kind: str
    disk: str | None


@dataclass(frozen=True, slots=True)
class Pending:
    """A write-ahead intent not yet completed. `op` is `write`/`unlink` (disk effect) or `adopt`
    (taking disk into this branch's tree). `old`/`new` are the side's expected values before and
    after, as evidence values (digest or ABSENT). An adoption planned on another branch is left
    for that branch (`on_this_branch=False`); another branch's disk effect that shows on disk
    decides this branch's state as if disk agreed with it, and any other branch's intent is
    neither completed, abandoned nor replayed here: only its own branch's tree can tell."""

    op: Literal["write", "unlink", "adopt"]
    old: _Absent | str
    new: _Absent | str
    on_this_branch: bool = True
    # An adoption's prior: the evidence its decision resolved (None: not recorded, an intent
    # older than the journal's column). Not done, it is decided again from there, since P may
    # have moved since with another branch's agreement while this branch's tree stood still.
    prior: _Absent | str | None = None
    id: int = 0  # the journal's intent id (0 in tables of cases): what settling resolves


@dataclass(frozen=True, slots=True)
class PathIntent:
    """Branch intent for one path; it rewinds with the branch (see intent.py).

    tombstone: the workspace deleted the path on purpose. origin_store: the workspace created it.
    damaged: the branch's intent could not be verified, so nothing about this path is known.
    restored: an undo or restore just changed this file (not kept in the branch: the pass after
    the rewind decides it once): the rewound content is the workspace's side, so a disk change
    since the agreement is a conflict with it, never taken over it silently.
    """

    tombstone: bool = False
    origin_store: bool = False
    conflict: Conflict | None = None
    pending: Pending | None = None
    damaged: bool = False
    restored: bool = False


NO_INTENT = PathIntent()


class Action(enum.StrEnum):
    AGREE = "agree"  # D = S; record P := D (if it changed)
    NOTHING = "nothing"  # nothing here on either side and nothing to record
    KEEP_STORE = "keep-store"  # only the store side changed, or disk cannot be trusted over it
    ADOPT_DISK = "adopt-disk"  # only disk changed: take it
    CONFLICT = "conflict"  # both changed, or no evidence and they differ
    UNVERIFIED = "unverified"  # disk or intent unknown: decide nothing, record nothing
    INTERRUPTED = "interrupted"  # a pending intent whose side matches neither outcome


class State(enum.StrEnum):
    SYNCED = "synced"
    WORKSPACE_DRAFT = "workspace-draft"
    WORKSPACE_DELETED = "workspace-deleted"
    NOT_IN_BRANCH = "not-in-branch"
    DISK_ONLY = "disk-only"
    CONFLICT = "conflict"
    DISK_MISSING_PROVENANCE_UNKNOWN = "disk-missing-provenance-unknown"
    UNVERIFIED = "unverified"


class Detail(enum.StrEnum):
    DRAFT = "draft"
    WORKSPACE_DELETION = "workspace-deletion"
    NOT_IN_BRANCH = "not-in-branch"
    PROVENANCE_UNKNOWN = "provenance-unknown"
    INGEST = "ingest"
    REMOVE = "remove"
    DISK_ONLY = "disk-only"
    PENDING_WRITE_SEEN = "pending-write-seen"  # disk shows our write; only a barriered push completes it
    MODE = "mode"  # the content agrees; only the permission bits differ
    TYPE_CLASH = "type-clash"  # a file one side holds where the other keeps a directory, or under a file


class ConflictKind(enum.StrEnum):
    BOTH_CHANGED = "both-changed"
    DELETED_ON_DISK = "deleted-on-disk"
    DELETED_IN_WORKSPACE = "deleted-in-workspace"
    UNKNOWN_PROVENANCE = "unknown-provenance"
    STORE_ORIGIN_COLLISION = "store-origin-collision"
    INTERRUPTED = "interrupted"
    TYPE_CHANGED = "type-changed"  # a file on one side where the other keeps a directory


Requirement = Literal["named", "force", "apply_deletions"]


# The empty requirement set, one object: a frozenset() of its own is 216 bytes, and a take-in
# decides every file it takes (decisions are kept with the pass's plans until the next pass).
NO_REQUIREMENTS: frozenset[Requirement] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a path and how it lists.

    record: the new P to record (a digest, ABSENT), or None for "record nothing".
    owes: what materialize owes disk here (`write`/`unlink`), and `requires` what a call must
    carry to do it (a named path, force, apply_deletions). A conflict is owed only with
    named+force: that is how the workspace side is taken.
    resolve_pending: "done" / "not-done" / "interrupted" when this decision settles a pending
    intent. "done" (only for an adoption) means: complete the intent first (P := its new value),
    then apply `record`, which is relative to that.
    clear_tombstone / record_conflict / clear_conflict: changes to branch intent.
    """

    action: Action
    state: State | None
    detail: Detail | None = None
    conflict: ConflictKind | None = None
    record: _Absent | str | None = None
    owes: Literal["write", "unlink"] | None = None
    requires: frozenset[Requirement] = NO_REQUIREMENTS
    resolve_pending: Literal["done", "not-done", "interrupted"] | None = None
    record_conflict: Conflict | None = None
    clear_conflict: bool = False
    clear_tombstone: bool = False
    disk_changed_since_conflict: bool = False
    reason: str = ""
    # Permission bits: `mode` is what the file is to have on both sides once the decision is
    # carried out (a take gives the store node this mode; a write gives disk's file this mode);
    # `take_mode`: the store keeps its content and takes this mode from disk; `record_mode`:
    # the mode to record in P with `record` (which then holds P's content value).
    mode: int | None = None
    take_mode: bool = False
    record_mode: int | None = None


SYNCED_UNCHANGED = Decision(Action.AGREE, State.SYNCED, reason="disk and store agree")
"""The decision for the unchanged case, shared: a pass over a quiet tree makes one per file."""


def decide_unchanged(disk: str | None, store: str | None, p: Evidence,
                     dm: int | None = None, sm: int | None = None,
                     pm: int | None = None) -> Decision | None:
    """The rule's decision when disk, store and P are one digest and one mode, or None: run
    `decide`.

    Valid only for a path with no branch intent (tombstone, origin, conflict, damage) and no
    pending intent: the caller checks that. With those absent, D = S goes straight to agreement,
    and P = D means nothing to record; so this is exactly `decide` for those inputs (a property
    test holds it to that), without the work of building the sides. `disk`/`store` are digests
    (None: no comparable content); `dm`/`sm`/`pm` the modes of disk, store and P."""
    if disk is not None and disk == store and p == disk and dm == sm and pm == dm:
        return SYNCED_UNCHANGED
    return None


def type_clash(where: str, *, disk_dir: bool) -> Decision:
    """The decision for a file disk holds that the store cannot take in, because the store
    keeps (a draft, a conflict, a file disk never had) a directory at that path (`disk_dir`
    False: disk replaced a directory by a file) or a file at `where`, an ancestor of it (True:
    disk replaced a file by a directory). Decided from the structure at each pass, not
    recorded: it ends as soon as one side gives way (a path sync takes disk's side; removing
    the workspace's entries, or moving disk's away, lets the rule decide each file again).
    Nothing is recorded or owed at the path itself: the store holds no file there."""
    if disk_dir:
        reason = (f"disk holds a directory at {where!r} where the workspace keeps a file; "
                  f"a sync of {where!r} takes disk's side")
    else:
        reason = ("disk holds a file where the workspace keeps a directory with changes; "
                  "a sync of this path takes disk's file")
    return Decision(Action.CONFLICT, State.CONFLICT, Detail.TYPE_CLASH,
                    conflict=ConflictKind.TYPE_CHANGED, reason=reason)


SPECIAL_NAMES = {"l": "symbolic link", "p": "FIFO", "s": "socket", "c": "character device",
                 "b": "block device"}  # a workspace entry's kind (memfs.store.trees), in words


def special_clash(kind: str, above: str | None = None) -> Decision:
    """The decision for a file disk holds where the workspace keeps a symlink, FIFO, socket or
    device (`kind`) and no file, at the path or at `above`, an ancestor of it: a type change,
    as type_clash's, that no plain pass resolves by replacing the workspace's entry (it is the
    workspace's own, and no materialize writes it), and no effect ever tries to. A sync of
    the path (of `above`) takes disk's side in its place."""
    what = SPECIAL_NAMES.get(kind, "special file")
    if above is not None:
        reason = (f"disk holds a directory at {above!r} where the workspace keeps a {what}; "
                  f"a sync of {above!r} takes disk's directory in its place, or move disk's "
                  f"directory away to keep the {what}")
    else:
        reason = (f"disk holds a file where the workspace keeps a {what}; a sync of this path "
                  f"takes disk's file in its place, or move disk's file away to keep the {what}")
    return Decision(Action.CONFLICT, State.CONFLICT, Detail.TYPE_CLASH,
                    conflict=ConflictKind.TYPE_CHANGED, reason=reason)


def _value(side: Disk | Store) -> _Absent | str | None:
    """A side as an evidence value: ABSENT, a digest, or None when it has no comparable value."""
    if side is ABSENT:
        return ABSENT
    if isinstance(side, Content):
        return side.digest
    return None


def _eq(a: _Absent | str | None, b: _Absent | str | None) -> bool:
    return a is not None and b is not None and a == b


def _conflict_kind(d: Disk, s: Store) -> ConflictKind:
    if d is ABSENT:
        return ConflictKind.DELETED_ON_DISK
    if s is ABSENT:
        return ConflictKind.DELETED_IN_WORKSPACE
    return ConflictKind.BOTH_CHANGED


UNHASHED = "unhashed"  # a conflict's disk side that was never hashed (untracked oversize)


def _disk_record(d: Disk) -> str | None:
    """A disk side as a conflict records it: a digest, None for absent, UNHASHED otherwise."""
    dv = _value(d)
    if dv is ABSENT:
        return None
    return dv if isinstance(dv, str) else UNHASHED


def _conflict(kind: ConflictKind, d: Disk, s: Store, reason: str) -> Decision:
    return Decision(
        Action.CONFLICT,
        State.CONFLICT,
        conflict=kind,
        owes="unlink" if s is ABSENT else "write",
        requires=frozenset({"named", "force"}),
        record_conflict=Conflict(str(kind), _disk_record(d)),
        reason=reason,
        mode=_mode(s),
    )


def _mode(side: Disk | Store) -> int | None:
    return side.mode if isinstance(side, Content) else None


def decide(d: Disk, s: Store, p: Evidence, intent: PathIntent = NO_INTENT,
           pm: int | None = None) -> Decision:
    """Decide one path (`pm`: the mode P agreed on, None if none is on record). See the module
    docstring for the table; docs/reconciliation.md for why."""
    dec = _decide_content(d, s, p, intent)
    if dec.resolve_pending is not None or dec.action in (Action.UNVERIFIED, Action.NOTHING,
                                                          Action.INTERRUPTED):
        return dec  # a write-ahead intent settles first; the next pass decides the mode
    return _decide_mode(dec, d, s, p, pm)


def _decide_mode_only(dm: int, sm: int, pm: int | None) -> str:
    """The rule on the permission bits alone: agree, draft (the workspace changed them), adopt
    (disk did) or conflict. No mode on record: disk's is taken, never written over."""
    if dm == sm:
        return "agree"
    if pm is None or pm == sm:
        return "adopt"
    if pm == dm:
        return "draft"
    return "conflict"


def _decide_mode(dec: Decision, d: Disk, s: Store, p: Evidence, pm: int | None) -> Decision:
    """The content decision with the permission bits decided by the same rule (see the module
    docstring). Where one side has no file, the mode goes with the content: a take gets disk's,
    a write the store's."""
    dm, sm = _mode(d), _mode(s)
    if dec.action == Action.CONFLICT:
        return dec  # resolved as a whole (a recorded one converges only when the modes agree)
    if dm is None or sm is None:
        if dec.action == Action.ADOPT_DISK and dec.state != State.DISK_ONLY and dm is not None:
            return replace(dec, mode=dm, record_mode=dm)  # a new file: disk's mode
        if dec.owes == "write":
            return replace(dec, mode=sm)  # disk has no file: the store's mode is written
        return dec
    if dec.action == Action.ADOPT_DISK and dec.state == State.DISK_ONLY:
        return dec  # the store drops its copy: no mode to keep
    m = _decide_mode_only(dm, sm, pm)
    if m == "conflict":
        return Decision(
            Action.CONFLICT, State.CONFLICT, conflict=ConflictKind.BOTH_CHANGED, owes="write",
            requires=frozenset({"named", "force"}),
            record_conflict=Conflict(str(ConflictKind.BOTH_CHANGED), _disk_record(d)),
            mode=sm, reason=f"disk and the workspace both changed its mode ({pm:o} -> disk "
                            f"{dm:o}, workspace {sm:o})")
    pv = dec.record if dec.record is not None else (
        p if p is not NO_EVIDENCE else _value(d))
    if dec.action == Action.ADOPT_DISK:
        # Disk's content taken; its mode too, unless only the workspace changed the mode
        # (then the store keeps its mode, which is owed to disk at the next pass).
        return replace(dec, mode=sm if m == "draft" else dm, record_mode=dm)
    if dec.action == Action.AGREE:
        if m == "agree":
            if pm == dm and dec.record is None:
                return dec  # nothing to carry (SYNCED_UNCHANGED stays the shared object)
            return replace(dec, record=pv, mode=dm, record_mode=dm)
        if m == "draft":
            return Decision(Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.MODE, owes="write",
                            record=dec.record, record_mode=pm if dec.record is not None else None,
                            mode=sm, clear_conflict=dec.clear_conflict,
                            reason="the workspace changed its mode only")
        return Decision(Action.ADOPT_DISK, State.SYNCED, Detail.MODE, take_mode=True, mode=dm,
                        record=pv, record_mode=dm, clear_conflict=dec.clear_conflict,
                        reason="disk changed its mode only")
    if dec.owes == "write":  # a content draft where disk holds a file
        if m == "adopt":
            # Disk changed the mode, the workspace the content: the store takes disk's mode
            # (recorded as agreed) and its draft is written with it.
            return replace(dec, mode=dm, take_mode=True, record=pv, record_mode=dm)
        return replace(dec, mode=sm)
    return dec


def _decide_content(d: Disk, s: Store, p: Evidence, intent: PathIntent) -> Decision:
    """The rule on content (the module docstring's table)."""
    if intent.damaged:
        return Decision(Action.UNVERIFIED, State.UNVERIFIED,
                        reason="branch intent is damaged; a path sync replaces it")
    if isinstance(d, DiskUnknown):
        if _nothing_at_a_link(d, s, p, intent):
            return Decision(Action.NOTHING, None, reason="disk has a symlink here, which memfs "
                            "neither takes in nor removes; the workspace has no file here")
        return Decision(Action.UNVERIFIED, State.UNVERIFIED, reason=f"disk unknown: {d.reason}")

    pending = intent.pending
    if pending is not None and (pending.on_this_branch or pending.op != "adopt"):
        return _settle_pending(d, s, p, intent, pending)

    dv, sv = _value(d), _value(s)

    if intent.conflict is not None:
        if _eq(dv, sv) and _mode(d) == _mode(s):
            return _agree(d, p, clear_conflict=True, reason="conflict converged")
        recorded = ABSENT if intent.conflict.disk is None else intent.conflict.disk
        kind = ConflictKind(intent.conflict.kind)
        return Decision(
            Action.CONFLICT, State.CONFLICT, conflict=kind,
            owes="unlink" if s is ABSENT else "write", requires=frozenset({"named", "force"}),
            disk_changed_since_conflict=not _eq(dv, recorded),
            reason="recorded conflict stays until a path sync, a forced materialize or convergence",
            mode=_mode(s),
        )

    if _eq(dv, sv):
        return _agree(d, p)

    if p is not NO_EVIDENCE:
        return _decide_known(d, s, p, intent)
    return _decide_unknown(d, s, intent)


def _nothing_at_a_link(d: DiskUnknown, s: Store, p: Evidence, intent: PathIntent) -> bool:
    """A disk symlink where the workspace has no file and disk never had one memfs agreed on
    (a file made in the mount at a disk symlink's name, then removed: its tombstone): nothing
    is owed either way, since no materialize writes or unlinks through a symlink. It used to
    read unverified forever; the symlink itself is listed as its incomplete region."""
    return (d.link and s is ABSENT and (p is NO_EVIDENCE or p is ABSENT)
            and intent.pending is None and intent.conflict is None)


def _agree(d: Disk, p: Evidence, *, clear_conflict: bool = False, reason: str = "") -> Decision:
    dv = _value(d)
    record = None if p == dv or (p is NO_EVIDENCE and dv is ABSENT) else dv
    if dv is ABSENT:
        return Decision(Action.AGREE if record is not None or clear_conflict else Action.NOTHING,
                        None, record=record, clear_conflict=clear_conflict,
                        reason=reason or "absent on both sides")
    return Decision(Action.AGREE, State.SYNCED, record=record, clear_conflict=clear_conflict,
                    reason=reason or "disk and store agree")


def _decide_known(d: Disk, s: Store, p: _Absent | str, intent: PathIntent) -> Decision:
    dv, sv = _value(d), _value(s)
    if _eq(dv, p):  # only the store side differs
        if s is ABSENT:
            if intent.tombstone:
                return Decision(Action.KEEP_STORE, State.WORKSPACE_DELETED,
                                Detail.WORKSPACE_DELETION, owes="unlink",
                                requires=frozenset({"apply_deletions"}),
                                reason="deleted in the workspace; disk still holds the agreed copy")
            return Decision(Action.KEEP_STORE, State.NOT_IN_BRANCH, Detail.NOT_IN_BRANCH,
                            reason="disk holds the agreed copy; this branch does not have it")
        return Decision(Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT, owes="write",
                        reason="changed in the workspace only")
    if _eq(sv, p):  # only disk changed
        if intent.restored:
            # The workspace went back to the agreed copy on purpose (undo, restore) while
            # disk changed it: both sides acted, so neither is taken over the other.
            return _conflict(_conflict_kind(d, s), d, s,
                             "an undo or restore brought this copy back; disk changed it since "
                             "they last agreed")
        return _adopt(d, p, intent)
    return _conflict(_conflict_kind(d, s), d, s, "disk, store and evidence all differ")


def _adopt(d: Disk, p: Evidence, intent: PathIntent) -> Decision:
    clear = intent.tombstone
    if d is ABSENT:
        return Decision(Action.ADOPT_DISK, None, Detail.REMOVE, record=ABSENT,
                        reason="deleted on disk only")
    assert isinstance(d, Content)
    if d.kind != "text":
        # The store drops its copy; disk-only files are shown from disk. The store now agrees
        # with absence, which is what P records.
        return Decision(Action.ADOPT_DISK, State.DISK_ONLY, Detail.DISK_ONLY,
                        record=None if p is ABSENT else ABSENT, clear_tombstone=clear, reason=f"{d.kind} file on disk")
    return Decision(Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, record=d.digest,
                    clear_tombstone=clear, reason="changed on disk only")


def _decide_unknown(d: Disk, s: Store, intent: PathIntent) -> Decision:
    if s is ABSENT and intent.tombstone:
        # Disk holds a file where the workspace deleted one, and nothing says which came first:
        # never resurrect. Applying the deletion over a copy of unknown provenance needs the path
        # named and forced.
        return Decision(Action.KEEP_STORE, State.WORKSPACE_DELETED, Detail.WORKSPACE_DELETION,
                        owes="unlink",
                        requires=frozenset({"apply_deletions", "named", "force"}),
                        reason="deleted in the workspace; disk copy of unknown provenance")
    if isinstance(s, Content) and intent.origin_store:
        if d is ABSENT:
            return Decision(Action.KEEP_STORE, State.WORKSPACE_DRAFT, Detail.DRAFT, owes="write",
                            reason="created in the workspace, not yet on disk")
        return _conflict(ConflictKind.STORE_ORIGIN_COLLISION, d, s,
                         "created in the workspace; disk holds a different file")
    if isinstance(s, Content):
        if d is ABSENT:
            return Decision(Action.KEEP_STORE, State.DISK_MISSING_PROVENANCE_UNKNOWN,
                            Detail.PROVENANCE_UNKNOWN, owes="write",
                            requires=frozenset({"named"}),
                            reason="no evidence: disk may never have had it, or a shell deleted it")
        return _conflict(ConflictKind.UNKNOWN_PROVENANCE, d, s,
                         "no evidence of which side is newer")
    # s is ABSENT, no tombstone: a file only disk has, never seen before.
    return _adopt(d, NO_EVIDENCE, intent)


def _settle_pending(
    d: Disk, s: Store, p: Evidence, intent: PathIntent, pending: Pending
) -> Decision:
    """Resolve a write-ahead intent at its next observation.

    A disk intent is completed only by a push whose barriers succeed: seeing its bytes on disk
    decides the listing but records nothing (the next materialize redoes it). Disk back at the
    old value means it never happened; anything else is an interrupted conflict.
    """
    side = _value(d) if pending.op in ("write", "unlink") else _value(s)
    rest = PathIntent(intent.tombstone, intent.origin_store, intent.conflict,
                      restored=intent.restored)
    if not pending.on_this_branch:
        if _eq(side, pending.new):
            # Another branch's push shows on disk: decide as if disk agreed with it, but
            # neither complete it (its own branch does, with barriers) nor replay it here.
            return _with(_decide_content(d, s, pending.new, rest), record=None)
        # Not (or not yet) done, or disk moved on: for this branch that is disk as it is,
        # decided from the evidence; the intent stays pending for its own branch, which alone
        # can say whether it was interrupted (recording it here would put a conflict on a
        # branch that never pushed anything).
        return _decide_content(d, s, p, rest)
    if _eq(side, pending.new):
        if pending.op == "adopt":
            # The adoption landed; completing its intent records P := new, and the rest of
            # the decision is made from there.
            return _with(_decide_content(d, s, pending.new, rest), resolve_pending="done")
        # What is owed follows the store as it is now, not the interrupted step: the workspace
        # may have removed the written file or made the unlinked one again since.
        if s is ABSENT and pending.op == "write" and not intent.tombstone:
            return Decision(Action.KEEP_STORE, State.NOT_IN_BRANCH, Detail.PENDING_WRITE_SEEN,
                            reason="disk shows the pending write; this branch no longer has it")
        owes: Literal["write", "unlink"] = "unlink" if s is ABSENT else "write"
        if s is ABSENT:
            state = State.WORKSPACE_DELETED
        else:
            state = State.SYNCED if _eq(_value(s), pending.new) else State.WORKSPACE_DRAFT
        return Decision(Action.KEEP_STORE, state, Detail.PENDING_WRITE_SEEN, owes=owes,
                        reason="disk shows the pending effect; a push with barriers completes it")
    if _eq(side, pending.old):
        # Not done: decide from the evidence as it stands. (Not from `old`: a forced write's old
        # is a disk copy the evidence never agreed with, and must not become agreed by a crash.)
        # An adoption is decided from the prior it resolved: its tree never took the step, and
        # whatever moved P since (another branch agreeing with disk while this one was not
        # selected) says nothing about this tree. Decided from a moved P, the old copy would
        # read as a draft, and materialize would write it over the disk edit being adopted.
        # (An intent written before priors were recorded has none: P as it stands, as before.)
        if pending.op == "adopt" and pending.prior is not None:
            return _with(_decide_content(d, s, pending.prior, rest), resolve_pending="not-done")
        return _with(_decide_content(d, s, p, rest), resolve_pending="not-done")
    return Decision(
        Action.INTERRUPTED, State.CONFLICT, conflict=ConflictKind.INTERRUPTED,
        owes="unlink" if s is ABSENT else "write", requires=frozenset({"named", "force"}),
        record_conflict=Conflict(str(ConflictKind.INTERRUPTED), _disk_record(d)),
        resolve_pending="interrupted",
        reason=f"a pending {pending.op} was interrupted: its side matches neither outcome",
    )


def _with(dec: Decision, **changes: object) -> Decision:
    return replace(dec, **changes)  # type: ignore[arg-type]
