"""What each host still shows or holds open, told to the hosts that collect garbage.

A GC run keeps what the running daemon pins (memfs.store.gc.Pins: views of history shown
under `.memfs`, files still open after they left the tree). On a store many hosts share, a
run on host B must also keep what host A pins, or A's `cat` of a history view, or of a file
it holds open after an undo, gets EIO once B has swept the rows A had not cached yet.

So every daemon publishes its pin set as one row of `host_pins` (schema 8), replaced whole
by one statement, with an expiry on the server's clock (hosts' clocks never matter). A run
keeps the pins of every row not expired; the row of a host that died or was cut off expires
and stops keeping anything. Expired rows are deleted by the next run.

A new view of a past commit is published before the kernel sees it (memfs.workspace.pinning
awaits `publish_checked` in a lookup): one transaction that holds SWEEP_KEY shared, as a
commit does, checks that the views' commits are still in `commits`, and replaces the row.
So no GC step that deletes rows runs inside it, and either the publish commits first (the
drop step and every sweep batch read the table under SWEEP_KEY exclusive: they keep it) or
the drop step came first and the check finds the commit gone (the view is refused, absent,
not half swept). A commit still there is kept by the run in course, whole.

Only a live row kept anything: a host paused or cut off past ttl() let its row expire, and a
run meanwhile kept none of it and may have swept any view's commit. So the same transaction
reads this host's row first, and when it is no longer live (expired, or deleted by a run's
finish) every view's commit is checked (`shown`), not only the new ones: the set is never
published again as if it had been kept whole. A live row was live since it was written (only
this host writes it, each time further ahead), so every run since kept it. A follower's
next commit to show is published the same way before it is shown (a host that follows a
branch pins the commit it shows), and so is a set that grew before this host moves a head.
Other changes of the set are published within PUBLISH_EVERY seconds.

Imports nothing of psycopg at load (the embedded store's daemon imports this module's
publisher, and the `pg` extra is optional). Threads: every function runs in the caller's thread on a connection it is given or the
store's own reader (a worker thread of the daemon, or the GC thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memfs.store.refs import TREE, Ref

if TYPE_CHECKING:
    import psycopg

    from memfs.store.gc import Pins
    from memfs.store.pg.store import PgStore

PUBLISH_EVERY = 2.0  # seconds between two looks at this host's pins (memfs.workspace.pinning)
# Tests: another PUBLISH_EVERY, to make the periodic look late (a value past the row's life,
# ttl(), lets the row expire unrenewed: only for a test that ends before it).
EVERY_ENV = "MEMFS_PINS_EVERY"


def publish_every() -> float:
    return float(os.environ.get(EVERY_ENV) or PUBLISH_EVERY)


def ttl() -> float:
    """Seconds a published set keeps without being renewed: four lease lives (60 s by
    default), so a host paused long enough to lose its lease loses its pins too."""
    from memfs.store.pg.lease import lease_ttl  # psycopg's side: not on the embedded store

    return 4 * lease_ttl()

_NOW = "extract(epoch FROM clock_timestamp())"


def publish(store: PgStore, hostname: str, pins: Pins, seconds: float) -> None:
    """Replace this host's published set with `pins`, valid for `seconds` (one
    statement: a run reads the old set or the new one, never a mix)."""
    store._query(_UPSERT + " RETURNING 1", _row(store, hostname, pins, seconds))


_UPSERT = ("INSERT INTO host_pins VALUES (%s, %s, " + _NOW + " + %s, %s, %s) "
           "ON CONFLICT (host) DO UPDATE SET hostname = excluded.hostname, "
           "expires = excluded.expires, trees = excluded.trees, refs = excluded.refs")


def _row(store: PgStore, hostname: str, pins: Pins, seconds: float) -> tuple:
    return (store.host, hostname, seconds, sorted(pins.trees),
            [_ref_text(r) for r in sorted(pins.refs)])


@dataclass
class Checked:
    """What publish_checked found: `gone`, commits no longer in the database (then nothing
    was written); `lapsed`, this host's row was no longer live, so every view's commit was
    checked."""

    gone: set[str] = field(default_factory=set)
    lapsed: bool = False


_LIVE = "SELECT 1 FROM host_pins WHERE host = %s AND expires > " + _NOW


def publish_checked(store: PgStore, hostname: str, pins: Pins, seconds: float,
                    commits: set[str], shown: set[str] | frozenset[str] = frozenset()
                    ) -> Checked:
    """`publish`, under SWEEP_KEY shared, if every commit of `commits` (those of views not
    yet published) is still in the database, and of `shown` (every view's) too when this
    host's row is no longer live (module docstring); else nothing is written and the commits
    gone are returned (their views are refused: a GC dropped them and may have swept them)."""
    import psycopg

    from memfs.store.pg import schema
    from memfs.store.pg.conn import server_error
    from memfs.testing import pins_fault, pins_gate

    pins_gate()
    reader = store._reader
    with reader.lock:
        conn = reader.get()
        try:
            with conn.transaction():
                pins_fault(conn)
                conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (schema.SWEEP_KEY,))
                lapsed = conn.execute(_LIVE, (store.host,)).fetchone() is None
                want = set(commits) | set(shown) if lapsed else set(commits)
                if want:
                    there = {r[0] for r in conn.execute(
                        "SELECT id FROM commits WHERE id = ANY(%s)", (sorted(want),))}
                    if want - there:
                        return Checked(want - there, lapsed)
                conn.execute(_UPSERT, _row(store, hostname, pins, seconds))
        except psycopg.OperationalError as exc:
            reader.drop()
            raise server_error(store.url, exc) from None
    return Checked(set(), lapsed)


def withdraw(store: PgStore) -> None:
    """This host pins nothing any more (a clean stop)."""
    store._query("DELETE FROM host_pins WHERE host = %s RETURNING 1", (store.host,))


def others(conn: psycopg.Connection, host: str) -> list[Ref]:
    """What the other hosts' live sets pin, as mark roots (trees first)."""
    roots: list[Ref] = []
    rows = conn.execute("SELECT trees, refs FROM host_pins WHERE host <> %s AND expires > "
                        + _NOW, (host,)).fetchall()
    for trees, refs in rows:
        roots += [Ref(TREE, t) for t in trees]
        roots += [_ref_of(text) for text in refs]
    return roots


def expire(conn: psycopg.Connection) -> None:
    """Delete the sets nobody renewed (a GC run's finish)."""
    conn.execute("DELETE FROM host_pins WHERE expires <= " + _NOW)


def _ref_text(ref: Ref) -> str:
    return f"{ref.kind}:{ref.id}"


def _ref_of(text: str) -> Ref:
    kind, _, oid = text.partition(":")
    return Ref(kind, oid)
