"""The store's tables in PostgreSQL (in the connection's schema: search_path).

The same rows as the embedded store (memfs.store.db, memfs.store.sqlite_records), plus what
many hosts need: chunks as content-addressed rows (bytea, one row per 1 MiB piece), a commit
sequence, and one writer lease per branch. Per-host state (the selected branch, backing
bindings, the backing journal) is not here: it lives in each host's root (memfs.store.pg.local).

Created once, under an advisory lock, so two hosts opening a new store at once do not race.
`memfs_meta.schema` holds the version; a store of an older version is brought up to this one
by the steps in MIGRATIONS (in the same transaction, under the same lock), and one of a newer
version is refused before anything changes. Version 1 is the first release's tables (DDL,
all CREATE ... IF NOT EXISTS); a change since is a new step under the next number.
"""

from __future__ import annotations

from collections.abc import Callable

from memfs.errors import MemfsError

LOCK_KEY = 0x6D656D6673  # pg_advisory_xact_lock key while creating ("memfs")

DDL = """
CREATE TABLE IF NOT EXISTS memfs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (id TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS objects (id TEXT PRIMARY KEY, data BYTEA NOT NULL);
CREATE SEQUENCE IF NOT EXISTS commit_seq;
CREATE TABLE IF NOT EXISTS commits (
    id TEXT PRIMARY KEY, seq BIGINT NOT NULL UNIQUE, parent TEXT, tree TEXT NOT NULL,
    branch TEXT NOT NULL, time_ns BIGINT NOT NULL, message TEXT NOT NULL,
    processes TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS commits_time ON commits(time_ns);
CREATE TABLE IF NOT EXISTS branches (name TEXT PRIMARY KEY, head TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY, commit_id TEXT NOT NULL, branch TEXT NOT NULL,
    time_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS reflog (
    seq BIGSERIAL PRIMARY KEY, branch TEXT NOT NULL, old TEXT, new TEXT NOT NULL,
    reason TEXT NOT NULL, time_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS commit_ops (commit_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks (
    seq BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, commit_id TEXT NOT NULL,
    branch TEXT NOT NULL, time_ns BIGINT NOT NULL, label TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS marks_commit ON marks(commit_id);
CREATE TABLE IF NOT EXISTS commit_intents (commit_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commit_inodes (commit_id TEXT PRIMARY KEY, inodes TEXT NOT NULL);
-- One writing host per branch: its token (from lease_token, never reused) fences every
-- commit; expires is the database's clock (epoch seconds), so hosts' clocks never matter.
CREATE SEQUENCE IF NOT EXISTS lease_token;
CREATE TABLE IF NOT EXISTS leases (
    branch TEXT PRIMARY KEY, host TEXT NOT NULL, hostname TEXT NOT NULL,
    token BIGINT NOT NULL, expires DOUBLE PRECISION NOT NULL);
"""


def _v2(conn) -> None:
    """Chunk bytes are stored as they come, not compressed (STORAGE EXTERNAL: out of line,
    never pglz). Chunks are mostly what compression cannot shrink (media, archives, builds),
    and on those pglz spent the server's CPU to no end: a piece whose first KiB repeats a few
    bytes makes it go through most of the MiB (measured: 51 MiB of such pieces, 0.70 s of
    server CPU and 40 MiB/s; 0.14 s and 129 MiB/s stored as they come; docs/performance.md,
    "On a PostgreSQL store"). The embedded
    store's packs do not compress either. Rows stored before keep their form (reads of
    compressed and plain rows are the same); a DBA may choose otherwise (`ALTER TABLE chunks
    ALTER COLUMN data SET STORAGE EXTENDED, ALTER COLUMN data SET COMPRESSION lz4`) and this
    step, run once, does not undo it."""
    conn.execute("ALTER TABLE chunks ALTER COLUMN data SET STORAGE EXTERNAL")


MIGRATIONS: dict[int, Callable[..., None]] = {2: _v2}
SCHEMA_VERSION = max(MIGRATIONS)


def create(conn) -> int:
    """Create the tables if missing and migrate an older store (one transaction, serialized
    between hosts); returns the version the store had (0: new)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        had = check_known(conn)
        conn.execute(DDL)
        for n in range(max(had, 1) + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[n](conn)
        if had < SCHEMA_VERSION:
            conn.execute("INSERT INTO memfs_meta VALUES ('schema', %s) ON CONFLICT (key) DO "
                         "UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))
    return had


def check_known(conn) -> int:
    """The version, refused if a newer memfs wrote it (read-only opens check this too)."""
    had = version(conn)
    if had > SCHEMA_VERSION:
        raise MemfsError(
            f"the PostgreSQL store is schema version {had}; this memfs knows versions up to "
            f"{SCHEMA_VERSION}", "use the newer memfs that made or upgraded this store")
    return had


def version(conn) -> int:
    """The store's schema version (0: no tables yet)."""
    if conn.execute("SELECT to_regclass('memfs_meta')").fetchone()[0] is None:
        return 0
    row = conn.execute("SELECT value FROM memfs_meta WHERE key = 'schema'").fetchone()
    return int(row[0]) if row else 0


def channel(conn) -> str:
    """The NOTIFY channel of this store: one per schema, so two stores in one database (two
    search_paths) never wake each other."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    return f"memfs_{schema}"[:63]
