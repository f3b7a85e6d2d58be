"""One psycopg connection used under a lock, opened again after the server went away.

Every call is synchronous and blocking: it runs in the thread that asks (the commit thread,
a worker, a CLI), never awaited on the trio loop. A read that finds its connection broken is
tried once more on a new one (reads are idempotent); a write is not (the caller decides).
An idle connection the server hung up on (a restart since it was last used: its FATAL or
EOF waits unread on the socket) is opened again before it is handed out, so the first
request after a restart does not fail on it with the server up.
A server whose disk is full answers on a working connection: that is its own error
(StoreFull), neither retried here nor taken for a lost connection.
"""

from __future__ import annotations

import errno
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from memfs.errors import MemfsError

CONNECT_TIMEOUT = 5  # seconds per attempt to reach the server
CONNECT_PATIENCE = 3.0  # seconds a caller waits for a server that restarts


class ServerError(MemfsError):
    """The server could not do what was asked; what to do about it is in the subclass."""


class StoreUnreachable(ServerError):
    errno = errno.EIO  # what a write through the mount that needed the server answers


class StoreFull(ServerError):
    """The server's disk is full (SQLSTATE 53100): a commit fails as on a full embedded store,
    with ENOSPC (memfs.workspace.health reads `errno`), and is retried until it has room.

    Of the other "insufficient resources" errors (class 53), none is this: out of memory and
    too many connections pass with time or settings, not by freeing space, and refusing
    writes with ENOSPC for them would send the user deleting files for nothing (StoreShort;
    a refused connection has no SQLSTATE in psycopg: only the server's message, perhaps
    translated, tells the connection limit)."""

    errno = errno.ENOSPC


class StoreShort(ServerError):
    """The server is out of memory (SQLSTATE 53200), or short of another resource of class 53
    but its disk (53100) and its connection limit (53300): it answered, so it runs and this
    host may connect; the remedy is the server's memory settings or its load, and the same
    request may pass later (a commit is retried). EIO through the mount, as a lost server."""

    errno = errno.EIO


# SQLSTATE class 53, "insufficient resources", but a full disk and the connection limit.
_SHORT = {"53000": "short of a resource", "53200": "out of memory",
          "53400": "at a configured limit"}


def server_name(url: str) -> str:
    """host:port of the URL (the server's name in words, no credentials)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "?"
    host = info.get("host") or info.get("hostaddr") or "localhost"
    return f"{host}:{info['port']}" if info.get("port") else str(host)


def _words(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


# How the server words a refused connection for its limits (SQLSTATE 53300, which psycopg does
# not carry for a connection refused at start-up): max_connections, the slots reserved for
# superusers, a role's or database's CONNECTION LIMIT. A server whose messages are translated
# gets the general remedy.
_CONNECTION_LIMIT = ("too many clients already", "remaining connection slots are reserved",
                     "too many connections for")


def server_error(url: str, exc: BaseException) -> ServerError:
    """The error a caller sees for `exc`: a full disk on the server, a server out of memory
    (or of another resource), its connection limit reached, or a server out of reach (a
    lost connection, one not made). The remedy is the server's alone: a daemon's failing
    commit adds that it retries (memfs.workspace.health), which is not so of `memfs init`,
    `mount` or a command run without a daemon."""
    from memfs.store.backend import redact

    if isinstance(exc, psycopg.errors.DiskFull):
        return StoreFull(f"the PostgreSQL server at {server_name(url)} has no room left on "
                         f"its disk: {_words(exc)}",
                         "free space on the server's disk (its data directory, or the "
                         "tablespace holding the file it names)")
    short = _SHORT.get(getattr(exc, "sqlstate", None) or "")
    if short is not None:
        return StoreShort(
            f"the PostgreSQL server at {server_name(url)} is {short}: {_words(exc)}",
            "the server is short of memory: check its memory settings (work_mem, "
            "maintenance_work_mem, shared_buffers, max_connections; for \"out of shared "
            "memory\", max_locks_per_transaction) against the machine's memory and what else "
            "runs there, then retry"
            if short == "out of memory" else
            "a server setting or its load limits it (its words above name what): raise the "
            "setting or ease the load, then retry")
    text = str(exc)
    if any(words in text for words in _CONNECTION_LIMIT):
        return StoreUnreachable(
            f"the PostgreSQL server at {server_name(url)} refuses new connections: "
            f"{_words(exc)}",
            "its connection limit is reached (max_connections, or a role's or database's "
            "CONNECTION LIMIT); each memfs daemon keeps 4 connections: raise "
            "the limit, close idle clients, or put PgBouncer in session mode in front")
    return StoreUnreachable(f"the PostgreSQL store at {redact(url)} is unreachable: "
                            f"{_words(exc)}",
                            "check that the server runs and this host may connect")


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
                raise server_error(url, exc) from None
            time.sleep(0.2)
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = on")
        cur.execute("SET TIME ZONE 'UTC'")
    if not autocommit:
        conn.commit()
    return conn


def close_quietly(conn: psycopg.Connection | None) -> None:
    """Close `conn`, if any: one being dropped may be broken already, with nothing to say."""
    if conn is not None:
        try:
            conn.close()
        except psycopg.Error:
            pass


def hung_up(conn: psycopg.Connection) -> bool:
    """Whether the server has spoken to `conn` while it sat idle, outside a transaction:
    nothing is due to an idle session that does not LISTEN, so what waits is its end (an
    AdminShutdown FATAL, the socket's EOF). A poll, no round trip; a false alarm costs a
    reconnect."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


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
        if conn is None or conn.closed or conn.broken or hung_up(conn):
            self.drop()
            conn = self._conn = connect(self.url, autocommit=self.autocommit)
        return conn

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def query(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Rows of one statement in autocommit; once more on a new connection if it broke."""
        with self.lock:
            for attempt in (1, 2):
                try:
                    return self.get().execute(sql, args).fetchall()
                except psycopg.OperationalError as exc:
                    if isinstance(exc, psycopg.errors.DiskFull):  # said by a working server
                        raise server_error(self.url, exc) from None
                    self.drop()
                    if attempt == 2:
                        raise server_error(self.url, exc) from None
        raise AssertionError("unreachable")

    @contextmanager
    def write(self) -> Iterator[psycopg.Connection]:
        """One transaction (a connection that is not autocommit) under `lock`, committed when
        the block ends: a COMMIT that returned is durable (synchronous_commit on). Rolled back
        on any error; the server's own in words (ServerError), once, never retried here."""
        with self.lock:
            c = self.get()
            try:
                yield c
                c.commit()
            except BaseException as exc:
                try:
                    c.rollback()
                except psycopg.Error:
                    self.drop()
                if isinstance(exc, psycopg.OperationalError):
                    raise self.failed(exc) from exc
                raise

    def rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Rows of one read on a connection that is not autocommit (its transaction ended
        after), once more on a new connection if it broke."""
        with self.lock:
            for attempt in (1, 2):
                c = self.get()
                try:
                    return c.execute(sql, args).fetchall()
                except psycopg.OperationalError as exc:
                    if isinstance(exc, psycopg.errors.DiskFull) or attempt == 2:
                        raise self.failed(exc) from None
                    self.drop()
                finally:
                    if not c.closed:
                        try:
                            c.rollback()
                        except psycopg.Error:
                            self.drop()
        raise AssertionError("unreachable")

    def failed(self, exc: psycopg.OperationalError) -> ServerError:
        """`exc` of a write on this connection (the caller holds `lock` and rolls back), in
        words; the connection is dropped unless the server answered on it (a full disk)."""
        if not isinstance(exc, psycopg.errors.DiskFull):
            self.drop()
        return server_error(self.url, exc)

    def close(self) -> None:
        with self.lock:
            self.drop()


_process_conns: dict[str, Conn] = {}
_process_lock = threading.Lock()


def process_conn(url: str) -> Conn:
    """This process's one connection (not autocommit) for the shared rows of consolidation
    (receipts, sessions, worker logs) of the store at `url`; the first call makes or upgrades
    the store's tables (memfs.store.pg.schema), so a command that opens no store still finds
    them."""
    from memfs.store.pg import schema

    with _process_lock:
        got = _process_conns.get(url)
        if got is None:
            got = Conn(url, autocommit=False)
            with got.lock:
                c = got.get()
                try:
                    schema.create(c)
                except psycopg.OperationalError as exc:
                    raise got.failed(exc) from exc
            _process_conns[url] = got
        return got
