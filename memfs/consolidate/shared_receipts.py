"""Consolidation receipts shared by many hosts: rows in the root's PostgreSQL store.

A root whose store is in PostgreSQL (memfs.store.backend) keeps its receipts in the
`receipts` table of that database (memfs.store.pg.schema, version 2), so a review started on
one host is listed and recovered by every host: `memfs recover` on any of them takes the
shared review lock (memfs.consolidate.lock) and finishes whatever a dead host left
`committing`. The row's `body` is the receipt's Markdown exactly as the file store writes it;
its JSON block is read back with the same parser, so both stores hold one format.

Write-ahead order: `write` returns only after its transaction committed with
`synchronous_commit = on` (memfs.store.pg.conn), that is with the row in the server's WAL
on disk, so a `committing` receipt is durable before the memory swap it guards begins, as
the file store's fsync and rename make it. A crash before that COMMIT leaves the old row
(or none): the server rolls back the transaction of a connection that died.

Threads: any; one connection per store and process, used under its lock.
"""

from __future__ import annotations

import threading
from pathlib import Path

from memfs.consolidate.receipts import (
    Receipt,
    ReceiptError,
    ReceiptScan,
    check_review_id,
    parse_receipt,
    render_receipt,
)
from memfs.memory.durable import crash_point


class SharedReceipts:
    """The receipts of one PostgreSQL store, written as this host (`host`)."""

    def __init__(self, url: str, host: str) -> None:
        from memfs.store.backend import redact
        from memfs.store.pg import schema
        from memfs.store.pg.conn import Conn

        self.conn = Conn(url, autocommit=False)
        self.host = host
        self.where = f"the PostgreSQL store at {redact(url)}"
        with self.conn.lock:
            c = self.conn.get()
            try:
                schema.create(c)  # the table, on a store no daemon of this version opened yet
            except BaseException as exc:
                self._rollback(c)
                raise self._told(exc) from exc

    def location(self, review_id: str) -> str:
        return f"receipt {check_review_id(review_id)} in {self.where}"

    def write(self, receipt: Receipt) -> str:
        """Store `receipt` (insert or replace its row) and commit; returns where it is."""
        body = render_receipt(receipt)
        with self.conn.lock:
            c = self.conn.get()
            try:
                c.execute("INSERT INTO receipts VALUES (%s, %s, %s, %s, %s) ON CONFLICT "
                          "(review_id) DO UPDATE SET state = EXCLUDED.state, "
                          "body = EXCLUDED.body",
                          (receipt.review_id, receipt.created_at, receipt.state, self.host,
                           body))
                crash_point("receipt-before-rename")  # written, not committed: not durable
                c.commit()
            except BaseException as exc:
                self._rollback(c)
                raise self._told(exc) from exc
        return self.location(receipt.review_id)

    def read(self, review_id: str) -> Receipt | None:
        rows = self._rows("SELECT review_id, body FROM receipts WHERE review_id = %s",
                          (check_review_id(review_id),))
        if not rows:
            return None
        receipt, why = _parsed(*rows[0])
        if receipt is None:
            raise ReceiptError(f"{self.location(review_id)} cannot be read: {why}",
                               "delete its row (DELETE FROM receipts WHERE review_id = ...) "
                               "once you know what it held, and re-run")
        return receipt

    def scan(self) -> ReceiptScan:
        """Every receipt of the store, oldest first; damaged rows reported, not skipped."""
        receipts: list[Receipt] = []
        damaged: list[tuple[Path | str, str]] = []
        for review_id, body in self._rows("SELECT review_id, body FROM receipts "
                                          "ORDER BY created_at, review_id", ()):
            receipt, why = _parsed(review_id, body)
            if receipt is None:
                damaged.append((f"receipt {review_id} in {self.where}", why))
            else:
                receipts.append(receipt)
        receipts.sort(key=lambda r: (r.created_at, r.review_id))
        return ReceiptScan(receipts, damaged, [])

    def _rows(self, sql: str, args: tuple) -> list[tuple]:
        import psycopg

        with self.conn.lock:
            c = self.conn.get()
            try:
                return c.execute(sql, args).fetchall()
            except psycopg.OperationalError as exc:
                self._rollback(c)
                raise self.conn.failed(exc) from exc
            finally:
                if not c.closed:
                    c.rollback()

    def _rollback(self, c) -> None:
        import psycopg

        try:
            c.rollback()
        except psycopg.Error:
            self.conn.drop()

    def _told(self, exc: BaseException) -> BaseException:
        """A write's failure: the server's (out of reach, its disk full) in words."""
        import psycopg

        return self.conn.failed(exc) if isinstance(exc, psycopg.OperationalError) else exc


def _parsed(review_id: str, body: str) -> tuple[Receipt | None, str]:
    try:
        receipt = parse_receipt(body)
    except ReceiptError as exc:
        return None, str(exc)
    if receipt.review_id != review_id:
        return None, f"holds review {receipt.review_id!r}, not its row's"
    return receipt, ""


def open_shared_receipts(root: Path) -> SharedReceipts | None:
    """The shared receipts of `root`'s store, or None when its store is embedded (files)."""
    from memfs.store.backend import read_location

    loc = read_location(Path(root))
    if loc is None:
        return None
    with _opened_lock:
        got = _opened.get((loc.url, loc.host))
        if got is None:  # one connection per store and process, its table made once
            got = _opened[(loc.url, loc.host)] = SharedReceipts(loc.url, loc.host)
        return got


_opened: dict[tuple[str, str], SharedReceipts] = {}
_opened_lock = threading.Lock()
