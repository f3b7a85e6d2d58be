"""The store's tables, defined in one place, with a version read at open and the migrations
that bring an older store up to it in place.

`meta.schema` holds the version. Every memfs before versions were read wrote 1 there whatever
tables it had made (each added its own tables with CREATE TABLE IF NOT EXISTS at open), so a
version-1 store may lack any table added since the first release; migration 2 makes every one
of them and the journal's added columns, idempotently. From version 2 on, a new table or column
is a new migration: add a function to MIGRATIONS under the next number. `migrate` runs the
missing steps in one IMMEDIATE transaction (two processes opening one old store at once
migrate it once) and refuses a store whose version is newer than this memfs knows, before
changing anything. The journal (memfs.store.journal) lives in the same file and may also be
opened by itself: `ensure_journal` makes its tables and columns.

Loop or thread: whoever opens the store (no state here).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from memfs.errors import MemfsError

log = logging.getLogger("memfs.store")

BASE = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Content chunks: (pack file, offset, length). Packs are append-only files under packs/.
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, pack INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL);
-- Tree objects: directory listings and file manifests, keyed by a BLAKE2b digest.
CREATE TABLE IF NOT EXISTS objects (id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS commits (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, parent TEXT, tree TEXT NOT NULL,
    branch TEXT NOT NULL, time_ns INTEGER NOT NULL, message TEXT NOT NULL,
    processes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS branches (name TEXT PRIMARY KEY, head TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY, commit_id TEXT NOT NULL, branch TEXT NOT NULL, time_ns INTEGER NOT NULL);
-- Every move of a branch head that is not a plain commit (undo, reset), so nothing is lost.
CREATE TABLE IF NOT EXISTS reflog (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, branch TEXT NOT NULL, old TEXT, new TEXT NOT NULL,
    reason TEXT NOT NULL, time_ns INTEGER NOT NULL);
"""

# Added after the first release (all in migration 2).
STORE_ADDED = """
-- Branch intent of backed mounts, per commit (memfs.backing): {mount: object id of the
-- intent bytes}, so it rewinds with undo and branch switch exactly as the tree does.
CREATE TABLE IF NOT EXISTS commit_intents (commit_id TEXT PRIMARY KEY, data TEXT NOT NULL);
-- The inode table of a commit whose tree has hard-linked inodes (memfs.store.trees): absent
-- for every other commit, so stores made before hard links read unchanged.
CREATE TABLE IF NOT EXISTS commit_inodes (commit_id TEXT PRIMARY KEY, inodes TEXT NOT NULL);
-- The operations a commit's changes belong to, and the boundaries `memfs mark` names
-- (memfs.store.history).
CREATE TABLE IF NOT EXISTS commit_ops (commit_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, commit_id TEXT NOT NULL,
    branch TEXT NOT NULL, time_ns INTEGER NOT NULL, label TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS marks_commit ON marks(commit_id);
CREATE INDEX IF NOT EXISTS commits_time ON commits(time_ns);
-- Commits the retention policy dropped, as tombstones (memfs.store.retention).
CREATE TABLE IF NOT EXISTS dropped_commits (
    id TEXT PRIMARY KEY, parent TEXT, seq INTEGER NOT NULL, branch TEXT NOT NULL,
    time_ns INTEGER NOT NULL, dropped_ns INTEGER NOT NULL, reason TEXT NOT NULL
) WITHOUT ROWID;
"""

# The backing journal (memfs.store.journal): evidence P, write-ahead intents, fingerprints.
JOURNAL = """
CREATE TABLE IF NOT EXISTS journal_roots (
    mount TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal_evidence (
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    digest TEXT,               -- NULL: disk and store agreed the path holds nothing
    recorded_at REAL NOT NULL,
    mode INTEGER,              -- the permission bits agreed on (NULL: not recorded)
    PRIMARY KEY (mount, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_evidence_aside (
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    digest TEXT,
    dev INTEGER,
    ino INTEGER,
    set_aside_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal_intents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('write', 'unlink', 'adopt')),
    branch TEXT,
    old TEXT,                  -- expected value before ('' = absent)
    new TEXT,                  -- value after ('' = absent)
    prior TEXT,                -- adopt: the P its decision resolved ('' = absent, NULL = unrecorded)
    mode INTEGER,              -- the permission bits the step sets (NULL: not recorded)
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'abandoned')),
    created_at REAL NOT NULL,
    settled_at REAL
);
CREATE INDEX IF NOT EXISTS journal_intents_pending
    ON journal_intents (mount, path) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS journal_fingerprints (
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    dev INTEGER NOT NULL,
    digest TEXT NOT NULL,
    kind TEXT NOT NULL,
    hashed_at_ns INTEGER NOT NULL,
    mime TEXT,                 -- sniffed from the head when hashed (NULL: not recorded)
    PRIMARY KEY (mount, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_pins (
    mount TEXT PRIMARY KEY,
    branch TEXT NOT NULL,      -- the branch disk was last materialized from
    pinned_at REAL NOT NULL
);
-- A count of row changes to the tables pass_inputs remembers, kept by triggers, so by every
-- connection that writes them (any process, any version of memfs): a remembered snapshot is
-- good while the count is unchanged, whatever else commits to the file.
CREATE TABLE IF NOT EXISTS journal_changes (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    n INTEGER NOT NULL
);
INSERT OR IGNORE INTO journal_changes VALUES (0, 0);
""" + "".join(
    f"CREATE TRIGGER IF NOT EXISTS {table}_{what} AFTER {what} ON {table} "
    "BEGIN UPDATE journal_changes SET n = n + 1 WHERE id = 0; END;\n"
    for table in ("journal_evidence", "journal_fingerprints")
    for what in ("INSERT", "UPDATE", "DELETE"))

# Columns the journal's tables got after its first release: their rows read NULL, "not
# recorded", which each reader handles.
JOURNAL_COLUMNS = (
    ("journal_intents", "prior", "TEXT"),
    ("journal_fingerprints", "mime", "TEXT"),
    ("journal_evidence", "mode", "INTEGER"),
    ("journal_intents", "mode", "INTEGER"),
)


def _columns(conn: sqlite3.Connection) -> None:
    have: dict[str, set[str]] = {}
    for table, col, decl in JOURNAL_COLUMNS:
        if table not in have:
            have[table] = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if col not in have[table]:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")
            have[table].add(col)


def _script(conn: sqlite3.Connection, script: str) -> None:
    """DDL statement by statement inside the caller's transaction (executescript would
    commit it first)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            conn.execute(buf)
            buf = ""


def _v1(conn: sqlite3.Connection) -> None:
    """The first release's tables."""
    _script(conn, BASE)


def _v2(conn: sqlite3.Connection) -> None:
    """Every table and column added since, which a version-1 store may or may not have."""
    _script(conn, STORE_ADDED)
    _script(conn, JOURNAL)
    _columns(conn)


def _v3(conn: sqlite3.Connection) -> None:
    """A chunk may be stored as a patch (memfs.store.delta): `over` names what it is read
    through, a full base then the patches between, ids separated by spaces (NULL: stored
    whole, as every chunk before)."""
    if not has_chunk_bases(conn):
        conn.execute("ALTER TABLE chunks ADD COLUMN over TEXT")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1, 2: _v2, 3: _v3}
SCHEMA_VERSION = max(MIGRATIONS)


def version(conn: sqlite3.Connection) -> int:
    """The store's schema version (0: a new database)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
                    ).fetchone() is None:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    return int(row[0]) if row else 0


def has_chunk_bases(conn: sqlite3.Connection) -> bool:
    """Has the chunks table the `over` column (version 3)? A read-only open of an older
    store reads it without: every chunk there is whole."""
    return "over" in {r[1] for r in conn.execute("PRAGMA table_info(chunks)")}


def check_known(conn: sqlite3.Connection, where: object) -> int:
    """The version, refused if a newer memfs wrote it (read-only opens check this too)."""
    v = version(conn)
    if v > SCHEMA_VERSION:
        raise MemfsError(
            f"{where} is store schema version {v}; this memfs knows versions up to "
            f"{SCHEMA_VERSION}", "use the newer memfs that made or upgraded this store")
    return v


def migrate(conn: sqlite3.Connection, where: object) -> int:
    """Bring the store up to SCHEMA_VERSION in place (one transaction); returns the version
    it had. A full disk refuses the write: a store that only lacks the version row's bump
    (every table there) opens as it is, one that lacks tables says so."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        had = check_known(conn, where)
        for n in range(had + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[n](conn)
        if had < SCHEMA_VERSION:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)",
                         (str(SCHEMA_VERSION),))
        conn.execute("COMMIT")
    except BaseException as exc:
        conn.execute("ROLLBACK")
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL and _complete(conn):
            log.warning("%s: schema version not recorded (the disk is full); it has every "
                        "table", where)
            return had
        raise
    if had and had < SCHEMA_VERSION:
        log.info("%s: store schema upgraded from version %d to %d", where, had, SCHEMA_VERSION)
    return had


def _complete(conn: sqlite3.Connection) -> bool:
    """Has the database every table this memfs uses (whatever its version row says)?"""
    want = set()
    for script in (BASE, STORE_ADDED, JOURNAL):
        for line in script.splitlines():
            if line.startswith("CREATE TABLE IF NOT EXISTS "):
                want.add(line.split()[5])
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return want <= have


def ensure_journal(conn: sqlite3.Connection) -> None:
    """The journal's tables and columns, for a journal opened by itself (its own transaction,
    so two processes opening one old journal at once add each column once)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        _script(conn, JOURNAL)
        _columns(conn)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


__all__ = ["BASE", "JOURNAL", "JOURNAL_COLUMNS", "MIGRATIONS", "SCHEMA_VERSION", "STORE_ADDED",
           "check_known", "has_chunk_bases", "ensure_journal", "migrate", "version"]
