"""Backing directories through a real mount: shell changes on disk, the rule's cells, the root.

Every test runs a real daemon, a real backing directory and real shell commands (cp, rm, mv,
ls, cat, getfattr through os.getxattr). On-access observation is rate-limited to once a second
per scope, so a test that relies on it waits ACCESS before looking.
"""

from __future__ import annotations

import errno
import os
import shutil
import time

import pytest
from helpers.backing_mount import ACCESS, sh, states, xattr  # noqa: F401 - shared
from helpers.png import make_png


def test_problem_png_copied_in_appears_and_rm_deletions_disappear(backed, tmp_path):
    m, disk = backed
    png = tmp_path / "shot.png"
    png.write_bytes(make_png())
    for i in range(3):
        (disk / f"note{i}.txt").write_text(f"note {i}\n")
    m.cli("sync")
    assert (m.work / "note2.txt").read_text() == "note 2\n"
    sh(f"cp {png} {disk}/shot.png && rm {disk}/note0.txt {disk}/note1.txt {disk}/note2.txt")
    time.sleep(ACCESS)
    listed = sh(f"ls {m.work}").split()
    assert "shot.png" in listed
    assert not {"note0.txt", "note1.txt", "note2.txt"} & set(listed)
    assert os.stat(m.work / "shot.png").st_size == png.stat().st_size
    assert (m.work / "shot.png").read_bytes() == png.read_bytes()
    if shutil.which("file"):
        assert sh(f"file -b --mime-type {m.work}/shot.png").strip() == "image/png"
    assert xattr(m.work / "shot.png") == "disk-only"
    assert xattr(m.work / "a.txt") == "synced"
    with pytest.raises(FileNotFoundError):
        os.stat(m.work / "note1.txt")
    with pytest.raises(OSError) as exc:
        (m.work / "shot.png").write_bytes(b"x")
    assert exc.value.errno == errno.EROFS
    assert states(m)["work/shot.png"] == ("disk-only", None)


def test_problem_350_entry_directory(backed, tmp_path):
    m, disk = backed
    logs = disk / "logs"
    logs.mkdir()
    for i in range(349):
        (logs / f"run{i:03}.log").write_text(f"line {i}\n" * 3)
    m.cli("sync")
    assert len(os.listdir(m.work / "logs")) == 349
    (logs / "chart.png").write_bytes(make_png(32, 32))  # 350 entries
    sh(f"rm {logs}/run007.log {logs}/run123.log {logs}/run300.log")
    time.sleep(ACCESS)
    assert sorted(os.listdir(m.work / "logs")) == sorted(os.listdir(logs))
    assert len(os.listdir(m.work / "logs")) == 347
    assert (m.work / "logs" / "chart.png").read_bytes() == (logs / "chart.png").read_bytes()


def test_rule_cells_draft_adopt_conflict_and_path_sync(backed):
    m, disk = backed
    # Only the store changed: a draft, kept by a sync without a path.
    (m.work / "a.txt").write_text("a-draft\n")
    m.cli("sync")
    assert (m.work / "a.txt").read_text() == "a-draft\n"
    assert (disk / "a.txt").read_text() == "a1\n"
    assert xattr(m.work / "a.txt") == "workspace-draft"
    # Only disk changed: adopted.
    (disk / "b.txt").write_text("b2 from disk\n")
    m.cli("sync")
    assert (m.work / "b.txt").read_text() == "b2 from disk\n"
    assert xattr(m.work / "b.txt") == "synced"
    # All three differ: a conflict; the workspace keeps its side, disk's is recorded.
    (disk / "a.txt").write_text("a-disk\n")
    res = m.cli_json("sync")
    assert res["mounts"]["work"]["conflicts"] == ["a.txt"]
    assert (m.work / "a.txt").read_text() == "a-draft\n"
    assert xattr(m.work / "a.txt") == "conflict"
    assert xattr(m.work / "a.txt", "user.memfs.conflict") == "both-changed"
    assert (m.mnt / ".memfs" / "conflicts" / "work" / "a.txt").read_text() == "a-disk\n"
    assert "a.txt" in m.status()["backing"]["work"]["conflicts"]
    # A plain sync keeps the conflict; a path sync takes disk and says what it gave up.
    m.cli("sync")
    assert (m.work / "a.txt").read_text() == "a-draft\n"
    res = m.cli_json("sync", "work/a.txt")
    assert res["mounts"]["work"]["discarded"] == [
        {"path": "a.txt", "was": "conflict", "op": "modified"}]
    assert (m.work / "a.txt").read_text() == "a-disk\n"
    assert xattr(m.work / "a.txt") == "synced"
    assert not (m.mnt / ".memfs" / "conflicts" / "work" / "a.txt").exists()


def test_draft_plus_shell_rm_is_a_deleted_on_disk_conflict(backed):
    m, disk = backed
    (m.work / "b.txt").write_text("b-draft\n")
    sh(f"rm {disk}/b.txt")
    m.cli("sync")
    assert (m.work / "b.txt").read_text() == "b-draft\n"  # the draft is never lost
    assert states(m)["work/b.txt"] == ("conflict", "deleted-on-disk")
    # While a file deleted on disk with no draft simply goes.
    sh(f"rm {disk}/sub/c.txt")
    m.cli("sync")
    assert not (m.work / "sub" / "c.txt").exists()


def test_workspace_deletion_is_a_tombstone_until_a_path_sync(backed):
    m, disk = backed
    os.unlink(m.work / "b.txt")
    m.cli("sync")
    assert not (m.work / "b.txt").exists()  # never resurrected
    assert (disk / "b.txt").exists()
    listed = states(m)
    assert listed["work/b.txt"] == ("workspace-deleted", None)
    assert "b.txt" in m.status()["backing"]["work"]["workspace_deleted"]
    res = m.cli_json("sync", "work/b.txt")
    assert res["mounts"]["work"]["discarded"] == [
        {"path": "b.txt", "was": "workspace-deleted", "op": "restored"}]
    assert (m.work / "b.txt").read_text() == "b1\n"


def test_branch_switch_never_rewinds_evidence(backed):
    m, disk = backed
    m.cli("branch", "create", "before")
    (disk / "a.txt").write_text("a2\n")
    m.cli("sync")
    assert (m.work / "a.txt").read_text() == "a2\n"
    m.cli("branch", "switch", "before")
    # The branch rewound S to a1, but P stays a2 (what disk agreed with): D = P != S, so this
    # branch's copy is a draft, not a disk change to adopt.
    assert (m.work / "a.txt").read_text() == "a1\n"
    assert states(m)["work/a.txt"] == ("workspace-draft", None)
    assert (m.work / "a.txt").read_text() == "a1\n"
    m.cli("branch", "switch", "main")
    assert states(m)["work/a.txt"] == ("synced", None)


def test_undo_rewinds_branch_intent(backed):
    m, disk = backed
    m.cli("checkpoint", "kept")
    os.unlink(m.work / "a.txt")
    fd = os.open(m.work, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    assert states(m)["work/a.txt"] == ("workspace-deleted", None)
    m.cli("restore", "kept")
    # The file and its lack of a tombstone came back together.
    assert (m.work / "a.txt").read_text() == "a1\n"
    assert states(m)["work/a.txt"] == ("synced", None)


def test_replaced_root_is_unavailable_and_accept_root_takes_it(backed, tmp_path):
    m, disk = backed
    (disk / "pic.png").write_bytes(make_png(16, 16))
    m.cli("sync")
    away = tmp_path / "away"
    disk.rename(away)
    disk.mkdir()  # an empty directory where the root was: an unplugged drive's mountpoint
    res = m.cli("sync", check=False)
    assert res.returncode == 1 and "--accept-root" in res.stdout
    st = m.status()["backing"]["work"]
    assert st["available"] is False and "--accept-root" in st["unavailable"]["remedy"]
    time.sleep(ACCESS)
    assert sorted(os.listdir(m.work)) == ["a.txt", "b.txt", "pic.png", "sub"]
    assert (m.work / "a.txt").read_text() == "a1\n"  # nothing left the store
    assert xattr(m.work / "a.txt") == "unverified"
    # The root comes back: everything agrees again.
    disk.rmdir()
    away.rename(disk)
    m.cli("sync")
    assert states(m)["work/a.txt"] == ("synced", None)
    # Replaced on purpose and accepted: old evidence is set aside, nothing reads as deleted.
    disk.rename(away)
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    res = m.cli_json("sync", "--accept-root")
    assert res["mounts"]["work"]["removed"] == []
    listed = states(m)
    assert listed["work/a.txt"] == ("synced", None)
    assert listed["work/b.txt"] == ("disk-missing-provenance-unknown", None)
    assert (m.work / "b.txt").read_text() == "b1\n"


def test_attach_without_daemon_then_mount_and_restart(mount_factory, tmp_path):
    disk = tmp_path / "proj"
    disk.mkdir()
    (disk / "readme.md").write_text("# hi\n")
    (disk / "logo.png").write_bytes(make_png(8, 8))
    root = tmp_path / "root-direct"
    m = mount_factory(root=root)
    m.require_real()
    m.umount()
    res = m.cli_json("attach", "proj", str(disk))  # no daemon: on the store directly
    assert res["pass"]["taken"] == ["readme.md"]
    m.remount()
    time.sleep(ACCESS)
    proj = m.mnt / "proj"
    assert sorted(os.listdir(proj)) == ["logo.png", "readme.md"]
    assert (proj / "logo.png").read_bytes() == (disk / "logo.png").read_bytes()
    assert m.status()["backing"]["proj"]["dir"] == str(disk)
    m.cli("detach", "proj")
    assert "proj" not in m.status().get("backing", {})
    assert sorted(os.listdir(proj)) == ["readme.md"]  # the store's files stay


def test_containment_symlinks_fifo_and_oversize(mounted, tmp_path):
    m = mounted
    m.require_real()
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text("outside the root\n")
    (outside / "dir" / "inner.txt").write_text("also outside\n")
    disk = tmp_path / "disk"
    disk.mkdir()
    os.symlink(outside / "secret.txt", disk / "to-file")
    os.symlink(outside / "dir", disk / "to-dir")
    os.mkfifo(disk / "pipe")
    (disk / "big.log").write_text("x" * 5000)
    (disk / "small.txt").write_text("small\n")
    res = m.cli_json("attach", "work", str(disk), "--max-file-size", "1000")  # a FIFO never blocks
    assert res["pass"]["taken"] == ["small.txt"]
    time.sleep(ACCESS)
    assert sorted(os.listdir(m.work)) == ["big.log", "small.txt"]
    assert not (m.work / "to-file").exists() and not (m.work / "to-dir").exists()
    assert os.stat(m.work / "big.log").st_size == 5000  # oversize: disk-only, real size
    assert (m.work / "big.log").read_text() == "x" * 5000
    regions = {r["path"]: r["reason"] for r in m.cli_json("ls", "--states")["mounts"][0]["regions"]}
    assert set(regions) == {"to-file", "to-dir"}
    assert "symlink" in regions["to-dir"]
    assert states(m)["work/big.log"] == ("disk-only", None)
    assert states(m)["work/pipe"] == ("disk-only", None)  # listed, never opened nor shown


def test_rename_and_create_through_the_mount_are_branch_intent(backed):
    m, disk = backed
    os.rename(m.work / "a.txt", m.work / "z.txt")
    (m.work / "fresh.txt").write_text("made in the mount\n")
    listed = states(m)
    assert listed["work/a.txt"] == ("workspace-deleted", None)
    assert listed["work/z.txt"] == ("workspace-draft", None)
    assert listed["work/fresh.txt"] == ("workspace-draft", None)
    assert not (disk / "z.txt").exists() and (disk / "a.txt").exists()  # disk untouched


def test_attach_refuses_a_directory_inside_the_mount(mounted):
    m = mounted
    m.require_real()
    (m.work / "inner").mkdir()
    res = m.cli("attach", "loop", str(m.work / "inner"), check=False, timeout=30)
    assert res.returncode == 1 and "inside the memfs mount" in res.stderr
    assert sorted(os.listdir(m.mnt)) == ["work"]  # answered, and nothing was bound
