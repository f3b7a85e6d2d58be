"""host.db's reserve: on a store in PostgreSQL, this host's root (a 32 MiB tmpfs here) holds
`host.db`, whose backing journal must append; another program fills that root to its last
byte, and the journal's next write still goes through (memfs.store.space.Reserve.for_write):
the daemon gave back the reserve it keeps there, and takes it again once there is room.

Without it the append failed with SQLITE_FULL and poisoned the journal: every later sync
refused, naming `memfs sync --reopen`, until the user freed space and reopened.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.backing_mount import states
from helpers.pg import host_root
from helpers.space import fill
from test_pg_hosts import wait_for

pytestmark = pytest.mark.mount
FILES = 1500  # a pass over them writes more journal pages than the WAL holds already


def test_a_journal_write_on_a_host_root_full_to_its_last_byte_goes_through(
        small_fs: Path, mount_factory, pg_url: str, tmp_path: Path) -> None:
    disk = tmp_path / "proj"
    disk.mkdir()
    for i in range(FILES):
        (disk / f"f{i:04}.txt").write_text(f"line {i}\n")
    m = mount_factory(root=host_root(small_fs, "a", pg_url), name="small-mnt")
    m.require_real()
    m.cli("attach", "work", str(disk), "--watch", "off")
    reserve = m.root / "reserve"
    wait_for(lambda: reserve.exists() and reserve.stat().st_blocks > 0,
             "the daemon to take host.db's reserve")

    filler = fill(small_fs)  # another program takes every byte left
    for i in range(FILES):  # every file's fingerprint changes: the pass rewrites its rows
        os.utime(disk / f"f{i:04}.txt", (1_700_000_000 + i, 1_700_000_000 + i))
    out = m.cli("sync", check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "reopen" not in text, text
    assert reserve.stat().st_blocks == 0, "the reserve was not given back"
    assert "gave back the reserve" in m.log_text()
    listed = states(m)
    assert listed["work/f0000.txt"] == ("synced", None), listed

    filler.unlink()  # room again: the next journal write takes the reserve back
    (disk / "f0000.txt").write_text("changed\n")
    m.cli("sync")
    assert (m.work / "f0000.txt").read_text() == "changed\n"
    assert reserve.stat().st_blocks > 0, "the reserve was not taken again"
