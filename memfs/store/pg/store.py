"""The PostgreSQL store: the StoreBackend of a store many hosts share.

In the database: objects, chunks, commits, branches, checkpoints, reflog, the records beside
the commits, writer leases. In this host's root: its record (store.json), its selected
branch and backing bindings (host.db, with the backing journal), its caches (cache/).

Threads: reads come from any thread through one reader connection (under its lock), served
from the caches first (objects and chunks never change once named); writes run in the commit
thread through the writer connection (`transaction()`); leases are renewed by their own
thread (memfs.store.pg.lease) and other hosts' commits heard by another (memfs.store.pg.
watch), which calls the `watch` callbacks.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from memfs.store import history, retention, revisions
from memfs.store.backend import Location, redact
from memfs.store.chunks import chunk_digest
from memfs.store.pg import chunkrows, schema
from memfs.store.pg.cache import ChunkCache, ObjectCache
from memfs.store.pg.chunkrows import ChunkForm
from memfs.store.pg.conn import Conn, ServerError, server_error
from memfs.store.pg.lease import Claim, Leases
from memfs.store.pg.local import LocalState
from memfs.store.pg.records import COMMIT_COLUMNS, PgRecords
from memfs.store.pg.tx import PgTx
from memfs.store.pg.watch import Event, Watcher
from memfs.store.refs import CommitRefs, intent_objects
from memfs.store.store import (
    DEFAULT_BRANCH,
    EMPTY_TREE,
    Commit,
    CommitDropped,
    StoreError,
    _check_ref_name,
    _commit_from_row,
    check_new_name,
)
from memfs.store.trees import Entry, decode_inodes, decode_manifest

log = logging.getLogger("memfs.pg")
OBJECTS_IN_MEMORY = 4096
GC_NOTICE = "gc"  # the head of a "*" notice a GC that dropped commits sends
IN_DB_MAX = 1 << 20  # ids remembered as in the database this GC epoch (~100 B each)


def _refused(conn: psycopg.Connection, exc: BaseException) -> bool:
    """Whether `exc`, raised while the COMMIT and the statements queued before it were sent,
    is the server refusing one of them on a connection that still works: then the
    transaction did not commit. Anything else (a connection lost, a session ended by the
    server: class 08 and 57) leaves the COMMIT's outcome unknown."""
    state = getattr(exc, "sqlstate", None)
    return (isinstance(exc, psycopg.Error) and state is not None
            and not state.startswith(("08", "57")) and not conn.broken and not conn.closed)


class PgStore(PgRecords):
    kind = "postgresql"

    def __init__(self, root: Path, loc: Location, *, readonly: bool = False) -> None:
        self.root = root
        self.location = loc
        self.url = loc.url
        self.host = loc.host
        self.readonly = readonly
        self.local = LocalState(root, readonly=readonly)
        self.db_path = self.local.path
        self.cache = ChunkCache(root)
        self.object_cache = ObjectCache(root)
        self._objects: dict[str, bytes] = {}
        self._commits: dict[str, Commit] = {}
        self._tables: dict[str, str | None] = {}  # commit -> its inode table (None: none)
        self._reader = Conn(self.url, autocommit=True)
        self._writer = None if readonly else Conn(self.url, autocommit=False)
        self._write_lock = threading.RLock()
        self.unsure_commits: set[str] = set()  # ours whose COMMIT broke off (tx.lock_head)
        # Chunks and objects this host saw in the database in GC epoch `in_db_epoch` (the
        # commit thread's): a cached copy of one of them needs no check (memfs.store.pg.gc).
        self.in_db: set[str] = set()
        self.in_db_epoch: str | None = None
        # How those chunks are stored (what each is read through): trusted, as `in_db`, only
        # for ids in `in_db` (the commit thread's; memfs.store.pg.tx).
        self.forms: dict[str, ChunkForm] = {}
        self._version = 0
        self._heads: dict[str, str] = {}
        self._listeners: list[Callable[[str, str], None]] = []
        self._watcher: Watcher | None = None
        self.leases = Leases(self.url, self.host)
        try:
            with self._reader.lock:
                conn = self._reader.get()
                if readonly:
                    had = schema.check_known(conn)  # a store of a newer memfs is refused
                else:
                    schema.create(conn)  # likewise, or made or migrated to this version
                    had = schema.SCHEMA_VERSION
                # A read-only open of a store from before patches (not migrated): every
                # chunk row is whole, and it has no `over` column to read.
                self._chunk_sql = (chunkrows.CHUNKS_SQL if had >= schema.PATCHES_VERSION
                                   else chunkrows.WHOLE_SQL)
                self.channel = schema.channel(conn)
            if not readonly:
                self._ensure_initial_commit()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, root: Path, loc: Location, *, readonly: bool = False) -> PgStore:
        if not readonly:
            from memfs.durable import mkdir_durable

            mkdir_durable(root)
        return cls(root, loc, readonly=readonly)

    def close(self) -> None:
        """Leases held stay held until they expire (a daemon gives its branch back with
        `release` at a clean exit; `memfs takeover` without a daemon keeps it for the next
        mount of this root)."""
        if self._watcher is not None:
            self._watcher.close()
        self.leases.close()
        self.cache.close()
        self._reader.close()
        if self._writer is not None:
            self._writer.close()
        self.object_cache.close()
        self.local.close()

    def describe(self) -> str:
        return redact(self.url)

    def _ensure_initial_commit(self) -> None:
        if self._query("SELECT 1 FROM branches LIMIT 1"):
            return
        with self.transaction() as tx:
            tx.conn.execute("SELECT pg_advisory_xact_lock(%s)", (schema.LOCK_KEY,))
            if tx.conn.execute("SELECT 1 FROM branches LIMIT 1").fetchone():
                return
            tree = tx.put_object(EMPTY_TREE)
            first = tx.add_commit(None, tree, DEFAULT_BRANCH, "init", [])
            history.put_ops(tx, first.id, [history.made_by_memfs("init")])

    # -- transactions ---------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[PgTx]:
        if self._writer is None:
            raise StoreError("the store is open read-only", "open it for writing (a bug if seen)")
        with self._write_lock, self._writer.lock:
            conn = self._writer.get()
            tx = PgTx(self, conn)
            try:
                with self._committed(tx, conn):
                    tx.begin()
                    yield tx
            finally:
                if tx.own_begin and not conn.closed:  # back to psycopg's own transactions
                    try:
                        conn.autocommit = False
                    except psycopg.Error:
                        self._writer.drop()
        self.unsure_commits.clear()
        if len(self.in_db) > IN_DB_MAX:
            self.in_db.clear()  # forgetting costs a check, never a wrong answer
            self.forms.clear()
        self.in_db.update(tx.chunks)
        self.forms.update(tx.forms)
        self.in_db.update(tx.sent_objects)
        self.object_cache.put_many(tx.sent_objects)
        self.cache.keep(tx.chunks)  # written by the cache's thread: this commit does not wait
        for branch, head in tx.notices:
            if branch != "*":
                self._heads[branch] = head
        self._version += 1

    @contextmanager
    def _committed(self, tx: PgTx, conn: psycopg.Connection) -> Iterator[None]:
        """Commit what the block did, or roll it back; errors in words."""
        try:
            yield
            tx.finish()
        except BaseException as exc:
            tx.abandon(exc)
            self._rolled_back(conn, exc)
            raise
        try:
            tx.commit()  # with the statements still queued (PgTx.pipelined)
        except BaseException as exc:
            if _refused(conn, exc):  # the server said no: nothing landed
                tx.abandon(exc)
                self._rolled_back(conn, exc)
                raise
            # Broken off during COMMIT: it may have landed. The next commit may then find
            # the head at this one and builds on it (PgTx.lock_head).
            if tx.commit_id:
                self.unsure_commits.add(tx.commit_id)
            self._writer.drop()
            if isinstance(exc, psycopg.Error):
                raise server_error(self.url, exc) from exc
            raise

    def _rolled_back(self, conn: psycopg.Connection, exc: BaseException) -> None:
        """Roll the writer's transaction back after `exc`; raises `exc` in words if it is
        the server's (a full disk, a lost connection)."""
        try:
            if conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF:
                raise psycopg.OperationalError("left in pipeline mode")  # not to be reused
            conn.rollback()
        except psycopg.Error:
            self._writer.drop()
        if isinstance(exc, psycopg.OperationalError):
            raise self._writer.failed(exc) from exc

    # -- reading -----------------------------------------------------------------------------
    def _query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        return self._reader.query(sql, args)

    def read_object(self, oid: str) -> bytes:
        data = self._objects.get(oid)
        if data is None:
            data = self.object_cache.get(oid)
            if data is None:
                rows = self._query("SELECT data FROM objects WHERE id = %s", (oid,))
                if not rows:
                    raise StoreError(f"object {oid} is missing", "run `memfs fsck`")
                data = bytes(rows[0][0])
                self.object_cache.put_many({oid: data})
            if len(self._objects) > OBJECTS_IN_MEMORY:
                self._objects.clear()
            self._objects[oid] = data
        return data

    def prefetch_objects(self, oids: list[str]) -> dict[str, bytes]:
        """Objects not yet cached, read from the database in one query (and cached)."""
        want = [o for o in oids if o not in self._objects]
        have = self.object_cache.has(want)
        want = [o for o in want if o not in have]
        if not want:
            return {}
        got = {r[0]: bytes(r[1]) for r in self._query(
            "SELECT id, data FROM objects WHERE id = ANY(%s)", (want,))}
        self.object_cache.put_many(got)
        return got

    def _db_chunk(self, chunk_id: str) -> bytes:
        """A chunk's bytes from the database: its row, and for a patch (its `over` set) the
        rows it is read through, in one statement (one snapshot, one round trip), rebuilt
        (memfs.store.delta) and checked against the chunk's name."""
        got = chunkrows.rebuilt(self._query(self._chunk_sql, ([chunk_id], [chunk_id])))
        data = got.get(chunk_id)
        if data is None:
            raise KeyError(f"chunk {chunk_id} is missing from the store")
        if isinstance(data, KeyError):
            raise data
        if chunk_digest(data) != chunk_id.split(".")[0]:
            raise OSError(f"chunk {chunk_id} in the database does not match its digest")
        return data

    def read_chunk(self, chunk_id: str) -> bytes:
        data = self.cache.get(chunk_id)
        if data is None:
            data = self._db_chunk(chunk_id)
            self.cache.keep({chunk_id: data}, wait=False)
        return data

    remote = True  # a miss of this host's caches is a round trip to the server

    def cached(self, objects: list[str], chunks: list[str]) -> bool:
        """Would reading these be served by this host's caches? (Cheap: memory and the local
        object cache; asked on the FUSE loop before it reads.)"""
        wanted = [o for o in objects if o not in self._objects]
        if wanted and len(self.object_cache.has(wanted)) < len(set(wanted)):
            return False
        return all(self.cache.has(c) for c in chunks)

    def fill_cache(self, objects: list[str], chunks: list[str]) -> None:
        """Read into the caches what `cached` misses (a worker thread: it may wait for the
        server, and for the cache's writer to take its copies)."""
        if objects:
            self.prefetch_objects(objects)
        for cid in chunks:
            if not self.cache.has(cid):
                self.cache.keep({cid: self._db_chunk(cid)})

    def read_chunk_range(self, chunk_id: str, start: int, length: int) -> bytes:
        got = self.cache.get_range(chunk_id, start, length)
        if got is not None:
            return got
        data = self.read_chunk(chunk_id)
        return data[start:start + max(0, length)]

    def current_branch(self) -> str:
        return self.local.get("branch") or DEFAULT_BRANCH

    def head(self, branch: str | None = None) -> str:
        branch = branch or self.current_branch()
        rows = self._query("SELECT head FROM branches WHERE name = %s", (branch,))
        if not rows:
            raise StoreError(f"no branch named {branch!r}", "list them with `memfs branch list`")
        return rows[0][0]

    def commit(self, cid: str) -> Commit:
        """A commit never changes once made: kept after the first read."""
        got = self._commits.get(cid)
        if got is not None:
            return got
        rows = self._query(f"SELECT {COMMIT_COLUMNS} FROM commits WHERE id = %s", (cid,))
        if not rows:
            gone = self.dropped_commit(cid)
            if gone is not None:
                raise CommitDropped(cid, gone.time_ns, gone.dropped_ns, gone.reason)
            raise StoreError(f"no commit {cid}", "see `memfs log` for commit ids")
        got = _commit_from_row(rows[0])
        if len(self._commits) > OBJECTS_IN_MEMORY:
            self._commits.clear()
        self._commits[cid] = got
        return got

    def log(self, branch: str | None = None, limit: int = 20,
            start: str | None = None) -> list[Commit]:
        """First-parent history, walked over the gaps retention left (as the embedded
        store's Store.log)."""
        out: list[Commit] = []
        cid: str | None = start or self.head(branch)
        while cid and len(out) < limit:
            chain = self.commit_chain(cid, limit - len(out))
            if chain:
                out += chain
                cid = chain[-1].parent
                continue
            gone = self.dropped_commit(cid)
            if gone is None:
                break
            cid = gone.parent
        return out

    def forget_history(self) -> None:
        """A GC dropped commits (memfs.store.pg.gc): what this process kept of commits
        and objects, in memory, may be of rows gone now; forgotten, so a dropped commit is
        refused by name. (Any thread: each is replaced whole, never changed in place.)"""
        self._commits = {}
        self._tables = {}
        self._objects = {}

    # -- the retention policy (memfs.store.retention), kept in the database ----------------------
    def policy(self) -> retention.Policy:
        rows = self._query("SELECT value FROM memfs_meta WHERE key = %s", (retention.META_KEY,))
        return retention.Policy.decode(rows[0][0] if rows else None)

    def set_policy(self, policy: retention.Policy) -> None:
        with self.transaction() as tx:
            tx.conn.execute("INSERT INTO memfs_meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                            "SET value = excluded.value", (retention.META_KEY, policy.encode()))

    def branches(self) -> dict[str, str]:
        return dict(self._query("SELECT name, head FROM branches ORDER BY name"))

    def reflog(self, limit: int = 50) -> list[dict]:
        rows = self._query("SELECT seq, branch, old, new, reason, time_ns FROM reflog "
                           "ORDER BY seq DESC LIMIT %s", (limit,))
        return [{"seq": r[0], "branch": r[1], "old": r[2], "new": r[3], "reason": r[4],
                 "time": r[5] / 1e9} for r in rows]

    def checkpoints(self) -> list[tuple[str, str, str, int]]:
        return self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints "
                           "ORDER BY time_ns")

    def resolve(self, rev: str) -> str:
        return revisions.resolve(self, rev)

    def file_chunks(self, ref: str) -> dict[int, str]:
        if not ref:
            return {}
        if ref.startswith("c:"):
            return {0: ref[2:]}
        return decode_manifest(self.read_object(ref[2:]))[1]

    def inode_table(self, commit_id: str) -> str | None:
        """Written with its commit, in one transaction: kept once the commit is seen."""
        if commit_id in self._tables:
            return self._tables[commit_id]
        rows = self._query("SELECT inodes FROM commit_inodes WHERE commit_id = %s", (commit_id,))
        table = rows[0][0] if rows else None
        if self.has_commit(commit_id):
            if len(self._tables) > OBJECTS_IN_MEMORY:
                self._tables.clear()
            self._tables[commit_id] = table
        return table

    def inodes(self, table: str | None) -> dict[str, Entry]:
        return decode_inodes(self.read_object(table)) if table else {}

    def _intent_doc(self, commit_id: str) -> dict | None:
        rows = self._query("SELECT data FROM commit_intents WHERE commit_id = %s", (commit_id,))
        return json.loads(rows[0][0]) if rows else None

    def commit_refs(self, commit: Commit) -> CommitRefs:
        """What one commit names directly, as the embedded store's (memfs.store.refs)."""
        rows = self._query("SELECT data FROM commit_intents WHERE commit_id = %s", (commit.id,))
        return CommitRefs(commit.tree, self.inode_table(commit.id),
                          tuple(intent_objects(rows[0][0] if rows else None)))

    def intents_at(self, commit_id: str, max_walk: int = 10_000) -> dict[str, bytes | None]:
        cid: str | None = commit_id
        for _ in range(max_walk):
            if cid is None:
                return {}
            doc = self._intent_doc(cid)
            if doc is not None:
                out: dict[str, bytes | None] = {}
                for mount, oid in doc.items():
                    try:
                        out[mount] = self.read_object(oid)
                    except StoreError:
                        out[mount] = None
                return out
            try:
                cid = self.commit(cid).parent
            except CommitDropped:  # GC copies what a gap would hide onto the commit after it
                return {}
        return {}

    def bindings(self) -> dict[str, dict]:
        return self.local.bindings()

    def set_binding(self, mount: str, doc: dict | None) -> None:
        self.local.set_binding(mount, doc)

    def fsck(self) -> list[str]:
        """memfs.store.fsck over the database's rows (chunks read from the database, not
        the cache, so a row the database lost is found), then branch heads and checkpoints."""
        from memfs.store.fsck import check_store
        from memfs.store.pg.fsck_rows import DatabaseChunks

        problems = check_store(DatabaseChunks(self))
        for name, head in self.branches().items():
            if not self.has_commit(head):
                problems.append(f"branch {name} points at missing commit {head}")
        for name, cid, _, _ in self.checkpoints():
            if not self.has_commit(cid):
                problems.append(f"checkpoint {name} points at missing commit {cid}")
        return problems

    def stat_space(self) -> os.statvfs_result:
        """The local root's filesystem: what holds this host's pending bytes and cache."""
        return os.statvfs(self.root)

    def data_version(self) -> int:
        return self._version

    # -- moving heads and names -----------------------------------------------------------------
    def set_current_branch(self, branch: str) -> None:
        self.head(branch)
        self.local.set("branch", branch)

    def create_branch(self, name: str, at: str | None = None) -> str:
        _check_ref_name(name)
        cid = self.resolve(at) if at else self.head()
        with self.transaction() as tx:
            if tx.ref_exists("branches", name):
                raise StoreError(f"branch {name!r} already exists", "pick another name")
            check_new_name(tx, name, "branch")
            tx.require_commit(cid)
            made = tx.conn.execute("INSERT INTO branches VALUES (%s, %s) ON CONFLICT (name) DO "
                                   "NOTHING RETURNING 1", (name, cid)).fetchone()
            if not made:
                raise StoreError(f"branch {name!r} already exists", "pick another name")
            tx.notify(name, cid)
        return cid

    def reset_head(self, branch: str, target: str, reason: str) -> None:
        """Move a head under its lease; a command run without a daemon (memfs restore)
        claims the lease for the move if it is free and gives it back after."""
        passing = self.leases.token(branch) is None and self.leases.claim(branch).writable
        try:
            with self.transaction() as tx:
                row = tx.conn.execute("SELECT head FROM branches WHERE name = %s FOR UPDATE",
                                      (branch,)).fetchone()
                tx.check_lease(branch)
                tx.require_commit(target)
                tx.conn.execute("UPDATE branches SET head = %s WHERE name = %s",
                                (target, branch))
                tx.add_reflog(branch, row[0] if row else None, target, reason, time.time_ns())
                tx.notify(branch, target)
        finally:
            if passing:
                self.leases.release(branch)

    def checkpoint(self, name: str, cid: str | None = None, *, force: bool = False) -> str:
        cid = cid or self.head()
        history.create_checkpoint(self, name, cid, self.current_branch(), force=force)
        return cid

    # -- many hosts ------------------------------------------------------------------------------
    def claim(self, branch: str) -> Claim:
        return self.leases.claim(branch)

    def takeover(self, branch: str) -> Claim:
        return self.leases.takeover(branch)

    def release(self, branch: str) -> None:
        self.leases.release(branch)

    def lease_state(self, branch: str) -> Claim:
        return self.leases.state(branch)

    def watch(self, on_head: Callable[[str, str], None],
              on_lost: Callable[[str], None]) -> None:
        """Call `on_head(branch, head)` (from the watcher thread) whenever another host moves
        a head, and once per branch after a lost connection if it moved meanwhile;
        `on_lost(branch)` (from the lease thread) when a lease of ours was taken over."""
        self._listeners.append(on_head)
        self.leases.on_lost = on_lost
        if self._watcher is None:
            self._heads = self.branches()
            self._watcher = Watcher(self.url, self.channel, self._heard)
            self._watcher.start()

    def watching(self, timeout: float) -> bool:
        return self._watcher is not None and self._watcher.ready.wait(timeout)

    def _heard(self, event: Event | None) -> None:
        self._version += 1
        if event is None:
            self.forget_history()  # a GC may have run while not listening
            return self._resync()
        if event.branch == "*" and event.head == GC_NOTICE:
            return self.forget_history()
        if event.host == self.host or event.branch == "*":
            return
        self._moved(event.branch, event.head)

    def _resync(self) -> None:
        try:
            heads = self.branches()
        except ServerError:
            return
        for branch, head in heads.items():
            if self._heads.get(branch) != head:
                self._moved(branch, head)

    def _moved(self, branch: str, head: str) -> None:
        self._heads[branch] = head
        for fn in self._listeners:
            fn(branch, head)


__all__ = ["PgStore", "ServerError"]
