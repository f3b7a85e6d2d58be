"""A group commit's round trips to the PostgreSQL server, counted in libpq's own trace of the
writer connection (memfs.store.pg.tx: the transaction is pipelined from its first put)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
from helpers import gcstore
from psycopg import pq

from memfs.store.backend import Location, open_store, record_location
from memfs.store.pg.lease import Fenced, Leases
from memfs.store.pg.store import PgStore
from memfs.store.trees import DIR, FILE, encode_dir
from memfs.workspace.workspace import Workspace


def pg_root(tmp_path: Path, name: str, url: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    record_location(root, Location("postgresql", url, f"host-{name}"))
    return root


class Trace:
    """libpq's trace of the store's writer connection while the block runs.

    A round trip is a wait for the server: in the trace, a run of server messages ("B")
    after client messages ("F"). A small commit's answers are a few bytes each, which the
    server holds until asked (Flush, Sync), so the count does not depend on timing."""

    def __init__(self, store: PgStore, path: Path) -> None:
        self.conn = store._writer.get()
        self.path = path

    def __enter__(self) -> Trace:
        self.file = open(self.path, "w")
        self.conn.pgconn.trace(self.file.fileno())
        self.conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.conn.pgconn.untrace()
        self.file.close()
        lines = self.path.read_text().splitlines()
        self.statements = [line for line in lines if "\tParse\t" in line or "\tBind\t" in line]
        sides = [line[0] for line in lines if line[:1] in ("F", "B")]
        self.round_trips = sum(1 for a, b in zip(sides[:-1], sides[1:], strict=True)
                               if (a, b) == ("F", "B"))


def test_a_small_group_commit_is_four_round_trips_and_three_without_new_data(
        tmp_path: Path, pg_url: str) -> None:
    ws = Workspace(open_store(pg_root(tmp_path, "a", pg_url)), commit_interval=10)
    store = ws.store
    assert isinstance(store, PgStore)
    counted: dict[str, Trace] = {}

    async def main() -> None:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        ws.write(ws.create(work, b"first", FILE, 0o644, 0, 0), 0, b"warm up")
        await ws.commit()
        with Trace(store, tmp_path / "write.trace") as t:
            ws.write(ws.create(work, b"f", FILE, 0o644, 0, 0), 0, os.urandom(4096))
            await ws.commit()
        counted["write"] = t
        with Trace(store, tmp_path / "mkdir.trace") as t:
            ws.create(work, b"d", DIR, 0o755, 0, 0)
            await ws.commit()
        counted["mkdir"] = t

    try:
        trio.run(main)
        # BEGIN with GC's sweep lock (shared) and epoch, which decide what the cache may
        # skip; the chunk (is it new?); the objects, the head locked, the lease, the sequence
        # number; the commit rows and COMMIT. It was 12 before pipelining (13 with the lock).
        write, mkdir = counted["write"], counted["mkdir"]
        assert write.round_trips == 4, write.path.read_text()
        assert mkdir.round_trips == 3, mkdir.path.read_text()  # no chunk to ask about
        assert any("COMMIT" in s for s in write.statements)
        assert store.head("main") == ws.head
    finally:
        store.close()


def test_a_transaction_after_a_pipelined_commit_is_still_one_transaction(
        tmp_path: Path, pg_url: str) -> None:
    """The commit path sends its own BEGIN in autocommit (psycopg's would be a round trip
    of its own); a transaction after it, refused or failed, must still leave nothing."""
    a = open_store(pg_root(tmp_path, "a", pg_url))
    b = open_store(pg_root(tmp_path, "b", pg_url))
    try:
        a.leases.close()
        a.leases = Leases(pg_url, a.host, ttl=1.0)  # a short lease, renewed by nobody
        a.leases._start = lambda: None
        assert a.claim("main").writable
        with a.transaction() as tx:
            tree = tx.put_object(encode_dir([]))
            first = tx.add_commit(a.head("main"), tree, "main", "pipelined", []).id
        with pytest.raises(RuntimeError), a.transaction() as tx:
            tx.conn.execute("INSERT INTO branches VALUES ('half', %s)", (first,))
            raise RuntimeError("the step fails after a write")
        assert "half" not in a.branches()
        deadline = time.monotonic() + 10
        while b.lease_state("main").expires_in > 0:  # a's lease runs out, unrenewed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert b.takeover("main").writable
        with pytest.raises(Fenced), a.transaction() as tx:  # refused in the pipeline
            tree = tx.put_object(encode_dir([]))
            tx.add_commit(first, tree, "main", "stale", [])
        with pytest.raises(RuntimeError), a.transaction() as tx:
            tx.conn.execute("INSERT INTO branches VALUES ('half', %s)", (first,))
            raise RuntimeError("the step fails after a write")
        assert "half" not in a.branches() and a.head("main") == first
        a.create_branch("mine", first)  # the writer connection still works
        assert a.branches()["mine"] == first
    finally:
        a.close()
        b.close()


def patch_rows(store: PgStore) -> list[tuple[int, int]]:
    """(how many rows each patch is read through, its stored bytes), oldest first."""
    return [(len(r[0].split()), r[1]) for r in store._query(
        "SELECT over, octet_length(data) FROM chunks WHERE over IS NOT NULL "
        "ORDER BY cardinality(string_to_array(over, ' '))")]


def test_a_small_change_to_a_big_file_is_a_patch_in_as_many_round_trips(
        tmp_path: Path, pg_url: str) -> None:
    """A line appended to a 512 KiB log per commit is stored as a patch over the chunk it
    replaces (memfs.store.delta) in the same four round trips as any small commit: what
    that chunk is read through, and its bytes, are this host's (its cache). After a
    restart (a new store object, the cache kept) the first one looks the replaced row up,
    one round trip more, once."""
    root = pg_root(tmp_path, "a", pg_url)
    ws = Workspace(open_store(root), commit_interval=10)
    store = ws.store
    assert isinstance(store, PgStore)
    body = bytearray(os.urandom(512 << 10))
    traces: list[Trace] = []

    async def appends(ws: Workspace, n: int, name: str) -> None:
        log = ws.children(ws.children(ws.root)[b"work"])[b"log"]
        for i in range(n):
            line = b"%s %d %s\n" % (name.encode(), i, os.urandom(30).hex().encode())
            ws.write(log, log.size(), line)
            body.extend(line)
            with Trace(ws.store, tmp_path / f"{name}{i}.trace") as t:
                await ws.commit()
            traces.append(t)

    async def first() -> None:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        ws.write(ws.create(work, b"log", FILE, 0o644, 0, 0), 0, bytes(body))
        await ws.commit()
        await appends(ws, 3, "append")

    try:
        trio.run(first)
        assert [t.round_trips for t in traces] == [4, 4, 4], traces[-1].path.read_text()
        rows = patch_rows(store)
        assert [n for n, _ in rows] == [1, 2, 3], rows  # over the base, then through each
        assert all(size < 200 for _, size in rows), rows  # the line, not the 512 KiB
    finally:
        store.close()
    ws = Workspace(open_store(root), commit_interval=10)
    store = ws.store
    traces.clear()
    try:
        trio.run(appends, ws, 2, "restarted")
        assert [t.round_trips for t in traces] == [5, 4], traces[0].path.read_text()
        assert [n for n, _ in patch_rows(store)] == [1, 2, 3, 4, 5]
        store.cache.close()
        for copy in store.cache.dir.iterdir():  # the database alone: read through the rows
            copy.unlink()
        store.cache = type(store.cache)(root)
        assert gcstore.files_at(store, store.head()) == {"work/log": bytes(body)}
        assert store.fsck() == []
    finally:
        store.close()
