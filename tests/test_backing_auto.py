"""`memfs attach --auto-materialize` through a real mount: drafts reach disk after each group
commit with the contract of a bare materialize (no deletions, no forcing, conflicts kept)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.backing_mount import states
from helpers.wait import wait_for

from memfs.testing import PUSH_DELAY_ENV


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except FileNotFoundError:
        return None


def _last(m) -> dict:
    return m.status()["backing"]["work"]["auto_materialize"]["last"] or {"time": 0}


def test_auto_materialize_writes_drafts_after_each_commit(mounted, tmp_path: Path):
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    (disk / "sub").mkdir(parents=True)
    (disk / "a.txt").write_text("a1\n")
    (disk / "b.txt").write_text("b1\n")
    res = m.cli_json("attach", "work", str(disk), "--auto-materialize", "--watch", "off")
    assert res["pass"]["taken"] == ["a.txt", "b.txt"]
    # A new file, nested, made through the mount reaches disk with no command.
    (m.work / "sub" / "deep").mkdir(parents=True)
    (m.work / "sub" / "deep" / "n.txt").write_text("new\n")
    assert wait_for(lambda: _read(disk / "sub" / "deep" / "n.txt") == "new\n")
    # An edit too.
    (m.work / "a.txt").write_text("a-draft\n")
    assert wait_for(lambda: _read(disk / "a.txt") == "a-draft\n")
    # A deletion is never applied by itself: it stays owed and counted.
    t0 = time.time()
    os.unlink(m.work / "b.txt")
    assert wait_for(lambda: _last(m)["time"] > t0)  # a round ran after the deletion
    assert m.status()["backing"]["work"]["owed"]["workspace_deletions"] == 1
    assert (disk / "b.txt").read_text() == "b1\n"
    # A disk edit memfs has not seen is never overwritten by a later draft: a conflict.
    (disk / "a.txt").write_text("a-disk\n")
    (m.work / "a.txt").write_text("a-draft-2\n")
    assert wait_for(lambda: _last(m)["skipped"] >= 1)
    assert (disk / "a.txt").read_text() == "a-disk\n"
    assert states(m, "work/a.txt")["work/a.txt"][0] == "conflict"
    events = m.cli_json("events")["events"]
    auto = [e for e in events if e["event"] == "materialized" and e["auto"]]
    assert {p for e in auto for p in e["written"]} == {"sub/deep/n.txt", "a.txt"}
    assert m.status()["backing"]["work"]["pinned"] == "main"


def test_without_the_flag_nothing_is_written(mounted, tmp_path: Path):
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    m.cli("attach", "work", str(disk), "--watch", "off")
    (m.work / "n.txt").write_text("new\n")
    m.cli("sync")  # a commit and a pass: nothing asks for a materialize
    time.sleep(0.5)
    assert not (disk / "n.txt").exists()
    assert m.status()["backing"]["work"]["auto_materialize"] is None


def test_a_change_made_while_a_round_runs_gets_its_own_round(mount_factory, tmp_path: Path):
    """A round covers the tree as it was when it began: a draft made while its push runs is
    written by a later round, never counted as seen."""
    m = mount_factory(env={PUSH_DELAY_ENV: "1.0"})
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    m.cli("attach", "work", str(disk), "--auto-materialize", "--watch", "off")
    (m.work / "n1.txt").write_text("first\n")
    assert wait_for(lambda: m.status()["backing"]["work"]["auto_materialize"]["running"], 15)
    (m.work / "n2.txt").write_text("made during the first round\n")  # while it pushes n1
    assert wait_for(lambda: _read(disk / "n1.txt") == "first\n", 20)
    assert wait_for(lambda: _read(disk / "n2.txt") == "made during the first round\n", 20)


def test_a_file_open_for_writing_is_written_when_closed(mounted, tmp_path: Path):
    """Close-to-open: a group commit in the middle of a long write never puts half a file on
    disk; the writer's close starts the round that writes it whole."""
    m = mounted
    m.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    m.cli("attach", "work", str(disk), "--auto-materialize", "--watch", "off")
    (m.work / "other.txt").write_text("x\n")
    assert wait_for(lambda: _read(disk / "other.txt") == "x\n")
    with open(m.work / "long.txt", "w") as f:
        f.write("first half\n")
        f.flush()
        t0 = time.time()
        assert wait_for(lambda: _last(m)["time"] > t0)  # a round ran while it is open
        (m.work / "other.txt").write_text("y\n")  # and another, for good measure
        assert wait_for(lambda: _read(disk / "other.txt") == "y\n")
        assert not (disk / "long.txt").exists()
        f.write("second half\n")
        f.flush()
        t1 = time.time()
        assert wait_for(lambda: _last(m)["time"] > t1)  # its commit's round held it back too
        assert not (disk / "long.txt").exists()
    # No commit follows the close: the close itself starts the round.
    assert wait_for(lambda: _read(disk / "long.txt") == "first half\nsecond half\n")


def test_auto_materialize_writes_a_draft_once_the_root_is_back(mounted, tmp_path: Path):
    """A draft made while the backing root is away (an unplugged drive) gets an auto round
    that finds the root unavailable. When the root comes back with nothing else changing,
    the draft must still reach disk: before the fix the round counted the tree as covered
    and nothing ran again until the next change."""
    m = mounted
    m.require_real()
    disk, away = tmp_path / "disk", tmp_path / "away"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk), "--auto-materialize", "--watch", "off")
    disk.rename(away)
    t0 = time.time()
    (m.work / "a.txt").write_text("draft while away\n")
    assert wait_for(lambda: (m.status()["backing"]["work"]["auto_materialize"]["last"] or
                          {"time": 0})["time"] > t0, 15)
    assert m.status()["backing"]["work"]["auto_materialize"]["last"]["refused"]
    away.rename(disk)
    assert wait_for(lambda: (disk / "a.txt").read_text() == "draft while away\n", 15)
