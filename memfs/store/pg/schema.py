"""The store's tables in PostgreSQL (in the connection's schema: search_path).

The same rows as the embedded store (memfs.store.db, memfs.store.sqlite_records), plus what
many hosts need: chunks as content-addressed rows (bytea, one row per 1 MiB piece, or a
patch over the piece it replaced: schema 6), a commit
sequence, and one writer lease per branch. Per-host state (the selected branch, backing
bindings, the backing journal) is not here: it lives in each host's root (memfs.store.pg.local).

Created once and upgraded in place, under an advisory lock, so two hosts opening a new (or an
older) store at once do not race. The version is the `schema` row of memfs_meta; each
migration adds what its version brought (tables only, `IF NOT EXISTS`), and a store a newer
memfs wrote is refused rather than half-understood.
"""

from __future__ import annotations

from memfs.errors import MemfsError

LOCK_KEY = 0x6D656D6673  # pg_advisory_xact_lock key while creating ("memfs")
# Garbage collection (memfs.store.pg.gc): every write transaction holds SWEEP_KEY shared, a
# GC step that deletes rows holds it exclusive; one collector at a time holds GC_KEY (for its
# session: a killed collector's connection ends and the server lets it go).
SWEEP_KEY = 0x6D656D6667  # "memfg"
GC_KEY = 0x6D656D6663  # "memfc"
EPOCH_KEY = "gc:epoch"  # memfs_meta: bumped by every GC transaction that deletes rows

BASE = """
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

# Version 2: consolidation receipts, shared by every host (memfs.consolidate.shared_receipts).
# `body` is the receipt's Markdown exactly as the file store writes it (its JSON block is the
# truth); `host` is the host that first wrote it, for the audit.
RECEIPTS = """
CREATE TABLE IF NOT EXISTS receipts (
    review_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, state TEXT NOT NULL,
    host TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS receipts_state ON receipts(state);
"""

# Version 3: agent sessions and consolidation worker logs, shared by every host
# (memfs.memory.shared_sessions, memfs.consolidate.shared_workers). A turn or an event is one
# row holding the JSON line the file store appends (JSON escapes what TEXT cannot hold, NUL).
SESSIONS = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, workspace TEXT, created TEXT NOT NULL, host TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS session_turns (
    session TEXT NOT NULL REFERENCES sessions(id), idx INTEGER NOT NULL, line TEXT NOT NULL,
    PRIMARY KEY (session, idx));
CREATE TABLE IF NOT EXISTS worker_attempts (
    id TEXT PRIMARY KEY, created TEXT NOT NULL, host TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS worker_events (
    attempt TEXT NOT NULL REFERENCES worker_attempts(id), seq INTEGER NOT NULL,
    line TEXT NOT NULL, PRIMARY KEY (attempt, seq));
"""

# Version 4: chunk bytes are stored as they come, not compressed (STORAGE EXTERNAL: out of
# line, never pglz). Chunks are mostly what compression cannot shrink (media, archives,
# builds), and on those pglz spent the server's CPU to no end: a piece whose first KiB repeats
# a few bytes makes it go through most of the MiB (measured: 51 MiB of such pieces, 0.70 s of
# server CPU and 40 MiB/s; 0.14 s and 129 MiB/s stored as they come; docs/performance.md, "On
# a PostgreSQL store"). The embedded store's packs do not compress either. Rows stored before
# keep their form (reads of compressed and plain rows are the same); a DBA may choose
# otherwise (`ALTER TABLE chunks ALTER COLUMN data SET STORAGE EXTENDED, ALTER COLUMN data SET
# COMPRESSION lz4`) and this step, run once, does not undo it.
CHUNKS_AS_THEY_COME = "ALTER TABLE chunks ALTER COLUMN data SET STORAGE EXTERNAL;"

# Version 5: retention and GC (memfs.store.pg.gc). The tombstones of dropped commits, as the
# embedded store's (memfs.store.schema), and the GC epoch: a host trusts its caches to say a
# row is in the database only for rows it saw there in the current epoch (memfs.store.pg.tx).
RETENTION = """
CREATE TABLE IF NOT EXISTS dropped_commits (
    id TEXT PRIMARY KEY, parent TEXT, seq BIGINT NOT NULL, branch TEXT NOT NULL,
    time_ns BIGINT NOT NULL, dropped_ns BIGINT NOT NULL, reason TEXT NOT NULL);
INSERT INTO memfs_meta VALUES ('gc:epoch', '0') ON CONFLICT (key) DO NOTHING;
"""

# Version 6: a chunk that replaces the committed chunk at the same place of the same file may
# be stored as a patch over it (memfs.store.delta, as the embedded store's schema 3): `over`
# names what it is read through (a whole base, then the patches between, oldest first; ids
# separated by spaces), and `data` then holds the patch. NULL: `data` is the chunk, as every
# row stored before (they read as before). GC keeps what a live patch is read through
# (memfs.store.pg.gc).
PATCHES = "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS over TEXT;"
PATCHES_VERSION = 6

# Version 7: objects (directory listings, manifests, inode tables: text-like, often large and
# rewritten by every commit that touches them) compressed with lz4, not pglz. pglz was most of
# the server's time in a git add/commit of 5k files: 1.6 s of backend CPU for 61 MB of object
# rows, against 0.42 s with lz4 for the same stored size (0.27 s stored as they come, but 1.75
# times the bytes and the WAL; docs/performance.md, "Objects compressed with lz4"). A server
# built without lz4 (or older than 14) stores them as they come, as the chunks. Rows stored
# before keep their form; a DBA's own choice made before this step is overwritten once.
OBJECTS_LZ4 = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression'
               AND 'lz4' = ANY(enumvals)) THEN
        EXECUTE 'ALTER TABLE objects ALTER COLUMN data SET COMPRESSION lz4';
    ELSE
        EXECUTE 'ALTER TABLE objects ALTER COLUMN data SET STORAGE EXTERNAL';
    END IF;
END $$;
"""

OBJECTS_LZ4_VERSION = 7

# Version 8: what each host's daemon pins (views of history it shows, files it holds open
# after they left the tree), one row a host, replaced whole, expiring on the server's clock:
# a GC run on any host keeps the live sets (memfs.store.pg.pins).
HOST_PINS = """
CREATE TABLE IF NOT EXISTS host_pins (
    host TEXT PRIMARY KEY, hostname TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL,
    trees TEXT[] NOT NULL, refs TEXT[] NOT NULL);
"""
HOST_PINS_VERSION = 8

MIGRATIONS: dict[int, str] = {1: BASE, 2: RECEIPTS, 3: SESSIONS, 4: CHUNKS_AS_THEY_COME,
                              5: RETENTION, PATCHES_VERSION: PATCHES,
                              OBJECTS_LZ4_VERSION: OBJECTS_LZ4, HOST_PINS_VERSION: HOST_PINS}
SCHEMA_VERSION = max(MIGRATIONS)


def version(conn) -> int:
    """The store's schema version (0: nothing made yet)."""
    if conn.execute("SELECT to_regclass('memfs_meta')").fetchone()[0] is None:
        return 0
    row = conn.execute("SELECT value FROM memfs_meta WHERE key = 'schema'").fetchone()
    return int(row[0]) if row else 0


def check_known(conn) -> int:
    """The version, refused if a newer memfs made or upgraded the store."""
    v = version(conn)
    if v > SCHEMA_VERSION:
        raise MemfsError(f"the PostgreSQL store is schema version {v}; this memfs knows "
                         f"versions up to {SCHEMA_VERSION}",
                         "use the newer memfs that made or upgraded this store")
    return v


def create(conn) -> int:
    """Create the tables, or upgrade an older store's, in one transaction serialized between
    hosts; returns the version the store had (0: new)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        had = check_known(conn)
        for n in range(had + 1, SCHEMA_VERSION + 1):
            conn.execute(MIGRATIONS[n])
        if had < SCHEMA_VERSION:
            conn.execute("INSERT INTO memfs_meta VALUES ('schema', %s) ON CONFLICT (key) DO "
                         "UPDATE SET value = EXCLUDED.value", (str(SCHEMA_VERSION),))
    return had


def channel(conn) -> str:
    """The NOTIFY channel of this store: one per schema, so two stores in one database (two
    search_paths) never wake each other."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    return f"memfs_{schema}"[:63]
