"""Found as a new user would (issue 15, item 9), through a real mount and a real directory.

- `memfs checkpoint before-wipe`, an edit in the mount, `rm -rf ~/project/*`, `memfs restore
  before-wipe`: the restored files used to be taken as deleted by the next pass at once (the
  restored copy equals what disk last agreed with, so "only disk changed"), silently. Now a
  restore takes disk's changes in first, against the tree they happened to, and a file an
  undo or restore changes is the workspace's side: the files come back, owed to disk, and the
  edited one is a conflict with the deletion (never taken over it).
- A disk change taken into the tree is an `adopted` event (deletions used to make none).
- An unavailable root printed a Python dict on `memfs status`, with an accept-root remedy
  when the root was simply missing, and stayed UNAVAILABLE after it came back until an access
  ran a pass.
- Conflict copies (the only copy of disk's side once it is replaced) were written without
  fsync.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from helpers.backing_mount import sh, states
from helpers.require import require_tool, strace_missing
from helpers.wait import wait_for


def test_restore_after_wiping_disk_brings_the_files_back(backed):  # noqa: F811
    m, disk = backed
    m.cli("checkpoint", "before-wipe")
    (m.work / "a.txt").write_text("a-edit\n")
    sh(f"rm -rf {disk}/*")
    m.cli("restore", "before-wipe")
    assert (m.work / "a.txt").read_text() == "a1\n"
    assert (m.work / "b.txt").read_text() == "b1\n"
    assert (m.work / "sub" / "c.txt").read_text() == "c1\n"
    listed = states(m)
    assert listed["work/a.txt"] == ("conflict", "deleted-on-disk")  # restored over a deletion
    assert listed["work/b.txt"] == ("workspace-draft", None)
    assert listed["work/sub/c.txt"] == ("workspace-draft", None)
    time.sleep(1.1)  # past the on-access window: nothing takes them away later either
    assert sorted(os.listdir(m.work)) == ["a.txt", "b.txt", "sub"]
    res = m.cli_json("materialize")["mounts"]["work"]
    assert sorted(res["written"]) == ["b.txt", "sub/c.txt"]
    assert [s["path"] for s in res["skipped"]] == ["a.txt"]
    m.cli("materialize", "--force", "work/a.txt")
    assert sorted(os.listdir(disk)) == ["a.txt", "b.txt", "sub"]
    assert (disk / "a.txt").read_text() == "a1\n"
    assert all(v[0] == "synced" for v in states(m).values())


def test_undo_of_a_change_disk_then_deleted_is_a_conflict_not_a_silent_removal(backed):  # noqa: F811
    """The same through undo: an edit in the mount committed, disk deletes the file, undo
    brings the agreed copy back: both sides acted, so it is a conflict."""
    m, disk = backed
    (m.work / "b.txt").write_text("b-edit\n")
    m.cli("sync")  # commits the edit
    (disk / "b.txt").unlink()
    m.cli("undo")
    assert (m.work / "b.txt").read_text() == "b1\n"
    assert states(m)["work/b.txt"] == ("conflict", "deleted-on-disk")


def test_undo_refuses_to_take_back_an_edit_saved_on_disk_unless_told(backed):  # noqa: F811
    """Found by a user trial: an agent edits in the mount, the person saves the same file on
    disk, the agent runs `memfs undo` for its own command. The last operation was the
    reconciler's take-in of the person's save, so the undo took that back, and `materialize`
    wrote the old copy over the person's file on disk. The undo is now refused, naming the
    pass, and nothing moves; `--disk-too` does it, as asked."""
    m, disk = backed
    (m.work / "a.txt").write_text("agent\n")
    m.cli("sync")
    m.cli("materialize")  # the agent's edit is on disk: both sides agree on it
    assert (disk / "a.txt").read_text() == "agent\n"
    (disk / "a.txt").write_text("person's save\n")
    m.cli("sync")  # the reconciler takes the save in
    head = m.cli_json("status")["head"]
    out = m.cli("undo", check=False)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert ("this undo would take back edits made on disk in a bound directory and taken in by "
            "`reconciler: disk changes in work`") in out.stderr, out.stderr
    assert "memfs undo --disk-too" in out.stderr, out.stderr
    assert m.cli_json("status")["head"] == head
    assert (m.work / "a.txt").read_text() == "person's save\n"
    m.cli("materialize")
    assert (disk / "a.txt").read_text() == "person's save\n"
    for args in (("undo", "--commits", "1"), ("undo", "--to", head[:12] + "~1")):
        assert m.cli(*args, check=False).returncode == 1, args
    assert m.cli_json("status")["head"] == head
    m.cli("undo", "--disk-too")  # asked for: the save is taken back, owed to disk
    assert (m.work / "a.txt").read_text() == "agent\n"
    assert states(m)["work/a.txt"] == ("workspace-draft", None)


def test_an_adopted_deletion_is_an_event(backed):  # noqa: F811
    m, disk = backed
    (disk / "b.txt").unlink()
    (disk / "new.txt").write_text("n\n")
    m.cli("sync")
    (ev,) = [e for e in m.cli_json("events")["events"]
             if e["event"] == "adopted" and e["removed"]]
    assert ev["removed"] == ["b.txt"] and ev["taken"] == ["new.txt"]
    assert ev["counts"] == {"taken": 1, "removed": 1} and ev["mount"] == "work"


def test_a_missing_root_says_what_to_do_and_comes_back_by_itself(mounted, tmp_path: Path):
    mounted.require_real()
    m = mounted
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    m.cli("attach", "work", str(disk), "--watch", "off")
    away = tmp_path / "away"
    disk.rename(away)
    res = json.loads(m.cli("sync", "--json", check=False).stdout)["mounts"]["work"]
    assert "missing" in res["unavailable"] and "accept-root" not in res["remedy"]
    out = m.cli("ls", "--states", check=False)
    assert out.returncode == 1 and "unavailable" in out.stdout  # as sync: not listed
    out = m.cli("status").stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith("backed")]
    assert "UNAVAILABLE: backing root" in line and "{" not in line and "bring the" in line
    away.rename(disk)
    assert wait_for(lambda: m.status()["backing"]["work"]["available"], 10)  # no access ran
    events = [e["event"] for e in m.cli_json("events")["events"]]
    assert "root-unavailable" in events and "root-available" in events
    # A replaced root is told the accept-root remedy, and does not come back by itself.
    disk.rename(away)
    disk.mkdir()
    res = json.loads(m.cli("sync", "--json", check=False).stdout)["mounts"]["work"]
    assert "accept-root" in res["remedy"]
    time.sleep(2.5)
    assert not m.status()["backing"]["work"]["available"]


def test_conflict_copies_are_fsynced(backed, tmp_path):  # noqa: F811
    m, disk = backed
    require_tool(strace_missing())
    (m.work / "a.txt").write_text("a-draft\n")
    m.cli("sync")
    trace = tmp_path / "trace"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync",
                               "-o", str(trace), "-p", str(m.proc.pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: trace.exists(), 10)
        time.sleep(0.5)  # attached to every thread
        (disk / "a.txt").write_text("a-disk\n")
        res = m.cli_json("sync")["mounts"]["work"]
        assert res["conflicts"] == ["a.txt"]
    finally:
        tracer.terminate()
        tracer.wait(timeout=30)
    conflicts = str(m.root / "conflicts")
    synced = [ln for ln in trace.read_text().splitlines() if conflicts in ln]
    assert any(".tmp>" in ln for ln in synced), synced  # the copy, before its rename
    assert any(ln.rstrip().endswith(f"{conflicts}>) = 0") or f"<{conflicts}>" in ln
               for ln in synced), synced  # and its directory
