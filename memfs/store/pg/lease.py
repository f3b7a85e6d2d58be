"""Writer leases: at most one host writes a branch at a time.

A lease is a row (branch, host, token, expires) in the shared database. Its token comes from
a sequence and is never reused; every commit and head move of the branch checks it inside its
own transaction (memfs.store.pg.tx), so a host that lost its lease — paused past its expiry
and taken over — cannot commit even if it does not know yet: it is fenced. Expiry is the
database's clock, so the hosts' clocks never matter.

Claiming a branch succeeds when nobody holds it, when this host held it (a restart after a
crash: the root's lock says no other process of this host runs), or when its holder released
it (a clean unmount, a branch switch). A lease that merely expired — its host died or is cut
off — moves only by `takeover`: a person (or an orchestrator) decides the other host is gone.

Threads: `claim`, `takeover`, `release` run in the caller's thread (a worker or a CLI); one
renewer thread per store renews every held lease each TTL/3 on its own connection, and tells
`on_lost` when a renewal finds the token gone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from memfs.store.backend import Claim
from memfs.store.pg.conn import Conn, ServerError
from memfs.store.store import StoreError

log = logging.getLogger("memfs.lease")
TTL_ENV = "MEMFS_LEASE_SECONDS"
DEFAULT_TTL = 15.0


def lease_ttl() -> float:
    text = os.environ.get(TTL_ENV)
    try:
        return max(1.0, float(text)) if text else DEFAULT_TTL
    except ValueError:
        return DEFAULT_TTL


class Fenced(StoreError):
    """A commit or head move refused: this host holds no valid lease of the branch."""


class Leases:
    def __init__(self, url: str, host: str, ttl: float | None = None) -> None:
        self.host = host
        self.hostname = socket.gethostname()
        self.ttl = lease_ttl() if ttl is None else ttl
        self._conn = Conn(url, autocommit=True)
        self._held: dict[str, int] = {}  # branch -> token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_lost: Callable[[str], None] = lambda branch: None

    def token(self, branch: str) -> int | None:
        with self._lock:
            return self._held.get(branch)

    def held(self) -> dict[str, int]:
        with self._lock:
            return dict(self._held)

    # -- taking and giving back ---------------------------------------------------------
    def claim(self, branch: str) -> Claim:
        """Take the branch's lease if it is free, released, or this host's own."""
        token = self._take(branch, "l.expires = 0")
        if token is not None:
            return self._took(branch, token)
        return self.state(branch)

    def takeover(self, branch: str) -> Claim:
        """Take the lease of a host whose lease expired (refused while it is live)."""
        token = self._take(branch, "l.expires < extract(epoch FROM clock_timestamp())")
        if token is not None:
            return self._took(branch, token)
        state = self.state(branch)
        raise StoreError(
            f"branch {branch} is written by host {state.holder}, whose lease is live for "
            f"{state.expires_in:.0f} s more",
            "a live host keeps renewing it: unmount there (or stop that host) first; a host "
            f"that died loses it after {self.ttl:g} s, then `memfs takeover {branch}` works")

    def release(self, branch: str) -> None:
        """Give the branch back (its next claimant needs no takeover). The token stays in
        the row, so a commit of ours still in flight is fenced all the same."""
        with self._lock:
            token = self._held.pop(branch, None)
        if token is None:
            return
        try:
            self._conn.query("UPDATE leases SET expires = 0 WHERE branch = %s AND token = %s "
                             "RETURNING 1", (branch, token))
        except ServerError as exc:  # it expires by itself; a takeover is then needed
            log.warning("could not release the lease of %s: %s", branch, exc)

    def state(self, branch: str) -> Claim:
        rows = self._conn.query(
            "SELECT host, hostname, token, expires - extract(epoch FROM clock_timestamp()), "
            "expires = 0 FROM leases WHERE branch = %s", (branch,))
        if not rows:
            return Claim(branch, False)
        host, hostname, token, left, released = rows[0]
        mine = host == self.host and self.token(branch) == token
        return Claim(branch, mine, f"{hostname} ({host})", None if released else float(left),
                     token if mine else None)

    def all(self) -> list[Claim]:
        names = [r[0] for r in self._conn.query("SELECT branch FROM leases ORDER BY branch")]
        return [self.state(b) for b in names]

    def _take(self, branch: str, free: str) -> int | None:
        """A new token for this host, if the branch has no lease, this host's, or one
        `free` (SQL over the row `l`) says may be taken; None if another host keeps it."""
        rows = self._conn.query(
            "INSERT INTO leases AS l (branch, host, hostname, token, expires) VALUES "
            "(%s, %s, %s, nextval('lease_token'), extract(epoch FROM clock_timestamp()) + %s) "
            "ON CONFLICT (branch) DO UPDATE SET host = excluded.host, "
            "hostname = excluded.hostname, token = excluded.token, expires = excluded.expires "
            f"WHERE l.host = excluded.host OR {free} RETURNING token",
            (branch, self.host, self.hostname, self.ttl))
        return rows[0][0] if rows else None

    def _took(self, branch: str, token: int) -> Claim:
        with self._lock:
            self._held[branch] = token
        self._start()
        return Claim(branch, True, f"{self.hostname} ({self.host})", self.ttl, token)

    # -- renewing ---------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, name="memfs-lease",
                                            daemon=True)
            self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew_all()

    def renew_all(self) -> None:
        for branch, token in self.held().items():
            try:
                rows = self._conn.query(
                    "UPDATE leases SET expires = extract(epoch FROM clock_timestamp()) + %s "
                    "WHERE branch = %s AND token = %s AND expires > 0 RETURNING 1",
                    (self.ttl, branch, token))
            except ServerError as exc:  # fencing keeps this safe; try again next round
                log.warning("could not renew the lease of %s: %s", branch, exc)
                continue
            if not rows:
                with self._lock:
                    if self._held.get(branch) == token:
                        del self._held[branch]
                log.error("lost the lease of branch %s (another host took it over)", branch)
                self.on_lost(branch)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._conn.close()
