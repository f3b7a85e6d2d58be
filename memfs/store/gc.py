"""Garbage collection: drop the history the retention policy lets go, then the objects and
chunks nothing kept names, then give pack space back (memfs.store.packs).

The steps, each crash-safe on its own (a SIGKILL or power cut between any two leaves a store
that opens, passes fsck and keeps everything the policy keeps):

1. plan   In one read snapshot: the commits, refs, the policy's keep set (memfs.store
          retention), and a mark of every object and chunk a kept commit names
          (memfs.store.refs: its tree, its inode table and every row's content, its
          intents), newest commit first, so each id remembers the newest kept commit that
          names it. Below the space floor that lets GC pick the oldest history
          whose drop frees enough. Candidates for the sweep are the ids the snapshot held
          and the mark missed.
2. drop   One transaction: tombstones for the dropped commits (retention's
          dropped_commits); their rows that name objects (commits, commit_inodes,
          commit_intents: memfs.store.refs.forget_commits) gone, who made them and their
          marks kept for log and undo; expired reflog rows gone. Before it,
          the refs are read again under the writer lock: a commit named since is kept.
3. sweep  Transactions of BATCH ids. Each first marks what commits made since the last
          look name (a group commit dedups new content against existing chunks with INSERT
          OR IGNORE, so a candidate may be named again), then deletes the candidates still
          unmarked. Liveness is decided under the writer lock, the only place a commit can
          name a chunk, and ids newer than the snapshot are never candidates: nothing a
          concurrent group commit is about to name is deleted.
4. packs  memfs.store.packs: empty packs removed, mostly dead packs rewritten, dead ranges of
          the rest punched out.
5. finish The WAL is checkpointed and cut back, free pages go back to the filesystem, the
          report is kept in meta 'gc:last' (status shows it).

Commits are dropped before anything they name is deleted: a crash between leaves garbage that
the next run collects, never a commit whose tree is missing.

Threads: `Collector.run` runs in one worker thread (the daemon's GC task, or the CLI). It reads
through its own connection and writes through the store's writer, under the store's lock,
never more than one batch at a time, so group commits wait at most one batch; FUSE requests
never wait for it. One collector per store at a time (`<root>/gc.lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from memfs.store import db, retention
from memfs.store.delta import split_over
from memfs.store.packs import PackWork, pack_usage, store_usage
from memfs.store.refs import (
    CHUNK,
    INODES,
    TREE,
    Ref,
    UnknownEntry,
    commit_refs,
    expire_tombstone_rows,
    forget_commits,
    intent_objects,
    object_refs,
)
from memfs.store.space import Reserve, Space, headroom
from memfs.store.store import Store, StoreError

INF = 1 << 62  # the mark of what protected refs and pins name: never dropped for space
BATCH = 2000
RETIRE_GRACE = 0.5  # seconds a read located before a pack moved may still be in flight
META_KEY = "gc:last"
CRASH_ENV = "MEMFS_GC_CRASH_AT"  # tests: SIGKILL at a named step
CRASH_POINTS = ("planned", "dropped", "swept-batch", "swept", "pack-written", "pack-moved",
                "pack-removed", "punched", "done")


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Pins:
    """What a running daemon still shows or holds open (views of history, unlinked files a
    process still reads): marked like a checkpoint."""

    trees: set[str] = field(default_factory=set)
    refs: set[Ref] = field(default_factory=set)


@dataclass
class Progress:
    """Where a run is; read by the loop for status while the GC thread writes it."""

    phase: str = "planning"
    done: int = 0
    total: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class GcReport:
    trigger: str
    dry_run: bool
    backend: str = "sqlite"  # or "postgresql" (memfs.store.pg.gc)
    started: float = 0.0
    seconds: float = 0.0
    pressure: bool = False  # below the space floor: kept history dropped for space too
    free_before: int = 0
    free_after: int = 0
    commits: int = 0
    commits_dropped: int = 0
    dropped_for_space: int = 0  # of those, kept by the windows but dropped below the floor
    reflog_dropped: int = 0
    live_bytes: int = 0  # chunk bytes branch heads, checkpoints and pins name
    history_bytes: int = 0  # chunk bytes only kept history names
    reclaimable_bytes: int = 0  # chunk and pack bytes no kept commit names
    objects_freed: int = 0
    object_bytes_freed: int = 0
    chunks_freed: int = 0
    chunk_bytes_freed: int = 0
    packs_rewritten: int = 0
    packs_removed: int = 0
    bytes_punched: int = 0
    store_before: int = 0  # bytes the store takes on disk (store.db, WAL, packs)
    store_after: int = 0
    reserve_released: int = 0  # the disk was full: the reserve was given to this run
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step
    problems: list[str] = field(default_factory=list)

    @property
    def returned(self) -> int:
        return max(0, self.store_before - self.store_after)

    def to_json(self) -> dict:
        return {**asdict(self), "returned": self.returned}


class Marks:
    """id -> seq of the newest kept commit naming it (INF: protected)."""

    def __init__(self) -> None:
        self.objects: dict[str, int] = {}
        self.chunks: dict[str, int] = {}
        self.cutoff = 0  # below the floor: marks under it are history dropped for space

    def table(self, kind: str) -> dict[str, int]:
        return self.chunks if kind == CHUNK else self.objects

    def live(self, kind: str, oid: str) -> bool:
        return self.table(kind).get(oid, -1) >= self.cutoff


class Collector:
    def __init__(self, store: Store, *, dry_run: bool = False, trigger: str = "manual",
                 pins: Callable[[], Pins] | None = None, now_ns: int | None = None,
                 punch: bool = True, free_for_space: int | None = None,
                 short_of_space: bool = False, all_for_space: bool = False) -> None:
        self.store = store
        self.dry_run = dry_run
        self.pins = pins or Pins
        self.now_ns = now_ns
        self.punch = punch
        self.free_for_space = free_for_space  # tests: act as below the floor, needing this
        self.short_of_space = short_of_space  # a write or commit was just refused for space
        # `memfs gc` (and du, which says what it would do) below the floor: all the history
        # the floor may take goes, not just enough for twice the floor (user trial: one run
        # after rm gave back 5.6 of 37 MiB; the rest took 2-3 more runs)
        self.all_for_space = all_for_space
        self.progress = Progress()
        self.report = GcReport(trigger, dry_run)
        self.marks = Marks()
        self._conn: sqlite3.Connection | None = None
        self._full = False
        self._phase_at = 0.0

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> GcReport:
        r = self.report
        r.started = time.time()
        t0 = time.monotonic()
        lock = self._lock()
        try:
            space = Space.of(self.store.root)
            self._full = space.avail < headroom(space.size)
            self._conn = db.connect(self.store.db_path)
            r.store_before = store_usage(self.store.root)
            r.free_before = Space.of(self.store.root).avail
            self._plan()
            crash_point("planned")
            if not self.dry_run:
                # On a full disk no commit may take, between this run's transactions, the
                # room they need (the reserve); they would fail anyway.
                with self.store.exclusive() if self._full else contextlib.nullcontext():
                    if self._full:
                        self._take_reserve_back()
                    self._drop()
                    crash_point("dropped")
                    self._sweep()
                    crash_point("swept")
                    self._phase("packs")
                    PackWork(self.store, self.report, self.progress, punch=self.punch,
                             pressure=r.pressure, crash=crash_point).run()
                self._finish()
                # The daemon's read fds kept removed packs' space taken until the next run
                # (outside the writer lock: the grace never holds a commit up).
                self.store.chunks.release_retired(RETIRE_GRACE)
                crash_point("done")
        finally:
            if self._conn is not None:
                self._conn.close()
            os.close(lock)
        r.store_after = store_usage(self.store.root) if not self.dry_run else r.store_before
        r.free_after = Space.of(self.store.root).avail
        r.seconds = round(time.monotonic() - t0, 3)
        self._phase("done")
        return r

    def _take_reserve_back(self) -> None:
        """On a full disk even the transactions that drop history need room: the reserve
        (memfs.store.space) is there for this. The daemon takes it again later."""
        self.report.reserve_released = Reserve(self.store.root).release()

    def _lock(self) -> int:
        fd = os.open(self.store.root / "gc.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"a garbage collection of {self.store.root} is already running",
                             "wait for it (`memfs status` shows its progress)") from None
        return fd

    def _phase(self, name: str, total: int = 0) -> None:
        now = time.monotonic()
        if self._phase_at:
            self.report.phases[self.progress.phase] = round(
                self.report.phases.get(self.progress.phase, 0) + now - self._phase_at, 3)
        self._phase_at = now
        self.progress.phase, self.progress.done, self.progress.total = name, 0, total

    # -- 1. plan --------------------------------------------------------------------------------
    def _plan(self) -> None:
        conn = self._conn
        assert conn is not None
        policy = self.store.policy()
        now = self.now_ns if self.now_ns is not None else time.time_ns()
        self.policy, self.now = policy, now
        pins = self.pins()  # before any lock: the daemon answers it from its loop
        conn.execute("BEGIN")  # one snapshot for everything below
        try:
            rows = conn.execute("SELECT id, seq, parent, tree, branch, time_ns FROM commits"
                                ).fetchall()
            self.commits = {r[0]: retention.CommitInfo(r[0], r[1], r[2], r[4], r[5])
                            for r in rows}
            self.trees = {r[0]: r[3] for r in rows}
            refs = _refs(conn)
            self.reflog_seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM reflog"
                                           ).fetchone()[0]
            self.intents = dict(conn.execute("SELECT commit_id, data FROM commit_intents"))
            self.inode_tables = dict(conn.execute("SELECT commit_id, inodes FROM commit_inodes"))
            self.epoch = max((c.seq for c in self.commits.values()), default=0)
            # A patch keeps what it is read through: the mark follows `over` (memfs.store.delta).
            self.over: dict[str, str] = dict(conn.execute(
                "SELECT id, over FROM chunks WHERE over IS NOT NULL"))
            self.keep = retention.kept(self.commits.values(), refs, policy, now)
            self._mark_all(pins)
            self.object_rows = conn.execute("SELECT id, length(data) FROM objects").fetchall()
            self.chunk_rows = conn.execute("SELECT id, len FROM chunks").fetchall()
        finally:
            conn.execute("COMMIT")
        self.report.commits = len(self.commits)
        self._decide_pressure()
        self.dropped = {cid for cid in self.commits if cid not in self.keep or (
            not retention.is_protected(self.keep[cid])
            and self.commits[cid].seq < self.marks.cutoff)}
        self.report.commits_dropped = len(self.dropped)
        self.report.dropped_for_space = sum(1 for cid in self.dropped if cid in self.keep)
        self._account()

    def _mark_all(self, pins: Pins) -> None:
        self._phase("marking", len(self.keep))
        protected = [cid for cid, why in self.keep.items() if retention.is_protected(why)]
        for cid in protected:
            self._mark_commit(cid, INF)
        for t in pins.trees:
            self._mark(Ref(TREE, t), INF)
        for ref in pins.refs:
            self._mark(ref, INF)
        rest = sorted((c for c in self.keep if c not in set(protected) and c in self.commits),
                      key=lambda c: self.commits[c].seq, reverse=True)
        for cid in rest:
            self._mark_commit(cid, self.commits[cid].seq)
            self.progress.done += 1

    def _mark_commit(self, cid: str, seq: int, conn: sqlite3.Connection | None = None) -> None:
        tree = self.trees.get(cid)
        if tree is None:
            return
        self._mark(Ref(TREE, tree), seq, conn)
        table = self.inode_tables.get(cid)
        if table:
            self._mark(Ref(INODES, table), seq, conn)
        for ref in intent_objects(self._effective_intents(cid)):
            self._mark(ref, seq, conn)

    def _effective_intents(self, cid: str) -> str | None:
        """The commit_intents row a commit's intent reads (its own or its nearest ancestor's:
        Store.intents_at), from the plan's snapshot."""
        seen = 0
        node: str | None = cid
        while node is not None and seen < 10_000:
            data = self.intents.get(node)
            if data is not None:
                return data
            info = self.commits.get(node)
            node = info.parent if info is not None else None
            seen += 1
        return None

    def _mark(self, root: Ref, seq: int, conn: sqlite3.Connection | None = None) -> None:
        """Mark `root` and what it names with `seq`, unless already live at least that new
        (what was reached from a newer commit reached everything below it then)."""
        conn = conn or self._conn
        marks = self.marks
        stack = [root]
        while stack:
            ref = stack.pop()
            table = marks.table(ref.kind)
            if table.get(ref.id, -1) >= marks.cutoff:
                continue  # reached before, from a commit at least as new (or now kept)
            table[ref.id] = seq
            if ref.kind == CHUNK:
                # a live patch keeps its base and the patches between
                stack += [Ref(CHUNK, dep) for dep in self._over(ref.id, conn)]
                continue
            row = conn.execute("SELECT data FROM objects WHERE id = ?", (ref.id,)).fetchone()
            if row is None:
                if len(self.report.problems) < 50:
                    self.report.problems.append(f"{ref.kind} {ref.id} is missing (named by "
                                                "history; `memfs fsck` lists all)")
                continue
            try:
                stack += object_refs(ref, row[0])
            except UnknownEntry as exc:
                raise StoreError(f"this store holds an entry memfs does not know: {exc}",
                                 "upgrade memfs before collecting garbage; nothing was "
                                 "deleted") from exc

    def _over(self, cid: str, conn: sqlite3.Connection | None) -> tuple[str, ...]:
        """What a patch is read through: from the plan's snapshot, or (catching up under the
        writer lock: a chunk a commit stored since) from the row itself."""
        if conn is None or conn is self._conn:
            return split_over(self.over.get(cid))
        row = conn.execute("SELECT over FROM chunks WHERE id = ?", (cid,)).fetchone()
        return split_over(row[0]) if row is not None else ()

    # -- space: how much kept history to give up below the floor ---------------------------------
    def _decide_pressure(self) -> None:
        """Below the floor, free space up to twice the floor (all_for_space: all it may):
        first what is dead anyway, then history by age (the cutoff: marks under it are
        dropped)."""
        sizes = dict(self.chunk_rows)
        if self.free_for_space is not None:
            need = self.free_for_space
        else:
            space = Space.of(self.store.root)
            floor = space_floor(space, self.policy)
            if not self.policy.space_floor or not (space.avail < floor or self.short_of_space):
                return
            need = INF if self.all_for_space else max(2 * floor - space.avail, floor)
        self.report.pressure = True
        dead_packs = pack_usage(self.store.root) - sum(sizes.values())  # tails, old ranges
        need -= max(0, dead_packs) + sum(
            n for cid, n in self.chunk_rows if cid not in self.marks.chunks)
        by_seq: dict[int, int] = {}
        for cid, seq in self.marks.chunks.items():
            if seq != INF:
                by_seq[seq] = by_seq.get(seq, 0) + sizes.get(cid, 0)
        freed, cutoff = 0, 0
        for seq in sorted(by_seq):
            if freed >= need:
                break
            freed += by_seq[seq]
            cutoff = seq + 1
        self.marks.cutoff = cutoff

    def _account(self) -> None:
        r, marks = self.report, self.marks
        for cid, n in self.chunk_rows:
            seq = marks.chunks.get(cid, -1)
            if seq == INF:
                r.live_bytes += n
            elif seq >= marks.cutoff:
                r.history_bytes += n
            else:
                r.reclaimable_bytes += n
        for oid, n in self.object_rows:
            if not marks.live(TREE, oid):
                r.reclaimable_bytes += n

    # -- 2. drop ------------------------------------------------------------------------------
    def _drop(self) -> None:
        self._phase("dropping history", len(self.dropped))
        with self.store.transaction() as tx:
            conn = tx.conn
            self._catch_up(conn)
            for cid in _named(conn, self.reflog_seq):  # named since the plan (a checkpoint)
                if cid in self.dropped:
                    self.dropped.discard(cid)
                    self._mark_commit(cid, INF, conn)
            gap_fixes = self._intent_fixes()
            conn.executemany("INSERT OR REPLACE INTO commit_intents VALUES (?, ?)", gap_fixes)
            why = self._why_dropped()
            conn.executemany(
                "INSERT OR REPLACE INTO dropped_commits "
                "SELECT id, parent, seq, branch, time_ns, ?, ? FROM commits WHERE id = ?",
                [(self.now, why(cid), cid) for cid in self.dropped])
            forget_commits(conn, self.dropped)
            if self.policy.reflog != retention.FOREVER:
                cutoff = self.now - int(self.policy.reflog * 1e9)
                cur = conn.execute("DELETE FROM reflog WHERE time_ns < ?", (cutoff,))
                self.report.reflog_dropped = cur.rowcount
                expire_tombstone_rows(conn, cutoff)  # who made long-dropped commits
        self.report.commits_dropped = len(self.dropped)

    def _intent_fixes(self) -> list[tuple[str, str]]:
        """A kept commit whose parent goes, with no intents row of its own, takes a copy of
        the row it read through that parent, so its intents survive the gap."""
        out = []
        for cid, info in self.commits.items():
            if cid in self.dropped or cid in self.intents or info.parent not in self.dropped:
                continue
            data = self._effective_intents(cid)
            if data is not None:
                out.append((cid, data))
        return out

    def _why_dropped(self) -> Callable[[str], str]:
        floor = f"{self.policy.space_floor:g}%"

        def why(cid: str) -> str:
            if cid in self.keep:
                return f"the disk was below the {floor} free-space floor; oldest history first"
            return f"outside the windows: {self.policy.summary().split(';')[0]}"
        return why

    # -- 3. sweep -----------------------------------------------------------------------------
    def _catch_up(self, conn: sqlite3.Connection) -> None:
        """Under the writer lock: mark what commits made since the last look name."""
        for cid, tree, seq in conn.execute(
                "SELECT id, tree, seq FROM commits WHERE seq > ? ORDER BY seq", (self.epoch,)
                ).fetchall():
            self.trees[cid] = tree
            for ref in commit_refs(conn, cid, tree).roots():
                self._mark(ref, INF, conn)
            self.epoch = max(self.epoch, seq)

    def _sweep(self) -> None:
        objects = [(oid, n) for oid, n in self.object_rows if not self.marks.live(TREE, oid)]
        chunks = [(cid, n) for cid, n in self.chunk_rows if not self.marks.live(CHUNK, cid)]
        work = [("o", oid, n) for oid, n in objects] + [("c", cid, n) for cid, n in chunks]
        self._phase("sweeping", len(work))
        r = self.report
        for start in range(0, len(work), BATCH):
            batch = work[start:start + BATCH]
            with self.store.transaction() as tx:
                self._catch_up(tx.conn)
                for what, oid, n in batch:
                    if what == "o" and not self.marks.live(TREE, oid):
                        tx.conn.execute("DELETE FROM objects WHERE id = ?", (oid,))
                        r.objects_freed += 1
                        r.object_bytes_freed += n
                    elif what == "c" and not self.marks.live(CHUNK, oid):
                        tx.conn.execute("DELETE FROM chunks WHERE id = ?", (oid,))
                        r.chunks_freed += 1
                        r.chunk_bytes_freed += n
            self.progress.done += len(batch)
            time.sleep(0)  # a commit waiting for the writer lock gets it before the next batch
            if start == 0:
                crash_point("swept-batch")
        self.store.chunks.forget_locations()
        self.store.forget_objects()

    # -- 5. finish ----------------------------------------------------------------------------
    def _finish(self) -> None:
        self._phase("finishing")
        with self.store.transaction() as tx:
            tx.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                            (META_KEY, json.dumps(self.report.to_json())))
        try:
            self.store.compact_db()
        except sqlite3.Error as exc:  # busy readers: the next run tries again
            self.report.problems.append(f"WAL checkpoint: {exc}")


def space_floor(space: Space, policy: retention.Policy) -> int:
    """Free bytes under which history gives way: the policy's percent, over the headroom
    writes already leave free (memfs.store.space), so the disk reaches it."""
    return int(space.size * policy.space_floor / 100) + headroom(space.size)


def _refs(conn: sqlite3.Connection) -> retention.Refs:
    return retention.Refs(
        dict(conn.execute("SELECT name, head FROM branches")),
        dict(conn.execute("SELECT name, commit_id FROM checkpoints")),
        [(o, n, t) for o, n, t in conn.execute("SELECT old, new, time_ns FROM reflog")])


def _named(conn: sqlite3.Connection, reflog_seq: int) -> Iterable[str]:
    """Commits branch heads and checkpoints name now, and reflog moves made since the plan."""
    refs = _refs(conn)
    yield from refs.heads.values()
    yield from refs.checkpoints.values()
    for old, new in conn.execute("SELECT old, new FROM reflog WHERE seq > ?", (reflog_seq,)):
        if old:
            yield old
        yield new


def last_run(store: Store) -> dict | None:
    """The report of the last GC run (meta 'gc:last'), if any."""
    rows = store._query("SELECT value FROM meta WHERE key = ?", (META_KEY,))
    return json.loads(rows[0][0]) if rows else None
