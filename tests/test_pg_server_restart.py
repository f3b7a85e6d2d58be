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
from pathlib import Path

import pytest
from helpers.pg import PgCluster, host_root, pg_missing
from helpers.require import require_tool
from helpers.store import store_check

pytestmark = pytest.mark.mount


def restart(cluster: PgCluster) -> None:
    """Stop the server (every backend ends; the clients are not told until they speak) and
    start it again on the same port."""
    cluster.stop()
    cluster.start()


def test_the_first_requests_after_a_server_restart_go_through(mount_factory,
                                                               tmp_path: Path) -> None:
    require_tool(pg_missing())
    cluster = PgCluster()  # its own server: this test restarts it
    try:
        cluster.start()
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
    finally:
        cluster.destroy()
