"""Stores made before hard links (commit 194a09a's format) open and read unchanged.

tests/data/store-before-links.tar.gz was written by that commit's Workspace: two commits on
main (and a branch `side` at the first), with a sparse two-chunk file, an explicit mtime and
atime, a 0755 script with a binary xattr, a symlink, an empty read-only file and a name that
is not UTF-8. No entry records a link count and the store has no inode tables.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tarfile
from pathlib import Path

import pytest

from memfs.store import Store

pytestmark = pytest.mark.mount

DATA = Path(__file__).parent / "data" / "store-before-links.tar.gz"
ODD = os.fsdecode("ünïcödé".encode() + b"\xff")


@pytest.fixture
def old_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(DATA) as tar:
        tar.extractall(root, filter="data")
    return root


def commits(root: Path) -> list[tuple]:
    return sqlite3.connect(root / "store.db").execute(
        "SELECT id, parent, tree FROM commits ORDER BY seq").fetchall()


def test_old_store_fsck_is_clean_and_commits_are_unchanged(old_root: Path) -> None:
    before = commits(old_root)
    store = Store.open(old_root, create=False)
    try:
        assert store.fsck() == []
        assert all(store.inode_table(cid) is None for cid, _, _ in before)
    finally:
        store.close()
    assert commits(old_root) == before


def check_first_commit(work: Path) -> None:
    main_c = work / "src" / "main.c"
    assert main_c.read_bytes() == b"int main(void) { return 0; }\n"
    st = os.lstat(main_c)
    assert (st.st_mtime_ns, st.st_atime_ns) == (1_600_000_000_123_456_789,
                                                1_600_000_001_000_000_000)
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    big = (work / "src" / "deep" / "big.bin").read_bytes()
    assert len(big) == (5 << 20) + 17 and big[: 2 << 20] == bytes(range(256)) * 8192
    assert big[2 << 20: 5 << 20] == bytes(3 << 20) and big.endswith(b"tail after a hole")
    assert os.getxattr(work / "script.sh", "user.note") == b"\x00\xffbinary"
    assert os.readlink(work / "link") == "src/main.c"
    assert (work / "empty").exists() and (work / ODD).exists()
    # Link counts that the old entries never recorded are counted from the listings.
    assert os.lstat(work).st_nlink == 3 and os.lstat(work / "src").st_nlink == 3
    assert os.lstat(work / "src" / "deep").st_nlink == 2 and st.st_nlink == 1


def test_old_store_mounts_and_reads_every_commit(mount_factory, old_root: Path) -> None:
    m = mount_factory(root=old_root)
    m.require_real()
    first, second = (cid for cid, _, _ in commits(old_root)[-2:])
    w = m.work
    assert (w / "src" / "main.c").read_bytes() == b"int main(void) { return 1; }\n"
    assert not (w / "empty").exists()
    assert stat.S_IMODE(os.lstat(w / "script.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(w / "src").st_mode) == 0o750
    check_first_commit(m.mnt / ".memfs" / "history" / first / "work")
    check_first_commit(m.mnt / ".memfs" / "branches" / "side" / "work")
    # New work on the old store: a hard link, a FIFO; old history still reads the same.
    os.link(w / "script.sh", w / "src" / "again.sh")
    os.mkfifo(w / "pipe")
    m.remount()
    assert os.lstat(w / "script.sh").st_ino == os.lstat(w / "src" / "again.sh").st_ino
    assert os.lstat(w / "src" / "again.sh").st_nlink == 2
    assert os.getxattr(w / "src" / "again.sh", "user.note") == b"\x00\xffbinary"
    check_first_commit(m.mnt / ".memfs" / "history" / first / "work")
    assert (m.mnt / ".memfs" / "history" / second / "work" / "src" / "main.c").read_bytes() \
        == b"int main(void) { return 1; }\n"
    m.cli("branch", "switch", "side")
    check_first_commit(w)
    res = m.cli("fsck", check=False)
    assert res.returncode == 0, res.stdout + res.stderr


# --- the schema version: read at open, older stores upgraded in place -----------------------


def _meta_schema(root: Path) -> str | None:
    row = sqlite3.connect(root / "store.db").execute(
        "SELECT value FROM meta WHERE key='schema'").fetchone()
    return row[0] if row else None


def _tables(db: Path) -> set[str]:
    return {r[0] for r in sqlite3.connect(db).execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger')")}


def test_an_old_store_is_upgraded_in_place_to_todays_schema(old_root: Path, tmp_path: Path):
    """The old store (version 1 in its meta row, as every store memfs wrote before versions
    were read, and without the tables added since) gets every table a new store has, and
    the version, at its first open; what it held reads unchanged (the tests above) and a
    second open changes nothing."""
    from memfs.store.schema import SCHEMA_VERSION

    assert _meta_schema(old_root) == "1"
    before = _tables(old_root / "store.db")
    assert "dropped_commits" not in before and "journal_evidence" not in before
    fresh = Store.open(tmp_path / "fresh")
    fresh.close()
    store = Store.open(old_root, create=False)
    try:
        assert store.fsck() == []
    finally:
        store.close()
    assert _meta_schema(old_root) == str(SCHEMA_VERSION)
    assert _tables(old_root / "store.db") == _tables(tmp_path / "fresh" / "store.db")
    data_version = sqlite3.connect(old_root / "store.db").execute(
        "PRAGMA schema_version").fetchone()[0]
    Store.open(old_root, create=False).close()
    assert sqlite3.connect(old_root / "store.db").execute(
        "PRAGMA schema_version").fetchone()[0] == data_version  # nothing migrated twice


def test_a_store_from_a_newer_memfs_is_refused_before_anything_changes(tmp_path: Path):
    from memfs.errors import MemfsError
    from memfs.store.schema import SCHEMA_VERSION

    root = tmp_path / "root"
    Store.open(root).close()
    conn = sqlite3.connect(root / "store.db")
    conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = (root / "store.db").read_bytes()
    for opener in (lambda: Store.open(root, create=False), lambda: Store.open_readonly(root)):
        with pytest.raises(MemfsError, match=f"schema version {SCHEMA_VERSION + 1}") as err:
            opener()
        assert "newer memfs" in err.value.remedy
    assert (root / "store.db").read_bytes() == before


def test_a_journal_opened_by_itself_gets_its_tables_and_columns(tmp_path: Path):
    """The journal shares the store's file but may be opened alone (a daemon-less command,
    the tests): it makes its own tables, and adds the columns an older journal lacks."""
    from memfs.store.journal import Journal

    db = tmp_path / "store.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE journal_intents (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                 "mount TEXT NOT NULL, path TEXT NOT NULL, op TEXT NOT NULL, branch TEXT, "
                 "old TEXT, new TEXT, state TEXT NOT NULL DEFAULT 'pending', "
                 "created_at REAL NOT NULL, settled_at REAL)")  # as the first release made it
    conn.commit()
    conn.close()
    j = Journal(db)
    try:
        iid = j.begin_intent("work", "a.txt", "adopt", old=None, new="1" * 32, prior=None,
                             mode=0o644)
        (got,) = j.pending_intents("work")
        assert got.id == iid and got.prior == "" and got.mode == 0o644
    finally:
        j.close()
    cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(journal_intents)")}
    assert {"prior", "mode"} <= cols


def test_a_version_2_store_reads_read_only_and_gets_patches_once_upgraded(tmp_path: Path):
    """Before patches (schema 2) the chunks table had no `over` column: a read-only open (a
    `memfs log` beside an old daemon) reads its chunks whole; the first writable open adds
    the column in place, and the next change to a chunk is kept as a patch over it."""
    from memfs.store.schema import SCHEMA_VERSION

    root = tmp_path / "root"
    store = Store.open(root)
    piece = os.urandom(300_000)
    with store.transaction() as tx:
        (old,) = tx.put_chunks([piece])
    store.close()
    conn = sqlite3.connect(root / "store.db")
    conn.execute("ALTER TABLE chunks DROP COLUMN over")  # as schema 2 made it
    conn.execute("UPDATE meta SET value='2' WHERE key='schema'")
    conn.commit()
    conn.close()
    ro = Store.open_readonly(root)
    try:
        assert ro.read_chunk(old) == piece
        assert ro.read_chunk_range(old, 1000, 10) == piece[1000:1010]
    finally:
        ro.close()
    assert _meta_schema(root) == "2"
    store = Store.open(root, create=False)
    try:
        assert _meta_schema(root) == str(SCHEMA_VERSION)
        changed = piece + b"one more line\n"
        with store.transaction() as tx:
            (new,) = tx.put_chunks([changed], [old])
        over, n = store._query("SELECT over, len FROM chunks WHERE id = ?", (new,))[0]
        assert over == old and n < 100, (over, n)
        assert store.read_chunk(new) == changed and store.read_chunk(old) == piece
    finally:
        store.close()
