"""The embedded store: commits of immutable trees on named branches, in one root folder.

Readers (the event loop) use their own connection; every write goes through the writer
connection under one lock, inside a transaction that references only chunks whose pack was
already synced. A transaction that returned is durable (WAL, synchronous=FULL).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from memfs.durable import fsync_dir, mkdir_durable
from memfs.errors import MemfsError
from memfs.store import db, retention, schema
from memfs.store.backend import SingleHost
from memfs.store.chunks import ChunkStore
from memfs.store.refs import CommitRefs, commit_refs
from memfs.store.sqlite_records import SqliteRecords, SqliteTxRecords
from memfs.store.trees import Entry, decode_inodes, decode_manifest, encode_dir, object_id

DEFAULT_BRANCH = "main"
EMPTY_TREE = encode_dir([])
BINDING_KEY = "backing:"  # meta key prefix: a store mount's backing directory (not per branch)

@dataclass(frozen=True)
class Commit:
    id: str
    seq: int
    parent: str | None
    tree: str
    branch: str
    time_ns: int
    message: str
    processes: list[dict]

    def to_json(self) -> dict:
        return {
            "id": self.id, "parent": self.parent, "tree": self.tree, "branch": self.branch,
            "time": self.time_ns / 1e9, "message": self.message, "processes": self.processes,
        }


class StoreError(MemfsError):
    pass


class UnknownRevision(StoreError):
    """A name that is no branch, checkpoint, commit or mark (a caller that also takes a
    time says both forms in its remedy)."""


class CommitDropped(StoreError):
    """A commit the retention policy dropped: named, dated, with the way to a kept one."""

    def __init__(self, cid: str, time_ns: int, dropped_ns: int, reason: str) -> None:
        def when(ns: int) -> str:
            return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M")
        super().__init__(
            f"commit {cid[:12]} ({when(time_ns)}) was dropped by the retention policy on "
            f"{when(dropped_ns)} ({reason})",
            "restore a kept commit or a checkpoint (`memfs log` lists them); to keep a state "
            "for good, `memfs checkpoint NAME`; the policy: `memfs config`")
        self.cid = cid


class Transaction(SqliteTxRecords):
    """One durable step: chunks, objects, a commit. Used only by the writer."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.conn = store._writer

    def put_chunks(self, pieces: list[bytes],
                   replacing: list[str | None] | None = None) -> list[str]:
        ids, rows = self.store.chunks.put_many(self.conn, pieces, replacing)
        self.conn.executemany(
            "INSERT OR IGNORE INTO chunks (id, pack, off, len, over) VALUES (?, ?, ?, ?, ?)",
            rows)
        return ids

    def put_object(self, data: bytes) -> str:
        oid = object_id(data)
        self.conn.execute("INSERT OR IGNORE INTO objects VALUES (?, ?)", (oid, data))
        return oid

    def add_commit(
        self, parent: str | None, tree: str, branch: str, message: str, processes: list[dict],
        inodes: str | None = None,
    ) -> Commit:
        """`inodes`: the object id of the tree's inode table, when it has hard links."""
        message = printable(message)
        now = time.time_ns()
        seq = self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM commits").fetchone()[0]
        body = json.dumps([parent, tree, branch, now, message, seq] + ([inodes] if inodes else []))
        cid = object_id(body.encode())
        procs = json.dumps(processes)
        self.conn.execute(
            "INSERT INTO commits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (cid, seq, parent, tree, branch, now, message, procs),
        )
        if inodes:
            self.conn.execute("INSERT INTO commit_inodes VALUES (?, ?)", (cid, inodes))
        self.conn.execute(
            "INSERT INTO branches (name, head) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET head = excluded.head",
            (branch, cid),
        )
        return Commit(cid, seq, parent, tree, branch, now, message, processes)

    def put_intents(self, commit_id: str, intents: dict[str, bytes]) -> None:
        """Keep each backed mount's branch-intent bytes with this commit."""
        doc = {mount: self.put_object(data) for mount, data in sorted(intents.items())}
        self.conn.execute("INSERT OR REPLACE INTO commit_intents VALUES (?, ?)",
                          (commit_id, json.dumps(doc)))


class Store(SqliteRecords, SingleHost):
    kind = "sqlite"  # memfs.store.backend: which backend this is

    def __init__(self, root: Path, *, readonly: bool = False) -> None:
        self.root = root
        self.db_path = root / "store.db"
        self.readonly = readonly
        self._write_lock = threading.RLock()  # re-entered by exclusive()
        self._writer = None if readonly else db.connect(self.db_path)
        if self._writer is not None:
            db.create_schema(self._writer, self.db_path)  # read the version, migrate
            fsync_dir(root)  # store.db's name (SQLite syncs the file, not the directory entry)
        self._reader = db.connect(self.db_path, readonly=readonly)
        if readonly:
            schema.check_known(self._reader, self.db_path)  # a newer memfs's store: refused
        self._reader_lock = threading.Lock()
        self.chunks = ChunkStore(root, deltas=schema.has_chunk_bases(self._reader))
        self._objects: dict[str, bytes] = {}
        if not readonly:
            self._ensure_initial_commit()

    # -- lifecycle ---------------------------------------------------------------
    @classmethod
    def open(cls, root: Path, *, create: bool = True) -> Store:
        if not (root / "store.db").exists():
            if not create:
                raise _no_store(root)
            mkdir_durable(root)
        return cls(root)

    @classmethod
    def open_readonly(cls, root: Path) -> Store:
        """Reads only (log, diff, show): no schema, no writer, safe beside a running daemon."""
        if not (root / "store.db").exists():
            raise _no_store(root)
        return cls(root, readonly=True)

    def close(self) -> None:
        self.chunks.close()
        if self._writer is not None:
            self._writer.close()
        self._reader.close()

    def _ensure_initial_commit(self) -> None:
        with self.transaction() as tx:
            if tx.conn.execute("SELECT 1 FROM branches LIMIT 1").fetchone():
                return
            tree = tx.put_object(EMPTY_TREE)
            first = tx.add_commit(None, tree, DEFAULT_BRANCH, "init", [])
            from memfs.store import history

            history.put_ops(tx, first.id, [history.made_by_memfs("init")])
            tx.conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('branch', ?)", (DEFAULT_BRANCH,)
            )

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        if self._writer is None:
            raise StoreError("the store is open read-only", "open it for writing (a bug if seen)")
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            self.chunks.begin()
            try:
                yield Transaction(self)
            except BaseException:
                # SQLite rolls a transaction back by itself on some errors (a full disk):
                # a second ROLLBACK would raise and hide the error that matters.
                if self._writer.in_transaction:
                    self._writer.execute("ROLLBACK")
                self.chunks.rollback()
                raise
            try:
                self._writer.execute("COMMIT")
            except sqlite3.Error as exc:
                # A full disk fails COMMIT before its commit frame is written: surely not
                # committed. Any other error may have committed (the WAL frames reached the
                # file): the appended chunks are kept, never overwritten by the next commit.
                if self._writer.in_transaction:
                    self._writer.execute("ROLLBACK")
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL:
                    self.chunks.rollback()
                raise

    def exclusive(self):
        """Hold the writer lock across several transactions (a GC on a full disk: no commit
        may take the room its transactions need in between)."""
        return self._write_lock

    def forget_objects(self) -> None:
        """Objects went (GC): drop the read cache."""
        self._objects = {}

    def compact_db(self) -> None:
        """Give SQLite's free pages back to the filesystem and cut the WAL back (GC's last
        step; a busy reader just leaves the WAL for the next run)."""
        with self._write_lock:
            # Python's sqlite3 steps this pragma once, and each step frees one page: one
            # statement per free page, in one transaction (one sync).
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                free = self._writer.execute("PRAGMA freelist_count").fetchone()[0]
                if self._writer.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
                    for _ in range(free):
                        self._writer.execute("PRAGMA incremental_vacuum(1)")
                self._writer.execute("COMMIT")
            except BaseException:
                if self._writer.in_transaction:
                    self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    # -- reading -----------------------------------------------------------------
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._reader_lock:
            return self._reader.execute(sql, args).fetchall()

    def read_object(self, oid: str) -> bytes:
        data = self._objects.get(oid)
        if data is None:
            rows = self._query("SELECT data FROM objects WHERE id = ?", (oid,))
            if not rows:
                raise StoreError(f"object {oid} is missing", "run `memfs fsck`")
            data = rows[0][0]
            if len(self._objects) > 4096:
                self._objects.clear()
            self._objects[oid] = data
        return data

    def read_chunk(self, chunk_id: str) -> bytes:
        with self._reader_lock:
            loc, over = self.chunks.locate_all(self._reader, chunk_id)
        return self.chunks.read_at(loc, over, chunk_id)

    remote = False  # reads are this host's SQLite and packs

    def cached(self, objects: list[str], chunks: list[str]) -> bool:
        return True

    def fill_cache(self, objects: list[str], chunks: list[str]) -> None:
        return None

    def read_chunk_range(self, chunk_id: str, start: int, length: int) -> bytes:
        with self._reader_lock:
            loc, over = self.chunks.locate_all(self._reader, chunk_id)
        return self.chunks.read_range(loc, over, start, length)

    def rebuild_chunk(self, chunk_id: str, own: bytes) -> bytes:
        """The full bytes of a patch row whose stored bytes are `own` (GC checks a copy)."""
        with self._reader_lock:
            loc, over = self.chunks.locate_all(self._reader, chunk_id)
        return self.chunks.rebuild(loc, over, own) if loc.over else own

    def current_branch(self) -> str:
        rows = self._query("SELECT value FROM meta WHERE key = 'branch'")
        return rows[0][0] if rows else DEFAULT_BRANCH

    def head(self, branch: str | None = None) -> str:
        branch = branch or self.current_branch()
        rows = self._query("SELECT head FROM branches WHERE name = ?", (branch,))
        if not rows:
            raise StoreError(f"no branch named {branch!r}", "list them with `memfs branch list`")
        return rows[0][0]

    def commit(self, cid: str) -> Commit:
        rows = self._query("SELECT * FROM commits WHERE id = ?", (cid,))
        if not rows:
            self._refuse_dropped(cid)
            raise StoreError(f"no commit {cid}", "see `memfs log` for commit ids")
        return _commit_from_row(rows[0])

    def _refuse_dropped(self, cid: str) -> None:
        gone = self.dropped_commit(cid)
        if gone is not None:
            raise CommitDropped(cid, gone.time_ns, gone.dropped_ns, gone.reason)

    def dropped_parent(self, cid: str) -> str | None:
        """The parent of a commit retention dropped (how history is walked over a gap)."""
        gone = self.dropped_commit(cid)
        if gone is None:
            raise StoreError(f"no commit {cid}", "see `memfs log` for commit ids")
        return gone.parent

    def log(self, branch: str | None = None, limit: int = 20, start: str | None = None) -> list[Commit]:
        """First-parent history from the branch head (or `start`), newest first; commits the
        retention policy dropped are walked over (memfs.store.retention)."""
        out: list[Commit] = []
        cid: str | None = start or self.head(branch)
        while cid and len(out) < limit:
            try:
                c = self.commit(cid)
            except CommitDropped:
                cid = self.dropped_parent(cid)
                continue
            out.append(c)
            cid = c.parent
        return out

    def policy(self) -> retention.Policy:
        """The retention policy kept with this store (the defaults if none was set)."""
        rows = self._query("SELECT value FROM meta WHERE key = ?", (retention.META_KEY,))
        return retention.Policy.decode(rows[0][0] if rows else None)

    def set_policy(self, policy: retention.Policy) -> None:
        with self.transaction() as tx:
            tx.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                            (retention.META_KEY, policy.encode()))

    def branches(self) -> dict[str, str]:
        return dict(self._query("SELECT name, head FROM branches ORDER BY name"))

    def reflog(self, limit: int = 50) -> list[dict]:
        """Ref moves other than commits, newest first: the way back. Branch heads moved by
        undo and restore, and checkpoints set, moved or deleted (ref `checkpoints/NAME`; a
        deletion has an empty `new`)."""
        rows = self._query(
            "SELECT seq, branch, old, new, reason, time_ns FROM reflog ORDER BY seq DESC LIMIT ?",
            (limit,),
        )
        return [{"seq": r[0], "branch": r[1], "old": r[2], "new": r[3], "reason": r[4],
                 "time": r[5] / 1e9} for r in rows]

    def checkpoints(self) -> list[tuple[str, str, str, int]]:
        return self._query("SELECT name, commit_id, branch, time_ns FROM checkpoints ORDER BY time_ns")

    def resolve(self, rev: str) -> str:
        """A commit id (or unique prefix ≥ 6), branch, checkpoint, or REV~N."""
        from memfs.store import revisions

        return revisions.resolve(self, rev)

    # -- branch and history operations (writer) -----------------------------------
    def set_current_branch(self, branch: str) -> None:
        self.head(branch)
        with self.transaction() as tx:
            tx.conn.execute("INSERT OR REPLACE INTO meta VALUES ('branch', ?)", (branch,))

    def create_branch(self, name: str, at: str | None = None) -> str:
        _check_ref_name(name)
        cid = self.resolve(at) if at else self.head()
        with self.transaction() as tx:
            if tx.conn.execute("SELECT 1 FROM branches WHERE name = ?", (name,)).fetchone():
                raise StoreError(f"branch {name!r} already exists", "pick another name")
            check_new_name(tx, name, "branch")
            tx.conn.execute("INSERT INTO branches VALUES (?, ?)", (name, cid))
        return cid

    def reset_head(self, branch: str, target: str, reason: str) -> None:
        """Move a branch head; the old head stays reachable through the reflog."""
        with self.transaction() as tx:
            old = tx.conn.execute("SELECT head FROM branches WHERE name = ?", (branch,)).fetchone()
            tx.conn.execute("UPDATE branches SET head = ? WHERE name = ?", (target, branch))
            tx.conn.execute(
                "INSERT INTO reflog (branch, old, new, reason, time_ns) VALUES (?, ?, ?, ?, ?)",
                (branch, old[0] if old else None, target, reason, time.time_ns()),
            )

    def checkpoint(self, name: str, cid: str | None = None, *, force: bool = False) -> str:
        """Name a commit (the head by default); moving an existing name needs `force`.
        memfs.store.history keeps the rules and the reflog rows."""
        from memfs.store import history

        cid = cid or self.head()
        history.create_checkpoint(self, name, cid, self.current_branch(), force=force)
        return cid

    # -- backing directories and their branch intent --------------------------------
    def bindings(self) -> dict[str, dict]:
        """mount -> its backing binding (memfs.backing.Binding as JSON)."""
        rows = self._query("SELECT key, value FROM meta WHERE key LIKE ?", (BINDING_KEY + "%",))
        return {k[len(BINDING_KEY):]: json.loads(v) for k, v in rows}

    def set_binding(self, mount: str, doc: dict | None) -> None:
        """Bind (doc) or unbind (None) a store mount; bindings are not per branch."""
        with self.transaction() as tx:
            if doc is None:
                tx.conn.execute("DELETE FROM meta WHERE key = ?", (BINDING_KEY + mount,))
            else:
                tx.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                (BINDING_KEY + mount, json.dumps(doc, sort_keys=True)))

    def intents_at(self, commit_id: str, max_walk: int = 10_000) -> dict[str, bytes | None]:
        """Intent bytes per mount kept with `commit_id` (or its nearest ancestor that kept
        any; none at all: {}). A mount whose object is missing maps to None (damaged)."""
        cid: str | None = commit_id
        for _ in range(max_walk):
            if cid is None:
                return {}
            rows = self._query("SELECT data FROM commit_intents WHERE commit_id = ?", (cid,))
            if rows:
                out: dict[str, bytes | None] = {}
                for mount, oid in json.loads(rows[0][0]).items():
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

    # -- references and consistency ---------------------------------------------------
    def inode_table(self, commit_id: str) -> str | None:
        """The object id of a commit's inode table (None: the tree has no hard links)."""
        rows = self._query("SELECT inodes FROM commit_inodes WHERE commit_id = ?", (commit_id,))
        return rows[0][0] if rows else None

    def inodes(self, table: str | None) -> dict[str, Entry]:
        """An inode table's rows by inode key ({} for None)."""
        return decode_inodes(self.read_object(table)) if table else {}

    def commit_refs(self, commit: Commit) -> CommitRefs:
        """What one commit names directly: its tree, inode table and intents' objects
        (memfs.store.refs says what every entry and object names in turn)."""
        with self._reader_lock:
            return commit_refs(self._reader, commit.id, commit.tree)

    def fsck(self) -> list[str]:
        """Objects, chunks and link counts of every commit, walked with work lists (a tree of
        any depth is checked) over what memfs.store.refs says each one names."""
        from memfs.store.fsck import check_store

        problems = check_store(self)
        for name, head in self.branches().items():
            if not self._query("SELECT 1 FROM commits WHERE id = ?", (head,)):
                problems.append(f"branch {name} points at missing commit {head}")
        for name, cid, _, _ in self.checkpoints():
            if not self._query("SELECT 1 FROM commits WHERE id = ?", (cid,)):
                problems.append(f"checkpoint {name} points at missing commit {cid}")
        return problems

    def file_chunks(self, ref: str) -> dict[int, str]:
        if not ref:
            return {}
        if ref.startswith("c:"):
            return {0: ref[2:]}
        return decode_manifest(self.read_object(ref[2:]))[1]

    def stat_space(self) -> os.statvfs_result:
        return os.statvfs(self.root)


def printable(text: str) -> str:
    """Text SQLite can hold: a name that is not UTF-8 (a surrogate-escaped byte, say in an
    attach message naming the directory) is kept as a visible `\\xff` escape."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _no_store(root: Path) -> StoreError:
    return StoreError(f"no memfs store at {root}",
                      "`memfs init` creates it there; if the store is elsewhere, give --root DIR "
                      "(or set MEMFS_ROOT)")


def _commit_from_row(row: tuple) -> Commit:
    cid, seq, parent, tree, branch, time_ns, message, processes = row
    return Commit(cid, seq, parent, tree, branch, time_ns, message, json.loads(processes))


def _check_ref_name(name: str) -> None:
    """A branch, checkpoint or mark name every revision spelling can reach: '/' is a path,
    '~' and ':' are revision syntax (HEAD~2, REV:PATH — `memfs show a:b` read the name 'a'),
    a leading '.' is hidden in `.memfs/history/`, and a space at either end or a control
    character cannot be told apart when printed."""
    why = ("it is empty" if not name else
           f"it is {len(name)} characters long (at most 200)" if len(name) > 200 else
           "it starts with '.'" if name.startswith(".") else
           "it starts or ends with a space" if name != name.strip() else
           f"it holds {next(ch for ch in name if ch in '/~:')!r}" if any(
               ch in "/~:" for ch in name) else
           "it holds a control character" if any(ord(ch) < 32 or ord(ch) == 127
                                                  for ch in name) else None)
    if why is not None:
        raise StoreError(
            f"invalid name {name!r}: {why}",
            "use letters, digits, '-', '_', '.', '@' or inner spaces, up to 200 characters; "
            "not '/', '~' or ':' (revision syntax), a leading '.', or control characters",
        )


RESERVED = ("HEAD", "now")  # revisions every command reads already
HEX = frozenset("0123456789abcdef")


def check_new_name(tx, name: str, kind: str) -> None:
    """A new branch, checkpoint or mark must be reachable by its name: refuse one that a
    revision read first would shadow (Store.resolve: HEAD, branches, checkpoints, commit
    ids, then marks). `tx`: the transaction that then creates it (either backend's)."""
    _check_ref_name(name)
    again = "pick another name"
    if name in RESERVED:
        raise StoreError(f"{name!r} names a revision already", again)
    if kind != "mark" and len(name) >= 6 and set(name) <= HEX:
        raise StoreError(f"{name!r} reads as a commit id", again + " (not 6+ hex digits)")
    for other, table in (("branch", "branches"), ("checkpoint", "checkpoints")):
        if kind != other and tx.ref_exists(table, name):
            raise StoreError(f"a {other} is named {name!r}: a {kind} of that name could never "
                             f"be reached by it", again)

