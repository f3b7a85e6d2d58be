"""Planning, pure: a whole pass, sync's contract and materialize's contract as functions.

Why pure: the contracts (a sync without a path never discards a draft; a path sync takes disk
and lists what it gave up; materialize never deletes without apply_deletions, takes up only what
the evidence says disk owes, and overwrites a copy without evidence only when named and forced)
are promises about decisions, so they are tested as tables without disks or clocks. The caller
(the workspace) gathers the inputs on one branch, applies the plan, and gathers again if the
branch moved under it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Protocol

from memfs.reconcile.intent import IntentTable
from memfs.reconcile.rule import (
    ABSENT,
    NO_EVIDENCE,
    NO_INTENT,
    SPECIAL_NAMES,
    SYNCED_UNCHANGED,
    Action,
    Content,
    Decision,
    Detail,
    Disk,
    DiskUnknown,
    PathIntent,
    Pending,
    State,
    _Absent,
    decide,
    decide_unchanged,
    special_clash,
    type_clash,
)

EvidenceMap = Mapping[str, "str | _Absent"]  # a missing key is NO_EVIDENCE


class ObservedFile(Protocol):
    """What plan_pass needs of one observed file (memfs.reconcile.observe.FileFact)."""

    @property
    def digest(self) -> str | None: ...


class Observed(Protocol):
    """What plan_pass needs of an observation (memfs.reconcile.observe.Observation).

    A path in `files` reads as that file's content whatever the regions say: `disk(path)` is
    then Content(fact.digest, fact.kind), which the unchanged fast path relies on."""

    @property
    def scope(self) -> str: ...
    @property
    def files(self) -> Mapping[str, ObservedFile]: ...
    @property
    def regions(self) -> Sequence[object]: ...

    def disk(self, path: str) -> Disk: ...


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + "/")


def pending_from_journal(intents: Iterable[object], branch: str | None) -> dict[str, Pending]:
    """Journal intents (memfs.store.journal.Intent, in id order) as the rule's Pending: per
    path the newest of this branch's, else the newest of another branch's (which this branch
    only reads, never settles)."""
    out: dict[str, Pending] = {}
    for it in intents:
        op = it.op  # type: ignore[attr-defined]
        old = ABSENT if it.old is None else it.old  # type: ignore[attr-defined]
        new = ABSENT if it.new is None else it.new  # type: ignore[attr-defined]
        on_branch = it.branch in (None, branch)  # type: ignore[attr-defined]
        raw = getattr(it, "prior", None)
        prior = None if raw is None else ABSENT if raw == "" else raw
        have = out.get(it.path)  # type: ignore[attr-defined]
        if have is not None and have.on_this_branch and not on_branch:
            continue
        out[it.path] = Pending(op, old, new, on_branch, prior,  # type: ignore[attr-defined]
                               it.id)  # type: ignore[attr-defined]
    return out


_SYNCED_ROW = (str(State.SYNCED), None)


@dataclass
class PassPlan:
    """One pass's decisions on one branch, and what applying it changes."""

    branch: str | None
    decisions: dict[str, Decision] = field(default_factory=dict)
    regions: list[object] = field(default_factory=list)
    pending: Mapping[str, Pending] = field(default_factory=dict)  # what it was decided with

    def listing(self) -> dict[str, tuple[str, str | None]]:
        """path -> (state, conflict kind) for every path that lists (absent-on-both excluded),
        in the order decided (plan_pass decides in path order). No sorted copy of the items:
        at 100k paths those tuples alone set off a full collection of the daemon's heap."""
        out: dict[str, tuple[str, str | None]] = {}
        for p, d in self.decisions.items():
            if d is SYNCED_UNCHANGED:
                out[p] = _SYNCED_ROW
            elif d.state is not None:
                out[p] = (str(d.state), str(d.conflict) if d.conflict else None)
        return out

    @cached_property
    def settling(self) -> dict[str, Decision]:
        """The decisions that settle a pending intent."""
        return {p: d for p, d in self.decisions.items() if d.resolve_pending is not None}

    @cached_property
    def disk_only(self) -> frozenset[str]:
        """The paths decided disk-only."""
        return frozenset(p for p, d in self.decisions.items() if d.state == State.DISK_ONLY)

    def adoptions(self) -> dict[str, Decision]:
        return {p: d for p, d in self.decisions.items() if d.action == Action.ADOPT_DISK}


def plan_pass(
    observation: Observed,
    store_view: Mapping[str, Content],
    evidence: EvidenceMap,
    intent: IntentTable,
    pending: Mapping[str, Pending] | None = None,
    *,
    branch: str | None = None,
    modes: Mapping[str, int] | None = None,
    specials: Mapping[str, str] | None = None,
    intent_paths: Iterable[str] | None = None,
) -> PassPlan:
    """Decide every path the observation's scope covers: store entries, evidence, intent, pending
    intents and files disk holds. Paths in incomplete regions come out unverified. `modes`:
    the permission bits P agreed on, per path (missing: none on record). `specials`: path ->
    kind of the workspace's entries that are neither file nor directory (a symlink, FIFO):
    disk's file is never put over one but by a path sync (`special_clash`). `intent_paths`:
    the intent table's paths under a scope, if the caller keeps them in order (found by
    range, where reading every entry of the table cost each one-path pass O(drafts)).

    The unchanged case (a file disk holds whose digest the store and P share, with no branch or
    pending intent) takes `decide_unchanged`, the rule's own answer for it without building
    the sides: on a quiet tree that is nearly every path."""
    pending = pending or {}
    modes = modes or {}
    scope = observation.scope
    files = observation.files
    if scope:
        paths = {p for p in store_view if _under(p, scope)}
        paths.update(p for p in evidence if _under(p, scope))
        paths.update(intent_paths if intent_paths is not None else
                     (p for p in intent if _under(p, scope)))
        paths.update(p for p in pending if _under(p, scope))
    else:
        paths = set(store_view)
        paths.update(evidence)
        paths.update(intent)
        paths.update(pending)
    paths.update(files)
    plan = PassPlan(branch, regions=list(observation.regions), pending=pending)
    decisions = plan.decisions
    # A damaged table answers "unverified" for paths it has no entry for: no fast path then.
    marked = None if intent.damaged else intent.entries
    for path in sorted(paths):
        if marked is not None and path not in marked and path not in pending:
            fact = files.get(path)
            s = store_view.get(path)
            if fact is not None and s is not None:
                fast = decide_unchanged(fact.digest, s.digest, evidence.get(path, NO_EVIDENCE),
                                        getattr(fact, "mode", None), s.mode, modes.get(path))
                if fast is not None:
                    decisions[path] = fast
                    continue
            pi = NO_INTENT
        else:
            pi = intent.get(path)
            if path in pending:
                pi = PathIntent(pi.tombstone, pi.origin_store, pi.conflict, pending[path],
                                pi.damaged, pi.restored)
        decisions[path] = decide(observation.disk(path), store_view.get(path, ABSENT),
                                 evidence.get(path, NO_EVIDENCE), pi, modes.get(path))
    for path, dec in _clashes(decisions, store_view, observation, specials or {}).items():
        decisions[path] = dec
    return plan


# --- type changes: a file where the other side keeps a directory ------------------------------


def _removes(dec: Decision) -> bool:
    """Does applying this decision take the store's file away (disk's deletion, or a binary
    or oversize disk copy the store drops to show disk-only)?"""
    if dec.action != Action.ADOPT_DISK:
        return False
    return dec.state == State.DISK_ONLY or dec.detail == Detail.REMOVE


def _puts(dec: Decision) -> bool:
    """Does applying this decision put a file into the tree (taken in, or shown disk-only)?"""
    return dec.action == Action.ADOPT_DISK and dec.detail in (Detail.INGEST, Detail.DISK_ONLY)


def _blocked(puts: Iterable[str], kept: Callable[[str], bool], keys: Sequence[str],
             ) -> dict[str, str | None]:
    """The paths of `puts` the tree cannot take: a kept store file at an ancestor (-> that
    ancestor: disk made a directory of a file) or below it (-> None: disk made a file of a
    directory). `keys`: every store path, sorted; `kept(p)`: the store keeps its file at p."""
    import bisect

    out: dict[str, str | None] = {}
    for t in puts:
        parts = t.split("/")
        above = next((a for a in ("/".join(parts[:i]) for i in range(1, len(parts)))
                      if kept(a)), None)
        if above is not None:
            out[t] = above
            continue
        prefix = t + "/"
        i = bisect.bisect_left(keys, prefix)
        while i < len(keys) and keys[i].startswith(prefix):
            if kept(keys[i]):
                out[t] = None
                break
            i += 1
    return out


def _clashes(decisions: Mapping[str, Decision], store_view: Mapping[str, Content],
             observation: Observed, specials: Mapping[str, str]) -> dict[str, Decision]:
    """The type changes the rule's per-file decisions cannot see: a file disk holds (to be
    taken in or shown disk-only) where the store keeps a directory with content it does not
    give up, or below a file the store keeps; or at or below a symlink or special file of the
    workspace's (`specials`), which no plain pass gives up either. Each becomes a type-changed
    conflict (truthful in the listing; nothing taken, recorded or owed there) instead of an
    adoption the tree could never apply (it used to list as synced and be skipped at every
    pass). Cheap when nothing is put: a quiet pass puts nothing."""
    puts = [p for p, d in decisions.items() if d is not SYNCED_UNCHANGED and _puts(d)]
    if not puts:
        return {}
    keys = sorted(store_view)

    def kept(p: str) -> bool:
        if p in specials:
            return True
        if p not in store_view:
            return False
        dec = decisions.get(p)
        return dec is None or not _removes(dec)

    out: dict[str, Decision] = {}
    for t in puts:
        if t in specials:
            out[t] = special_clash(specials[t])
    for t, above in _blocked([t for t in puts if t not in out], kept, keys).items():
        out[t] = special_clash(specials[above], above) if above in specials else \
            type_clash(above or t, disk_dir=above is not None)
    return out


# --- sync ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Discarded:
    path: str
    was: str  # the state the workspace change had
    op: Literal["modified", "deleted", "restored", "replaced"]  # replaced: by disk's directory
    over: str | None = None  # the workspace's symlink or special file disk's side replaces


@dataclass
class SyncPlan:
    """What a sync takes. `take` maps path -> the disk side to put in the store (a Content) or
    ABSENT to remove it; `record` is the evidence to record; intent changes clear tombstones and
    conflicts of the paths taken."""

    take: dict[str, Content | _Absent] = field(default_factory=dict)
    take_modes: dict[str, int] = field(default_factory=dict)  # the store keeps its content
    record: dict[str, str | _Absent] = field(default_factory=dict)
    record_modes: dict[str, int] = field(default_factory=dict)  # P's mode with `record`
    clear_intent: list[str] = field(default_factory=list)
    record_conflicts: dict[str, object] = field(default_factory=dict)
    resolve_pending: dict[str, str] = field(default_factory=dict)
    discarded: list[Discarded] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    refused: str | None = None
    replace: frozenset[str] = frozenset()  # taken over the workspace's symlink or special file


def _take_for(d: Disk) -> tuple[Content | _Absent, str | _Absent]:
    """The store side and P a sync takes for disk side d (binary/oversize: dropped, disk-only)."""
    if d is ABSENT:
        return ABSENT, ABSENT
    assert isinstance(d, Content)
    if d.kind != "text" or d.digest is None:
        return ABSENT, ABSENT
    return d, d.digest


def plan_sync(
    plan: PassPlan,
    observation: Observed,
    store_view: Mapping[str, Content],
    *,
    path: str | None = None,
    branch_now: str | None = None,
    specials: Mapping[str, str] | None = None,
) -> SyncPlan:
    """Sync's contract. Without a path: apply the rule (adoptions, agreements, conflicts) and
    never discard a draft. With a path: take disk for everything under it that disk shows,
    listing each workspace change given up under `discarded`; only on the branch it was asked on
    (the pass's branch), else take nothing and say so. A file taken where the workspace keeps
    a symlink or special file (`specials`, as plan_pass's) replaces it (`replace`), listed
    `discarded` with what it replaced (`over`): the user named the path to take disk's side."""
    out = SyncPlan()
    if path is not None and branch_now != plan.branch:
        out.refused = (f"the selected branch changed ({plan.branch} -> {branch_now}) before the "
                       f"sync of {path!r} gathered; nothing was taken")
        return out
    for p, dec in plan.decisions.items():
        if dec is SYNCED_UNCHANGED:
            continue  # agreed, nothing to record, nothing to take: the same under a path sync
        if dec.state == State.UNVERIFIED:
            out.unverified.append(p)
            continue
        if dec.resolve_pending is not None:
            out.resolve_pending[p] = dec.resolve_pending
        named = path is not None and _under(p, path)
        if not named or dec.action in (Action.AGREE, Action.NOTHING, Action.ADOPT_DISK):
            if dec.take_mode and dec.mode is not None:
                out.take_modes[p] = dec.mode  # disk's mode, the store's content
            if dec.action == Action.ADOPT_DISK and dec.detail != Detail.MODE:
                d = observation.disk(p)
                take, _ = _take_for(d)
                if isinstance(take, Content) and dec.mode is not None and take.mode != dec.mode:
                    take = Content(take.digest, take.kind, dec.mode)  # the store keeps its mode
                out.take[p] = take
                if dec.clear_tombstone:
                    out.clear_intent.append(p)
            if dec.record is not None:
                out.record[p] = dec.record
                if dec.record_mode is not None:
                    out.record_modes[p] = dec.record_mode
            if dec.clear_conflict:
                out.clear_intent.append(p)
            if dec.record_conflict is not None:
                out.record_conflicts[p] = dec.record_conflict
            continue
        # A path sync of a path the rule keeps for the workspace: take disk, say what was lost.
        d = observation.disk(p)
        if isinstance(d, DiskUnknown):
            out.unverified.append(p)
            continue
        s = store_view.get(p, ABSENT)
        take, record = _take_for(d)
        if dec.state == State.NOT_IN_BRANCH or dec.detail == Detail.TYPE_CLASH:
            out.take[p] = take  # (a type change: what it gives up is listed for the paths
            # the store keeps under or above it, also under this path or still blocking)
        elif s != take or dec.state in (State.WORKSPACE_DELETED, State.CONFLICT):
            op: Literal["modified", "deleted", "restored"] = (
                "restored" if s is ABSENT else "deleted" if take is ABSENT else "modified")
            out.discarded.append(Discarded(p, str(dec.state), op))
            out.take[p] = take
        out.record[p] = record
        if isinstance(take, Content) and take.mode is not None:
            out.record_modes[p] = take.mode
        out.clear_intent.append(p)
    if path is not None:
        _still_blocked(out, plan, observation, store_view, path, specials or {})
        _replacing(out, plan, path, specials or {})
    return out


def _replacing(out: SyncPlan, plan: PassPlan, path: str, specials: Mapping[str, str]) -> None:
    """A path sync's file taken at or below a symlink or special file the workspace keeps
    under the path: the take replaces it (by the file, or by disk's directory), and
    `discarded` says so (what the workspace had there, and the state it had)."""
    if not specials:
        return
    at: dict[str, str] = {}  # special -> the kind, for a file taken at it
    above: dict[str, str] = {}  # special -> the kind, for a file taken below it
    for t, take in out.take.items():
        if not isinstance(take, Content):
            continue
        if t in specials and _under(t, path):
            at[t] = specials[t]
        parts = t.split("/")
        for a in ("/".join(parts[:i]) for i in range(1, len(parts))):
            if a in specials and _under(a, path):
                above[a] = specials[a]
    if not at and not above:
        return
    out.replace = frozenset(at) | frozenset(above)
    listed = {d.path: i for i, d in enumerate(out.discarded)}
    for p, kind in sorted(at.items()):
        what = SPECIAL_NAMES.get(kind, "special file")
        i = listed.get(p)
        if i is not None:
            d = out.discarded[i]
            out.discarded[i] = Discarded(d.path, d.was, d.op, what)
        else:
            dec = plan.decisions.get(p)
            was = str(dec.state) if dec is not None and dec.state is not None else "unverified"
            out.discarded.append(Discarded(p, was, "restored", what))
    for p, kind in sorted(above.items()):
        out.discarded.append(Discarded(p, "not-writable", "replaced",
                                       SPECIAL_NAMES.get(kind, "special file")))


def _still_blocked(out: SyncPlan, plan: PassPlan, observation: Observed,
                   store_view: Mapping[str, Content], path: str,
                   specials: Mapping[str, str]) -> None:
    """A path sync takes disk under its path; a type change whose blocking entry lies outside
    that path (the store keeps a file, or the workspace a symlink, above it) still cannot be
    taken: drop it from the take. What a sync puts: text taken in, and (taken as ABSENT while
    disk holds a file) disk-only."""
    puts = [p for p, t in out.take.items()
            if isinstance(t, Content) or isinstance(observation.disk(p), Content)]
    if not puts:
        return

    def kept(p: str) -> bool:
        if p in specials:
            return not _under(p, path)  # named: the take replaces it (_replacing)
        if p not in store_view or out.take.get(p) is ABSENT:
            return False
        dec = plan.decisions.get(p)
        return dec is None or not _removes(dec)

    blocked = _blocked(puts, kept, sorted(store_view))
    for t in blocked:
        out.take.pop(t, None)
        out.record.pop(t, None)
        out.record_modes.pop(t, None)
        if t in out.clear_intent:
            out.clear_intent.remove(t)
    if blocked:  # nothing given up where nothing is taken
        out.discarded = [d for d in out.discarded if d.path not in blocked]


# --- status --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwedCounts:
    pending_changes: int
    pending_workspace_deletions: int
    conflicts: int
    not_carried: int = 0  # changes no materialize carries (links, specials): not owed


def count_owed(
    store_view: Mapping[str, Content],
    evidence: EvidenceMap,
    intent: IntentTable,
    pending: Mapping[str, Pending] | None = None,
    modes: Mapping[str, int] | None = None,
    unwritable: Collection[str] = (),
) -> OwedCounts:
    """What disk owes by the evidence alone (no disk read): drafts (store differs from P, P
    known; or a workspace-created file), pending writes, workspace deletions disk has not
    confirmed, conflicts. An entry never checked against disk (no P, no origin) is left out
    until a listing or a materialize checks it. A change at an `unwritable` path (a hard
    link, a symlink or special file of the workspace: plan_materialize skips it, forced or
    not) is counted `not_carried`, not owed: no materialize pays it, so "disk owes" would never
    reach 0. That includes a workspace deletion there (`ln -sf` over a synced file: disk's file
    stays while the link does)."""
    pending = pending or {}
    changes = deletions = conflicts = not_carried = 0
    marked = None if intent.damaged else intent.entries
    paths = set(store_view)
    paths.update(evidence)
    paths.update(intent)
    paths.update(pending)
    for path in paths:
        pi = NO_INTENT if marked is not None and path not in marked else intent.get(path)
        if pi.conflict is not None or pi.damaged:
            conflicts += int(pi.conflict is not None)
            continue
        pend = pending.get(path)
        s = store_view.get(path, ABSENT)
        p = evidence.get(path, NO_EVIDENCE)
        if pend is not None and pend.op == "unlink":
            deletions += 1
            continue
        if pend is not None and pend.op == "write":
            change = True
        elif s is ABSENT:
            if pi.tombstone and p is not NO_EVIDENCE and p is not ABSENT:
                if path in unwritable:
                    not_carried += 1
                else:
                    deletions += 1
            continue
        elif p is NO_EVIDENCE:
            change = pi.origin_store
        else:
            # content, or the workspace changed its mode only
            change = p != s.digest or bool(modes and s.mode is not None
                                            and modes.get(path, s.mode) != s.mode)
        if change and path in unwritable:
            not_carried += 1
        elif change:
            changes += 1
    return OwedCounts(changes, deletions, conflicts, not_carried)
