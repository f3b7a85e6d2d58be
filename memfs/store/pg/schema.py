"""The store's tables in PostgreSQL (in the connection's schema: search_path).

The same rows as the embedded store (memfs.store.db, memfs.store.sqlite_records), plus what
many hosts need: chunks as content-addressed rows (bytea, one row per 1 MiB piece), a commit
sequence, and one writer lease per branch. Per-host state (the selected branch, backing
bindings, the backing journal) is not here: it lives in each host's root (memfs.store.pg.local).

Created once, under an advisory lock, so two hosts opening a new store at once do not race.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
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


def create(conn) -> None:
    """Create the tables if missing (one transaction, serialized between hosts)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        conn.execute(DDL)
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', %s) ON CONFLICT DO NOTHING",
                     (str(SCHEMA_VERSION),))


def channel(conn) -> str:
    """The NOTIFY channel of this store: one per schema, so two stores in one database (two
    search_paths) never wake each other."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    return f"memfs_{schema}"[:63]
