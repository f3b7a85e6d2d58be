"""Materialize's contract over one pass, pure: which workspace changes are written to disk,
which disk files are unlinked, and which are refused, each with the remedy that fits.

Split from memfs.reconcile.plan (which decides a pass) because materialize is its own
contract: it takes up only what the evidence says disk owes, never deletes without
apply_deletions, and overwrites a copy without evidence only when named and forced. Tested as
tables without disks or clocks (tests/test_reconcile_plan.py and the write-ahead tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memfs.reconcile.plan import Observed, PassPlan, _under
from memfs.reconcile.rule import (
    ABSENT,
    SYNCED_UNCHANGED,
    Decision,
    Detail,
    DiskUnknown,
    State,
    _Absent,
)


@dataclass(frozen=True, slots=True)
class Write:
    path: str
    expected: str | _Absent  # disk as the decision saw it
    force: bool  # skip the effect's freshness check (a named, forced path only)
    after_unlinks: bool = False  # below a disk file this plan unlinks (a file made a directory)
    mode: int | None = None  # the permission bits to write (None: keep disk's, or 0o644)


@dataclass(frozen=True, slots=True)
class Unlink:
    path: str
    expected: str
    force: bool


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    state: str
    reason: str
    remedy: str


@dataclass
class MaterializePlan:
    writes: list[Write] = field(default_factory=list)
    unlinks: list[Unlink] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    deletions_left: list[str] = field(default_factory=list)
    refused: str | None = None


def _named(path: str, paths: Sequence[str] | None) -> bool:
    return bool(paths) and any(_under(path, n) for n in paths or ())


def plan_materialize(
    plan: PassPlan,
    observation: Observed,
    *,
    paths: Sequence[str] | None = None,
    force: bool = False,
    apply_deletions: bool = False,
    pinned_branch: str | None = None,
    mount: str = "",
    unwritable: Mapping[str, str] | None = None,
) -> MaterializePlan:
    """Materialize's contract over one pass (decided on the branch it selects, in the same turn).

    Takes up only what the decisions say disk owes; a bare call never overwrites a copy without
    evidence and never writes a pre-evidence entry disk lacks; force counts only for named
    paths; nothing is deleted without apply_deletions; every refusal is listed with its remedy.
    A mount pinned to another branch is refused unless forced. `mount` prefixes the paths
    the remedies name, so each is a command that works as written. `unwritable`: paths of the
    store that no write can put on disk as they are (a hard link, a FIFO, a device), with why:
    each is listed in `skipped` (forced or not) and nothing is written there.
    """
    out = MaterializePlan()
    if pinned_branch is not None and plan.branch != pinned_branch and not force:
        out.refused = (f"disk holds branch {pinned_branch!r} (last materialized); "
                       f"{plan.branch!r} diverges from it")
        return out
    unwritable = unwritable or {}
    for p, why in sorted(unwritable.items()):
        if not paths or _named(p, paths):
            dec = plan.decisions.get(p)
            out.skipped.append(Skipped(p, "not-writable", why, replaced_file_remedy(mount, p)
                                       if dec is not None and dec.state == State.WORKSPACE_DELETED
                                       else _NOT_WRITABLE_REMEDY))
    for p, dec in sorted(plan.decisions.items()):
        if dec is SYNCED_UNCHANGED or (paths and not _named(p, paths)) or p in unwritable:
            continue  # disk owes nothing where it agrees
        named = _named(p, paths)
        if dec.state == State.UNVERIFIED:
            out.skipped.append(Skipped(p, "unverified", dec.reason, _LINK_REMEDY
                                       if "symlink" in (dec.reason or "") else _UNREAD_REMEDY))
            continue
        if dec.owes is None:
            continue
        need = set(dec.requires)
        have = {"apply_deletions"} if apply_deletions else set()
        if named:
            have.add("named")
            if force:
                have.add("force")
        if dec.owes == "unlink" and "apply_deletions" not in have:
            out.deletions_left.append(p)
            continue
        if not need <= have:
            out.skipped.append(_skip(p, dec, need - have, mount))
            continue
        d = observation.disk(p)
        if isinstance(d, DiskUnknown):  # pragma: no cover - the rule already said unverified
            continue
        if dec.owes == "write":
            unlinked = {u.path for u in out.unlinks}  # ancestors sort first: decided already
            clash = _write_clash(p, observation, mount, unlinked)
            if clash == "after-unlinks":
                out.writes.append(Write(p, ABSENT, False, after_unlinks=True, mode=dec.mode))
                continue
            if clash is not None:
                out.skipped.append(Skipped(p, "conflict: type-changed", *clash))
                continue
        expected: str | _Absent = ABSENT if d is ABSENT else (d.digest or "")
        effect_force = "force" in need or (named and force)
        if dec.owes == "write":
            out.writes.append(Write(p, expected, effect_force, mode=dec.mode))
        elif d is not ABSENT:
            out.unlinks.append(Unlink(p, expected, effect_force))  # type: ignore[arg-type]
        elif dec.detail == Detail.PENDING_WRITE_SEEN:
            out.unlinks.append(Unlink(p, "", False))  # already gone: completes with barriers
    return out


_UNREAD_REMEDY = ("make the path readable (or fix the branch intent with a sync of the "
                  "path), then materialize again")
_LINK_REMEDY = ("disk has a symlink there, which memfs never writes through: rename or "
                "remove the link on disk, or give the file another name in the mount, then "
                "materialize again")
def replaced_file_remedy(mount: str, rel: str) -> str:
    """The ways out where the workspace put a symlink or special file over a file disk still
    has (`ln -sf` over a synced file): each ends with nothing owed. (Making the same link on
    disk does not: disk's link is not read, so the path would list unverified.)"""
    path = f"{mount}/{rel}" if mount else rel
    return (f"disk keeps its file while this stands in the workspace: `memfs sync {path}` takes "
            "disk's file back in its place, removing disk's file keeps the workspace's, or "
            "remove it in the mount and `memfs materialize --apply-deletions`")


_NOT_WRITABLE_REMEDY = ("it stays in the workspace (kept with its links or type); to put its "
                        "content on disk, copy it to a plain file in the mount and materialize "
                        "that")


def _write_clash(rel: str, observation: Observed, mount: str, unlinked: set[str],
                 ) -> tuple[str, str] | str | None:
    """(reason, remedy) when disk's structure cannot take a file at rel: disk holds a file
    at an ancestor (the workspace made a directory there), or a directory at rel (with files
    in it: an empty one is refused by the effect itself, saying so). Neither is forced over:
    writing would first have to remove what disk holds, which no materialize does unasked.
    "after-unlinks": the ancestor file is one this plan unlinks (--apply-deletions of the
    workspace's own type change): the write goes after the unlinks."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        above = "/".join(parts[:i])
        if above in unlinked:
            return "after-unlinks"
        if above in observation.files:
            where = f"{mount}/{above}" if mount else above
            return (f"disk holds a file at {above!r}, where the workspace has a directory",
                    f"`memfs sync {where}` takes disk's file (the workspace's {above}/ is "
                    "discarded); if the workspace deleted that file, `memfs materialize "
                    f"--apply-deletions {where}` removes it first; or move it away on disk "
                    "and materialize again")
    listed = getattr(observation, "listed", ())
    if rel in listed:
        where = f"{mount}/{rel}" if mount else rel
        return (f"disk holds a directory at {rel!r}, where the workspace has a file",
                f"`memfs sync {where}` takes disk's directory (the workspace's file is "
                "discarded), or move that directory away on disk and materialize again")
    return None


def _skip(rel: str, dec: Decision, missing: set[str], mount: str = "") -> Skipped:
    path = f"{mount}/{rel}" if mount else rel
    state = str(dec.state)
    if dec.conflict is not None:
        state = f"conflict: {dec.conflict}"
        remedy = (f"`memfs sync {path}` takes disk's copy; `memfs materialize --force {path}` "
                  "writes the workspace's")
    elif dec.state == State.DISK_MISSING_PROVENANCE_UNKNOWN:
        remedy = (f"nothing records whether disk ever had it: `memfs materialize {path}` writes "
                  f"it, `memfs sync {path}` drops it from the workspace")
    elif dec.state == State.WORKSPACE_DELETED:
        remedy = (f"disk's copy has no evidence: `memfs materialize --apply-deletions --force "
                  f"{path}` removes it, `memfs sync {path}` restores it")
    else:
        remedy = f"name the path ({', '.join(sorted(missing))}): `memfs materialize {path}`"
    return Skipped(rel, state, dec.reason, remedy)
