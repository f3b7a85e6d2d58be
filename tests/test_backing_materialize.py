"""materialize through a real mount: drafts written to disk, deletions only when asked, a
conflict's workspace side only when named and forced, and the states that follow."""

from __future__ import annotations

import os
import subprocess

from helpers.backing_mount import states


def test_materialize_writes_drafts_and_keeps_disk_edits(backed):  # noqa: F811
    m, disk = backed
    (m.work / "a.txt").write_text("a-draft\n")
    (m.work / "new").mkdir()
    (m.work / "new" / "n.txt").write_text("made in the mount\n")
    os.unlink(m.work / "b.txt")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert sorted(res["written"]) == ["a.txt", "new/n.txt"]
    assert res["deletions_left"] == ["b.txt"] and res["removed"] == []
    assert (disk / "a.txt").read_text() == "a-draft\n"
    assert (disk / "new" / "n.txt").read_text() == "made in the mount\n"
    assert (disk / "b.txt").exists()  # never deleted without --apply-deletions
    listed = states(m)
    assert listed["work/a.txt"] == ("synced", None)
    assert listed["work/new/n.txt"] == ("synced", None)
    res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
    assert res["removed"] == ["b.txt"] and not (disk / "b.txt").exists()
    # A conflict: a bare materialize refuses it with the remedy; named and forced, it writes.
    (m.work / "sub" / "c.txt").write_text("c-draft\n")
    (disk / "sub" / "c.txt").write_text("c-disk\n")
    m.cli("sync")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert [s["path"] for s in res["skipped"]] == ["sub/c.txt"]
    assert "--force" in res["skipped"][0]["remedy"]
    assert (disk / "sub" / "c.txt").read_text() == "c-disk\n"
    res = m.cli_json("materialize", "--force", "work/sub/c.txt")["mounts"]["work"]
    assert res["written"] == ["sub/c.txt"]
    assert (disk / "sub" / "c.txt").read_text() == "c-draft\n"
    assert states(m)["work/sub/c.txt"] == ("synced", None)


def test_field_report_no_evidence_after_restart(mounted, tmp_path):
    """Seed 002's field report: after a restart, a bare materialize refuses a path with no
    evidence whose disk copy is newer (with --force too, unless the path is named) and still
    writes a new file; naming the path with --force overwrites it."""
    m = mounted
    m.require_real()
    (m.work / "legacy.txt").write_text("old store copy\n")  # in the store before any binding
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "legacy.txt").write_text("newer on disk\n")
    m.cli("attach", "work", str(disk), "--watch", "off")
    m.remount()
    (m.work / "n.txt").write_text("new\n")
    for args in ((), ("--force",)):
        res = m.cli_json("materialize", *args)["mounts"]["work"]
        assert [s["path"] for s in res["skipped"]] == ["legacy.txt"], args
        assert "`memfs materialize --force work/legacy.txt`" in res["skipped"][0]["remedy"]
        assert (disk / "legacy.txt").read_text() == "newer on disk\n"
    assert (disk / "n.txt").read_text() == "new\n"  # the new file was written all the same
    res = m.cli_json("materialize", "--force", "work/legacy.txt")["mounts"]["work"]
    assert res["written"] == ["legacy.txt"]
    assert (disk / "legacy.txt").read_text() == "old store copy\n"


def _tree(d) -> list[str]:
    """Every path under `d` (directories with a trailing slash), sorted."""
    out = []
    for top, dirs, files in os.walk(d):
        rel = os.path.relpath(top, d)
        out += [os.path.normpath(os.path.join(rel, n)) + "/" for n in dirs]
        out += [os.path.normpath(os.path.join(rel, n)) for n in files]
    return sorted(out)


def test_a_moved_directory_leaves_no_empty_directories_on_disk(backed, tmp_path):
    """`mv old new` in the mount, then `materialize --apply-deletions`: the files moved on
    disk, but `old/` and `old/deep/` stayed behind, empty (a native mv leaves none). The
    directories the removals left empty now go too; one the workspace still holds stays (a
    native `rm` of its last file keeps it), and so does one holding what memfs never took
    (an ignored .git), with or without a daemon."""
    m, disk = backed
    for d in (disk, tmp_path / "native"):
        (d / "old" / "deep").mkdir(parents=True)
        (d / "old" / "a.txt").write_text("a\n")
        (d / "old" / "deep" / "b.txt").write_text("b\n")
        (d / "odd" / "kept" / ".git").mkdir(parents=True)  # ignored: memfs never takes it
        (d / "odd" / "kept" / "f.txt").write_text("f\n")
        (d / "odd" / "gone").mkdir()
        (d / "odd" / "gone" / "g.txt").write_text("g\n")
    native = tmp_path / "native"
    (native / "a.txt").write_text("a1\n")
    (native / "b.txt").write_text("b1\n")
    (native / "sub").mkdir()
    (native / "sub" / "c.txt").write_text("c1\n")
    m.cli("sync")
    for d in (m.work, native):
        os.rename(d / "old", d / "new")
        os.unlink(d / "sub" / "c.txt")  # sub/ itself stays in the workspace
        os.unlink(d / "odd" / "kept" / "f.txt")
        os.unlink(d / "odd" / "gone" / "g.txt")
        os.rmdir(d / "odd" / "gone")
    res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
    assert _tree(disk) == _tree(native)
    assert res["removed_dirs"] == ["odd/gone", "old/deep", "old"], res  # deepest first
    # Without a daemon: the same, through the store directly.
    for d in (m.work, native):
        os.rename(d / "new", d / "newer")
    m.umount()
    out = m.cli("materialize", "--apply-deletions").stdout.splitlines()
    assert _tree(disk) == _tree(native)
    assert [line for line in out if line.endswith("(left empty)")] == [
        "removed  work/new/deep/ (left empty)", "removed  work/new/ (left empty)"], out


def test_a_file_made_and_removed_at_a_disk_symlink_leaves_nothing_unverified(backed):
    """Disk has a symlink memfs does not follow; a file made at that name in the mount is
    skipped by materialize (right: nothing is written through a symlink). Once it is removed
    again, its tombstone read as `unverified` at every listing and materialize, forever, and
    `memfs sync PATH` could not clear it. Nothing is owed there now: the workspace has no file,
    disk never had one memfs agreed on, and the symlink is listed as its region."""
    m, disk = backed
    os.symlink("a.txt", disk / "link")
    m.cli("sync")
    (m.work / "link").write_text("a file where disk has a symlink\n")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert [s["path"] for s in res["skipped"]] == ["link"], res
    os.unlink(m.work / "link")
    for _ in range(2):  # and again once the daemon starts afresh from the stored intent
        res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
        assert res["skipped"] == [] and res["removed"] == [] and res["written"] == [], res
        listed = m.cli_json("ls", "--states")["mounts"][0]
        assert "link" not in {e["path"] for e in listed["entries"]}, listed
        assert [(r["path"], r["kind"]) for r in listed["regions"]] == [("link", "symlink")]
        assert os.readlink(disk / "link") == "a.txt"  # disk's symlink untouched
        m.remount()


def test_a_file_replaced_by_a_symlink_in_the_mount_is_a_workspace_deletion(backed):
    """`ln -sf b.txt a.txt` in a bound mount renames a symlink over the synced file. The
    rename noted no removal of the file it replaced, so a.txt read `not-in-branch` ("this
    branch does not have it") instead of a workspace deletion, and, once the link was gone
    too, `materialize --apply-deletions` said "nothing owed" and kept disk's a.txt forever.
    Now it is deleted in the workspace, as a file replaced by a directory is
    (docs/reconciliation.md, "Type changes"): removed from disk only by --apply-deletions, once
    the link (which no materialize writes) is gone too."""
    m, disk = backed
    subprocess.run(["ln", "-sf", "b.txt", str(m.work / "a.txt")], check=True)
    assert os.readlink(m.work / "a.txt") == "b.txt"
    assert states(m)["work/a.txt"] == ("workspace-deleted", None)
    res = m.cli_json("materialize")["mounts"]["work"]
    # While the link is there it is what materialize names: not writable, disk's file kept.
    assert [(s["path"], s["state"]) for s in res["skipped"]] == [("a.txt", "not-writable")], res
    assert (disk / "a.txt").read_text() == "a1\n"
    os.unlink(m.work / "a.txt")
    assert states(m)["work/a.txt"] == ("workspace-deleted", None)
    res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
    assert res["removed"] == ["a.txt"] and not (disk / "a.txt").exists(), res
    assert "work/a.txt" not in states(m)


def test_a_file_replaced_by_a_link_or_fifo_in_the_mount_is_not_carried_not_owed(backed):
    """`ln -sf b.txt a.txt` in a bound mount is a workspace deletion of a.txt that no
    materialize carries: it leaves disk's a.txt while the link stands (links are not written to
    disk), yet status counted it owed ("disk owes 1 deletion(s)") and the remedy that implies,
    `materialize --apply-deletions`, never brought it to 0. It is counted not carried, as a
    hard-linked file's change is, in words true for a link (and for a FIFO put there, the
    other reason): once the link is gone the deletion is owed again, and paid."""
    m, disk = backed
    subprocess.run(["ln", "-sf", "b.txt", str(m.work / "a.txt")], check=True)
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 1, st
    text = m.cli("status").stdout
    assert "disk owes 0 change(s), 0 deletion(s)" in text, text
    assert "not carried: 1 change(s) no materialize writes (hard links, symbolic links or " \
        "special files in the workspace; `memfs ls --states work` names each and why)" in text
    assert "hard-linked file(s)" not in text, text
    # What `ls --states` and materialize name for it: the ways out that end with nothing
    # owed (not "make it on disk", which leaves it unverified: disk's link is not read).
    ways = "`memfs sync work/a.txt` takes disk's file back in its place"
    (row,) = [e for e in m.cli_json("ls", "--states", "work")["mounts"][0]["entries"]
              if e["path"] == "a.txt"]
    assert row["state"] == "workspace-deleted" and ways in row["note"], row
    res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
    assert [(s["path"], s["state"]) for s in res["skipped"]] == [("a.txt", "not-writable")]
    assert ways in res["skipped"][0]["remedy"], res
    assert (disk / "a.txt").read_text() == "a1\n"  # what materialize leaves: still not owed
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 1, st
    # A FIFO made where a synced file was: the same, for the other reason.
    os.unlink(m.work / "b.txt")
    os.mkfifo(m.work / "b.txt")
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 2, st
    # Without the link the deletion is one materialize carries: owed, and paid.
    os.unlink(m.work / "a.txt")
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 1 and st["not_carried"] == 1, st
    m.cli("materialize", "--apply-deletions")
    assert not (disk / "a.txt").exists() and (disk / "b.txt").read_text() == "b1\n"
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 1, st


def test_a_path_sync_takes_disks_file_back_over_a_link_made_in_the_mount(backed):
    """After `ln -sf b.txt a.txt` in a bound mount, `memfs sync work/a.txt` (take disk's side
    there) said it restored disk's a.txt, did nothing, and blamed a file "open for writing":
    the take would not go over the link. It takes disk's file in the link's place and says
    so; the link is in the history (the take-in is an operation: `memfs undo --disk-too`, the
    flag any undo of a take-in needs, brings it back)."""
    m, disk = backed
    subprocess.run(["ln", "-sf", "b.txt", str(m.work / "a.txt")], check=True)
    out = m.cli("sync", str(m.work / "a.txt")).stdout
    assert "1 taken" in out and "discarded: a.txt (workspace-deleted, restored, in place of " \
        "the workspace's symbolic link)" in out, out
    assert "open for writing" not in out and "not taken" not in out, out
    assert not os.path.islink(m.work / "a.txt") and (m.work / "a.txt").read_text() == "a1\n"
    assert (disk / "a.txt").read_text() == "a1\n"
    assert states(m)["work/a.txt"] == ("synced", None)
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 0, st
    m.cli("undo", "--disk-too")
    assert os.readlink(m.work / "a.txt") == "b.txt"



def test_keeping_a_link_made_over_a_synced_file_is_agreed_by_removing_disks_file(backed):
    """The third way out of `ln -sf b.txt a.txt` in a bound mount (besides a path sync, and
    removing the link then `materialize --apply-deletions`): keep the link and remove disk's
    a.txt. Disk then agrees on the deletion: nothing owed, nothing counted not carried, and
    the link is listed as what no materialize writes."""
    m, disk = backed
    subprocess.run(["ln", "-sf", "b.txt", str(m.work / "a.txt")], check=True)
    os.unlink(disk / "a.txt")
    m.cli("sync")
    st = m.status()["backing"]["work"]
    assert st["owed"]["workspace_deletions"] == 0 and st["not_carried"] == 0, st
    assert states(m)["work/a.txt"] == ("not-writable", None)
    assert os.readlink(m.work / "a.txt") == "b.txt" and not os.path.lexists(disk / "a.txt")
