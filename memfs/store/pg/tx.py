"""One durable step on the PostgreSQL store: chunks, objects, a commit, its records.

Everything goes into one database transaction on the writer connection (the commit thread),
so a commit and every row it names become visible together, to every host, or not at all.
The branch head moves by compare-and-swap under the branch's writer lease (memfs.store.pg.
lease): the head row is locked, must still be the commit this one builds on, and the lease
row must still carry this host's token. A host fenced off by a takeover is refused here,
whatever it believes.

Round trips are few: from its BEGIN to its COMMIT, every transaction is in
psycopg's pipeline mode, so a statement whose result nobody reads is sent with the next one
that is read, and the client waits for the server only where it must know an answer. A small
group commit is four round trips: BEGIN with GC's sweep lock and epoch (PgTx.begin: what the
cache may skip depends on it); the new chunks (is each one new, or already stored with the
same bytes?); the objects, the head row locked, the lease row and the commit's sequence
number (the compare-and-swap is decided on those); the commit rows, the head moved, the
records, the notification and COMMIT. A commit that stores no new chunk is three, and a
piece stored as a patch over the one it replaces (put_chunks) costs none more. A
statement queued that way raises its error at the next read (at the latest at COMMIT), still
inside the transaction, so it is rolled back and reported as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from psycopg.pq import TransactionStatus

from memfs.store import delta
from memfs.store.chunks import chunk_digest
from memfs.store.pg import chunkrows, schema
from memfs.store.pg.chunkrows import WHOLE, ChunkForm
from memfs.store.pg.lease import Fenced
from memfs.store.pg.records import PgTxRecords
from memfs.store.store import Commit, StoreError, printable
from memfs.store.trees import object_id

if TYPE_CHECKING:
    import psycopg

    from memfs.store.pg.store import PgStore


BATCH_BYTES = 8 << 20  # chunk bytes per INSERT: bounds the client's copies of a commit


def _batches(pieces: dict[str, bytes]) -> list[list[str]]:
    out: list[list[str]] = []
    size = BATCH_BYTES
    for name, data in pieces.items():
        if size + len(data) > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(name)
        size += len(data)
    return out


class PgTx(PgTxRecords):
    def __init__(self, store: PgStore, conn: psycopg.Connection) -> None:
        self.store = store
        self.conn = conn
        self.objects: dict[str, bytes] = {}  # put, not yet sent
        self.sent_objects: dict[str, bytes] = {}
        self.chunks: dict[str, bytes] = {}  # written or matched by this transaction
        self.cached: set[str] = set()  # named by the cache: the database has them
        self.forms: dict[str, ChunkForm] = {}  # how the chunks this transaction inserted are
        # stored (PgStore.forms after the COMMIT)
        self.commit_id: str | None = None
        self.notices: list[tuple[str, str]] = []
        self._pipeline: ExitStack | None = None  # pipeline mode, from the first put on
        self.own_begin = False  # BEGIN sent by pipelined(), in autocommit (PgStore undoes it)

    # -- pipeline mode, and the end (PgStore.transaction) ----------------------------------
    def pipelined(self) -> None:
        """Queue the statements from here to the COMMIT (psycopg's pipeline mode): the
        commit path's puts call this; other transactions (a branch made, a head reset) stay
        in plain mode."""
        if self._pipeline is not None:
            return
        begin = self.conn.info.transaction_status == TransactionStatus.IDLE
        if begin:  # psycopg's own BEGIN would be a round trip alone (it syncs after it)
            self.conn.autocommit = True
            self.own_begin = True
        stack = ExitStack()
        stack.enter_context(self.conn.pipeline())
        self._pipeline = stack
        if begin:
            self.conn.execute("BEGIN", prepare=False)

    def commit(self) -> None:
        """COMMIT, sent with whatever is still queued: one round trip. Returns once the
        server has it in its WAL on disk (synchronous_commit on)."""
        stack = self._pipeline
        if stack is None:
            self.conn.commit()
            return
        self.conn.execute("COMMIT", prepare=False)  # if this raises, abandon() ends the mode
        self._pipeline = None
        stack.close()  # the Sync: every queued result read, the first error raised

    def abandon(self, exc: BaseException) -> None:
        """Leave pipeline mode after `exc` (the caller rolls back): what the server still
        says about the queued statements is dropped, `exc` is the error to report."""
        stack, self._pipeline = self._pipeline, None
        if stack is not None:
            try:
                stack.__exit__(type(exc), exc, exc.__traceback__)
            except BaseException:  # noqa: BLE001 - `exc` is the error to report
                pass

    def begin(self) -> None:
        """The transaction's first statement: SWEEP_KEY shared until it ends, so no GC step
        deletes a row between this transaction's checks and its COMMIT, and the GC epoch
        (memfs.store.pg.gc): past a GC that deleted rows, what this host remembered as in the
        database is forgotten (its caches are checked again, PgTx.confirm_cached). Sent with
        the BEGIN, in pipeline mode from here on: one round trip.

        The epoch is its own statement, after the lock's: a statement reads the snapshot
        taken when it started, before a lock it waits for is granted, so in the lock's
        statement it would be the epoch from before the GC step this commit waited for."""
        self.pipelined()
        self.conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (schema.SWEEP_KEY,))
        epoch = self.conn.execute("SELECT value FROM memfs_meta WHERE key = %s",
                                  (schema.EPOCH_KEY,)).fetchone()[0]
        if epoch != self.store.in_db_epoch:
            self.store.in_db.clear()
            self.store.forms.clear()
            self.store.in_db_epoch = epoch

    def confirm_cached(self, olds: Sequence[str] = ()) -> None:
        """Pieces this host's cache holds are in the database only if no GC took them since
        this host saw them there: those not seen there in this epoch are looked up, and the
        missing ones sent with the rest. `olds`, chunks being replaced whose form this host
        does not know, are looked up in the same statement (chunkrows.FORMS_SQL)."""
        unsure = [n for n in self.cached if n not in self.store.in_db]
        ask = list(dict.fromkeys([*unsure, *olds]))
        if not ask:
            return
        found = set()
        for cid, over, patched, complete in self.conn.execute(chunkrows.FORMS_SQL, (ask,)):
            found.add(cid)
            if complete:  # a fact of this epoch, as `in_db`: kept even if this tx rolls back
                self.store.forms[cid] = ChunkForm(delta.split_over(over), patched)
        self.store.in_db.update(found)
        self.cached.difference_update(n for n in unsure if n not in found)

    # -- chunks ---------------------------------------------------------------------------
    def put_chunks(self, pieces: list[bytes],
                   replacing: list[str | None] | None = None) -> list[str]:
        """Name each piece (its digest, suffixed past a different stored piece of that
        digest) and store those the database lacks, in one statement. A piece that replaces
        a committed chunk (`replacing[i]`: the same piece of the same file) is stored as a
        patch over it when delta.encode says so, as on the embedded store.

        What the replaced chunk is read through comes from what this host knows (it wrote
        or looked the row up in this GC epoch) and its full bytes from its chunk cache, so a
        log appended at every commit costs no round trip more. A replaced chunk not known is
        looked up with the cache's check, one statement for them all; one whose bytes the
        cache lacks makes the piece stored whole (it is then the next patches' base)."""
        self.pipelined()
        names = [self._local_name(p) for p in pieces]
        olds: list[str | None] = [None] * len(pieces)
        if replacing:
            olds = [old if old is not None and n not in self.chunks
                    and delta.worth_trying(len(p)) else None
                    for n, p, old in zip(names, pieces, replacing, strict=True)]
        self.confirm_cached([o for o in dict.fromkeys(olds) if o is not None
                             and self._form(o) is None])
        fresh = {n: p for n, p in zip(names, pieces, strict=True)
                 if n not in self.chunks and n not in self.cached}
        stored: dict[str, tuple[bytes, ChunkForm]] = {}
        for n, p, old in zip(names, pieces, olds, strict=True):
            if n in fresh and n not in stored:
                stored[n] = self._stored_form(p, old)
        collided: set[str] = set()
        for batch in _batches({n: stored[n][0] for n in fresh}):
            collided |= self._send_chunks({n: fresh[n] for n in batch}, stored)
        if collided:  # another piece holds this digest: one at a time past it
            names = [self._collided(n, p) if n in collided else n
                     for n, p in zip(names, pieces, strict=True)]
        for n, p in zip(names, pieces, strict=True):
            self.chunks.setdefault(n, p)
        return names

    def _form(self, cid: str) -> ChunkForm | None:
        """How `cid` is stored, if this transaction stored it or this host saw it in the
        database in this GC epoch (so it is there until this transaction ends: SWEEP_KEY)."""
        form = self.forms.get(cid)
        if form is None and cid in self.store.in_db:
            form = self.store.forms.get(cid)
        return form

    def _stored_form(self, data: bytes, old: str | None) -> tuple[bytes, ChunkForm]:
        """(the bytes to store, their form): delta.encode's choice, whole if `old`'s form
        or the full bytes it needs are not at hand. Everything a patch names is a row this
        transaction knows is there, and GC keeps it while the patch is named
        (memfs.store.pg.gc)."""
        form = self._form(old) if old is not None else None
        if form is None:
            return data, WHOLE
        blob, over = delta.encode(data, old, form.over, lambda: form.patched, self._full)
        return (data, WHOLE) if not over else (blob, form.after(blob, over))

    def _full(self, cid: str) -> bytes | None:
        """A committed chunk's full bytes, from this host's cache (never a round trip)."""
        data = self.chunks.get(cid)
        return data if data is not None else self.store.cache.get(cid)

    def _send_chunks(self, fresh: dict[str, bytes],
                     stored: dict[str, tuple[bytes, ChunkForm]]) -> set[str]:
        """Insert the pieces the database lacks (each in its stored form), then compare the
        bytes of those it had; returns the names held by other bytes (collisions).
        Pipelined statements, binary: one round trip per batch, no array for the server to
        unpack (an unnest of a bytea[] ran at a tenth of the speed). A row it had stored as
        a patch is compared rebuilt (a round trip more, only then)."""
        rows = [(n, stored[n][0], delta.join_over(stored[n][1].over)) for n in fresh]
        inserted = set(self._many("INSERT INTO chunks (id, data, over) VALUES (%s, %s, %s) "
                                  "ON CONFLICT (id) DO NOTHING RETURNING id", rows))
        known = [i for i in fresh if i not in inserted]
        same = set(self._many("SELECT id FROM chunks WHERE id = %s AND over IS NULL AND "
                              "data = %s", [(i, fresh[i]) for i in known])) if known else set()
        rest = [i for i in known if i not in same]
        if rest:
            same |= {i for i, got in self._rebuilt(rest).items() if got == fresh[i]}
        for cid in fresh:
            if cid in inserted:
                self.forms[cid] = stored[cid][1]
            if cid in inserted or cid in same:
                self.chunks[cid] = fresh[cid]
        return {i for i in known if i not in same}

    def _rebuilt(self, ids: list[str]) -> dict[str, bytes | KeyError]:
        return chunkrows.rebuilt(self.conn.execute(chunkrows.CHUNKS_SQL, (ids, ids)))

    def _many(self, sql: str, rows: list[tuple]) -> list:
        """The first column of every row each statement returned."""
        out = []
        with self.conn.cursor(binary=True) as cur:
            cur.executemany(sql, rows, returning=True)
            while True:
                out.extend(r[0] for r in cur.fetchall())
                if not cur.nextset():
                    break
        return out

    def _local_name(self, data: bytes) -> str:
        """The digest, suffixed past a piece of this transaction or of the cache that has
        the same digest but other bytes."""
        base = chunk_digest(data)
        n = 0
        while True:
            cid = base if n == 0 else f"{base}.{n}"
            mine = self.chunks.get(cid)
            if mine is None:
                mine = self.store.cache.get(cid)
                if mine == data:
                    self.cached.add(cid)  # a committed row of these bytes: nothing to send
            if mine is None or mine == data:
                return cid
            n += 1

    def _collided(self, cid: str, data: bytes) -> str:
        base, n = chunk_digest(data), 1
        while True:
            name = f"{base}.{n}"
            if self.chunks.get(name) == data:
                return name
            if self.conn.execute("INSERT INTO chunks (id, data) VALUES (%s, %s) ON CONFLICT "
                                 "(id) DO NOTHING RETURNING 1", (name, data)).fetchone() or \
                    self._rebuilt([name]).get(name) == data:
                self.chunks[name] = data
                return name
            n += 1

    # -- objects ---------------------------------------------------------------------------
    def put_object(self, data: bytes) -> str:
        self.pipelined()
        oid = object_id(data)
        if oid not in self.sent_objects:
            self.objects[oid] = data
        return oid

    def flush_objects(self) -> None:
        if not self.objects:
            return
        todo = self.objects
        self.objects = {}
        in_db = self.store.in_db  # a cached copy alone may be of a row a GC swept
        cached = {o for o in self.store.object_cache.has(list(todo)) if o in in_db}
        send = {k: v for k, v in todo.items() if k not in cached}
        if send:  # queued: their outcome is read with the next answer the commit needs
            with self.conn.cursor(binary=True) as cur:
                cur.executemany("INSERT INTO objects (id, data) VALUES (%s, %s) ON CONFLICT "
                                "(id) DO NOTHING", list(send.items()))
        self.sent_objects.update(todo)

    # -- the commit ---------------------------------------------------------------------------
    def add_commit(
        self, parent: str | None, tree: str, branch: str, message: str, processes: list[dict],
        inodes: str | None = None,
    ) -> Commit:
        message = printable(message)
        self.pipelined()
        self.flush_objects()
        parent, seq = self.lock_head(branch, parent)
        now = time.time_ns()
        body = json.dumps([parent, tree, branch, now, message, seq] + ([inodes] if inodes else []))
        cid = object_id(body.encode())
        # Queued, sent with the COMMIT: nothing below needs an answer.
        self.conn.execute("INSERT INTO commits VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                          (cid, seq, parent, tree, branch, now, message, json.dumps(processes)))
        if inodes:
            self.conn.execute("INSERT INTO commit_inodes VALUES (%s, %s)", (cid, inodes))
        self.conn.execute("INSERT INTO branches (name, head) VALUES (%s, %s) ON CONFLICT (name) "
                          "DO UPDATE SET head = excluded.head", (branch, cid))
        self.commit_id = cid
        self.notify(branch, cid)
        return Commit(cid, seq, parent, tree, branch, now, message, processes)

    def lock_head(self, branch: str, expected: str | None) -> tuple[str | None, int]:
        """Lock the branch's head row and check the lease; the head this step builds on, and
        the new commit's sequence number.

        The head must be `expected`, or a commit of this host whose COMMIT's outcome was
        unknown (the connection broke during it) and that did land: then this step builds on
        it, since it holds the same changes and more. A new branch (no row) needs no lease.
        The three statements go in one round trip (with whatever was queued before them);
        the sequence number is taken after the head's lock, as the commits of one branch
        are ordered.
        """
        head = self.conn.execute("SELECT head FROM branches WHERE name = %s FOR UPDATE",
                                 (branch,))
        lease = self._lease_row(branch)
        seq = self.conn.execute("SELECT nextval('commit_seq')")
        row = head.fetchone()
        number = seq.fetchone()[0]
        if row is None:
            return expected, number
        self._check_token(branch, lease.fetchone())
        if row[0] == expected or row[0] in self.store.unsure_commits:
            return row[0], number
        raise StoreError(f"branch {branch} moved to {row[0][:12]} under this host (expected "
                         f"{(expected or '-')[:12]})",
                         "another writer moved it: remount to see the branch as it is now")

    def check_lease(self, branch: str) -> None:
        self._check_token(branch, self._lease_row(branch).fetchone())

    def _lease_row(self, branch: str) -> psycopg.Cursor:
        return self.conn.execute("SELECT token, hostname, host FROM leases WHERE branch = %s "
                                 "FOR SHARE", (branch,))

    def _check_token(self, branch: str, row: tuple | None) -> None:
        token = self.store.leases.token(branch)
        if token is None or row is None or row[0] != token:
            holder = f"{row[1]} ({row[2]})" if row else "nobody"
            raise Fenced(f"this host holds no lease to write branch {branch} (its writer: "
                         f"{holder}); nothing was committed",
                         f"work on a branch of your own (`memfs branch create NAME && memfs "
                         f"branch switch NAME`), or `memfs takeover {branch}` once its "
                         f"writer's lease has expired")

    def put_intents(self, commit_id: str, intents: dict[str, bytes]) -> None:
        doc = {mount: self.put_object(data) for mount, data in sorted(intents.items())}
        self.flush_objects()
        self.conn.execute("INSERT INTO commit_intents VALUES (%s, %s) ON CONFLICT (commit_id) "
                          "DO UPDATE SET data = excluded.data", (commit_id, json.dumps(doc)))

    def notify(self, branch: str, head: str) -> None:
        """Other hosts hear of it when (and only if) this transaction commits."""
        if (branch, head) not in self.notices:
            self.notices.append((branch, head))

    def finish(self) -> None:
        """Just before COMMIT: the last objects, and the notifications."""
        self.flush_objects()
        for branch, head in self.notices:
            self.conn.execute("SELECT pg_notify(%s, %s)",
                              (self.store.channel, f"{branch} {head} {self.store.host}"))
