"""The embedded store needs no PostgreSQL driver: the README's main command installs memfs
without the `pg` extra, so nothing the embedded daemon or the CLI loads may import psycopg.

Found in a fresh-clone run of `scripts/demo`: the daemon imported the pins publisher, which
imported the lease module and psycopg, and exited before mounting. The test puts a `psycopg`
that refuses to import first on the daemon's and the CLI's path, then uses the mount.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.mount import REPO

pytestmark = pytest.mark.mount


@pytest.fixture
def no_psycopg(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "fake-site" / "psycopg"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("psycopg is not installed (blocked by the test)")\n')
    return {"PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"}


def test_the_embedded_daemon_and_cli_run_without_psycopg(mount_factory, no_psycopg) -> None:
    m = mount_factory(env=no_psycopg)
    m.require_real()
    (m.work / "a.txt").write_text("hello\n")
    fd = os.open(m.work / "a.txt", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    env = dict(os.environ, **no_psycopg)
    for args in (["status"], ["log", "-n", "1"], ["gc", "--dry-run"], ["du"]):
        res = subprocess.run([str(REPO / ".venv/bin/python"), "-m", "memfs", "--root",
                              str(m.root), *args], capture_output=True, text=True, env=env,
                             cwd=REPO, timeout=60)
        assert res.returncode == 0, (args, res.stderr)
    assert "history" in os.listdir(m.mnt / ".memfs")
    assert os.listdir(m.mnt / ".memfs" / "branches") == ["main"]
    m.umount()
    assert "psycopg" not in m.log_text(), m.log_text()[-2000:]
