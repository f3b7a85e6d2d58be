"""Scratch files a killed write leaves are swept (issue 15, item 7), through a real daemon.

A materialize writes to `.memfs-tmp-<16 hex>` beside the file and renames it over the name.
SIGKILLed after the scratch file is synced and before the rename, it leaves that file behind.
It used to survive restarts and a detach+attach (only tests called the sweep); now the first
pass of a mount in a process (the daemon's start, an attach) removes it, says so as an event,
and leaves a user's own file that merely starts with the prefix alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.killmatrix import first_pass_done, killed, start_crashing
from helpers.wait import wait_for


def scratch(disk: Path) -> list[str]:
    return sorted(n for n in os.listdir(disk) if n.startswith(".memfs-tmp-"))


def test_a_killed_writes_scratch_file_is_swept_at_start_and_at_attach(
        mount_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    (disk / ".memfs-tmp-notes").write_text("the user's own\n")
    m = start_crashing(mount_factory, monkeypatch, "effect:temp-synced")
    m.cli("attach", "work", str(disk), "--watch", "off")
    (m.work / "a.txt").write_text("a-draft\n")
    m.cli("materialize", check=False)
    killed(m)
    left = [n for n in scratch(disk) if n != ".memfs-tmp-notes"]
    assert len(left) == 1 and (disk / "a.txt").read_text() == "a1\n"

    m.start()  # the start pass sweeps it
    assert wait_for(lambda: first_pass_done(m), 10)
    assert scratch(disk) == [".memfs-tmp-notes"]
    events = m.cli_json("events")["events"]
    assert [e["paths"] for e in events if e["event"] == "scratch-removed"] == [left]
    assert m.cli_json("materialize")["mounts"]["work"]["written"] == ["a.txt"]
    assert (disk / "a.txt").read_text() == "a-draft\n"

    planted = disk / ".memfs-tmp-0123456789abcdef"  # as another kill would leave one
    planted.write_text("half\n")
    m.cli("sync")  # the daemon swept once at start, not at every pass
    assert planted.exists()
    m.cli("detach", "work")
    m.cli("attach", "work", str(disk), "--watch", "off")
    assert scratch(disk) == [".memfs-tmp-notes"]
    assert (disk / ".memfs-tmp-notes").read_text() == "the user's own\n"
