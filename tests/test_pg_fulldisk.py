"""A PostgreSQL server whose own disk is full, through a real mount: memfs's chunks table sits
in a tablespace on a small tmpfs of a throwaway server, which a test fills. The server says
"could not extend file ...: No space left on device" (SQLSTATE 53100, DiskFull, an
OperationalError as a lost connection is); memfs must tell that apart: fsync and write fail
with ENOSPC as on a full embedded store (not EIO), status and umount name the server's disk
and the remedy, nothing acknowledged is lost, and once the server has room again the pending
commits go through by themselves.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.pg import PgCluster, pg_missing
from helpers.require import require_tool
from helpers.space import MiB, fill
from helpers.store import store_check
from test_pg_hosts import host_root, wait_for, write_synced

from memfs.store.backend import open_store

pytestmark = pytest.mark.mount

ROOM = 6 * MiB  # what the server's small disk has left when the mount starts writing


@pytest.fixture
def small_server() -> Iterator[tuple[PgCluster, Path]]:
    """A server of its own (this test fills its disk) with a tablespace `small` on a 32 MiB
    tmpfs inside the server's directory (which its unprivileged user may enter); torn down
    after the mounts (the test asks for it first)."""
    require_tool(pg_missing())
    cluster = PgCluster()
    disk = cluster.dir / "small"
    try:
        disk.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs",
                              str(disk)], capture_output=True, text=True)
        if res.returncode != 0:
            require_tool(f"cannot mount a small tmpfs (needs root): {res.stderr.strip()}")
        cluster.start()
        ts = disk / "tablespace"
        ts.mkdir(mode=0o700)
        owner = cluster.dir.stat()
        os.chown(ts, owner.st_uid, owner.st_gid)
        import psycopg

        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(f"CREATE TABLESPACE small LOCATION '{ts}'")
        yield cluster, disk
    finally:
        cluster.stop()
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        cluster.destroy()


def leave_free(fs: Path, room: int) -> Path:
    """Someone else takes all but `room` bytes of the server's disk."""
    st = os.statvfs(fs)
    path = fs / "filler"
    with open(path, "wb") as f:
        f.truncate(0)
        left = st.f_bavail * st.f_frsize - room
        while left > 0:
            n = min(left, MiB)
            f.write(b"\0" * n)
            left -= n
    return path


def test_a_full_disk_on_the_server_is_enospc_and_commits_once_it_has_room(
        small_server, mount_factory, tmp_path: Path) -> None:
    cluster, disk = small_server
    url = cluster.new_database()
    root = host_root(tmp_path, "a", url)
    open_store(root).close()  # the schema; then memfs's chunks go to the small disk
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE chunks SET TABLESPACE small")
    filler = leave_free(disk, ROOM)
    m = mount_factory(root=root, name="a")

    acked: dict[str, bytes] = {}
    for i in range(64):  # 1 MiB files, each fsynced, until the server's disk is full
        name, data = f"f{i:02}.bin", os.urandom(MiB)
        try:
            write_synced(m.work / name, data)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, f"fsync on the server's full disk: {exc!r}"
            unsure = (name, data)  # written, its fsync refused: pending, not lost
            break
        acked[name] = data
    else:
        pytest.fail("64 MiB went into a server with 6 MiB free")
    assert acked, "the first fsync failed: the server's disk was full before the test wrote"

    # New data is refused at write(), as on a full embedded store.
    with pytest.raises(OSError) as refused:
        (m.work / "more").write_bytes(b"x" * 10000)
    assert refused.value.errno == errno.ENOSPC, repr(refused.value)
    failure = m.status()["commit_failure"]
    assert failure["errno"] == errno.ENOSPC, failure
    server = f"127.0.0.1:{cluster.port}"
    assert failure["reason"].startswith(
        f"the PostgreSQL server at {server} has no room left on its disk: "), failure
    assert "No space left on device" in failure["reason"], failure  # the server's words
    assert failure["remedy"].startswith("free space on the server's disk"), failure
    assert "commits by itself once it is possible" in failure["remedy"], failure
    assert "check that the server runs" not in failure["remedy"], failure
    assert "memfs gc" not in failure["remedy"], failure  # no GC on a shared store
    text = m.cli("status").stdout
    assert "FAILING" in text and "has no room left on its disk" in text, text
    res = m.cli("umount", str(m.mnt), check=False)
    assert res.returncode != 0 and "stays mounted" in res.stderr, res.stderr
    assert "no room left on its disk" in res.stderr and "free space on the server's disk" in \
        res.stderr, res.stderr
    assert m.proc.poll() is None
    assert (m.work / unsure[0]).read_bytes() == unsure[1]
    logged = [ln for ln in m.log.read_text().splitlines()
              if "group commit failed" in ln]
    assert logged and all(ln.count("no room left on its disk") == 1 and
                          ln.count("free space on the server's disk") == 1 for ln in logged), \
        logged  # the server's words and the remedy once each, not repeated

    # The server has room again: the pending commit goes through without a restart.
    filler.unlink()
    wait_for(lambda: m.status()["commit_failure"] is None, "the pending commit to land",
             timeout=30)
    write_synced(m.work / "more", b"x" * 10000)
    assert m.status()["pending"] == 0
    m.umount()
    store_check(root)
    m.remount()
    for name, data in {**acked, unsure[0]: unsure[1]}.items():
        assert (m.work / name).read_bytes() == data, name
    assert (m.work / "more").read_bytes() == b"x" * 10000
    m.umount()


def test_a_memory_record_on_the_servers_full_disk_fails_its_close_with_enospc(
        small_server, mount_factory, tmp_path: Path) -> None:
    """Memory generations are rows too: a record written through `.memfs/memory/` while the
    server's disk is full fails at close with ENOSPC (it was EIO: psycopg's error unmapped),
    changes nothing, and is taken once the server has room."""
    cluster, disk = small_server
    url = cluster.new_database()
    root = host_root(tmp_path, "a", url)
    m = mount_factory(root=root, name="a")
    (m.work / "x").write_text("so the workspace exists\n")
    rec = m.mnt / ".memfs/memory/workspaces/work/editor.md"
    rec.write_text("# Editor\nfirst\n")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE memory_generations SET TABLESPACE small")
    filler = fill(disk)
    big = "# Editor\n" + os.urandom(30 << 10).hex() + "\n"  # under the 64 KiB cap
    with pytest.raises(OSError) as refused:
        rec.write_text(big)
    assert refused.value.errno == errno.ENOSPC, repr(refused.value)
    assert rec.read_text() == "# Editor\nfirst\n"
    filler.unlink()
    rec.write_text(big)
    m.umount()
    m.remount()
    assert (m.mnt / ".memfs/memory/workspaces/work/editor.md").read_text() == big
    m.umount()
