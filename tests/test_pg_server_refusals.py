"""A PostgreSQL server that refuses a new connection for its connection limit: memfs says so,
with the remedy that fits (raise the limit, or pool), not "check that the server runs". The
throwaway server's role `limited` may hold one connection (CONNECTION LIMIT 1); the test
holds it. psycopg gives a refused connection no SQLSTATE, only the server's words, so this
is told by the server's English text (a translated server gets the general remedy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from helpers.mount import REPO
from helpers.pg import host_root


def test_a_connection_limit_is_named_with_its_remedy(pg_cluster, tmp_path: Path) -> None:
    url = pg_cluster.new_database()
    db = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        admin.execute("CREATE ROLE limited LOGIN")
        admin.execute(f'ALTER DATABASE "{db}" OWNER TO limited')
    limited = url.replace(url.split("//", 1)[1].split("@", 1)[0] + "@", "limited@", 1)
    root = host_root(tmp_path, "a", limited)

    def memfs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args],
                              capture_output=True, text=True, cwd=REPO, timeout=120,
                              env=dict(os.environ, MEMFS_LEASE_SECONDS="2"))

    assert memfs("init").returncode == 0
    with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
        admin.execute("ALTER ROLE limited CONNECTION LIMIT 1")
    try:
        with psycopg.connect(limited) as held:  # the role's one connection, taken
            out = memfs("log")
            assert held.execute("SELECT 1").fetchone() == (1,)
    finally:
        with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
            admin.execute("ALTER ROLE limited CONNECTION LIMIT -1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "refuses new connections" in out.stderr, out.stderr
    assert "max_connections" in out.stderr and "PgBouncer" in out.stderr, out.stderr
    assert "check that the server runs" not in out.stderr, out.stderr
    assert memfs("log").returncode == 0  # the limit gone, the same command works


# What PostgreSQL says when an allocation fails (SQLSTATE 53200), raised by a trigger the test
# puts on the policy's table, so the server answers `memfs config` with it.
OUT_OF_MEMORY = """
CREATE FUNCTION test_out_of_memory() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'out of memory' USING ERRCODE = 'out_of_memory',
        DETAIL = 'Failed on request of size 8192 in memory context "ExecutorState".';
END $$;
CREATE TRIGGER test_out_of_memory BEFORE INSERT OR UPDATE ON memfs_meta
    FOR EACH ROW EXECUTE FUNCTION test_out_of_memory();
"""


def test_a_server_out_of_memory_is_named_with_its_remedy(pg_cluster, tmp_path: Path) -> None:
    """The server answers a write with out_of_memory (SQLSTATE 53200): memfs says the server
    is out of memory and points at its memory settings, not "check that the server runs"
    (it runs: it answered)."""
    url = pg_cluster.new_database()
    root = host_root(tmp_path, "a", url)

    def memfs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args],
                              capture_output=True, text=True, cwd=REPO, timeout=120)

    assert memfs("init").returncode == 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OUT_OF_MEMORY)
    out = memfs("config", "keep-all", "2d")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "is out of memory: out of memory" in out.stderr, out.stderr
    assert "work_mem" in out.stderr and "memory settings" in out.stderr, out.stderr
    assert "check that the server runs" not in out.stderr, out.stderr
    assert "unreachable" not in out.stderr, out.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER test_out_of_memory ON memfs_meta")
    assert memfs("config", "keep-all", "2d").returncode == 0  # memory back: the same works
    assert "2d" in memfs("config", "keep-all").stdout
