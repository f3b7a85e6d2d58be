"""The backing journal's write-ahead intents: what a step is about to do to disk or to the
workspace, durable before the step starts, completed (P := its new value) once its effect is
durable, abandoned when it did not happen (docs/reconciliation.md, "Write-ahead").

`IntentLog` is a part of memfs.store.journal.Journal, split out to keep one concern a module:
it uses the journal's connection, locks and snapshots (`_write`, `_read`, `_ensure_root`,
`_patch_memo`), so it runs in whichever thread calls the journal, under its lock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, TypeVar

from memfs.errors import MemfsError
from memfs.store.journal_sql import ABSENT_COL as _ABSENT_COL
from memfs.store.journal_sql import db_param as _db

T = TypeVar("T")


@dataclass(frozen=True)
class Intent:
    id: int
    mount: str
    path: str
    op: Literal["write", "unlink", "adopt"]
    branch: str | None
    old: str | None  # None: absent
    new: str | None
    state: str
    # adopt: the evidence its decision resolved: None when not recorded (an intent written
    # before the column existed), "" when P was agreed absence, else the digest.
    prior: str | None = None
    mode: int | None = None  # the permission bits the step sets (None: not recorded)


class NewIntent(NamedTuple):
    """One intent to record (Journal.begin_intents): `old`/`new` None mean absent; `prior`
    the evidence an adoption's decision resolved (None: agreed absence; False: not given)."""

    path: str
    old: str | None
    new: str | None
    prior: str | None | bool = False
    mode: int | None = None


class IntentLog:
    """Journal's intents (see the module docstring)."""

    if TYPE_CHECKING:  # provided by memfs.store.journal.Journal
        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...
        def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        @staticmethod
        def _ensure_root(c: sqlite3.Connection, mount: str,
                         root: tuple[int, int] | None) -> None: ...
        def _patch_memo(self, c: sqlite3.Connection, mount: str,
                        evidence: Mapping[str, str | None] | None = None,
                        fingerprints: Mapping[str, object] | None = None,
                        modes: Mapping[str, int | None] | None = None) -> None: ...

    def begin_intent(
        self, mount: str, path: str, op: Literal["write", "unlink", "adopt"], *,
        old: str | None, new: str | None, branch: str | None = None,
        root: tuple[int, int] | None = None, prior: str | None | bool = False,
        mode: int | None = None,
    ) -> int:
        """Durably record an intent before its effect; `old`/`new` None mean absent. `prior`
        (adoptions): the evidence the decision resolved, None for agreed absence (False: not
        given). `mode`: the permission bits the step sets, recorded in P on completion."""
        (iid,) = self.begin_intents(mount, op, [NewIntent(path, old, new, prior, mode)],
                                    branch=branch, root=root)
        return iid

    def begin_intents(self, mount: str, op: Literal["write", "unlink", "adopt"],
                      intents: Iterable[NewIntent], *, branch: str | None = None,
                      root: tuple[int, int] | None = None) -> list[int]:
        """begin_intent for many, in one transaction (a pass's batch of adoptions syncs once,
        not once a file): every one is durable before any effect of them starts."""
        now = time.time()
        with self._write() as c:
            self._ensure_root(c, mount, root)
            return [int(c.execute(
                "INSERT INTO journal_intents (mount, path, op, branch, old, new, prior, "
                "created_at, mode) VALUES (?, CAST(? AS TEXT), ?, ?, ?, ?, ?, ?, ?)",
                (mount, _db(i.path), op, branch, _ABSENT_COL if i.old is None else i.old,
                 _ABSENT_COL if i.new is None else i.new,
                 None if i.prior is False else _ABSENT_COL if i.prior is None else i.prior,
                 now, i.mode)).lastrowid or 0) for i in intents]

    def complete_intent(self, intent_id: int) -> None:
        """Mark an intent done and record its new value as P, in one transaction. Call only once
        the effect is durable (data and every directory up to the root fsynced)."""
        self.complete_intents([intent_id])

    def complete_intents(self, intent_ids: Iterable[int]) -> None:
        """complete_intent for many, in one transaction: a pass that adopted 20k files
        patches each remembered snapshot once (a copy of its maps), not once a file, and
        syncs once. All of them or none: a crash before the commit leaves every one pending,
        to be observed again as an interrupted intent is. None to complete opens no
        transaction: a pass that adopted nothing (on-access's steady state) must not wait
        for SQLite's write lock, which the store's own commits hold on the same file."""
        ids = list(intent_ids)
        if not ids:
            return
        with self._write() as c:
            done: dict[str, tuple[dict[str, str | None], dict[str, int | None]]] = {}
            for intent_id in ids:
                mount, path, digest, mode = self._complete(c, intent_id)
                evidence, modes = done.setdefault(mount, ({}, {}))
                evidence[path], modes[path] = digest, mode
            for mount, (evidence, modes) in done.items():  # once a mount: see _patch_memo
                self._patch_memo(c, mount, evidence=evidence, modes=modes)

    @staticmethod
    def _complete(c: sqlite3.Connection, intent_id: int
                  ) -> tuple[str, str, str | None, int | None]:
        """One intent marked done and its P written; (mount, path, digest, mode) recorded."""
        row = c.execute("SELECT mount, path, new, state, branch, mode FROM journal_intents "
                        "WHERE id=?", (intent_id,)).fetchone()
        if row is None or row[3] != "pending":
            raise MemfsError(f"intent {intent_id} is not pending", "observe the path again")
        mount, path, new = row[0], row[1], row[2]
        c.execute("UPDATE journal_intents SET state='done', settled_at=? WHERE id=?",
                  (time.time(), intent_id))
        # A redo supersedes the interrupted intents of the same path it completes, on its
        # own branch: another branch's pending push or adoption stays for that branch to
        # resolve (its tree is the only side that can tell whether it happened).
        c.execute("UPDATE journal_intents SET state='abandoned', settled_at=? WHERE mount=? "
                  "AND path=CAST(? AS TEXT) AND state='pending' AND id<? AND branch IS ?",
                  (time.time(), mount, _db(path), intent_id, row[4]))
        digest = None if new == _ABSENT_COL else new
        mode = None if digest is None else row[5]
        c.execute(
            "INSERT OR REPLACE INTO journal_evidence (mount, path, digest, recorded_at, mode)"
            " VALUES (?, CAST(? AS TEXT), ?, ?, ?)",
            (mount, _db(path), digest, time.time(), mode))
        return mount, path, digest, mode

    def abandon_intent(self, intent_id: int) -> None:
        """The effect did not happen (refused untouched, or observed not done); P is unchanged."""
        self.abandon_intents([intent_id])

    def abandon_intents(self, intent_ids: Iterable[int]) -> None:
        """abandon_intent for many, in one transaction (a pass's refused takes: one sync,
        not one a file); none opens no transaction (see complete_intents)."""
        now = time.time()
        rows = [(now, i) for i in intent_ids]
        if not rows:
            return
        with self._write() as c:
            c.executemany("UPDATE journal_intents SET state='abandoned', settled_at=? "
                          "WHERE id=? AND state='pending'", rows)

    def pending_intents(self, mount: str, path: str | None = None) -> list[Intent]:
        return self._read(lambda c: self._pending(c, mount, path))

    @staticmethod
    def _pending(c: sqlite3.Connection, mount: str, path: str | None) -> list[Intent]:
        sql = ("SELECT id, mount, path, op, branch, old, new, state, prior, mode "
               "FROM journal_intents WHERE state='pending' AND mount=?")
        args: tuple[str | bytes, ...] = (mount,)
        if path is not None:
            sql += " AND path=CAST(? AS TEXT)"
            args += (_db(path),)
        return [Intent(r[0], r[1], r[2], r[3], r[4], r[5] or None, r[6] or None, r[7], r[8],
                       r[9]) for r in c.execute(sql + " ORDER BY id", args)]
