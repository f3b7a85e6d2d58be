"""A PostgreSQL server restarted under a running daemon: the daemon's idle connections were
ended by the server, and a connection learns that only when it is next used. The first
request of each kind after the restart (a head move through the daemon, a read of memory
through the mount, a GC's memory prune) must go through with the server up, not fail once
with "the server is unreachable".

Its own server, as the other tests that stop one (tests/test_pg_hosts.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.mount import REPO, memfs_cmd
from helpers.pg import PgCluster, host_root
from helpers.store import store_check

pytestmark = pytest.mark.mount


def restart(cluster: PgCluster) -> None:
    """Stop the server (every backend ends; the clients are not told until they speak) and
    start it again on the same port."""
    cluster.stop()
    cluster.start()


def test_the_first_requests_after_a_server_restart_go_through(mount_factory, own_pg_cluster,
                                                               tmp_path: Path) -> None:
    cluster = own_pg_cluster  # its own server: this test restarts it
    a = mount_factory(root=host_root(tmp_path, "a", cluster.new_database()), name="a")
    memory = a.mnt / ".memfs/memory"
    (memory / "global.md").write_text("# before the restart\n")
    (a.work / "f.txt").write_bytes(b"before\n")
    a.cli("checkpoint", "create", "before")  # the writer's connection is open and used
    assert (memory / "global.md").read_text() == "# before the restart\n"
    workspaces = os.listdir(memory / "workspaces")  # so is the memory store's

    restart(cluster)
    # A head move through the daemon, on its writer connection.
    out = a.cli("checkpoint", "create", "after", check=False)
    assert out.returncode == 0, out.stderr
    # A read of memory through the mount, on the memory store's connection.
    assert os.listdir(memory / "workspaces") == workspaces
    assert (memory / "global.md").read_text() == "# before the restart\n"

    restart(cluster)
    # A GC's memory prune, on the memory store's connection as the daemon holds it.
    gc = json.loads(a.cli("gc", "--json").stdout)
    assert not gc.get("problems") and not gc["memory"]["problems"], gc
    # And a memory write through the mount.
    (memory / "global.md").write_text("# after the restart\n")
    assert (memory / "global.md").read_text() == "# after the restart\n"

    names = {c["name"] for c in json.loads(a.cli("checkpoint", "list", "--json").stdout)}
    assert {"before", "after"} <= names
    a.umount()
    store_check(a.root)


def test_du_and_a_dry_run_with_the_server_down_say_what_they_are(mount_factory, own_pg_cluster,
                                                                  tmp_path: Path) -> None:
    """`memfs du` is a dry run of the collection: with the server down it is not "garbage
    collection stopped ... run `memfs gc` again" (which would send the user to collect when
    they asked how much there is), and neither is `memfs gc --dry-run`."""
    cluster = own_pg_cluster
    a = mount_factory(root=host_root(tmp_path, "a", cluster.new_database()), name="a")
    (a.work / "f.txt").write_bytes(b"x\n")
    a.cli("du")
    cluster.stop()
    du = a.cli("du", check=False)
    assert du.returncode == 1
    assert du.stderr.startswith("memfs: memfs du stopped: the PostgreSQL store at"), du.stderr
    assert "unreachable" in du.stderr and "run `memfs du` again" in du.stderr, du.stderr
    assert "memfs gc" not in du.stderr, du.stderr
    dry = a.cli("gc", "--dry-run", check=False)
    assert dry.returncode == 1
    assert "dry run stopped" in dry.stderr and "`memfs gc --dry-run` again" in dry.stderr, \
        dry.stderr
    assert "half done" not in dry.stderr, dry.stderr
    real = a.cli("gc", check=False)  # a real run keeps its own words
    assert real.returncode == 1 and "garbage collection stopped" in real.stderr, real.stderr
    cluster.start()
    a.umount()


def test_a_command_with_the_server_down_claims_no_retry_that_is_not_running(
        mount_factory, own_pg_cluster, tmp_path: Path) -> None:
    """`memfs init` and `memfs mount` with the server down said "... memfs retries its
    commits meanwhile", where nothing runs to retry; a daemon whose commits fail says it
    does, once."""
    cluster = own_pg_cluster
    url = cluster.new_database()
    a = mount_factory(root=host_root(tmp_path, "a", url), name="a")
    (a.work / "f.txt").write_bytes(b"x\n")
    a.cli("sync")
    cluster.stop()
    (a.work / "pending.txt").write_bytes(b"waits for the server\n")
    failure = wait_for_failure(a)
    assert failure["reason"].startswith("the PostgreSQL store at") or \
        "unreachable" in failure["reason"], failure
    assert failure["remedy"].count("commits by itself") == 1, failure
    assert "retries its commits meanwhile" not in failure["remedy"], failure
    for args in (("init", "--store", url), ("mount", str(tmp_path / "mnt-c"))):
        root = tmp_path / f"root-{args[0]}"
        if args[0] == "mount":
            root = host_root(tmp_path, "c", url)
            (tmp_path / "mnt-c").mkdir()
        out = subprocess.run(memfs_cmd(root, *args), capture_output=True, text=True,
                             cwd=REPO, timeout=120)
        assert out.returncode == 1, out
        assert "unreachable" in out.stderr and "check that the server runs" in out.stderr, \
            out.stderr
        assert "retries" not in out.stderr, out.stderr
    cluster.start()
    a.umount()
    a.remount()
    assert (a.work / "pending.txt").read_bytes() == b"waits for the server\n"


def wait_for_failure(m) -> dict:
    """The daemon's commit failure, once status shows one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        failure = m.status().get("commit_failure")
        if failure:
            return failure
        time.sleep(0.1)
    raise AssertionError("no commit failure in status with the server down")
