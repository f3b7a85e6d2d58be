"""Write-ahead: the journal's intents around each effect and each adoption.

Why: a crash between deciding and finishing must never lose either side's work. So an intent
carrying the expected old value is durable before each disk write or unlink and before each
adoption into the tree; completion (and with it the new P) is recorded only once the effect is
durable. A pending intent is resolved at its next observation by the rule (done, not done, or
touched by someone else → an interrupted conflict); `settle` applies that resolution.

The journal is memfs.store.journal.Journal; this module only calls its methods, so it keeps
the one-way imports (reconcile never imports the workspace or the FUSE layer).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Protocol, TypeVar

from memfs.errors import MemfsError
from memfs.reconcile.contained import Refused, RootId, RootUnavailable
from memfs.reconcile.effects import (
    EffectFailed,
    Written,
    remove_empty_dir,
    unlink_file,
    write_file,
)
from memfs.reconcile.materialize_plan import MaterializePlan
from memfs.reconcile.rule import ABSENT, Decision, Pending, _Absent
from memfs.testing import crash_point

T = TypeVar("T")


class JournalLike(Protocol):
    def begin_intent(self, mount: str, path: str, op: Literal["write", "unlink", "adopt"], *,
                     old: str | None, new: str | None, branch: str | None = None,
                     root: tuple[int, int] | None = None, prior: str | None | bool = False,
                     mode: int | None = None) -> int: ...
    def complete_intent(self, intent_id: int) -> None: ...
    def abandon_intent(self, intent_id: int) -> None: ...
    def pending_intents(self, mount: str, path: str | None = None) -> list: ...  # type: ignore[type-arg]


def _col(v: str | _Absent) -> str | None:
    return None if v is ABSENT else v  # type: ignore[return-value]


def push_write(
    journal: JournalLike, mount: str, root_path: str | os.PathLike[str], root: RootId, rel: str,
    data: bytes | Iterable[bytes], *, new_digest: str, expected: str | _Absent,
    force: bool = False, branch: str | None = None, mode: int | None = None,
    dir_modes: Mapping[str, int] | None = None,
) -> Written:
    """Intent, effect, completion. A refusal that touched nothing abandons the intent (P stays as
    it was); a failure after the rename leaves it pending, so the path stays owed. `mode`: the
    permission bits written, recorded in P with the digest on completion; `dir_modes`: those
    of the directories the write makes (write_file)."""
    iid = journal.begin_intent(mount, rel, "write", old=_col(expected), new=new_digest,
                               branch=branch, root=(root.dev, root.ino), mode=mode)
    written = _effect(journal, iid, partial(write_file, root_path, rel, data, root=root,
                                            expected=expected, force=force, mode=mode,
                                            dir_modes=dir_modes))
    if written.digest != new_digest:
        journal.abandon_intent(iid)
        raise Refused(f"{rel}: the bytes written are not the ones the intent named",
                      "retry the materialize", reason="digest-mismatch", touched=True)
    journal.complete_intent(iid)
    return written


def push_unlink(
    journal: JournalLike, mount: str, root_path: str | os.PathLike[str], root: RootId, rel: str,
    *, expected: str, force: bool = False, branch: str | None = None,
) -> bool:
    """Intent, unlink, completion (P := absent)."""
    iid = journal.begin_intent(mount, rel, "unlink", old=expected, new=None, branch=branch,
                               root=(root.dev, root.ino))
    removed = _effect(journal, iid, partial(unlink_file, root_path, rel, root=root,
                                            expected=expected, force=force))
    journal.complete_intent(iid)
    return removed


def _effect(journal: JournalLike, iid: int, effect: Callable[[], T]) -> T:
    """An effect after its intent: a refusal that touched nothing abandons the intent (disk
    is unchanged); a failure after it touched disk leaves the intent pending, to be settled."""
    crash_point("apply:after-intent")
    try:
        result = effect()
    except EffectFailed:
        raise
    except Refused as exc:
        if not exc.touched:
            journal.abandon_intent(iid)
        raise
    crash_point("apply:after-effect")
    return result


def settle(journal: JournalLike, mount: str, decisions: dict[str, Decision],
           decided: Mapping[str, Pending] | None = None) -> dict[str, str]:
    """Apply the rule's resolution of pending intents: done (an adoption that landed) completes;
    not-done and interrupted abandon (an interrupted path's conflict goes into branch intent by
    the caller, from decision.record_conflict). `decided`: the pending intents the decisions
    were made with (PassPlan.pending); exactly those are settled (another branch's intent of
    the same path is not this decision's to settle). Without it, each path's newest intent.
    Returns path -> resolution."""
    settled: dict[str, str] = {}
    intents = journal.pending_intents(mount)
    pending = {i.id: i for i in intents}
    ids = {i.path: i.id for i in intents} if decided is None else \
        {p: pend.id for p, pend in decided.items()}
    for path, dec in decisions.items():
        if dec.resolve_pending is None or path not in ids:
            continue
        intent = pending.get(ids[path])
        if intent is None:
            continue  # settled meanwhile (a change through the mount settles adoptions)
        try:
            if dec.resolve_pending == "done":
                journal.complete_intent(intent.id)
            else:
                journal.abandon_intent(intent.id)
        except MemfsError:
            # A change through the mount may settle an adoption on the loop meanwhile
            # (Backing.settle_before_change), from the tree this decision saw: not a failure.
            if any(p.id == intent.id for p in journal.pending_intents(mount, path)):
                raise
            continue
        settled[path] = dec.resolve_pending
    return settled


@dataclass
class MaterializeResult:
    """What a materialize did: written and removed paths, every refusal with its remedy (the
    plan's and the effects'), the deletions left on disk, and failures that stay owed."""

    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    removed_dirs: list[str] = field(default_factory=list)  # left empty by `removed`
    skipped: list[dict[str, str]] = field(default_factory=list)
    deletions_left: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    refused: str | None = None
    interrupted: str | None = None  # the selection changed mid-push: the rest was not written


def run_materialize(
    journal: JournalLike, mount: str, root_path: str | os.PathLike[str], root: RootId,
    mplan: MaterializePlan, content: Callable[[str], tuple[bytes | Iterable[bytes], str]], *,
    branch: str | None = None, still_selected: Callable[[], bool] = lambda: True,
    dir_modes: Mapping[str, int] | None = None,
    store_dirs: Callable[[Iterable[str]], set[str]] = lambda dirs: set(dirs),
) -> MaterializeResult:
    """Carry out a materialize plan through the write-ahead steps. `content(path)` gives the
    workspace's bytes and their digest; `dir_modes` the permission bits of the workspace's
    directories above the writes, for those disk lacks. A refusal that touched nothing leaves the path owed (its
    P unchanged) and is listed with its remedy; a failure after the rename stays pending.

    `still_selected()` is asked before each effect: once the branch (or tree) the plan was
    made on is no longer selected, the bytes in hand belong to a tree nobody sees, so nothing
    more is written and the rest stays owed (`interrupted`).

    After the unlinks, the directories they left empty go too, deepest first, unless
    `store_dirs(candidates)` (the ones the workspace holds as directories) names them."""
    out = MaterializeResult(deletions_left=list(mplan.deletions_left), refused=mplan.refused)
    out.skipped = [{"path": s.path, "state": s.state, "reason": s.reason, "remedy": s.remedy}
                   for s in mplan.skipped]
    if mplan.refused:
        return out

    def write(w) -> None:
        if not _still(still_selected, out, w.path):
            return
        data, digest = content(w.path)
        _record(out, w.path, out.written, partial(
            push_write, journal, mount, root_path, root, w.path, data, new_digest=digest,
            expected=w.expected, force=w.force, branch=branch, mode=w.mode,
            dir_modes=dir_modes))

    # Writes before unlinks (a move in the workspace: the new name is on disk before the old
    # goes), except a write below a file this plan unlinks, which can only go after it.
    for w in mplan.writes:
        if not w.after_unlinks:
            write(w)
    for u in mplan.unlinks:
        if not _still(still_selected, out, u.path):
            continue
        _record(out, u.path, out.removed, partial(
            push_unlink, journal, mount, root_path, root, u.path, expected=u.expected,
            force=u.force, branch=branch))
    for w in mplan.writes:
        if w.after_unlinks:
            write(w)
    _prune_dirs(out, root_path, root, store_dirs)
    return out


def _prune_dirs(out: MaterializeResult, root_path: str | os.PathLike[str], root: RootId,
                store_dirs: Callable[[Iterable[str]], set[str]]) -> None:
    """rmdir the directories above what `out` removed that are now empty and that the
    workspace does not hold (its empty directories are kept, as a native `rm` keeps them)."""
    if not out.removed or out.interrupted:
        return
    above = {posixpath.dirname(p) for p in out.removed}
    for d in list(above):
        while d:
            above.add(d)
            d = posixpath.dirname(d)
    above.discard("")
    kept = store_dirs(sorted(above))
    for d in sorted(above - kept, key=lambda p: (-p.count("/"), p)):
        try:
            if remove_empty_dir(root_path, d, root=root):
                out.removed_dirs.append(d)
        except (Refused, RootUnavailable):
            return  # the root moved, or a barrier failed: the files' removals stand


def _record(out: MaterializeResult, path: str, done: list[str],
            effect: Callable[[], object]) -> None:
    """Run one write-ahead effect and record how it ended: done, failed after it touched disk
    (it stays pending) or refused (disk unchanged, the path stays owed)."""
    try:
        effect()
        done.append(path)
    except EffectFailed as exc:
        out.failed.append({"path": path, "reason": exc.reason, "message": exc.message,
                           "remedy": exc.remedy})
    except Refused as exc:
        # The disk failing the effect (full, read-only, an I/O error) is an error of the
        # command; memfs declining to write (a changed file, a hard link) is a refusal.
        disk = exc.reason.startswith("os-") or exc.reason == "write-failed"
        out.skipped.append({"path": path, "state": "disk-error" if disk else "refused",
                            "reason": exc.message, "remedy": exc.remedy})


def _still(still_selected: Callable[[], bool], out: MaterializeResult, path: str) -> bool:
    """False (and the path listed as skipped) once the plan's selection is gone."""
    if out.interrupted is None and not still_selected():
        out.interrupted = ("the branch or tree changed during materialize; nothing more was "
                           "written")
    if out.interrupted is None:
        return True
    out.skipped.append({"path": path, "state": "interrupted", "reason": out.interrupted,
                        "remedy": "run `memfs materialize` again on the branch you want on disk"})
    return False
