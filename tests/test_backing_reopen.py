"""The journal's failed append through a real daemon, and its reopen without a restart.

Seed 002 (aa771bf): after an I/O error inside a journal write, deciding from the journal's
view could record a conflict from evidence the failed write made stale; so every evidence read
refuses, naming the reopen, until the journal is reopened. Here the failure is injected into
the daemon's journal with the MEMFS_TEST_JOURNAL_FAULT hook (memfs/store/journal.py): the next
write commits, then fails as SQLite does when the WAL's fsync fails after its frames were
written, so the record is in the file while the writer was told it failed. That SQLite's own
view can then lack the record is shown under libfiu in test_reconcile_journal.py; this test
shows what the daemon does with the refusal, and that `memfs sync --reopen` ends it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.backing_mount import ACCESS, sh, states, xattr

from memfs.testing import JOURNAL_FAULT_ENV as FAULT_ENV


def refusal(m, *args: str) -> dict:
    """A command that must answer with the journal's refusal: exit 1, the error as JSON."""
    res = m.cli(*args, "--json", check=False)
    assert res.returncode == 1, f"memfs {' '.join(args)} did not refuse: {res.stdout}"
    return json.loads(res.stdout)


def test_failed_append_refuses_until_sync_reopen(mount_factory, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    trigger = tmp_path / "fail-the-next-journal-write"
    monkeypatch.setenv(FAULT_ENV, str(trigger))
    m = mount_factory()
    m.require_real()
    daemon = m.proc
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("A\n")
    m.cli("attach", "work", str(disk))
    # A branch holding the draft C, made while disk and evidence say A.
    m.cli("branch", "create", "draft")
    m.cli("branch", "switch", "draft")
    sh(f"echo C > {m.work}/a.txt")
    m.cli("branch", "switch", "main")
    # On main the same edit on both sides: the next pass records P := B, an agreement, as its
    # first journal write. That write fails.
    sh(f"echo B > {m.work}/a.txt && echo B > {disk}/a.txt")
    trigger.touch()
    err = refusal(m, "sync")
    assert not trigger.exists()  # the one injected failure fired, on this pass's write
    assert "disk I/O error" in err["error"] and "memfs sync --reopen" in err["remedy"]

    # While it refuses: status says so once per mount with the remedy, and reads no evidence.
    head = m.cli_json("status")["head"]
    st = m.cli_json("status")["backing"]["work"]
    assert "disk I/O error" in st["journal"]["error"]
    assert "memfs sync --reopen" in st["journal"]["remedy"]
    assert st["owed"] is None
    assert "journal  REFUSING" in m.cli("status").stdout
    assert m.status()["backing"]["work"]["journal"] is not None  # .memfs/status too
    # Every command that needs evidence answers with the refusal, though the fault is spent;
    # a listing of a path neither side has writes nothing, so there the read itself refuses.
    for args in (("ls", "--states"), ("ls", "--states", "work/nothing-here"), ("sync",),
                 ("materialize",)):
        assert "memfs sync --reopen" in refusal(m, *args)["remedy"]
    time.sleep(ACCESS)  # past the on-access window: the open below tries to observe, and fails
    assert sh(f"cat {m.work}/a.txt") == "B\n"  # the workspace's files stay readable
    assert m.cli_json("status")["head"] == head  # nothing committed: no take, no intent
    # The seed's case: the branch holding the draft C, disk B, the evidence not to be trusted.
    # Deciding here could record a conflict; nothing is decided.
    m.cli("branch", "switch", "draft")
    assert sh(f"cat {m.work}/a.txt") == "C\n"
    assert xattr(m.work / "a.txt") == "unverified"
    assert "memfs sync --reopen" in refusal(m, "ls", "--states", "work")["remedy"]
    assert (disk / "a.txt").read_text() == "B\n"

    # The reopen, in the same daemon.
    res = m.cli_json("sync", "--reopen")
    assert "disk I/O error" in res["reopened"]["was_refusing"]
    assert res["mounts"]["work"]["conflicts"] == []
    assert m.proc is daemon and daemon.poll() is None  # no restart
    # The failed write had reached the file: P = B, so C is a draft, not both-changed.
    assert states(m) == {"work/a.txt": ("workspace-draft", None)}
    st = m.cli_json("status")["backing"]["work"]
    assert st["journal"] is None and st["conflicts"] == []
    assert st["owed"] == {"changes": 1, "workspace_deletions": 0, "conflicts": 0}
    assert xattr(m.work / "a.txt") == "workspace-draft"
    assert sh(f"cat {m.work}/a.txt") == "C\n" and (disk / "a.txt").read_text() == "B\n"
    m.cli("branch", "switch", "main")
    assert states(m) == {"work/a.txt": ("synced", None)}
    assert "reopened" not in m.cli_json("sync")  # a plain sync reopens nothing
    events = [e["event"] for e in m.cli_json("events")["events"]]
    assert "journal-reopened" in events and "conflict-recorded" not in events
