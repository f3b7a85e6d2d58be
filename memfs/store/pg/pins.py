"""What each host still shows or holds open, told to the hosts that collect garbage.

A GC run keeps what the running daemon pins (memfs.store.gc.Pins: views of history shown
under `.memfs`, files still open after they left the tree). On a store many hosts share, a
run on host B must also keep what host A pins, or A's `cat` of a history view, or of a file
it holds open after an undo, gets EIO once B has swept the rows A had not cached yet.

So every daemon publishes its pin set as one row of `host_pins` (schema 8), replaced whole
by one statement, with an expiry on the server's clock (hosts' clocks never matter). A run
keeps the pins of every row not expired; the row of a host that died or was cut off expires
and stops keeping anything. Expired rows are deleted by the next run.

The window this leaves (docs/lifecycle.md): a host publishes when its pins changed, at most
every PUBLISH_EVERY seconds, so a view shown less than that before another host's run may
not be seen by it; a sweep batch re-reads the table under the sweep lock, so only a pin
published after the batch that deletes it is missed.

Imports nothing of psycopg at load (the embedded store's daemon imports this module's
publisher, and the `pg` extra is optional). Threads: every function runs in the caller's thread on a connection it is given or the
store's own reader (a worker thread of the daemon, or the GC thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfs.store.refs import TREE, Ref

if TYPE_CHECKING:
    import psycopg

    from memfs.store.gc import Pins
    from memfs.store.pg.store import PgStore

PUBLISH_EVERY = 2.0  # seconds between two looks at this host's pins (memfs.workspace.pinning)


def ttl() -> float:
    """Seconds a published set keeps without being renewed: four lease lives (60 s by
    default), so a host paused long enough to lose its lease loses its pins too."""
    from memfs.store.pg.lease import lease_ttl  # psycopg's side: not on the embedded store

    return 4 * lease_ttl()

_NOW = "extract(epoch FROM clock_timestamp())"


def publish(store: PgStore, hostname: str, pins: Pins, seconds: float) -> None:
    """Replace this host's published set with `pins`, valid for `seconds` (one
    statement: a run reads the old set or the new one, never a mix)."""
    store._query(
        "INSERT INTO host_pins VALUES (%s, %s, " + _NOW + " + %s, %s, %s) "
        "ON CONFLICT (host) DO UPDATE SET hostname = excluded.hostname, "
        "expires = excluded.expires, trees = excluded.trees, refs = excluded.refs "
        "RETURNING 1",
        (store.host, hostname, seconds, sorted(pins.trees), [_ref_text(r) for r in sorted(pins.refs)]))


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
