"""Garbage collection on a store shared in PostgreSQL: the embedded store's policy and report
(memfs.store.gc, memfs.store.retention), made safe with many hosts committing at once.

The protocol (docs/lifecycle.md, "On a store in PostgreSQL"):

- One collector at a time, store-wide: it holds the session advisory lock GC_KEY for its
  run. A collector killed (or a server restarted) ends its session, and the lock with it.
- Every write transaction of every host holds the advisory lock SWEEP_KEY *shared* from its
  first statement to its end (PgStore.transaction); each GC step that deletes rows holds it
  *exclusive*, for one transaction. So a deleting step and a commit never overlap: the step
  waits for the commits in flight to end, and a commit that starts meanwhile waits for the
  step (one batch of BATCH ids at most). Inside the step, READ COMMITTED, the collector first
  marks what every commit made since its snapshot names (they have all ended), then deletes
  the candidates still unmarked. A commit that comes after finds a deleted chunk gone and
  inserts it again (INSERT ... ON CONFLICT DO NOTHING inserts; its bytes are in hand).
- Deleting steps bump the GC epoch (memfs_meta 'gc:epoch') in the same transaction. A
  commit trusts a host's cache to mean "the database has this row" only for rows it saw
  there in the epoch it reads under its shared lock (PgTx.confirm_cached); a copy cached
  before a sweep is checked once, and sent again if the sweep took it.
- The snapshot the mark reads is taken while holding SWEEP_KEY exclusive (for a moment), so
  no commit was in flight at it: every commit made later has a greater `seq`, and the
  catch-up (`seq > epoch`) misses none.
- A patch (memfs.store.delta, `chunks.over`) keeps what it is read through: the mark follows
  `over` (live_chunks), and the sweep deletes a dead patch in the same batch as the rows it
  names or an earlier one (a longer `over` first), so at no COMMIT is a row left reading
  through one already deleted (which a commit could then name again by dedup).

No grace period or clock is involved: the locks order a delete and a commit. Why not a
grace period: a commit dedups against rows of any age (a chunk written a year ago is named
again today), so the age of a row says nothing about whether a commit in flight names it,
unless every dedup hit rewrote the row (a write per reused chunk). Why not row locks (FOR KEY
SHARE on every named row): a commit would lock every chunk and object it reuses, thousands of
rows per group commit; the advisory lock is one statement per transaction.

Steps, each one transaction (PostgreSQL makes each atomic and durable; a SIGKILL of the
collector or of the server between or inside any of them leaves the last committed one):
plan (a REPEATABLE READ snapshot: commits, refs, the keep set, the mark), drop (tombstones,
the dropped commits' rows), sweep (batches), finish (the report in memfs_meta 'gc:last',
then VACUUM so the database reuses the space). Commits go before what they name.

No space floor here: the server's disk is not this host's to measure (the database's size
is shown; `space-floor` applies to embedded stores). Pins (views a daemon shows, files it
holds open) are this host's daemon's, asked of its loop, and every other host's live set in
`host_pins` (memfs.store.pg.pins), read in the plan and again in each sweep batch.

Threads: `run` in one worker thread (the daemon's GC task, or the CLI), on connections of
its own; status reads `progress` from the loop.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psycopg
from psycopg import IsolationLevel

from memfs.store import retention
from memfs.store.delta import split_over
from memfs.store.gc import BATCH, GcReport, Pins, Progress, crash_point
from memfs.store.pg import pins as host_pins
from memfs.store.pg import schema
from memfs.store.pg.conn import server_error
from memfs.store.pg.store import GC_NOTICE, PgStore
from memfs.store.refs import CHUNK, INODES, TREE, Ref, UnknownEntry, intent_objects, object_refs
from memfs.store.store import StoreError

META_KEY = "gc:last"
LOCK_WAIT = 2.0  # seconds a deleting step waits for the commits in flight before it yields
LOCK_TRIES = 30  # then tries again; past this many, the run stops (nothing half done)
# The crash points a PostgreSQL run passes (tests): memfs.store.gc's without the packs, and
# two inside a transaction, after its deletes and before its COMMIT.
PG_CRASH_POINTS = ("planned", "dropping", "dropped", "sweeping", "swept-batch", "swept", "done")
STOP_ENV = "MEMFS_GC_STOP_AT"  # tests: SIGSTOP at a named step (the server is killed meanwhile)


def step(name: str) -> None:
    """A named step: tests kill (memfs.store.gc.CRASH_ENV) or stop the process here."""
    crash_point(name)
    if os.environ.get(STOP_ENV) == name:
        os.kill(os.getpid(), signal.SIGSTOP)


class GcBusy(StoreError):
    """Another collector (this host's or another's) holds the store: nothing was done."""


def live_chunks(named: set[str], over: Callable[[set[str]], dict[str, tuple[str, ...]]]
                ) -> set[str]:
    """The chunk-liveness rule: the chunks that must stay, given those kept objects name.

    A chunk is live when something kept names it, or when a live chunk is read through it: a
    patch (memfs.store.delta) keeps its base and the patches between (`over(ids)`: the
    `over` of those ids that are patches). The list is flat, so one step closes the set;
    the loop only makes that a fact checked, not assumed."""
    live = set(named)
    todo = set(named)
    while todo:
        todo = {dep for deps in over(todo).values() for dep in deps} - live
        live |= todo
    return live


@dataclass
class Mark:
    """What the kept history names: `protected` from heads, checkpoints, pins and commits
    made since the snapshot; `kept` from everything the policy keeps (a superset)."""

    objects: set[str] = field(default_factory=set)
    chunks: set[str] = field(default_factory=set)
    protected_chunks: set[str] = field(default_factory=set)


class PgCollector:
    def __init__(self, store: PgStore, *, dry_run: bool = False, trigger: str = "manual",
                 pins: Callable[[], Pins] | None = None, now_ns: int | None = None) -> None:
        self.store = store
        self.dry_run = dry_run
        self.pins = pins or Pins
        self.now_ns = now_ns
        self.progress = Progress()
        self.report = GcReport(trigger, dry_run, backend="postgresql")
        self.mark = Mark()
        self._phase_at = 0.0

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> GcReport:
        r = self.report
        r.started = time.time()
        t0 = time.monotonic()
        try:
            conn = psycopg.connect(self.store.url, autocommit=True)
        except psycopg.Error as exc:
            raise self._stopped(exc) from exc
        try:
            self._run_locked(conn)
        except psycopg.OperationalError as exc:
            raise self._stopped(exc) from exc
        finally:
            conn.close()
        r.seconds = round(time.monotonic() - t0, 3)
        self._phase("done")
        return r

    def _stopped(self, exc: BaseException) -> StoreError:
        return _stopped(self.store.url, exc, dry_run=self.dry_run, trigger=self.report.trigger)

    def _run_locked(self, conn: psycopg.Connection) -> None:
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (schema.GC_KEY,)).fetchone()[0]:
            raise GcBusy("a garbage collection of this store is already running (on this "
                         "or another host)", "wait for it: `memfs status` on the host "
                         "running it shows its progress; `memfs gc` after it ends")
        r = self.report
        r.store_before = r.store_after = _database_size(conn)
        self._plan(conn)
        step("planned")
        if self.dry_run:
            return
        self._drop(conn)
        step("dropped")
        self._sweep(conn)
        step("swept")
        self._finish(conn)
        step("done")

    def _phase(self, name: str, total: int = 0) -> None:
        now = time.monotonic()
        if self._phase_at:
            self.report.phases[self.progress.phase] = round(
                self.report.phases.get(self.progress.phase, 0) + now - self._phase_at, 3)
        self._phase_at = now
        self.progress.phase, self.progress.done, self.progress.total = name, 0, total

    # -- 1. plan --------------------------------------------------------------------------------
    def _plan(self, conn: psycopg.Connection) -> None:
        self._phase("marking")
        self.policy = self.store.policy()
        pins = self.pins()  # before any lock: the daemon answers it from its loop
        _exclusive(conn, session=True)  # no commit in flight at the snapshot below
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                self.now = self.now_ns if self.now_ns is not None else conn.execute(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint"
                ).fetchone()[0]  # the server's clock: the same for every host that collects
                conn.execute("SELECT pg_advisory_unlock(%s)", (schema.SWEEP_KEY,))
                self._read_snapshot(conn, pins)
        finally:
            conn.isolation_level = None
        r = self.report
        r.commits = len(self.commits)
        self.dropped = {cid for cid in self.commits if cid not in self.keep}
        r.commits_dropped = len(self.dropped)
        for cid, n in self.chunk_rows:
            if cid in self.mark.protected_chunks:
                r.live_bytes += n
            elif cid in self.mark.chunks:
                r.history_bytes += n
            else:
                r.reclaimable_bytes += n
        r.reclaimable_bytes += sum(n for oid, n in self.object_rows
                                   if oid not in self.mark.objects)

    def _read_snapshot(self, conn: psycopg.Connection, pins: Pins) -> None:
        # Every chunk row of the snapshot, and what each patch is read through (the mark
        # follows it: live_chunks); rows made after it are asked about when named.
        self.chunk_rows: list[tuple[str, int]] = []
        self.over: dict[str, tuple[str, ...]] = {}
        for cid, n, over in conn.execute("SELECT id, octet_length(data), over FROM chunks"):
            self.chunk_rows.append((cid, n))
            if over:
                self.over[cid] = split_over(over)
        self.in_snapshot = {cid for cid, _ in self.chunk_rows}
        rows = conn.execute("SELECT id, seq, parent, tree, branch, time_ns FROM commits"
                            ).fetchall()
        self.commits = {r[0]: retention.CommitInfo(r[0], r[1], r[2], r[4], r[5]) for r in rows}
        self.trees = {r[0]: r[3] for r in rows}
        self.epoch = max((c.seq for c in self.commits.values()), default=0)
        refs = _refs(conn)
        self.reflog_seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM reflog").fetchone()[0]
        self.intents = dict(conn.execute("SELECT commit_id, data FROM commit_intents"))
        self.tables = dict(conn.execute("SELECT commit_id, inodes FROM commit_inodes"))
        self.keep = retention.kept(self.commits.values(), refs, self.policy, self.now)
        protected = [cid for cid, why in self.keep.items() if retention.is_protected(why)]
        self.progress.total = len(self.keep)
        roots = [Ref(TREE, t) for t in pins.trees] + list(pins.refs)
        roots += host_pins.others(conn, self.store.host)  # what other hosts show (pins)
        for cid in protected:
            roots += self._roots(cid)
        self._mark(conn, roots, protected=True)
        rest = [cid for cid in self.keep if cid not in set(protected)]
        for start in range(0, len(rest), 200):
            roots = [ref for cid in rest[start:start + 200] for ref in self._roots(cid)]
            self._mark(conn, roots, protected=False)
            self.progress.done = len(protected) + start
        self.object_rows = conn.execute("SELECT id, octet_length(data) FROM objects").fetchall()

    def _roots(self, cid: str) -> list[Ref]:
        tree = self.trees.get(cid)
        if tree is None:
            return []
        out = [Ref(TREE, tree)]
        if self.tables.get(cid):
            out.append(Ref(INODES, self.tables[cid]))
        return out + intent_objects(self._effective_intents(cid))

    def _effective_intents(self, cid: str) -> str | None:
        """The commit_intents row a commit's intent reads (its own or its nearest ancestor's:
        PgStore.intents_at), from what the plan read."""
        node: str | None = cid
        for _ in range(10_000):
            if node is None:
                return None
            data = self.intents.get(node)
            if data is not None:
                return data
            info = self.commits.get(node)
            node = info.parent if info is not None else None
        return None

    def _mark(self, conn: psycopg.Connection, roots: Iterable[Ref], *, protected: bool) -> None:
        """Mark `roots` and what they name, a level at a time (one query per level)."""
        m = self.mark
        chunks: set[str] = set()
        level = {r for r in roots}
        while level:
            want: dict[str, Ref] = {}
            for ref in level:
                if ref.kind == CHUNK:
                    chunks.add(ref.id)
                elif ref.id not in m.objects:
                    m.objects.add(ref.id)
                    want[ref.id] = ref
            level = set()
            if not want:
                break
            found = dict(conn.execute("SELECT id, data FROM objects WHERE id = ANY(%s)",
                                      (list(want),)))
            for oid, ref in want.items():
                data = found.get(oid)
                if data is None:
                    if len(self.report.problems) < 50:
                        self.report.problems.append(f"{ref.kind} {oid} is missing (named by "
                                                    "history; `memfs fsck` lists all)")
                    continue
                try:
                    level.update(object_refs(ref, bytes(data)))
                except UnknownEntry as exc:
                    raise StoreError(f"this store holds an entry memfs does not know: {exc}",
                                     "upgrade memfs before collecting garbage; nothing was "
                                     "deleted") from exc
        live = live_chunks(chunks, lambda ids: self._over(conn, ids))
        m.chunks |= live
        if protected:
            m.protected_chunks |= live

    def _over(self, conn: psycopg.Connection, ids: set[str]) -> dict[str, tuple[str, ...]]:
        """What the patches among `ids` are read through: from the snapshot, and for rows
        made since (a commit the catch-up marks) from the database, under the lock."""
        out = {cid: self.over[cid] for cid in ids if cid in self.over}
        newer = [cid for cid in ids if cid not in self.in_snapshot]
        if newer:
            for cid, over in conn.execute("SELECT id, over FROM chunks WHERE id = ANY(%s) AND "
                                          "over IS NOT NULL", (newer,)):
                self.over[cid] = out[cid] = split_over(over)
        return out

    # -- 2. drop --------------------------------------------------------------------------------
    def _drop(self, conn: psycopg.Connection) -> None:
        self._phase("dropping history", len(self.dropped))
        with conn.transaction():
            _exclusive(conn)
            self._catch_up(conn)
            for cid in _named(conn, self.reflog_seq):  # named since the plan (a checkpoint)
                if cid in self.dropped:
                    self.dropped.discard(cid)
                    self._mark(conn, self._roots(cid), protected=True)
            fixes = self._intent_fixes()
            if fixes:
                conn.cursor().executemany(
                    "INSERT INTO commit_intents VALUES (%s, %s) ON CONFLICT (commit_id) DO "
                    "UPDATE SET data = excluded.data", fixes)
            why = self.policy.summary().split(";")[0]
            dropped = sorted(self.dropped)
            conn.execute(
                "INSERT INTO dropped_commits SELECT id, parent, seq, branch, time_ns, %s, %s "
                "FROM commits WHERE id = ANY(%s) ON CONFLICT (id) DO NOTHING",
                (self.now, f"outside the windows: {why}", dropped))
            forget_commits(conn, dropped)
            if self.policy.reflog != retention.FOREVER:
                cutoff = self.now - int(self.policy.reflog * 1e9)
                cur = conn.execute("DELETE FROM reflog WHERE time_ns < %s", (cutoff,))
                self.report.reflog_dropped = cur.rowcount
                expire_tombstone_rows(conn, cutoff)
            if dropped:  # every host's daemon forgets what it remembered of them
                conn.execute("SELECT pg_notify(%s, %s)",
                             (self.store.channel, f"* {GC_NOTICE} {self.store.host}"))
            step("dropping")
        self.report.commits_dropped = len(self.dropped)
        if dropped:
            self.store.forget_history()

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

    def _catch_up(self, conn: psycopg.Connection) -> None:
        """Under SWEEP_KEY exclusive: mark what other hosts pin now, and what the commits
        made since the last look name (all of them have ended: each held SWEEP_KEY shared)."""
        self._mark(conn, host_pins.others(conn, self.store.host), protected=True)
        rows = conn.execute("SELECT id, tree, seq FROM commits WHERE seq > %s ORDER BY seq",
                            (self.epoch,)).fetchall()
        if not rows:
            return
        ids = [r[0] for r in rows]
        self.tables.update(conn.execute("SELECT commit_id, inodes FROM commit_inodes WHERE "
                                        "commit_id = ANY(%s)", (ids,)).fetchall())
        self.intents.update(conn.execute("SELECT commit_id, data FROM commit_intents WHERE "
                                         "commit_id = ANY(%s)", (ids,)).fetchall())
        roots: list[Ref] = []
        for cid, tree, seq in rows:
            self.trees[cid] = tree
            roots += [Ref(TREE, tree)] + ([Ref(INODES, self.tables[cid])]
                                          if self.tables.get(cid) else [])
            roots += intent_objects(self.intents.get(cid))
            self.epoch = max(self.epoch, seq)
        self._mark(conn, roots, protected=True)

    # -- 3. sweep -------------------------------------------------------------------------------
    def _sweep(self, conn: psycopg.Connection) -> None:
        work = [("o", oid, n) for oid, n in self.object_rows if oid not in self.mark.objects]
        # A patch goes in the same batch as what it is read through, or an earlier one (a
        # longer `over` first: each row it names has a shorter one), so between two batches
        # no row is left reading through one already deleted (a commit may name it again).
        dead = [(cid, n) for cid, n in self.chunk_rows if cid not in self.mark.chunks]
        dead.sort(key=lambda row: -len(self.over.get(row[0], ())))
        work += [("c", cid, n) for cid, n in dead]
        self._phase("sweeping", len(work))
        r = self.report
        for start in range(0, len(work), BATCH):
            batch = work[start:start + BATCH]
            with conn.transaction():
                _exclusive(conn)
                self._catch_up(conn)
                objects = [(oid, n) for what, oid, n in batch
                           if what == "o" and oid not in self.mark.objects]
                chunks = [(cid, n) for what, cid, n in batch
                          if what == "c" and cid not in self.mark.chunks]
                if objects:
                    conn.execute("DELETE FROM objects WHERE id = ANY(%s)",
                                 ([o for o, _ in objects],))
                if chunks:
                    conn.execute("DELETE FROM chunks WHERE id = ANY(%s)",
                                 ([c for c, _ in chunks],))
                    for c, _ in chunks:  # a commit may store it again, in another form
                        self.in_snapshot.discard(c)
                        self.over.pop(c, None)
                conn.execute("UPDATE memfs_meta SET value = (value::bigint + 1)::text "
                             "WHERE key = %s", (schema.EPOCH_KEY,))
                if start == 0:
                    step("sweeping")
            r.objects_freed += len(objects)
            r.object_bytes_freed += sum(n for _, n in objects)
            r.chunks_freed += len(chunks)
            r.chunk_bytes_freed += sum(n for _, n in chunks)
            self.progress.done += len(batch)
            if start == 0:
                step("swept-batch")

    # -- 4. finish ------------------------------------------------------------------------------
    def _finish(self, conn: psycopg.Connection) -> None:
        """The report, then VACUUM: the deleted rows' room is the database's to reuse (and
        a table's empty tail the filesystem's); VACUUM FULL, which would lock the tables
        against every host's commits, is left to the DBA."""
        self._phase("finishing")
        try:
            conn.execute("VACUUM chunks, objects, commits, commit_inodes, commit_intents")
        except psycopg.Error as exc:  # not the owner, say: the next autovacuum does it
            self.report.problems.append(f"VACUUM: {str(exc).strip()}")
        host_pins.expire(conn)
        r = self.report
        r.store_after = _database_size(conn)
        r.seconds = round(time.time() - r.started, 3)
        conn.execute("INSERT INTO memfs_meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET "
                     "value = excluded.value", (META_KEY, json.dumps(r.to_json())))


def _stopped(url: str, exc: BaseException, *, dry_run: bool, trigger: str) -> StoreError:
    """The server went away (or never answered): each step is one transaction, so what the
    run committed stands and the rest was never done. A dry run (`memfs du`, `memfs gc
    --dry-run`) changes nothing, so it is named as what it is, with its own command."""
    told = server_error(url, exc)
    if dry_run:
        what, again = (("memfs du", "`memfs du`") if trigger == "du" else
                       ("garbage collection's dry run", "`memfs gc --dry-run`"))
        return StoreError(f"{what} stopped: {told.message}",
                          f"it changes nothing: run {again} again once the server answers")
    return StoreError(f"garbage collection stopped: {told.message}",
                      "nothing is left half done: run `memfs gc` again once the server "
                      "answers (each step it finished stays done)")


def _exclusive(conn: psycopg.Connection, *, session: bool = False) -> None:
    """SWEEP_KEY exclusive, waiting LOCK_WAIT at a time: a long commit in flight makes this
    step wait, and every commit queued behind the wait with it, so the wait gives way now and
    then (for this transaction: the caller's; `session`: until unlocked)."""
    fn = "pg_advisory_lock" if session else "pg_advisory_xact_lock"
    for _ in range(LOCK_TRIES):
        try:
            with conn.transaction():  # a savepoint inside the caller's transaction
                conn.execute(f"SET LOCAL lock_timeout = '{int(LOCK_WAIT * 1000)}ms'")
                conn.execute(f"SELECT {fn}(%s)", (schema.SWEEP_KEY,))
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(0.2)
    raise StoreError(f"garbage collection waited {LOCK_TRIES * LOCK_WAIT:.0f} s for commits "
                     "in flight to end and gave up (nothing was left half done)",
                     "run `memfs gc` again when the hosts commit less")


def _database_size(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]


def _refs(conn: psycopg.Connection) -> retention.Refs:
    return retention.Refs(
        dict(conn.execute("SELECT name, head FROM branches").fetchall()),
        dict(conn.execute("SELECT name, commit_id FROM checkpoints").fetchall()),
        [tuple(r) for r in conn.execute("SELECT old, new, time_ns FROM reflog").fetchall()])


def _named(conn: psycopg.Connection, reflog_seq: int) -> Iterable[str]:
    """Commits branch heads and checkpoints name now, and reflog moves made since the plan."""
    refs = _refs(conn)
    yield from refs.heads.values()
    yield from refs.checkpoints.values()
    for old, new in conn.execute("SELECT old, new FROM reflog WHERE seq > %s",
                                 (reflog_seq,)).fetchall():
        if old:
            yield old
        yield new


def forget_commits(conn: psycopg.Connection, cids: list[str]) -> None:
    """memfs.store.refs.forget_commits in PostgreSQL's SQL: the dropped commits' rows that
    name objects go with their `commits` rows (the FORGET tables)."""
    from memfs.store.refs import FORGET

    conn.execute("DELETE FROM commits WHERE id = ANY(%s)", (cids,))
    for table in FORGET:
        conn.execute(f"DELETE FROM {table} WHERE commit_id = ANY(%s)", (cids,))


def expire_tombstone_rows(conn: psycopg.Connection, before_ns: int) -> None:
    """memfs.store.refs.expire_tombstone_rows in PostgreSQL's SQL."""
    old = "SELECT id FROM dropped_commits WHERE dropped_ns < %s"
    conn.execute(f"DELETE FROM commit_ops WHERE commit_id IN ({old})", (before_ns,))
    conn.execute(f"DELETE FROM marks WHERE commit_id IN ({old})", (before_ns,))


def database_size(store: PgStore) -> int:
    """The database's size (`memfs du`'s store, the daemon's growth trigger)."""
    return store._query("SELECT pg_database_size(current_database())")[0][0]


def has_commits_before(store: PgStore, time_ns: int) -> bool:
    return bool(store._query("SELECT 1 FROM commits WHERE time_ns < %s LIMIT 1", (time_ns,)))


def last_run(store: PgStore) -> dict | None:
    rows = store._query("SELECT value FROM memfs_meta WHERE key = %s", (META_KEY,))
    return json.loads(rows[0][0]) if rows else None
