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

from pathlib import Path

from memfs.consolidate.receipts import (
    COMMITTING,
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
        from memfs.store.pg.conn import process_conn

        self.conn = process_conn(url)
        self.host = host
        self.where = f"the PostgreSQL store at {redact(url)}"

    def location(self, review_id: str) -> str:
        return f"receipt {check_review_id(review_id)} in {self.where}"

    def write(self, receipt: Receipt) -> str:
        """Store `receipt` (insert or replace its row) and commit; returns where it is."""
        body = render_receipt(receipt)
        with self.conn.write() as c:
            done = c.execute(
                "INSERT INTO receipts VALUES (%s, %s, %s, %s, %s) ON CONFLICT (review_id) DO "
                "UPDATE SET state = EXCLUDED.state, body = EXCLUDED.body WHERE receipts.state "
                "= %s RETURNING review_id",
                (receipt.review_id, receipt.created_at, receipt.state, self.host, body,
                 COMMITTING)).fetchall()
            if not done:
                raise self._finished_elsewhere(c, receipt)
            crash_point("receipt-before-rename")  # written, not committed: not durable
        return self.location(receipt.review_id)

    def _finished_elsewhere(self, c, receipt: Receipt) -> ReceiptError:
        """A final receipt is never written over. Under the review lock no one else writes
        it; but that lock is a database session's, and a host whose lock connection broke
        mid-review may go on while another host recovers the same review: the first end
        recorded stands (memory itself is guarded by its own compare-and-swap)."""
        state = c.execute("SELECT state FROM receipts WHERE review_id = %s",
                          (receipt.review_id,)).fetchone()[0]
        return ReceiptError(f"{self.location(receipt.review_id)} was already finished as "
                            f"{state} (by another host's recovery, while this one lost the "
                            f"review lock); {receipt.state} is not recorded",
                            "see it with `memfs receipts`; nothing more is to be done")

    def read(self, review_id: str) -> Receipt | None:
        rows = self.conn.rows("SELECT review_id, body FROM receipts WHERE review_id = %s",
                              (check_review_id(review_id),))
        if not rows:
            return None
        receipt, why = _parsed(*rows[0])
        if receipt is None:
            raise ReceiptError(f"{self.location(review_id)} cannot be read: {why}",
                               "delete its row (DELETE FROM receipts WHERE review_id = ...) "
                               "once you know what it held, and re-run")
        return receipt

    def bodies(self) -> dict[str, str]:
        """review id -> its Markdown as stored (the mount's `.memfs/receipts/`)."""
        return dict(self.conn.rows("SELECT review_id, body FROM receipts"))

    def scan(self) -> ReceiptScan:
        """Every receipt of the store, oldest first; damaged rows reported, not skipped."""
        receipts: list[Receipt] = []
        damaged: list[tuple[Path | str, str]] = []
        for review_id, body in self.conn.rows("SELECT review_id, body FROM receipts "
                                              "ORDER BY created_at, review_id"):
            receipt, why = _parsed(review_id, body)
            if receipt is None:
                damaged.append((self.location(review_id), why))
            else:
                receipts.append(receipt)
        receipts.sort(key=lambda r: (r.created_at, r.review_id))
        return ReceiptScan(receipts, damaged, [])


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
    return None if loc is None else SharedReceipts(loc.url, loc.host)
