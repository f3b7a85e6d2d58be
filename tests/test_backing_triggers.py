"""Backing triggers and crash safety through a real mount: inotify, on-access, start, SIGKILL.

The kill test proves ordering only (the tree commit before the adoption's completion); the
durability of each step rests on fsync, which a SIGKILL cannot test.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.backing_mount import ACCESS, sh, states, xattr
from helpers.png import make_png
from helpers.require import require_tool, root_missing
from helpers.wait import wait_for


def _quiet_last_pass(m, mount: str = "work") -> float:
    """The mount's last pass time once it stays put for longer than the on-access window."""
    last = m.status()["backing"][mount]["last_pass"]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(ACCESS)
        now = m.status()["backing"][mount]["last_pass"]
        if now == last:
            return now
        last = now
    raise AssertionError("passes kept running")


def _disk(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    """A backing directory holding `files` (name -> text or bytes)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    for name, data in files.items():
        (disk / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return disk


def _real(m) -> None:
    m.require_real()


def test_fs_events_observe_without_access(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = tmp_path / "disk"
    (disk / "deep" / "er").mkdir(parents=True)
    (disk / "keep.txt").write_text("k\n")
    m.cli("attach", "work", str(disk), "--watch", "fs-events")
    (disk / "deep" / "er" / "new.txt").write_text("from the shell\n")
    (disk / "deep" / "pic.png").write_bytes(make_png(8, 8))
    os.unlink(disk / "keep.txt")
    # No sync and no waiting out the access interval: the events alone bring the changes in.
    assert wait_for(lambda: states(m).get("work/deep/er/new.txt") == ("synced", None) or
                    (m.work / "deep" / "er" / "new.txt").exists())
    assert (m.work / "deep" / "er" / "new.txt").read_text() == "from the shell\n"
    assert wait_for(lambda: not (m.work / "keep.txt").exists())
    assert (m.work / "deep" / "pic.png").read_bytes() == (disk / "deep" / "pic.png").read_bytes()


def test_watch_off_sees_disk_only_on_sync(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n"})
    m.cli("attach", "work", str(disk), "--watch", "off")
    assert sh(f"cat {m.work}/a.txt") == "a1\n"
    (disk / "late.txt").write_text("late\n")
    (disk / "a.txt").write_text("a2 on disk\n")
    time.sleep(ACCESS)
    assert "late.txt" not in os.listdir(m.work)
    assert sh(f"cat {m.work}/a.txt") == "a1\n"  # an open observes nothing either
    m.cli("sync")
    assert (m.work / "late.txt").read_text() == "late\n"
    assert sh(f"cat {m.work}/a.txt") == "a2 on disk\n"


def test_on_access_lookup_takes_a_new_file_in(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = tmp_path / "disk"
    disk.mkdir()
    m.cli("attach", "work", str(disk))
    (disk / "direct.txt").write_text("looked up by name\n")
    # A lookup by name (no listing) observes that one path.
    assert (m.work / "direct.txt").read_text() == "looked up by name\n"
    assert xattr(m.work / "direct.txt") == "synced"


def test_on_access_open_shows_a_disk_edit_without_a_listing(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "old\n", "b.txt": "b1\n", "gone.txt": "bye\n"})
    (disk / "pic.png").write_bytes(make_png(8, 8))  # disk-only: read from disk, sized by attr
    m.cli("attach", "work", str(disk))
    assert (m.work / "pic.png").read_bytes() == make_png(8, 8)
    # The kernel now holds the names, the attributes (size 4) and the pages: the next `cat`
    # sends no lookup, only an open.
    assert sh(f"cat {m.work}/a.txt {m.work}/b.txt {m.work}/gone.txt") == "old\nb1\nbye\n"
    with open(m.work / "a.txt") as held:  # opened before the edit
        sh(f"echo 'new, and longer than before' > {disk}/a.txt && rm {disk}/gone.txt"
           f" && echo b2 > {disk}/b.txt")
        (disk / "pic.png").write_bytes(make_png(64, 64))
        time.sleep(ACCESS)  # past the attach pass's once-a-second window for the mount
        assert sh(f"cat {m.work}/a.txt") == "new, and longer than before\n"
        # A changed file is a new inode: a descriptor opened before keeps the bytes it opened,
        # as with a file replaced by rename on a local filesystem.
        assert held.read() == "old\n"
    assert (m.work / "pic.png").read_bytes() == make_png(64, 64)  # all of it, not 8x8's size
    res = subprocess.run(["cat", str(m.work / "gone.txt")], capture_output=True, text=True)
    assert res.returncode == 1 and "No such file" in res.stderr
    assert xattr(m.work / "a.txt") == "synced"
    # A writing open observes first too: the append lands on disk's new bytes (a draft of
    # them), not on the old ones (which would be both-changed: a conflict).
    sh(f"echo appended >> {m.work}/b.txt")
    assert (m.work / "b.txt").read_text() == "b2\nappended\n"
    assert states(m, "work/b.txt") == {"work/b.txt": ("workspace-draft", None)}
    assert "gone.txt" not in os.listdir(m.work)


def test_on_access_open_keeps_drafts(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n", "b.txt": "b1\n"})
    m.cli("attach", "work", str(disk))
    sh(f"echo draft > {m.work}/a.txt")  # only the store changed
    sh(f"echo 'draft b' > {m.work}/b.txt && echo 'disk b' > {disk}/b.txt")  # both changed
    time.sleep(ACCESS)
    assert sh(f"cat {m.work}/a.txt") == "draft\n"
    assert sh(f"cat {m.work}/b.txt") == "draft b\n"
    # Each open observed its path: the states say so, and disk was left alone.
    assert xattr(m.work / "a.txt") == "workspace-draft"
    assert xattr(m.work / "b.txt") == "conflict"
    assert (disk / "a.txt").read_text() == "a1\n"
    assert (disk / "b.txt").read_text() == "disk b\n"
    # The read-only branch view has the same paths below it, but is never observed.
    before = _quiet_last_pass(m)
    view = m.mnt / ".memfs" / "branches" / "main" / "work"
    sh(f"ls {view} && cat {view}/a.txt {view}/b.txt")
    assert m.status()["backing"]["work"]["last_pass"] == before


def test_on_access_open_leaves_fs_events_mounts_to_their_events(mounted, tmp_path: Path):
    m = mounted
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n"})
    m.cli("attach", "work", str(disk), "--watch", "fs-events")

    def edited_and_shown() -> bool:  # the watcher starts within a poll of the attach
        sh(f"echo a2 > {disk}/a.txt")
        return sh(f"cat {m.work}/a.txt") == "a2\n"

    assert wait_for(edited_and_shown)
    before = _quiet_last_pass(m)  # the event passes are over; an on-access window would be too
    for _ in range(3):
        assert sh(f"cat {m.work}/a.txt") == "a2\n"
    assert m.status()["backing"]["work"]["last_pass"] == before  # no pass ran at open


def test_daemon_start_observes_changes_made_while_down(mount_factory, tmp_path: Path):
    m = mount_factory()
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n", "gone.txt": "bye\n"})
    m.cli("attach", "work", str(disk), "--watch", "off")
    m.umount()
    (disk / "a.txt").write_text("a2 while down\n")
    os.unlink(disk / "gone.txt")
    m.remount()
    assert wait_for(lambda: not (m.work / "gone.txt").exists(), 5)
    assert (m.work / "a.txt").read_text() == "a2 while down\n"


def test_kill_after_adoption_commit_completes_on_restart(mount_factory, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    disk = _disk(tmp_path, {"a.txt": "a1\n"})
    m = mount_factory()
    _real(m)
    m.cli("attach", "work", str(disk), "--watch", "off")
    m.umount()
    monkeypatch.setenv("MEMFS_CRASH_AT", "backing:after-commit")
    m.remount()  # the start pass has nothing to adopt, so it never reaches the point
    # ... as long as it is over before disk changes (it runs once the mount is up).
    assert wait_for(lambda: m.status()["backing"]["work"]["last_pass"] is not None, 10)
    (disk / "a.txt").write_text("a2 on disk\n")
    res = m.cli("sync", check=False)
    assert res.returncode != 0  # the daemon died at the point, after the tree commit
    assert m.proc is not None and m.proc.wait(timeout=30) == -9
    m.kill()
    monkeypatch.delenv("MEMFS_CRASH_AT")
    (disk / "a.txt").write_text("a3 while down\n")
    m.remount()
    # The adoption's intent was pending and the tree shows its outcome (a2), so the restart
    # completes it (P := a2) first: then only disk changed (a3) and it is adopted. Without the
    # intent P would still be a1 and disk, store and evidence would all differ: a false conflict.
    assert wait_for(lambda: states(m).get("work/a.txt") == ("synced", None), 10)
    assert (m.work / "a.txt").read_text() == "a3 while down\n"
    assert m.status()["backing"]["work"]["conflicts"] == []


def test_root_identity_survives_a_restart(mount_factory, tmp_path: Path):
    m = mount_factory()
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n"})
    m.cli("attach", "work", str(disk), "--watch", "off")
    m.umount()
    disk.rename(tmp_path / "unplugged")
    disk.mkdir()  # the empty mountpoint a drive leaves behind
    m.remount()
    assert wait_for(lambda: m.status()["backing"]["work"]["last_pass"] is not None, 5)
    st = m.status()["backing"]["work"]
    assert st["available"] is False and "--accept-root" in st["unavailable"]["remedy"]
    assert (m.work / "a.txt").read_text() == "a1\n"  # nothing left the store


def test_on_access_open_skips_the_pass_while_disk_holds_what_was_seen(mounted, tmp_path: Path):
    """An open whose file still has the fingerprint the last pass saw (under the walk's trust
    rule) runs no pass; a change on disk, even a same-size rewrite moments after a pass, is
    still seen at the next open."""
    m = mounted
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n", "b.txt": "b1\n"})
    time.sleep(2.2)  # older than the racy window when the attach pass looks
    m.cli("attach", "work", str(disk))
    last = _quiet_last_pass(m)
    assert sh(f"cat {m.work}/a.txt {m.work}/b.txt") == "a1\nb1\n"
    time.sleep(ACCESS)
    assert sh(f"cat {m.work}/a.txt {m.work}/b.txt") == "a1\nb1\n"
    assert m.status()["backing"]["work"]["last_pass"] == last  # no pass: disk as seen
    (disk / "a.txt").write_text("a2\n")  # same size
    time.sleep(ACCESS)
    assert sh(f"cat {m.work}/a.txt") == "a2\n"
    (disk / "a.txt").write_text("a3\n")  # same size again, moments after that pass looked
    time.sleep(ACCESS)
    assert sh(f"cat {m.work}/a.txt") == "a3\n"
    assert m.status()["backing"]["work"]["last_pass"] != last


INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")


def test_a_refused_watcher_is_reported_and_retried_not_fatal(mounted, tmp_path: Path):
    """inotify_init1 failing (EMFILE: the per-user instance limit, lowered here to 0 for a
    moment) is shown on status and retried; before, the watcher's error ended the daemon."""
    m = mounted
    _real(m)
    require_tool(root_missing("lower fs.inotify.max_user_instances"))
    require_tool(None if os.access(INOTIFY_LIMIT, os.W_OK) else f"{INOTIFY_LIMIT} is read-only here")
    disk = _disk(tmp_path, {"a.txt": "a1\n"})
    old = INOTIFY_LIMIT.read_text()
    INOTIFY_LIMIT.write_text("0\n")
    try:
        m.cli("attach", "work", str(disk), "--watch", "fs-events")
        assert wait_for(lambda: m.status()["backing"]["work"]["watch_error"] is not None, 10)
    finally:
        INOTIFY_LIMIT.write_text(old)
    assert m.proc is not None and m.proc.poll() is None  # the daemon lives
    assert "inotify" in m.status()["backing"]["work"]["watch_error"]["remedy"]
    events = [e["event"] for e in m.cli_json("events")["events"]]
    assert "watch-failed" in events
    # Once the kernel allows it again, the watcher starts and events drive passes again.
    assert wait_for(lambda: m.status()["backing"]["work"]["watch_error"] is None, 15)
    (disk / "b.txt").write_text("b1\n")
    assert wait_for(lambda: (m.work / "b.txt").exists(), 10)


def test_a_pass_that_vouches_for_nothing_new_does_not_wait_for_other_writes(mount_factory,
                                                                          tmp_path: Path):
    """An on-access pass that takes nothing and records no new evidence leaves a draft
    elsewhere to its group commit; one that records evidence still waits for durability."""
    m = mount_factory(extra_args=("--commit-interval", "60000"))  # a minute: commits on demand
    _real(m)
    disk = _disk(tmp_path, {"a.txt": "a1\n", "b.txt": "b1\n"})
    m.cli("attach", "work", str(disk))
    (m.work / "b.txt").write_text("draft\n")  # pending: the group commit is a minute away
    assert m.status()["pending"] > 0
    time.sleep(ACCESS)
    before = m.status()["backing"]["work"]["last_pass"]
    assert sh(f"cat {m.work}/a.txt") == "a1\n"  # its file is newer than the racy window: a pass
    assert m.status()["backing"]["work"]["last_pass"] != before
    assert m.status()["pending"] > 0  # the draft was not committed for it
    (disk / "a.txt").write_text("a2 on disk\n")
    time.sleep(ACCESS)
    assert sh(f"cat {m.work}/a.txt") == "a2 on disk\n"  # an adoption: evidence, so durable
    assert m.status()["pending"] == 0
