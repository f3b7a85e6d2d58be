"""Worker sessions (one consolidation attempt's log) shared by many hosts, as PostgreSQL rows.

On a root whose store is in PostgreSQL the worker's log is rows of that database (tables
`worker_attempts` and `worker_events`, memfs.store.pg.schema version 3) instead of
`<root>/sessions/workers/<attempt>.jsonl`, so any host can rebuild a review's final plan
from it alone (memfs.consolidate.worker.replay_final_proposal) and replay a receipt a dead
host left `committing`. Each event is committed (synchronous_commit on) before the loop goes
on, as the file's fsync makes it durable; an attempt id is taken once, as O_EXCL takes the
file's name.

Threads: the worker's; the process's one connection for these rows (memfs.store.pg.conn).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from memfs.errors import MemfsError


class SharedWorkerSession:
    """The append-only log of one attempt, as rows; the interface of worker.WorkerSession."""

    def __init__(self, url: str, host: str, attempt_id: str) -> None:
        from memfs.store.backend import redact
        from memfs.store.pg.conn import process_conn

        self.conn = process_conn(url)
        self.attempt_id = attempt_id
        self.path = f"worker session {attempt_id} in the PostgreSQL store at {redact(url)}"
        with self.conn.write() as c:
            made = c.execute("INSERT INTO worker_attempts VALUES (%s, %s, %s) ON CONFLICT DO "
                             "NOTHING RETURNING id",
                             (attempt_id, datetime.now(UTC).isoformat(timespec="seconds"),
                              host)).fetchall()
        if not made:
            raise MemfsError(f"{self.path} exists already",
                             "start a new attempt (a new review id)")
        self._seq = 0

    def append(self, event: str, **fields: Any) -> None:
        self._seq += 1
        line = json.dumps({"seq": self._seq, "event": event, **fields}, sort_keys=True)
        with self.conn.write() as c:
            c.execute("INSERT INTO worker_events VALUES (%s, %s, %s)",
                      (self.attempt_id, self._seq, line))

    def close(self) -> None:
        pass  # nothing held open: every event is committed as it comes


def load_shared_worker_session(url: str, attempt_id: str) -> list[dict[str, Any]]:
    """The events of one attempt, in order; refused when the attempt has no log here."""
    from memfs.store.backend import redact
    from memfs.store.pg.conn import process_conn

    conn = process_conn(url)
    if not conn.rows("SELECT 1 FROM worker_attempts WHERE id = %s", (attempt_id,)):
        raise MemfsError(f"no worker session for attempt {attempt_id}",
                         f"expected it in the PostgreSQL store at {redact(url)} (table "
                         "worker_events)")
    return [json.loads(line) for (line,) in conn.rows(
        "SELECT line FROM worker_events WHERE attempt = %s ORDER BY seq", (attempt_id,))]
