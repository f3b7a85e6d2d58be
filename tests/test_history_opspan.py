"""The operation rule (memfs.store.opspan) as a table: which consecutive commits one `memfs
undo` takes, for the shapes of process trees people and agents make."""

from __future__ import annotations

import pytest

from memfs.store.history import LoggedCommit, OpRecord
from memfs.store.opspan import span_at, spans
from memfs.store.store import Commit


def op(group: str, command: str = "top", *, shell: bool = False, kind: str = "process",
       label: str | None = None) -> OpRecord:
    return OpRecord(kind, f"{group}/{command}", group, command, label or f"{group}/{command}",
                    label or f"{group} leader", top_self=command == "top", top_shell=shell)


def history(*commits: tuple[OpRecord, ...] | None) -> list[LoggedCommit]:
    """Newest first; the last one is the store's first commit (no parent)."""
    out = []
    n = len(commits)
    for i, ops in enumerate(commits):
        cid = f"c{n - i:03d}"
        parent = f"c{n - i - 1:03d}" if i < n - 1 else None
        out.append(LoggedCommit(Commit(cid, n - i, parent, "t", "main", n - i, "msg", []),
                                tuple(ops) if ops is not None else None))
    return out


def taken(commits: list[LoggedCommit], start: int = 0) -> list[str]:
    s = span_at(lambda i: commits[i] if i < len(commits) else None, start)
    assert s is not None
    return [c.id for c in s.commits]


GIT = op("git-group")  # a job-control `git commit`: git is the group's top and writes itself
HOOK = op("git-group", "hook@1")  # its hook, a child of git
BASH = "script-group"  # a script: bash is the top, each command a child


@pytest.mark.parametrize("name, commits, expected", [
    ("a program with its children is one operation",
     [(GIT,), (HOOK,), (GIT,), (op("other"),)], ["c004", "c003", "c002"]),
    ("the group's child wrote first: still the program's operation",
     [(GIT,), (HOOK,), (op("other"),)], ["c003", "c002"]),
    ("a script's last command, not the whole script",
     [(op(BASH, "git-commit@9", shell=True),), (op(BASH, "git-commit@9", shell=True),),
      (op(BASH, "git-add@8", shell=True),), (op(BASH, shell=True),), (None)],
     ["c005", "c004"]),
    ("a shell's own changes (echo > f) are an operation of their own",
     [(op(BASH, shell=True),), (op(BASH, "git-add@8", shell=True),), (None)], ["c003"]),
    ("a runner that never wrote itself: one tool call",
     [(op("runner", "sh@5"),), (op("runner", "sh@4"),), (op("runner", "sh@4"),)], ["c003"]),
    ("a runner that writes itself becomes one operation (marks split it)",
     [(op("runner", "sh@5"),), (op("runner"),), (op("runner", "sh@4"),), (op("x"),)],
     ["c004", "c003", "c002"]),
    ("a mark starts a new group epoch",
     [(op("runner#1"),), (op("runner#0"),)], ["c002"]),
    ("a commit shared with another operation is taken whole",
     [(op("a"),), (op("b"), op("a")), (op("b"),)], ["c003", "c002"]),
    ("the last change names the operation",
     [(op("a"), op("b")), (op("b"),), (op("a"),)], ["c003", "c002"]),
    ("reconciler passes are one operation each",
     [(op("rec:2", "", kind="reconciler"),), (op("rec:1", "", kind="reconciler"),)], ["c002"]),
    ("a commit from before operations were recorded is one operation",
     [None, None, None], ["c003"]),
])
def test_the_rule(name: str, commits: list, expected: list[str]) -> None:
    assert taken(history(*commits)) == expected, name


def test_spans_walk_back_and_never_take_the_first_commit() -> None:
    commits = history((op("b"),), (op("a"),), (op("a"),), (op("init"),))
    got = spans(lambda i: commits[i] if i < len(commits) else None, 5)
    assert [[c.id for c in s.commits] for s in got] == [["c004"], ["c003", "c002"]]
    assert got[-1].target == "c001"


def test_a_long_runner_run_is_read_once_per_walk() -> None:
    """log --ops over one runner group of many commands: each commit is read a bounded
    number of times, not once per command."""
    commits = history(*[(op("runner", f"sh@{i}"),) for i in range(2000, 0, -1)], (op("z"),))
    reads = []

    def get(i: int):
        reads.append(i)
        return commits[i] if i < len(commits) else None

    got = spans(get, 2000)
    assert len(got) == 2000
    assert len(reads) < 6 * len(commits), f"{len(reads)} reads for {len(commits)} commits"


def test_others_names_the_operation_sharing_a_commit() -> None:
    commits = history((op("a", label="vim notes"), op("b", label="git commit")), (op("c"),))
    s = span_at(lambda i: commits[i] if i < len(commits) else None, 0)
    assert s.label == "git commit" and s.others == ["vim notes"]


def test_operations_that_changed_only_times_go_with_the_one_before() -> None:
    """`git status` between commands: its commits go with the operation before it; at the
    newest end of history with nothing before it, it stands alone; legacy commits never
    fold."""
    commits = history((op("status2"),), (op("status1"),), (GIT,), (HOOK,), (op("add"),),
                      (op("status0"),), None, None)
    quiet_groups = {"status0", "status1", "status2"}
    get = lambda i: commits[i] if i < len(commits) else None  # noqa: E731

    def quiet(s) -> bool:
        return s.op is None or s.op.group in quiet_groups  # None: must not be asked to fold

    got = spans(get, 10, quiet=quiet)
    assert [[c.id for c in s.commits] for s in got] == [
        ["c008", "c007", "c006", "c005"], ["c004"], ["c003", "c002"]]
    assert got[0].quiet == ("status2 leader", "status1 leader") and got[0].n_quiet == 2
    assert got[0].label == "git-group leader" and got[0].others == []
    assert got[1].quiet == () and got[2].quiet == ("status0 leader",)
    alone = history((op("status1"),), (op("status0"),), None)
    got = spans(lambda i: alone[i] if i < len(alone) else None, 5, quiet=quiet)
    assert [([c.id for c in s.commits], s.label) for s in got] == [
        (["c003"], "status1 leader"), (["c002"], "status0 leader")]
