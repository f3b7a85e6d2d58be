"""The global record journal: disk-agreement evidence P, write-ahead intents, fingerprints.

Why global: P says what a backing directory last agreed with, and disk does not rewind when a
branch is switched or a change undone, so neither may P. Branch-local intent (tombstones, store
origin, conflicts) is elsewhere (memfs.reconcile.intent) and rewinds with the branch.

The journal lives in the store's SQLite file (`<root>/store.db`, WAL, synchronous=FULL) in
tables prefixed `journal_`, through its own connection. Paths are names, and Linux names are
bytes: a path column holds the name's own bytes, valid UTF-8 or not (see _db and _text).

The failed-append rule (seed 002): if SQLite reports an I/O error (or a full disk, or
corruption) inside a write, what reached the file is no longer known to this connection's view:
the record may be in the WAL and read back by the next opener. Deciding from this view could
then record a conflict from stale evidence. So the journal is poisoned: every evidence read and
write raises JournalNeedsReopen until `reopen()` (`memfs sync --reopen` does it in a running
daemon, then observes again).

Fault injection for tests: memfs.testing.journal_fault, run after each write's COMMIT (the
record may be in the file, the writer is told it failed).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from sys import intern
from types import MappingProxyType
from typing import TypeVar

from memfs.errors import MemfsError
from memfs.pathtable import FingerprintTable, Row
from memfs.store import journal_snapshot as snapshot
from memfs.store import schema
from memfs.store.journal_intents import Intent, IntentLog, NewIntent
from memfs.store.journal_sql import at_or_below, at_or_below_args
from memfs.store.journal_sql import db_param as _db
from memfs.store.journal_sql import text as _text
from memfs.testing import journal_fault

T = TypeVar("T")
log = logging.getLogger("memfs.journal")
_new = tuple.__new__

# Extended-result families that mean "what reached the file is unknown".
SQLITE_FULL = 13
_POISON_CODES = {
    10,  # SQLITE_IOERR (every SQLITE_IOERR_* extended code has this as its low byte)
    11,  # SQLITE_CORRUPT
    13,  # SQLITE_FULL
    14,  # SQLITE_CANTOPEN
    26,  # SQLITE_NOTADB
}

# Its tables and the columns added since its first release are memfs.store.schema's.

# One int object per permission value (CPython shares only -5..256): a snapshot keeps a mode
# per file, and 0o644 read from a row is a new 32-byte int each time.
_MODES = tuple(range(0o1000))
REOPEN_REMEDY = ("run `memfs sync --reopen` (it reopens the journal's view of the store in the "
                 "running daemon, then observes again; restarting memfs does the same) before any "
                 "sync, listing or materialize; files the workspace already holds stay readable")


class JournalNeedsReopen(MemfsError):
    """The journal saw a failed write; its view may be stale until it is reopened."""


@dataclass(frozen=True)
class EvidenceRecord:
    """P for one path: `digest` is what disk and store last agreed on, None if on absence;
    `mode` the permission bits they agreed on, None if not recorded (evidence older than
    modes, or an absence)."""

    digest: str | None
    mode: int | None = None


# One cached fingerprint as callers read it: a view built on demand from the snapshot's
# columns (memfs.pathtable), not an object kept per file.
FingerprintRow = Row


@dataclass(frozen=True)
class PassInputs:
    """What a reconcile pass reads from the journal, from one snapshot.

    `evidence`: path -> the digest P holds, None where P is agreed absence (a missing path has
    no evidence); `fingerprints` and `evidence` cover the pass's prefix; `pending` holds every
    pending intent of the mount (a pending intent is resolved wherever it is observed).
    `evidence` and `fingerprints` are read-only: while the journal is unchanged they are the
    same objects from pass to pass, which lets a pass tell at once that they did not change
    (observe.DirMemo, Backing._plan). `modes`: path -> the permission bits P agreed on, for
    the paths whose evidence has one (the same sharing)."""

    root: tuple[int, int] | None
    evidence: Mapping[str, str | None]
    pending: list[Intent]
    fingerprints: FingerprintTable  # path -> row, kept as columns (memfs.pathtable)
    modes: Mapping[str, int] = field(default_factory=lambda: _NO_MODES)


# (change count, evidence, fingerprints, modes): P and its modes over the rows (see
# memfs.store.journal_snapshot: each path once).
_Snapshot = tuple[int, snapshot.EvidenceOverlay, FingerprintTable, snapshot.ModeOverlay]
_MEMO_KEYS = 16  # (mount, prefix) snapshots kept; on-access scopes come and go
_NO_MODES: Mapping[str, int] = MappingProxyType({})


def _change_count(c: sqlite3.Connection) -> int:
    """journal_changes.n: moved by every row change to the evidence and fingerprint tables."""
    return c.execute("SELECT n FROM journal_changes WHERE id = 0").fetchone()[0]


def _under(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def _is_poison(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        # No code: sqlite3 raised before reaching the library (e.g. a closed connection),
        # or something outside sqlite3 failed mid-write. Treat as unknown outcome.
        return not isinstance(exc, sqlite3.ProgrammingError | sqlite3.IntegrityError)
    return (code & 0xFF) in _POISON_CODES


class Journal(IntentLog):
    """Evidence, intents and fingerprints of every backed mount; one per process and root.

    Thread-safe (one lock around one connection): the FUSE layer calls it from worker threads.
    """

    def __init__(self, db_path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        self.db_path = str(db_path)
        self._busy_ms = busy_timeout_ms
        self._lock = threading.RLock()
        self._failure: BaseException | None = None
        # (mount, prefix) -> (change count, evidence, fingerprints, modes): see pass_inputs.
        self._memo: dict[tuple[str, str], _Snapshot] = {}
        self._stale: dict[tuple[str, str], _Snapshot] = {}
        self._count_before = -1  # the change count when this write began
        # Called before each write, under the lock: makes room for it when the disk is short
        # (on a store in PostgreSQL, host.db's reserve: memfs.store.space.Reserve.for_write).
        self.before_write: Callable[[], object] | None = None
        self._conn = self._connect()

    # -- connection --------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        conn.text_factory = _text  # names are bytes (see _db)
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_ms)}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        schema.ensure_journal(conn)
        return conn

    def reopen(self) -> None:
        """Drop this view and read the file afresh; clears a failed write's poison."""
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._memo.clear()
            try:
                self._conn = self._connect()
            except sqlite3.Error as exc:
                # The old connection is gone and no new one opened: refuse (naming the
                # reopen) rather than fail later on a closed connection.
                self._failure = exc
                raise
            self._failure = None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @property
    def needs_reopen(self) -> bool:
        return self._failure is not None

    def refusal(self) -> JournalNeedsReopen | None:
        """What every read and write raises while a failed write poisons the journal."""
        if self._failure is None:
            return None
        remedy = REOPEN_REMEDY
        if (getattr(self._failure, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL:
            # Reopening a journal whose disk is still full fails again at the next write.
            where = os.path.dirname(os.path.abspath(self.db_path))
            remedy = (f"free space on the filesystem that holds {where} first (`df {where}`; "
                      "on the embedded store, deleting files in the mount and `memfs gc` give "
                      "space back), then " + REOPEN_REMEDY)
        return JournalNeedsReopen(
            f"the journal's last write failed ({self._failure}); its evidence may be stale",
            remedy)

    def _check(self) -> None:
        refusal = self.refusal()
        if refusal is not None:
            raise refusal

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            self._check()
            return fn(self._conn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; an I/O-class failure anywhere in it poisons the journal."""
        with self._lock:
            self._check()
            # The remembered snapshots are set aside while the write runs: one that knows what
            # it changed brings them up to date (_patch_memo); pass_inputs serves a snapshot
            # only at the change count it was made for.
            self._stale, self._memo = self._memo, {}
            conn = self._conn
            self._make_room()
            try:
                conn.execute("BEGIN IMMEDIATE")
                self._count_before = _change_count(conn)
            except sqlite3.Error as exc:
                if _is_poison(exc):
                    self._failure = exc
                    self._check()
                raise
            try:
                yield conn
                # A snapshot the write did not patch stays, under its count: still served if
                # the write changed nothing it holds (an intent, a pin, a root).
                for key, entry in self._stale.items():
                    self._memo.setdefault(key, entry)
                conn.execute("COMMIT")
                journal_fault()
            except BaseException as exc:
                self._memo.clear()  # patched for a transaction that did not commit
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if isinstance(exc, sqlite3.Error) and _is_poison(exc):
                    self._failure = exc
                    self._check()
                raise
            finally:
                self._stale = {}  # the snapshots before the write: kept no longer than it

    def _make_room(self) -> None:
        if self.before_write is None:
            return
        try:
            if given := self.before_write():
                log.warning("the disk of %s was short: gave back the reserve (%s bytes) so "
                            "the journal could write", self.db_path, given)
        except OSError as exc:  # the write itself says what is wrong with the disk
            log.warning("could not make room for the journal's write: %s", exc)

    def _patch_memo(self, c: sqlite3.Connection, mount: str,
                    evidence: Mapping[str, str | None] | None = None,
                    fingerprints: Mapping[str, FingerprintRow | None] | None = None,
                    modes: Mapping[str, int | None] | None = None) -> None:
        """Inside a write: bring the mount's remembered snapshots up to date with what this
        write changed (paths -> new value; None drops a fingerprint), instead of reading 100k
        rows again at the next pass. Only a snapshot that was current when the write began
        (its count is the count then, and the write holds the file's write lock) is patched;
        it is served only from the count after this write, and forgotten if it rolls back."""
        after = _change_count(c)
        for key, (count, ev, fps, mds) in self._stale.items():
            if key[0] != mount or count != self._count_before:
                continue
            prefix = key[1]
            fps_in = fingerprints or {}
            fp_items = [p for p in fps_in if _under(p, prefix)]  # their rows read as patched
            ev_items = {intern(p): v if v is None else intern(v)
                        for p, v in (evidence or {}).items() if _under(p, prefix)}
            md_items = {intern(p): v if v is None or not 0 <= v < len(_MODES) else _MODES[v]
                        for p, v in (modes or {}).items() if _under(p, prefix)}
            new_ev, new_fps, new_mds = ev, fps, mds
            if fp_items:
                new_fps = fps.patched((intern(p), fps_in[p]) for p in fp_items)
                new_ev = snapshot.with_rows(ev, new_fps, (intern(p) for p in fp_items))
            if ev_items:
                new_ev = snapshot.with_evidence(new_ev, ev_items)
            if new_ev is not ev or md_items:
                new_mds = snapshot.with_modes(mds, new_ev, md_items, ev_items)
            self._memo[key] = (after, new_ev, new_fps, new_mds)

    # -- root identity -----------------------------------------------------------------------

    def root(self, mount: str) -> tuple[int, int] | None:
        """The (dev, ino) recorded with the mount's first evidence, or None."""
        row = self._read(lambda c: c.execute(
            "SELECT dev, ino FROM journal_roots WHERE mount=?", (mount,)).fetchone())
        return (row[0], row[1]) if row else None

    def accept_root(self, mount: str, dev: int, ino: int) -> int:
        """Take a replaced root on purpose: set its evidence aside so nothing reads as deleted,
        and abandon the old directory's pending intents.

        Returns how many evidence records were set aside.
        """
        now = time.time()
        with self._write() as c:
            old = c.execute("SELECT dev, ino FROM journal_roots WHERE mount=?", (mount,)).fetchone()
            c.execute(
                "INSERT INTO journal_evidence_aside (mount, path, digest, dev, ino, set_aside_at)"
                " SELECT mount, path, digest, ?, ?, ? FROM journal_evidence WHERE mount=?",
                (old[0] if old else None, old[1] if old else None, now, mount),
            )
            n = c.execute("DELETE FROM journal_evidence WHERE mount=?", (mount,)).rowcount
            c.execute("DELETE FROM journal_fingerprints WHERE mount=?", (mount,))
            c.execute("DELETE FROM journal_pins WHERE mount=?", (mount,))
            # Pending intents were about the old directory: on this one their old and new
            # values mean nothing (one matching neither would read as an interrupted push).
            c.execute("UPDATE journal_intents SET state='abandoned', settled_at=? "
                      "WHERE mount=? AND state='pending'", (now, mount))
            c.execute(
                "INSERT OR REPLACE INTO journal_roots (mount, dev, ino, recorded_at)"
                " VALUES (?, ?, ?, ?)", (mount, dev, ino, now))
        return n

    # -- branch pin ---------------------------------------------------------------------------

    def pin(self, mount: str) -> str | None:
        """The branch the mount was last materialized from (global: disk does not rewind)."""
        row = self._read(lambda c: c.execute(
            "SELECT branch FROM journal_pins WHERE mount=?", (mount,)).fetchone())
        return row[0] if row else None

    def set_pin(self, mount: str, branch: str) -> None:
        with self._write() as c:
            c.execute("INSERT OR REPLACE INTO journal_pins (mount, branch, pinned_at)"
                      " VALUES (?, ?, ?)", (mount, branch, time.time()))

    def clear_pin(self, mount: str) -> None:
        """Detach or a replaced root: no branch is on that disk by our account any more."""
        with self._write() as c:
            c.execute("DELETE FROM journal_pins WHERE mount=?", (mount,))

    @staticmethod
    def _ensure_root(c: sqlite3.Connection, mount: str, root: tuple[int, int] | None) -> None:
        if root is None:
            return
        row = c.execute("SELECT dev, ino FROM journal_roots WHERE mount=?", (mount,)).fetchone()
        if row is None:
            c.execute("INSERT INTO journal_roots (mount, dev, ino, recorded_at) VALUES (?,?,?,?)",
                      (mount, root[0], root[1], time.time()))
        elif (row[0], row[1]) != tuple(root):
            raise MemfsError(
                f"mount {mount!r}: the backing root is not the directory disk last agreed with",
                "bring the original directory back, or take this one with `memfs sync "
                "--accept-root`",
            )

    # -- evidence P --------------------------------------------------------------------------

    def evidence(self, mount: str, path: str) -> EvidenceRecord | None:
        """P for a path: None when there is no evidence at all (P unknown)."""
        row = self._read(lambda c: c.execute(
            "SELECT digest, mode FROM journal_evidence WHERE mount=? AND path=CAST(? AS TEXT)",
            (mount, _db(path))).fetchone())
        return EvidenceRecord(row[0], row[1]) if row else None

    def evidence_under(self, mount: str, prefix: str = "") -> dict[str, EvidenceRecord]:
        """Every P of a mount at or below `prefix` ('' for the whole mount)."""
        return self._read(lambda c: {p: EvidenceRecord(d, m)
                                     for p, d, m in self._evidence_rows(c, mount, prefix)})

    @staticmethod
    def _evidence_rows(c: sqlite3.Connection, mount: str, prefix: str) -> sqlite3.Cursor:
        if not prefix:
            return c.execute("SELECT path, digest, mode FROM journal_evidence WHERE mount=?",
                             (mount,))
        return c.execute(at_or_below("SELECT path, digest, mode FROM journal_evidence"),
                         at_or_below_args(mount, prefix))

    def record_evidence(
        self, mount: str, items: Iterable[tuple[str, str | None] | tuple[str, str | None,
                                                                          int | None]], *,
        root: tuple[int, int] | None = None,
    ) -> None:
        """Record P := value for each (path, digest-or-None[, mode-or-None]); the root identity
        goes with the first evidence of a mount, and a different root is refused."""
        now = time.time()
        with self._write() as c:
            self._ensure_root(c, mount, root)
            rows = [(it[0], it[1], it[2] if len(it) > 2 else None) for it in items]
            c.executemany(
                "INSERT OR REPLACE INTO journal_evidence (mount, path, digest, recorded_at, mode)"
                " VALUES (?, CAST(? AS TEXT), ?, ?, ?)",
                [(mount, _db(p), d, now, m) for p, d, m in rows])
            self._patch_memo(c, mount, evidence={p: d for p, d, _ in rows},
                             modes={p: m for p, _, m in rows})

    def forget_evidence(self, mount: str, paths: Iterable[str]) -> None:
        """Drop P (the write-ahead rule's exception: a drop forgets first, with no intent)."""
        with self._write() as c:
            c.executemany("DELETE FROM journal_evidence WHERE mount=? AND path=CAST(? AS TEXT)",
                          [(mount, _db(p)) for p in paths])

    # -- fingerprint cache -------------------------------------------------------------------

    def fingerprints(self, mount: str, prefix: str = "") -> dict[str, FingerprintRow]:
        """The observer's cache at or below `prefix` ('' for the whole mount); read through the
        same poison gate, since a stale cache could vouch for bytes that changed."""
        return dict(self._read(lambda c: self._fingerprint_rows(c, mount, prefix)))

    @staticmethod
    def _fingerprint_rows(c: sqlite3.Connection, mount: str, prefix: str) -> FingerprintTable:
        cols = "SELECT path, size, mtime_ns, ctime_ns, ino, dev, digest, kind, hashed_at_ns, " \
               "mime FROM journal_fingerprints"
        if not prefix:
            rows = c.execute(cols + " WHERE mount=?", (mount,))
        else:
            rows = c.execute(at_or_below(cols), at_or_below_args(mount, prefix))
        # Paths interned (see pass_inputs); the row's fields go into the table's columns.
        return FingerprintTable.build((intern(r[0]), _new(FingerprintRow, r[1:]))
                                      for r in rows)

    # -- one pass's reads --------------------------------------------------------------------

    def pass_inputs(self, mount: str, prefix: str = "") -> PassInputs:
        """Root, evidence, pending intents and fingerprints for a pass, in one read transaction
        (one consistent snapshot, one lock round).

        Evidence and fingerprints are remembered per (mount, prefix) with the count of row
        changes to their tables (`journal_changes`, kept by triggers, so by every connection
        that writes them; the store's commits to its own tables do not move it). A write
        through this journal patches the snapshots with what it changed (`_patch_memo`) or
        forgets them. So a remembered snapshot is served only while those tables cannot have
        changed under it, and a pass skips reading a row per file. Both are shared and
        read-only. Paths are interned (so are the workspace's paths): a pass looks each path
        up in several maps, and one object per value makes those lookups pointer checks. The
        fingerprint rows' digests are 16 bytes in the table's column, a string made when read
        (P's own digests, the exceptions, are interned)."""
        def q(c: sqlite3.Connection) -> PassInputs:
            c.execute("BEGIN")
            try:
                version = _change_count(c)
                hit = self._memo.get((mount, prefix))
                if hit is not None and hit[0] == version:
                    _, evidence, fps, modes = hit
                else:
                    # Read after the version: a commit in between only makes the memo miss.
                    fps = self._fingerprint_rows(c, mount, prefix)
                    evidence, modes = snapshot.build(fps, (
                        (intern(p), d if d is None else intern(d),
                         m if m is None or not 0 <= m < len(_MODES) else _MODES[m])
                        for p, d, m in self._evidence_rows(c, mount, prefix)))
                    if len(self._memo) >= _MEMO_KEYS:
                        self._memo.clear()
                    self._memo[(mount, prefix)] = (version, evidence, fps, modes)
                row = c.execute("SELECT dev, ino FROM journal_roots WHERE mount=?",
                                (mount,)).fetchone()
                pending = self._pending(c, mount, None)
            finally:
                c.execute("COMMIT")
            return PassInputs((row[0], row[1]) if row else None, evidence, pending, fps, modes)
        return self._read(q)

    def put_fingerprints(self, mount: str,
                         rows: Mapping[str, FingerprintRow | None]) -> None:
        """Store (or with None, drop) cached fingerprints. `rows` may build its rows when
        read (a walk's HashedFiles): they are read one at a time, never listed."""
        with self._write() as c:
            c.executemany("DELETE FROM journal_fingerprints WHERE mount=? AND "
                          "path=CAST(? AS TEXT)",
                          ((mount, _db(p)) for p, r in rows.items() if r is None))
            c.executemany(
                "INSERT OR REPLACE INTO journal_fingerprints (mount, path, size, mtime_ns, "
                "ctime_ns, ino, dev, digest, kind, hashed_at_ns, mime) VALUES "
                "(?,CAST(? AS TEXT),?,?,?,?,?,?,?,?,?)",
                ((mount, _db(p), r.size, r.mtime_ns, r.ctime_ns, r.ino, r.dev, r.digest, r.kind,
                  r.hashed_at_ns, getattr(r, "mime", None)) for p, r in rows.items()
                 if r is not None))
            self._patch_memo(c, mount, fingerprints=rows)


__all__ = ["EvidenceRecord", "FingerprintRow", "Intent", "Journal", "JournalNeedsReopen",
           "NewIntent", "PassInputs", "REOPEN_REMEDY"]
