"""The retention policy: what it keeps at its boundaries, how it is stored, set and shown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.mount import REPO, memfs_cmd

from memfs.store import Store
from memfs.store.retention import (
    DAY,
    HOUR,
    CommitInfo,
    Policy,
    PolicyError,
    Refs,
    kept,
    parse_duration,
)

NOW = 1_800_000_000 * 10**9
S = 10**9
NO_REFS = Refs({}, {}, [])


def commit(n: int, age_s: float, branch: str = "main") -> CommitInfo:
    return CommitInfo(f"c{n}", n, f"c{n - 1}" if n > 1 else None, branch,
                      int(NOW - age_s * S))


def test_every_commit_inside_the_window_and_none_just_outside() -> None:
    policy = Policy(keep_all=DAY, hourly=0, daily=0, reflog=0)
    inside, outside = commit(2, DAY - 1), commit(1, DAY + 1)
    assert kept([outside, inside], NO_REFS, policy, NOW) == {"c2": "recent"}


def test_one_commit_an_hour_then_one_a_day_newest_of_each() -> None:
    policy = Policy(keep_all=HOUR, hourly=2 * DAY, daily=10 * DAY, reflog=0)
    base = (NOW // (HOUR * S)) * HOUR * S  # the start of the current hour
    hour_ago = [CommitInfo(f"h{i}", i, None, "main", int(base - 2 * HOUR * S + i * 60 * S))
                for i in range(1, 4)]  # three commits in one hour, two hours back
    days_ago = [CommitInfo(f"d{i}", 10 + i, None, "main",
                           int(base - 5 * DAY * S + i * 60 * S)) for i in range(3)]
    other_branch = CommitInfo("b1", 20, None, "try", int(base - 2 * HOUR * S + 30 * S))
    too_old = CommitInfo("old", 30, None, "main", int(NOW - 11 * DAY * S))
    got = kept([*hour_ago, *days_ago, other_branch, too_old], NO_REFS, policy, NOW)
    assert got.get("h3") == "hourly" and "h1" not in got and "h2" not in got
    assert got.get("d2") == "daily" and "d0" not in got and "d1" not in got
    assert got.get("b1") == "hourly", "each branch keeps its own hour"
    assert "old" not in got


def test_refs_keep_commits_of_any_age_and_the_reflog_only_within_its_window() -> None:
    policy = Policy(keep_all=0, hourly=0, daily=0, reflog=DAY)
    old = [commit(i, 100 * DAY) for i in range(1, 7)]
    refs = Refs({"main": "c6"}, {"before-refactor": "c1"},
                [("c2", "c3", NOW - int((DAY - 5) * S)), ("c4", "c5", NOW - int((DAY + 5) * S))])
    got = kept(old, refs, policy, NOW)
    assert got == {"c6": "branch head main", "c1": "checkpoint before-refactor",
                   "c2": "reflog", "c3": "reflog"}


def test_durations_and_settings_refuse_nonsense() -> None:
    assert parse_duration("90m") == 5400 and parse_duration("2w") == 14 * DAY
    assert parse_duration("forever") == float("inf") and parse_duration("0") == 0
    for bad in ("", "7", "7y", "-1d", "1.d"):
        with pytest.raises(PolicyError):
            parse_duration(bad)
    p = Policy()
    assert p.with_setting("space-floor", "10%").space_floor == 10
    with pytest.raises(PolicyError):
        p.with_setting("space-floor", "80%")
    with pytest.raises(PolicyError):
        p.with_setting("gc-auto", "maybe")
    with pytest.raises(PolicyError):
        p.with_setting("keep-forever", "1d")


def test_policy_is_kept_with_the_store(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "root")
    assert store.policy() == Policy()
    store.set_policy(Policy().with_setting("keep-daily", "forever"))
    store.close()
    store = Store.open(tmp_path / "root")
    assert store.policy().daily == float("inf")
    store.close()


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(memfs_cmd(root, *args), capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def test_init_flags_config_and_status(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bad = run(root, "init", "--keep-all", "1y")
    assert bad.returncode == 1 and "not a duration" in bad.stderr
    assert not root.exists(), "a refused init created the store"
    assert run(root, "init", "--keep-all", "2d", "--gc-auto", "off").returncode == 0
    doc = json.loads(run(root, "config", "--json").stdout)
    assert doc["keep-all"] == "2d" and doc["gc-auto"] == "off" and doc["keep-daily"] == "30d"
    assert run(root, "config", "keep-hourly", "3d").returncode == 0
    assert run(root, "config", "keep-hourly").stdout.strip() == "3d"
    refused = run(root, "config", "keep-hourly", "soon")
    assert refused.returncode == 1 and "unit" in refused.stderr
    assert run(root, "config", "keep-hourly").stdout.strip() == "3d", "a refusal changed it"
    status = run(root, "status").stdout
    assert "history  every commit for 2d, one an hour to 3d" in status, status


def test_a_config_change_says_what_it_was_and_means(tmp_path: Path) -> None:
    """From a user trial: `memfs config keep-all 0` was taken without a word, and the next
    collection thinned the day's history. A change says the old value, the new policy in
    words, and how to see what the next collection would drop."""
    root = tmp_path / "root"
    assert run(root, "init").returncode == 0
    said = run(root, "config", "keep-all", "0")
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    assert lines[0] == "keep-all: 1d -> 0", said.stdout
    assert lines[1].startswith("one an hour to 1w, one a day to 30d; reflog"), said.stdout
    for key in ("keep-hourly", "keep-daily"):
        assert run(root, "config", key, "0").returncode == 0
    said = run(root, "config", "keep-reflog", "1d")
    assert said.stdout.splitlines()[1].startswith("no history by age; reflog 1d"), said.stdout
    assert "memfs gc --dry-run" in said.stdout, said.stdout
    doc = json.loads(run(root, "config", "keep-all", "1d", "--json").stdout)
    assert doc == {"keep-all": "1d", "was": "0"}, doc
