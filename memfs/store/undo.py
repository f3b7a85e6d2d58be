"""Where an undo goes: the last N operations, the last N commits, or back to a moment.

A plan only reads; the caller moves the head (Store.reset_head, with the plan's reason in
the reflog) and shows the tree. The workspace plans under its commit lock after committing
what is pending; the CLI without a daemon plans on the store directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memfs.store.backend import StoreBackend as Store
from memfs.store.history import History, LoggedCommit, find_point
from memfs.store.opspan import Quiet, Span, spans
from memfs.store.store import CommitDropped, StoreError
from memfs.store.treediff import commit_state, only_times

NOTHING = "there is nothing before the store's first commit"


@dataclass(frozen=True)
class UndoPlan:
    target: str  # the commit the head moves to
    old_head: str  # the head before: `memfs restore <old_head>` goes back
    commits: int  # how many commits of the head's history are left behind
    what: list[str] = field(default_factory=list)  # the operations undone, newest first
    others: list[str] = field(default_factory=list)  # other operations sharing those commits
    reason: str = ""  # for the reflog
    quiet: list[str] = field(default_factory=list)  # taken along: they changed only times
    # The processes whose changes were undone, as (pid, comm): the command checks which
    # still run (one that goes on writing does so to files the undo replaced).
    procs: list[tuple[int, str]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"head": self.target, "old_head": self.old_head, "commits": self.commits,
                "undone": self.what, "also": self.others, "quiet": self.quiet,
                "reason": self.reason, "procs": [list(p) for p in self.procs]}


def changed_only_times(store: Store) -> Quiet:
    """opspan's test for an operation that changed times at most (`git status`) without
    setting one on purpose (a `touch` is a change the user asked for)."""
    def quiet(s: Span) -> bool:
        if s.set_times:
            return False
        try:
            before = commit_state(store, s.target)
        except CommitDropped:  # the state before it is gone: no telling, so it counts
            return False
        return only_times(store, before, commit_state(store, s.commits[0].id))
    return quiet


def plan_operations(store: Store, head: str, count: int = 1, *,
                    disk_too: bool = False) -> UndoPlan:
    if count < 1:
        raise StoreError("undo takes a positive number of operations", "e.g. memfs undo 2")
    hist = History(store, head)
    got = spans(hist.get, count, quiet=changed_only_times(store))
    if not got:
        raise StoreError("nothing to undo: " + NOTHING, "make a change first")
    if len(got) < count:
        raise StoreError(f"only {len(got)} operation(s) to undo, not {count}",
                         f"memfs undo {len(got)} goes back to the first commit")
    _refuse_disk_edits([c for s in got for c in s.commits], disk_too)
    n = sum(len(s.commits) for s in got)
    target = got[-1].target
    assert target is not None  # spans() never takes the store's first commit
    target, dropped = _over_gaps(store, hist, got, target)
    n += dropped
    store.commit(target)  # a commit no longer kept is refused here, before the head moves
    what = [s.label for s in got]
    others = [o for s in got for o in s.others if o not in what]
    quiet = [q for s in got for q in s.quiet]
    label = what[0] if count == 1 else f"{count} operations"
    procs = list(dict.fromkeys((p.pid, p.comm) for s in got for c in s.commits
                               for o in c.ops or () if s.owns(o) for p in o.pids))
    return UndoPlan(target, head, n, what, others, f"undo {label} ({n} commit{_s(n)})", quiet,
                    procs)


def _over_gaps(store: Store, hist: History, got: list[Span], target: str) -> tuple[str, int]:
    """Where undoing `got` goes when the retention policy dropped commits among or below
    them, and how many dropped commits that takes back too. A gap whose commits are all
    recorded as changes of the operations undone is taken with them (the target is the kept
    commit below it); any other gap holds changes of another operation, or of no recorded
    one: the undo is refused, by name, and nothing moves."""
    commits = [c for s in got for c in s.commits]
    dropped = 0
    for c in commits:
        gap = hist.gap_below(c.id)
        if gap is None:
            continue
        ours = not gap.unrecorded and all(any(s.owns(o) for s in got) for o in gap.ops)
        if c is commits[-1] and ours and gap.below is not None:
            return gap.below, dropped + len(gap.commits)
        if c is commits[-1]:
            return target, dropped  # Store.commit refuses it by name (CommitDropped)
        if not ours:
            others = ", ".join(f"`{x}`" for x in gap.labels if x) or "changes not recorded"
            raise StoreError(
                f"undoing {' and '.join(f'`{s.label}`' for s in got)} would also take back "
                f"{len(gap.commits)} commit(s) between them that the retention policy dropped "
                f"({gap.reason}), holding {others}",
                "undo fewer operations, or `memfs undo --to REV` to a kept commit "
                "(`memfs log` shows the gap)")
        dropped += len(gap.commits)
    return target, dropped


def plan_commits(store: Store, head: str, count: int, *, disk_too: bool = False) -> UndoPlan:
    if count < 1:
        raise StoreError("undo takes a positive number of commits", "e.g. memfs undo --commits 2")
    # N parents back, each one: a commit the retention policy dropped on the way is refused
    # by name (History steps over a gap, which made `--commits 1` take a whole gap back).
    target = store.resolve(f"{head}~{count}")
    hist = History(store, head)
    undone = [c for c in (hist.get(i) for i in range(count)) if c is not None]
    _refuse_disk_edits(undone, disk_too)
    what = [c.commit.message for c in undone]
    return UndoPlan(target, head, count, what, [], f"undo {count} commit{_s(count)}",
                    procs=_procs_of(undone))


def plan_to(store: Store, head: str, where: str, *, disk_too: bool = False) -> UndoPlan:
    point = find_point(store, where, head)
    hist = History(store, head)
    n = None
    for i, c in enumerate(hist):
        if c.id == point.commit:
            n = i
            break
    if n is None:
        raise StoreError(f"{where} ({point.commit[:12]}) is not in this branch's history",
                         f"`memfs restore {where}` moves the branch there anyway")
    undone = [c for c in (hist.get(i) for i in range(n)) if c is not None]
    _refuse_disk_edits(undone, disk_too)
    what = [c.commit.message for c in undone]
    return UndoPlan(point.commit, head, n, what, [], f"undo --to {where}",
                    procs=_procs_of(undone))


def _procs_of(commits: list[LoggedCommit]) -> list[tuple[int, str]]:
    """The processes recorded in `commits`, as (pid, comm), each once, newest first."""
    return list(dict.fromkeys((p.pid, p.comm) for c in commits for o in c.ops or ()
                              for p in o.pids))


def procs_left_behind(store: Store, old: str, new: str) -> list[tuple[int, str]]:
    """The processes, as (pid, comm), recorded in the commits `old`'s history has and
    `new`'s lacks: whose changes a move of the tree from `old` to `new` (a restore, a branch
    switch) takes out of it, as an undo's plan names the processes of what it undoes. The
    two first-parent histories are walked newest first by seq (a parent's is always lower)
    down to where they meet, so this reads the commits on both sides since the fork: none
    for a move to the same commit, as many as `undo --to` reads for the same distance.
    Commits the retention policy dropped are not read (their processes are a day old)."""
    if old == new:
        return []
    mine, theirs = History(store, old), History(store, new)
    i = j = 0
    a, b = mine.get(0), theirs.get(0)
    procs: dict[tuple[int, str], None] = {}
    while a is not None and (b is None or a.id != b.id):
        if b is not None and b.commit.seq > a.commit.seq:  # only `new`'s: not left behind
            j += 1
            b = theirs.get(j)
            continue
        for o in a.ops or ():
            procs.update(((p.pid, p.comm), None) for p in o.pids)
        i += 1
        a = mine.get(i)
    return list(procs)


def _refuse_disk_edits(commits: list[LoggedCommit], disk_too: bool) -> None:
    """An undo that would take back edits made in a bound directory (a reconciler pass took
    them in) is refused unless asked for: the store's older copies would be drafts that
    `memfs materialize` writes over the person's own edits on disk. An agent that runs
    `memfs undo` for its last command would otherwise undo a save made meanwhile on disk."""
    if disk_too:
        return
    passes = list(dict.fromkeys(o.label for c in commits for o in c.ops or ()
                                if o.kind == "reconciler"))
    if passes:
        raise StoreError(
            f"this undo would take back edits made on disk in a bound directory and taken in "
            f"by {', '.join(f'`{p}`' for p in passes)}; their older copies would become "
            f"drafts that `memfs materialize` writes over those edits on disk",
            "`memfs log --ops` shows what came after the command you meant; to take the "
            "disk's edits back too, say so: memfs undo --disk-too (same arguments)")


def _s(n: int) -> str:
    return "" if n == 1 else "s"
