"""History records kept beside the commits: the operation each commit belongs to, marks,
checkpoint moves, and the queries `log`, `undo` and the `.memfs/history/` views need.

A commit row says what tree a moment had; these records say who made it: one OpRecord per
operation whose changes the group commit holds (normally one), in the order of their last
change. They live in their own table so a commit's identity (its hash) stays what it was.

Threads: `put_ops` runs in the commit thread inside the commit's transaction; checkpoint and
mark writes take the store's writer lock (`Store.transaction`); every read goes through the
store's reader (any thread). The rows themselves are the backend's (its Records methods:
memfs.store.backend), so these rules hold on every backend.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta

from memfs.store.backend import DroppedCommit
from memfs.store.backend import StoreBackend as Store
from memfs.store.store import (
    Commit,
    CommitDropped,
    StoreError,
    UnknownRevision,
    _check_ref_name,
    check_new_name,
)

CHECKPOINT_REF = "checkpoints/"  # reflog rows of checkpoint moves name the ref this way
PAGE = 256  # commits read per query when walking history


@dataclass(frozen=True)
class ProcRef:
    pid: int
    comm: str
    uid: int


@dataclass(frozen=True)
class OpRecord:
    """One operation: what a person or a program did, as the commit keeps it.

    `group` is the process group (with its session, its top process's start and the mark
    epoch, so a reused pid or a `memfs mark` makes a new one); `command` is the process right
    below the group's top on the requester's ancestry, or "top" for the top itself. Whether a
    whole group or one command is the unit `undo` takes is decided from these records
    (memfs.store.opspan), not here.
    """

    kind: str  # "process", "reconciler", "materialize", "attach" or "memfs" (unattributed)
    key: str  # group + command: the finest unit
    group: str
    command: str
    label: str  # what a person reads: the command line, or "reconciler: disk changes in work"
    leader: str = ""  # the group's top process's command line
    pid: int = 0  # the requester (for a commit: its command's or first requester's pid)
    pgid: int = 0
    sid: int = 0
    uid: int = 0
    comm: str = ""
    top_self: bool = False  # made by the group's top process itself
    top_shell: bool = False  # the group's top process is a shell (sh, bash, ...)
    pids: tuple[ProcRef, ...] = ()
    # It set a time on purpose (touch, utimes): a change of times only is then what it did,
    # not a side effect of reading (git status's index refresh), and undo takes it alone.
    set_times: bool = False

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["pids"] = [asdict(p) for p in self.pids]
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> OpRecord:
        known = {f for f in cls.__dataclass_fields__}
        args = {k: v for k, v in doc.items() if k in known}
        args["pids"] = tuple(ProcRef(**p) for p in doc.get("pids") or [])
        return cls(**args)

    def with_pids(self, pids: list[ProcRef]) -> OpRecord:
        return replace(self, pids=tuple(pids))


@dataclass(frozen=True)
class LoggedCommit:
    """A commit with its operations (None: made before operations were recorded) and marks."""

    commit: Commit
    ops: tuple[OpRecord, ...] | None
    marks: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.commit.id

    @property
    def parent(self) -> str | None:
        return self.commit.parent

    @property
    def time_ns(self) -> int:
        return self.commit.time_ns

    @property
    def op(self) -> OpRecord | None:
        """The operation of the commit's last change."""
        return self.ops[-1] if self.ops else None

    def to_json(self) -> dict:
        doc = self.commit.to_json()
        op = self.op
        doc.update({
            "seq": self.commit.seq,
            "operation": op.to_json() if op else None,
            "ops": [o.to_json() for o in self.ops or ()],
            "marks": list(self.marks),
            "pid": op.pid if op else None, "pgid": op.pgid if op else None,
            "sid": op.sid if op else None, "uid": op.uid if op else None,
            "cmdline": op.label if op else None, "kind": op.kind if op else None,
        })
        return doc


@dataclass(frozen=True)
class Gap:
    """Commits the retention policy dropped between a kept commit and its nearest kept
    ancestor, read from their tombstones (retention's `dropped_commits`), which keep who made
    them (`commit_ops`) for the reflog window: how `log` shows the gap and `undo` decides
    whether an operation can still be taken back over it."""

    commits: tuple[str, ...]  # newest first
    newest_ns: int
    oldest_ns: int
    dropped_ns: int
    reason: str  # the newest tombstone's
    below: str | None  # the nearest kept ancestor (None: nothing older is kept)
    ops: tuple[OpRecord, ...] = ()  # the operations they held, as far as recorded
    unrecorded: int = 0  # tombstones with no operations kept (older ones, or never recorded)

    @property
    def labels(self) -> list[str]:
        return list(dict.fromkeys(o.label for o in self.ops))

    def to_json(self) -> dict:
        return {"commits": list(self.commits), "count": len(self.commits),
                "newest_time": self.newest_ns / 1e9, "oldest_time": self.oldest_ns / 1e9,
                "dropped_time": self.dropped_ns / 1e9, "reason": self.reason,
                "below": self.below, "operations": self.labels, "unrecorded": self.unrecorded}


@dataclass(frozen=True)
class Checkpoint:
    name: str
    commit: str
    branch: str
    time_ns: int  # when the name was set

    def to_json(self) -> dict:
        return {"name": self.name, "commit": self.commit, "branch": self.branch,
                "time": self.time_ns / 1e9}


@dataclass(frozen=True)
class Mark:
    name: str
    commit: str
    branch: str
    time_ns: int


# -- writing ---------------------------------------------------------------------------------
def made_by_memfs(label: str) -> OpRecord:
    """A change memfs itself makes outside any mount (the store's first commit)."""
    key = f"memfs:{label}:{time.time_ns():x}"
    return OpRecord("memfs", key, key, "", label, label, os.getpid(), os.getpgid(0),
                    os.getsid(0), os.getuid(), "memfs")


def put_ops(tx, commit_id: str, ops: list[OpRecord]) -> None:
    """Commit thread, inside the commit's transaction `tx`."""
    if ops:
        tx.put_ops(commit_id, json.dumps([o.to_json() for o in ops]))


def add_mark(store: Store, name: str, commit_id: str, branch: str, label: str) -> Mark:
    _check_ref_name(name)
    now = time.time_ns()
    with store.transaction() as tx:
        check_new_name(tx, name, "mark")
        tx.add_mark(name, commit_id, branch, now, label)
    return Mark(name, commit_id, branch, now)


# -- checkpoints -------------------------------------------------------------------------------
def checkpoints(store: Store) -> list[Checkpoint]:
    return [Checkpoint(*row) for row in store.checkpoint_rows()]


def checkpoint(store: Store, name: str) -> Checkpoint | None:
    row = store.checkpoint_row(name)
    return Checkpoint(*row) if row else None


def create_checkpoint(store: Store, name: str, commit_id: str, branch: str, *,
                      force: bool = False) -> tuple[Checkpoint, str | None]:
    """Name `commit_id`; an existing name moves only with `force`. Returns the checkpoint and
    the commit it named before (None if it is new or did not move). Every move is in the
    reflog (ref `checkpoints/NAME`)."""
    _check_ref_name(name)
    now = time.time_ns()
    with store.transaction() as tx:
        row = tx.checkpoint_row(name)
        old = row[1] if row else None
        if old is None:
            check_new_name(tx, name, "checkpoint")
        if old is not None and old != commit_id and not force:
            raise StoreError(f"checkpoint {name!r} already names {old[:12]}",
                             f"pick another name, `memfs checkpoint delete {name}` first, or "
                             f"move it with `memfs checkpoint create {name} --force`")
        if old == commit_id:
            return Checkpoint(*row), None
        tx.set_checkpoint(name, commit_id, branch, now)
        tx.add_reflog(CHECKPOINT_REF + name, old, commit_id,
                      f"checkpoint {'move' if old else 'create'} {name}", now)
    return Checkpoint(name, commit_id, branch, now), old


def delete_checkpoint(store: Store, name: str) -> Checkpoint:
    """Remove a name (the commit stays until the retention policy drops it). The reflog row
    keeps the commit it named in `old`; its `new` is empty."""
    with store.transaction() as tx:
        row = tx.checkpoint_row(name)
        if row is None:
            raise StoreError(f"no checkpoint named {name!r}", "list them with "
                             "`memfs checkpoint list`")
        tx.delete_checkpoint(name)
        tx.add_reflog(CHECKPOINT_REF + name, row[1], "", f"checkpoint delete {name}",
                      time.time_ns())
    return Checkpoint(*row)


# -- reading ---------------------------------------------------------------------------------------
class History:
    """First-parent history from a commit, newest first, read a page at a time and kept, so
    `log --ops` and `undo` can look back over a long operation without reading it twice."""

    def __init__(self, store: Store, start: str) -> None:
        self.store = store
        self._items: list[LoggedCommit] = []
        self._next: str | None = start
        self.gaps: dict[str, Gap] = {}  # kept commit id -> the dropped commits below it
        self._ids: set[str] = set()  # ids of _items (gap_below's look-up)

    def get(self, i: int) -> LoggedCommit | None:
        while i >= len(self._items) and self._next is not None:
            self._load_page()
        return self._items[i] if i < len(self._items) else None

    def __iter__(self) -> Iterator[LoggedCommit]:
        i = 0
        while (c := self.get(i)) is not None:
            yield c
            i += 1

    def _load_page(self) -> None:
        # One query walks up to PAGE parents (the commits table is keyed by id).
        self._next = self._over_gaps(self._next, self._items[-1].id if self._items else None)
        if self._next is None:
            return
        commits = self.store.commit_chain(self._next, PAGE)
        if not commits:
            raise StoreError(f"no commit {self._next}", "see `memfs log` for commit ids")
        ids = [c.id for c in commits]
        ops = self._ops_of(ids)
        marks = self._marks_of(ids)
        for c in commits:
            self._items.append(LoggedCommit(c, ops.get(c.id), tuple(marks.get(c.id, ()))))
        self._next = commits[-1].parent

    def gap_below(self, cid: str) -> Gap | None:
        """The dropped commits between kept commit `cid` (already read) and its nearest kept
        ancestor, if any: they are walked when the commits after `cid` are read (read here
        as far as needed)."""
        while self._next is not None and (not self._items or self._items[-1].id == cid
                                          or cid not in self._seen()):
            self._load_page()
        return self.gaps.get(cid)

    def _seen(self) -> set[str]:
        if len(self._ids) != len(self._items):
            self._ids = {c.id for c in self._items}
        return self._ids

    def _over_gaps(self, cid: str | None, child: str | None) -> str | None:
        """A commit the retention policy dropped is walked over to its parent, as log does;
        what was walked over is remembered as the gap below `child`. The tombstones are the
        backend's (Records.dropped_commit)."""
        walked: list[DroppedCommit] = []
        while cid is not None and not self.store.has_commit(cid):
            gone = self.store.dropped_commit(cid)
            if gone is None:
                break
            walked.append(gone)
            cid = gone.parent
        if walked and child is not None:
            ids = [w.id for w in walked]
            ops: dict[str, tuple[OpRecord, ...]] = {}
            for i in range(0, len(ids), PAGE):
                ops.update(self._ops_of(ids[i:i + PAGE]))
            self.gaps[child] = Gap(
                tuple(ids), walked[0].time_ns, walked[-1].time_ns, walked[0].dropped_ns,
                walked[0].reason, cid, tuple(o for i in ids for o in ops.get(i, ())),
                sum(1 for i in ids if i not in ops))
        return cid

    def _ops_of(self, ids: list[str]) -> dict[str, tuple[OpRecord, ...]]:
        return {cid: tuple(OpRecord.from_json(d) for d in json.loads(data))
                for cid, data in self.store.commit_ops(ids).items()}

    def _marks_of(self, ids: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for cid, name in self.store.marks_of(ids):
            out.setdefault(cid, []).append(name)
        return out


def logged(store: Store, cid: str) -> LoggedCommit:
    """One commit with its records."""
    got = History(store, cid).get(0)
    assert got is not None
    return got


def mark_commit(store: Store, name: str, branch: str | None = None) -> str | None:
    """The commit the newest mark of that name (on `branch`, if given) points at."""
    return store.mark_commit(name, branch)


def resolve(store: Store, rev: str) -> str:
    """A revision as Store.resolve reads it (commit id or prefix, branch, checkpoint, REV~N),
    else the newest mark of that name."""
    try:
        return store.resolve(rev)
    except StoreError:
        base, sep, back = rev.partition("~")
        cid = mark_commit(store, base)
        if cid is None:
            raise
        return store.resolve(cid + sep + back)


def at_time(store: Store, head: str, when_ns: int) -> str:
    """The newest commit on head's first-parent history made at or before `when_ns`."""
    for c in History(store, head):
        if c.time_ns <= when_ns:
            return c.id
    raise StoreError(f"no commit at or before {_fmt(when_ns)}",
                     "the first commit is later; `memfs log` shows the times there are")


def commits_by_time(store: Store, start_ns: int, end_ns: int) -> list[tuple[str, int]]:
    """(id, time) of every commit made in [start, end), oldest first (all branches)."""
    return store.commits_by_time(start_ns, end_ns)


def days(store: Store) -> list[tuple[str, int]]:
    """Local dates (YYYY-MM-DD) that hold commits, with each day's newest commit time: one
    indexed query per day, so 100k commits over a few days cost a few queries."""
    out: list[tuple[str, int]] = []
    t = store.commit_times()[1]
    while t is not None:
        day = datetime.fromtimestamp(t / 1e9).date()
        end = day_start(day + timedelta(days=1))
        newest = store.newest_time_before(end)
        out.append((day.isoformat(), newest))
        t = store.oldest_time_from(end)
    return out


def day_start(day) -> int:
    return int(datetime(day.year, day.month, day.day).timestamp() * 1e9)


def summary(store: Store) -> dict:
    """How many commits the store keeps and their time range (for .memfs/history/INDEX)."""
    n, oldest, newest = store.commit_times()
    return {"commits": n, "oldest": oldest, "newest": newest}


# -- times -------------------------------------------------------------------------------------
_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)"
                  r"(?:\s+ago)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: float | None = None) -> int:
    """A moment as people write it: `10:32`, `10:32:05` (today), `2026-12-01 10:32`, an ISO
    time, `5m` / `2 hours ago` (before now), or `@SECONDS` (Unix time). Nanoseconds."""
    now = time.time() if now is None else now
    s = text.strip()
    m = _REL.match(s)
    if m:
        return int((now - float(m.group(1)) * _UNITS[m.group(2)[0]]) * 1e9)
    if s.startswith("@"):
        try:
            return int(float(s[1:]) * 1e9)
        except ValueError:
            pass
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?", s):
        s = datetime.fromtimestamp(now).date().isoformat() + " " + s
    try:
        return int(datetime.fromisoformat(s).timestamp() * 1e9)
    except ValueError:
        raise StoreError(f"{text!r} is not a time or a revision",
                         "give a commit id, checkpoint, branch or mark, or a time such as "
                         "10:32, '2026-12-01 10:32', 5m (ago) or @1767225600") from None


def _fmt(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


@dataclass
class Point:
    """Where `--to` goes: a commit, found by revision or by time."""

    commit: str
    how: str = field(default="rev")  # "rev" or "time"


def find_point(store: Store, text: str, head: str) -> Point:
    """A revision if it names one, else a time on head's history."""
    try:
        return Point(resolve(store, text), "rev")
    except CommitDropped:
        raise  # a revision that names a dropped commit: said by name, not "not a time"
    except StoreError as exc:
        try:
            when = parse_when(text)
        except StoreError:
            remedy = exc.remedy if exc.remedy and not isinstance(exc, UnknownRevision) else \
                "give a commit id, checkpoint, branch or mark, or a time such as 10:32, " \
                "'2026-12-01 10:32', 5m (ago) or @1767225600"
            raise StoreError(f"{text!r} is neither a revision nor a time", remedy) from None
        return Point(at_time(store, head, when), "time")
