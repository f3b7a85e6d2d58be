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
