"""materialize through a real mount: drafts written to disk, deletions only when asked, a
conflict's workspace side only when named and forced, and the states that follow."""

from __future__ import annotations

import os

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
