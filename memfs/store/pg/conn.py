"""One psycopg connection used under a lock, opened again after the server went away.

Every call is synchronous and blocking: it runs in the thread that asks (the commit thread,
a worker, a CLI), never awaited on the trio loop. A read that finds its connection broken is
tried once more on a new one (reads are idempotent); a write is not (the caller decides).
"""

from __future__ import annotations

import threading
import time

import psycopg

from memfs.errors import MemfsError

CONNECT_TIMEOUT = 5  # seconds per attempt to reach the server
CONNECT_PATIENCE = 3.0  # seconds a caller waits for a server that restarts


class StoreUnreachable(MemfsError):
    pass


def unreachable(url: str, exc: BaseException) -> StoreUnreachable:
    from memfs.store.backend import redact

    return StoreUnreachable(f"the PostgreSQL store at {redact(url)} is unreachable: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}",
                            "check that the server runs and this host may connect; memfs "
                            "retries its commits meanwhile")


def connect(url: str, *, autocommit: bool) -> psycopg.Connection:
    """A connection with the settings the store relies on: synchronous_commit on (a
    COMMIT that returned is in the server's WAL on disk), TCP keepalives, UTC."""
    deadline = time.monotonic() + CONNECT_PATIENCE
    while True:
        try:
            conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT,
                                   keepalives=1, keepalives_idle=10, keepalives_interval=5,
                                   keepalives_count=3)
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise unreachable(url, exc) from None
            time.sleep(0.2)
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("SET TIME ZONE 'UTC'")
    if not autocommit:
        conn.commit()
    return conn


class Conn:
    """A lazily (re)opened connection; `lock` serializes its users."""

    def __init__(self, url: str, *, autocommit: bool) -> None:
        self.url = url
        self.autocommit = autocommit
        self.lock = threading.RLock()
        self._conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        """The open connection (the caller holds `lock`)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self.drop()
            conn = self._conn = connect(self.url, autocommit=self.autocommit)
        return conn

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Rows of one statement in autocommit; once more on a new connection if it broke."""
        with self.lock:
            for attempt in (1, 2):
                try:
                    return self.get().execute(sql, args).fetchall()
                except psycopg.OperationalError as exc:
                    self.drop()
                    if attempt == 2:
                        raise unreachable(self.url, exc) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self.lock:
            self.drop()
