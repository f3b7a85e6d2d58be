"""Hearing other hosts' commits: LISTEN on the store's channel, in one thread of its own.

Every transaction that moves a head or a name sends `pg_notify(channel, "BRANCH HEAD HOST")`
(memfs.store.pg.tx); PostgreSQL delivers it only when that transaction commits, so a head
heard of is a durable head. A connection that breaks may have missed notifications: after
each (re)connect the watcher says so with `on_event(None)`, and the store compares every
branch head with what it last saw (memfs.store.pg.store.PgStore._resync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from psycopg import sql

from memfs.store.pg.conn import ServerError, close_quietly, connect

log = logging.getLogger("memfs.watch")


class Event:
    __slots__ = ("branch", "head", "host")

    def __init__(self, payload: str) -> None:
        parts = payload.split(" ")
        self.branch, self.head, self.host = (parts + ["", "", ""])[:3]


class Watcher:
    def __init__(self, url: str, channel: str, on_event: Callable[[Event | None], None]) -> None:
        self.url = url
        self.channel = channel
        self.on_event = on_event
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memfs-watch", daemon=True)
        self._conn: psycopg.Connection | None = None
        self.ready = threading.Event()  # set once listening (tests wait on it)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                self._conn = connect(self.url, autocommit=True)
                self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                self.ready.set()
                self._tell(None)  # whatever was missed while not listening
                delay = 0.2
                while not self._stop.is_set():
                    for n in self._conn.notifies(timeout=0.5):
                        self._tell(Event(n.payload))
            except (psycopg.Error, ServerError) as exc:
                if self._stop.is_set():
                    break
                log.warning("listening for other hosts' commits: %s (again in %.1f s)",
                            exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                self._drop()

    def _tell(self, event: Event | None) -> None:
        try:
            self.on_event(event)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the listening
            log.exception("handling a store event failed")

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
