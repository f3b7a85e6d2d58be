"""What one operation is, read back from the commits: the rule `memfs undo` and `log --ops`
share. Pure: it reads commit records through `get(i)` (newest first) and nothing else.

The rule (docs/guarantees.md, "What an operation is"):
- The last change of the newest commit names the operation O.
- The commits of O's process group are the run of consecutive commits holding a change of
  that group (same session, group, top process and mark epoch).
- If the group's top process is a program that changed files itself (git, tar, an editor;
  not a shell), the whole run is one operation: a `git commit` with its hooks and children.
- Otherwise the top is a runner (a shell running a script, a terminal's shell, an agent's
  runner starting one shell per tool call): each command it started is an operation, and the
  run is cut to the consecutive commits of O's command.
- A commit made before operations were recorded is an operation of its own. A commit that
  also holds another operation's changes (two commands writing at once) is taken whole:
  undo cannot split a commit.
- An operation that changed only times (no path, byte, mode or owner: `git status` takes
  .git/index.lock and drops it, or rewrites the index with the same bytes) is no undo of its
  own: it is taken with the operation before it, so `memfs undo` after a `git status`
  still takes back the command before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from memfs.store.history import LoggedCommit, OpRecord

Get = Callable[[int], LoggedCommit | None]
Quiet = Callable[["Span"], bool]  # did this operation change only times?


@dataclass(frozen=True)
class Span:
    """The consecutive commits of one operation, newest first."""

    commits: tuple[LoggedCommit, ...]
    op: OpRecord | None  # None: a commit made before operations were recorded
    whole_group: bool  # the unit was the process group (not one command in it)
    quiet: tuple[str, ...] = ()  # later operations that changed only times, taken with it
    n_quiet: int = 0  # how many of `commits` (the newest) are theirs

    @property
    def label(self) -> str:
        if self.op is None:
            return self.commits[0].commit.message
        if self.whole_group and self.op.leader:
            return self.op.leader
        return self.op.label

    @property
    def target(self) -> str | None:
        """The commit before the operation: where undoing it goes."""
        return self.commits[-1].parent

    @property
    def others(self) -> list[str]:
        """Labels of other operations whose changes share these commits (taken with them)."""
        seen: dict[str, None] = {}
        for c in self.commits[self.n_quiet:]:
            for o in c.ops or ():
                if not self._mine(o):
                    seen.setdefault(o.label)
        return list(seen)

    @property
    def set_times(self) -> bool:
        """Did this operation set a time on purpose (touch) in any of its commits?"""
        return any(o.set_times and self._mine(o) for c in self.commits for o in c.ops or ())

    def _mine(self, o: OpRecord) -> bool:
        if self.op is None:
            return False
        return o.group == self.op.group if self.whole_group else o.key == self.op.key


def span_at(get: Get, start: int, runs: dict[str, tuple[int, bool]] | None = None) -> Span | None:
    """The operation whose last commit is commit `start` (0 = the head). `runs` remembers,
    per group, where its run ends and whether it is one operation, for a caller walking
    forward through one long run (a runner's hundreds of commands are read once)."""
    head = get(start)
    if head is None:
        return None
    op = head.op
    if op is None:
        return Span((head,), None, False)
    known = runs.get(op.group) if runs is not None else None
    if known is not None and known[0] > start:
        end, whole = known
    else:
        end, whole = _run(get, start, op)
        if runs is not None:
            runs[op.group] = (end, whole)
    if whole:
        return Span(tuple(get(i) for i in range(start, end)), op, True)  # type: ignore[misc]
    mine = []
    for i in range(start, end):
        c = get(i)
        if c is None or not any(o.key == op.key for o in c.ops or ()):
            break
        mine.append(c)
    return Span(tuple(mine), op, False)


def _run(get: Get, start: int, op: OpRecord) -> tuple[int, bool]:
    """End (exclusive) of the run of commits holding changes of op's group, and whether the
    group is one operation (its top is a program that changed files itself)."""
    i, whole = start, False
    while (c := get(i)) is not None and c.ops and any(o.group == op.group for o in c.ops):
        whole = whole or (op.kind == "process" and any(
            o.top_self and not o.top_shell for o in c.ops if o.group == op.group))
        i += 1
    return i, whole


def walk(get: Get, start: int = 0, quiet: Quiet | None = None) -> Iterator[Span]:
    """Operations from commit `start` back, newest first, as successive undos take them:
    with `quiet`, each run of operations that changed only times is taken with the operation
    before it (none before it but the store's first commit: each stands alone). A commit
    made before operations were recorded is never quiet."""
    runs: dict[str, tuple[int, bool]] = {}
    i = start
    held: list[Span] = []  # quiet operations waiting for the one before them
    while (s := span_at(get, i, runs)) is not None:
        i += len(s.commits)
        if quiet is not None and s.op is not None and s.commits[-1].parent is not None \
                and quiet(s):
            held.append(s)
            continue
        if held and s.commits[0].parent is None:  # only the store's first: nothing to undo
            yield from held
        elif held:
            s = _with_quiet(s, held)
        yield s
        held = []
    yield from held


def _with_quiet(s: Span, held: list[Span]) -> Span:
    commits = tuple(c for h in held for c in h.commits)
    return replace(s, commits=commits + s.commits, quiet=tuple(h.label for h in held),
                   n_quiet=len(commits))


def spans(get: Get, count: int, start: int = 0, quiet: Quiet | None = None) -> list[Span]:
    """Up to `count` operations from commit `start` back, newest first (walk's). A commit
    with no parent (the store's first) is never part of one: there is nothing before it."""
    out: list[Span] = []
    if count < 1:
        return out
    for s in walk(get, start, quiet):
        if s.commits[-1].parent is None:
            s = _without_root(s)
            if s is None:
                break
        out.append(s)
        if len(out) >= count:
            break
    return out


def _without_root(s: Span) -> Span | None:
    kept = tuple(c for c in s.commits if c.parent is not None)
    return replace(s, commits=kept, n_quiet=min(s.n_quiet, len(kept))) if kept else None
