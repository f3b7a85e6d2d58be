"""Review: .memfs/history/by-time/<day>/ on a store in PostgreSQL follows new commits.

history_view.Facts returns a remembered value as is on a remote store, trusting the
directory's prepare to have renewed it; `_commit_names` (and `_day_names`) keep a memo of
their own, derived from the renewed one, that no prepare renews: so the listing a host made
first is the listing it shows for ever (a new commit is missing, a dropped one stays).
"""

from __future__ import annotations

import os
from datetime import datetime

import pytest
from test_pg_hosts import hosts, read, wait_for, write_synced  # noqa: F401

pytestmark = pytest.mark.mount


def _listed(day_dir) -> list[str]:
    return sorted(os.listdir(day_dir))


def test_a_day_listing_shows_a_commit_made_after_the_first_listing(hosts) -> None:  # noqa: F811
    a, b = hosts
    write_synced(a.work / "one.txt", b"1\n")
    wait_for(lambda: read(b.work / "one.txt") == b"1\n", "host b to see a's file")
    first = a.cli_json("log", "-n", "1")[0]["id"]
    day = datetime.now().strftime("%Y-%m-%d")  # local time, as by-time names its days
    day_dir = b.mnt / ".memfs" / "history" / "by-time" / day
    wait_for(lambda: any(first[:8] in n for n in _listed(day_dir)), "b to list a's commit")
    write_synced(a.work / "two.txt", b"2\n")
    wait_for(lambda: read(b.work / "two.txt") == b"2\n", "host b to see a's second file")
    second = a.cli_json("log", "-n", "1")[0]["id"]
    assert second != first
    # b has seen the commit (its file shows), so its data_version moved.
    wait_for(lambda: any(second[:8] in n for n in _listed(day_dir)),
             f"b's listing of {day} to show the commit made after its first listing "
             f"(it shows {_listed(day_dir)})", timeout=15)


def test_a_locked_server_holds_only_the_status_file_that_asked(hosts, pg_url: str) -> None:  # noqa: F811
    """`cat .memfs/status` on a store in PostgreSQL reads the retention policy
    (memfs.workspace.status.retention -> PgStore.policy: memfs_meta) on the FUSE loop: while another
    session holds memfs_meta locked, every request of the mount waits with it."""
    import subprocess

    import psycopg
    from test_pg_hosts import _waiting_on

    a, b = hosts
    write_synced(a.work / "hot.txt", b"read on b first\n")
    wait_for(lambda: read(b.work / "hot.txt") == b"read on b first\n", "host b to see a's file")
    with psycopg.connect(pg_url) as locker:
        locker.execute("LOCK TABLE memfs_meta IN ACCESS EXCLUSIVE MODE")
        slow = subprocess.Popen(["cat", str(b.mnt / ".memfs" / "status")],
                                stdout=subprocess.PIPE)
        try:
            wait_for(_waiting_on(pg_url, "memfs_meta"), "b's read of memfs_meta to wait")
            cat = subprocess.run(["cat", str(b.work / "hot.txt")], capture_output=True,
                                 timeout=20)
            assert cat.stdout == b"read on b first\n", cat
        finally:
            locker.rollback()
            slow.communicate(timeout=60)
