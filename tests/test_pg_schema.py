"""The PostgreSQL store's schema version: a new store is made at today's version, an older
one is migrated in place when a writer opens it, a newer one is refused unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from memfs.errors import MemfsError
from memfs.store.backend import Location, open_store, open_store_readonly, record_location
from memfs.store.chunks import chunk_digest
from memfs.store.pg import schema


def pg_root(tmp_path: Path, url: str) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    record_location(root, Location("postgresql", url, "host-a"))
    return root


def storage(url: str) -> str:
    """How the chunks' bytes are stored: 'x' compressed if it pays (PostgreSQL's default for
    bytea), 'e' as they come."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT attstorage FROM pg_attribute WHERE attrelid = "
                            "'chunks'::regclass AND attname = 'data'").fetchone()[0]


def object_compression(url: str, oid: str) -> tuple[str, str | None]:
    """The objects column's compression method ('l': lz4, '': the server's default, pglz)
    and how one row is stored ('lz4', 'pglz', or None: as it came)."""
    with psycopg.connect(url) as conn:
        column = conn.execute("SELECT attcompression FROM pg_attribute WHERE attrelid = "
                              "'objects'::regclass AND attname = 'data'").fetchone()[0]
        row = conn.execute("SELECT pg_column_compression(data) FROM objects WHERE id = %s",
                           (oid,)).fetchone()[0]
    return column, row


def server_has_lz4(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = "
                            "'default_toast_compression'").fetchone()[0]


def recorded(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT value FROM memfs_meta WHERE key = 'schema'").fetchone()[0]


def compressible() -> bytes:
    return b"memfs " * (200_000)


def stored_size(url: str, cid: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_column_size(data) FROM chunks WHERE id = %s",
                            (cid,)).fetchone()[0]


def test_a_new_store_keeps_chunk_bytes_as_they_come(tmp_path: Path, pg_url: str) -> None:
    store = open_store(pg_root(tmp_path, pg_url))
    try:
        data = compressible()
        with store.transaction() as tx:
            (cid,) = tx.put_chunks([data])
    finally:
        store.close()
    assert recorded(pg_url) == str(schema.SCHEMA_VERSION)
    assert storage(pg_url) == "e"
    assert stored_size(pg_url, cid) >= len(data)  # never handed to pglz


def test_a_version_1_store_is_migrated_when_a_writer_opens_it(tmp_path: Path,
                                                              pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:  # the first release's tables and version row
        conn.execute(schema.BASE)
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', '1')")
        conn.execute("INSERT INTO chunks VALUES ('old', %s)", (compressible(),))
    assert storage(pg_url) == "x" and stored_size(pg_url, "old") < len(compressible())
    store = open_store(pg_root(tmp_path, pg_url))
    try:
        assert recorded(pg_url) == str(schema.SCHEMA_VERSION)
        assert storage(pg_url) == "e"
        with store.transaction() as tx:
            (cid,) = tx.put_chunks([compressible() + b"!"])
        assert stored_size(pg_url, cid) > len(compressible())
        assert store._db_chunk(cid) == compressible() + b"!"
        with psycopg.connect(pg_url) as conn:  # the row stored compressed reads as before
            assert bytes(conn.execute("SELECT data FROM chunks WHERE id = 'old'"
                                      ).fetchone()[0]) == compressible()
    finally:
        store.close()


def test_a_store_of_a_newer_memfs_is_refused_unchanged(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute(schema.BASE)
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', '99')")
    with pytest.raises(MemfsError, match="schema version 99; this memfs knows versions up to "
                       f"{schema.SCHEMA_VERSION}") as err:
        open_store(pg_root(tmp_path, pg_url))
    assert "newer memfs" in str(err.value.remedy)
    with pytest.raises(MemfsError, match="schema version 99"):
        open_store_readonly(tmp_path / "root")
    assert recorded(pg_url) == "99" and storage(pg_url) == "x"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM branches").fetchone()[0] == 0


def has_over(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_name = "
                            "'chunks' AND column_name = 'over'").fetchone() is not None


def test_a_version_5_store_gains_patches_in_place(tmp_path: Path, pg_url: str) -> None:
    """Version 6 adds `chunks.over` (patches, memfs.store.delta). A store from before reads
    read-only as it is (not migrated: its rows are whole); a writer migrates it in place,
    its rows read as before, and a piece replacing one of them may be kept as a patch."""
    data = os.urandom(256 << 10)
    cid = chunk_digest(data)
    with psycopg.connect(pg_url) as conn:
        for n in range(1, 6):
            conn.execute(schema.MIGRATIONS[n])
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', '5')")
        conn.execute("INSERT INTO chunks VALUES (%s, %s)", (cid, data))
    root = pg_root(tmp_path, pg_url)
    ro = open_store_readonly(root)
    try:
        assert ro.read_chunk(cid) == data
    finally:
        ro.close()
    assert recorded(pg_url) == "5" and not has_over(pg_url), "a read-only open migrated"
    store = open_store(root)
    try:
        assert recorded(pg_url) == str(schema.SCHEMA_VERSION) and has_over(pg_url)
        assert store._db_chunk(cid) == data
        assert store.read_chunk(cid) == data  # now in this host's cache: a patch's "before"
        changed = data[:1000] + b"changed" + data[1007:]
        with store.transaction() as tx:
            (new,) = tx.put_chunks([changed], [cid])
        assert store._query("SELECT over, octet_length(data) < 100 FROM chunks WHERE id = %s",
                            (new,)) == [(cid, True)]
        assert store._db_chunk(new) == changed
    finally:
        store.close()


def test_objects_are_compressed_with_lz4_and_older_rows_read_as_before(
        tmp_path: Path, pg_url: str) -> None:
    """Version 7: a store of version 5 (objects left to pglz) migrated; its pglz row reads the
    same, a new object is stored lz4 (pglz was most of the server's time in a git commit)."""
    assert server_has_lz4(pg_url), "the test server (Debian's 15) is built with lz4"
    with psycopg.connect(pg_url) as conn:
        for n in range(1, 6):
            conn.execute(schema.MIGRATIONS[n])
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', '5')")
        conn.execute("INSERT INTO objects VALUES ('old', %s)", (compressible(),))
    assert object_compression(pg_url, "old") == ("", "pglz")
    store = open_store(pg_root(tmp_path, pg_url))
    try:
        assert recorded(pg_url) == str(schema.SCHEMA_VERSION)
        with store.transaction() as tx:
            oid = tx.put_object(compressible() + b"!")
        assert object_compression(pg_url, oid) == ("l", "lz4")
        assert object_compression(pg_url, "old") == ("l", "pglz")
        with psycopg.connect(pg_url) as conn:
            assert bytes(conn.execute("SELECT data FROM objects WHERE id = 'old'"
                                      ).fetchone()[0]) == compressible()
        assert store.read_object(oid) == compressible() + b"!"
    finally:
        store.close()
