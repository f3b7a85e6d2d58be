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
