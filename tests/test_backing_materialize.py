"""materialize through a real mount: drafts written to disk, deletions only when asked, a
conflict's workspace side only when named and forced, and the states that follow."""

from __future__ import annotations

import os

from test_backing_mount import backed, states  # noqa: F401 - the fixture is used by name


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
