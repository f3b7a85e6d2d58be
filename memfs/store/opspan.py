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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memfs.store.history import LoggedCommit, OpRecord

Get = Callable[[int], LoggedCommit | None]


@dataclass(frozen=True)
class Span:
    """The consecutive commits of one operation, newest first."""

    commits: tuple[LoggedCommit, ...]
    op: OpRecord | None  # None: a commit made before operations were recorded
    whole_group: bool  # the unit was the process group (not one command in it)

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
        for c in self.commits:
            for o in c.ops or ():
                if not self._mine(o):
                    seen.setdefault(o.label)
        return list(seen)

    def owns(self, o: OpRecord) -> bool:
        """Is `o` a change of this operation (its group, or its command)?"""
        return self._mine(o)

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


def spans(get: Get, count: int, start: int = 0) -> list[Span]:
    """Up to `count` operations from commit `start` back, newest first. A commit with no
    parent (the store's first) is never part of one: there is nothing before it."""
    out: list[Span] = []
    runs: dict[str, tuple[int, bool]] = {}
    i = start
    while len(out) < count:
        s = span_at(get, i, runs)
        if s is None:
            break
        if s.commits[-1].parent is None:
            s = _without_root(s)
            if s is None:
                break
        out.append(s)
        i += len(s.commits)
    return out


def _without_root(s: Span) -> Span | None:
    kept = tuple(c for c in s.commits if c.parent is not None)
    return Span(kept, s.op, s.whole_group) if kept else None
