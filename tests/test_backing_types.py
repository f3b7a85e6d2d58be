"""Type changes on either side (issue 15, item 2), through a real mount bound to a real directory.

A file where the other side has a directory, or the reverse. Before: the listing said `synced`
for a file disk made where the store still had a directory, every sync skipped it with no
reason, and materialize refused the workspace's file below with "'x' is a symlink or not a
directory". Now: where the store gives up everything in the way (disk's change only), the pass
takes disk's side in one go; where the store keeps something (a draft, a conflict, a file disk
never had), disk's file is a `type-changed` conflict, materialize says why it cannot write
below it, and a sync of the path takes disk's side, listing what it discarded.
"""

from __future__ import annotations

import os

from helpers.backing_mount import sh, states
from helpers.png import make_png


def test_disk_replaces_an_agreed_directory_by_a_file(backed):  # noqa: F811
    m, disk = backed
    sh(f"rm -r {disk}/sub && echo x > {disk}/sub")
    res = m.cli_json("sync")["mounts"]["work"]
    assert res["taken"] == ["sub"] and res["removed"] == ["sub/c.txt"] and res["skipped"] == []
    assert (m.work / "sub").is_file() and (m.work / "sub").read_text() == "x\n"
    listed = states(m)
    assert listed["work/sub"] == ("synced", None) and "work/sub/c.txt" not in listed
    again = m.cli_json("sync")["mounts"]["work"]
    assert again["taken"] == [] and again["skipped"] == []


def test_disk_replaces_a_directory_holding_a_draft_by_a_file(backed):  # noqa: F811
    m, disk = backed
    (m.work / "sub" / "c.txt").write_text("c-draft\n")
    sh(f"rm -r {disk}/sub && echo x > {disk}/sub")
    res = m.cli_json("sync")["mounts"]["work"]
    assert res["taken"] == [] and res["skipped"] == []
    listed = states(m)
    assert listed["work/sub"] == ("conflict", "type-changed")
    assert listed["work/sub/c.txt"] == ("conflict", "deleted-on-disk")
    assert (m.work / "sub" / "c.txt").read_text() == "c-draft\n"  # the draft is kept
    assert (disk / "sub").read_text() == "x\n"
    assert "sub" in m.status()["backing"]["work"]["conflicts"]
    res = m.cli_json("sync", "work/sub")["mounts"]["work"]
    assert res["discarded"] == [{"path": "sub/c.txt", "was": "conflict", "op": "deleted"}]
    assert (m.work / "sub").read_text() == "x\n"
    assert states(m)["work/sub"] == ("synced", None)


def test_disk_makes_a_file_where_the_mount_made_a_directory_with_a_draft(backed):  # noqa: F811
    m, disk = backed
    (m.work / "x").mkdir()
    (m.work / "x" / "d.txt").write_text("draft\n")
    (disk / "x").write_text("disk file\n")
    listed = states(m)
    assert listed["work/x"] == ("conflict", "type-changed")
    assert listed["work/x/d.txt"] == ("workspace-draft", None)
    res = m.cli_json("materialize")["mounts"]["work"]
    (skip,) = [s for s in res["skipped"] if s["path"] == "x/d.txt"]
    assert skip["state"] == "conflict: type-changed"
    assert "disk holds a file at 'x'" in skip["reason"]
    assert "memfs sync work/x" in skip["remedy"]
    assert res["failed"] == [] and (disk / "x").read_text() == "disk file\n"
    res = m.cli_json("materialize", "--force", "work/x/d.txt")["mounts"]["work"]
    assert res["written"] == [] and (disk / "x").read_text() == "disk file\n"
    res = m.cli_json("sync", "work/x")["mounts"]["work"]
    assert res["discarded"] == [{"path": "x/d.txt", "was": "workspace-draft", "op": "deleted"}]
    assert (m.work / "x").read_text() == "disk file\n"
    assert states(m)["work/x"] == ("synced", None)


def test_disk_replaces_an_agreed_file_by_a_directory(backed):  # noqa: F811
    m, disk = backed
    sh(f"rm {disk}/a.txt && mkdir {disk}/a.txt && echo y > {disk}/a.txt/y.txt")
    res = m.cli_json("sync")["mounts"]["work"]
    assert res["taken"] == ["a.txt/y.txt"] and res["removed"] == ["a.txt"]
    assert (m.work / "a.txt").is_dir() and (m.work / "a.txt" / "y.txt").read_text() == "y\n"
    listed = states(m)
    assert listed["work/a.txt/y.txt"] == ("synced", None) and "work/a.txt" not in listed


def test_disk_replaces_a_drafted_file_by_a_directory(backed):  # noqa: F811
    m, disk = backed
    (m.work / "a.txt").write_text("a-draft\n")
    sh(f"rm {disk}/a.txt && mkdir {disk}/a.txt && echo y > {disk}/a.txt/y.txt")
    listed = states(m)
    assert listed["work/a.txt"] == ("conflict", "deleted-on-disk")
    assert listed["work/a.txt/y.txt"] == ("conflict", "type-changed")
    assert (m.work / "a.txt").read_text() == "a-draft\n"
    res = m.cli_json("materialize", "--force", "work/a.txt")["mounts"]["work"]
    (skip,) = res["skipped"]
    assert skip["state"] == "conflict: type-changed" and "directory at 'a.txt'" in skip["reason"]
    assert (disk / "a.txt" / "y.txt").read_text() == "y\n"
    res = m.cli_json("sync", "work/a.txt")["mounts"]["work"]
    assert res["discarded"] == [{"path": "a.txt", "was": "conflict", "op": "deleted"}]
    assert (m.work / "a.txt" / "y.txt").read_text() == "y\n"
    assert states(m)["work/a.txt/y.txt"] == ("synced", None)


def test_a_binary_file_where_the_mount_keeps_a_directory(backed):  # noqa: F811
    """A disk-only file is put into the tree too (as a read-only node): the same clash."""
    m, disk = backed
    (m.work / "img").mkdir()
    (m.work / "img" / "notes.txt").write_text("mine\n")
    (disk / "img").write_bytes(make_png(8, 8))
    assert states(m)["work/img"] == ("conflict", "type-changed")
    assert (m.work / "img" / "notes.txt").read_text() == "mine\n"
    m.cli("sync", "work/img")
    assert (m.work / "img").read_bytes() == (disk / "img").read_bytes()
    assert states(m)["work/img"] == ("disk-only", None)


def test_a_directory_removed_on_disk_leaves_no_empty_directory_in_the_mount(backed):  # noqa: F811
    """Issue 15, item 9: the emptied directories stayed in the mount."""
    m, disk = backed
    (disk / "sub" / "deeper").mkdir()
    (disk / "sub" / "deeper" / "d.txt").write_text("d\n")
    m.cli("sync")
    assert (m.work / "sub" / "deeper" / "d.txt").read_text() == "d\n"
    sh(f"rm -r {disk}/sub")
    res = m.cli_json("sync")["mounts"]["work"]
    assert sorted(res["removed"]) == ["sub/c.txt", "sub/deeper/d.txt"]
    assert "sub" not in os.listdir(m.work)
    (disk / "keep").mkdir()
    (disk / "keep" / "k.txt").write_text("k\n")
    m.cli("sync")
    sh(f"rm {disk}/keep/k.txt")  # the directory stays on disk: it stays in the mount
    m.cli("sync")
    assert os.listdir(m.work / "keep") == []


def test_the_workspace_replaces_a_file_by_a_directory(backed):  # noqa: F811
    """The workspace's own type change reaches disk with --apply-deletions: the file goes
    first, then the files below the new directory (a bare materialize says why it waits)."""
    m, disk = backed
    sh(f"rm {m.work}/a.txt && mkdir {m.work}/a.txt && echo n > {m.work}/a.txt/n.txt")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["deletions_left"] == ["a.txt"] and res["written"] == []
    (skip,) = res["skipped"]
    assert skip["path"] == "a.txt/n.txt" and "--apply-deletions" in skip["remedy"]
    assert (disk / "a.txt").read_text() == "a1\n"
    res = m.cli_json("materialize", "--apply-deletions")["mounts"]["work"]
    assert res["removed"] == ["a.txt"] and res["written"] == ["a.txt/n.txt"]
    assert (disk / "a.txt" / "n.txt").read_text() == "n\n"
    assert states(m)["work/a.txt/n.txt"] == ("synced", None)


def test_a_disk_file_at_a_link_made_in_the_mount_is_a_type_change(backed):  # noqa: F811
    """A symlink made in a bound mount, then a file of that name on disk: every pass tried to
    take the file, could not put it over the link, and said "not taken this pass: n.txt (open
    for writing ...)". A plain sync keeps the workspace's link (it never gives up a
    workspace entry) and lists a type change, as for a directory against a file; a sync of
    the path takes disk's file in the link's place (--json: `over`)."""
    m, disk = backed
    os.symlink("b.txt", m.work / "n.txt")
    (disk / "n.txt").write_text("n1\n")
    out = m.cli("sync").stdout
    assert "not taken" not in out and "open for writing" not in out, out
    assert states(m)["work/n.txt"] == ("conflict", "type-changed")
    assert os.readlink(m.work / "n.txt") == "b.txt"
    assert m.status()["backing"]["work"]["owed"] == {
        "changes": 0, "workspace_deletions": 0, "conflicts": 0}
    res = m.cli_json("sync", str(m.work / "n.txt"))["mounts"]["work"]
    assert res["taken"] == ["n.txt"] and res["skipped"] == [], res
    assert res["discarded"] == [{"path": "n.txt", "was": "conflict", "op": "restored",
                                 "over": "symbolic link"}], res
    assert (m.work / "n.txt").read_text() == "n1\n" and not os.path.islink(m.work / "n.txt")
    assert states(m)["work/n.txt"] == ("synced", None)


def test_the_workspace_replaces_a_directory_by_a_link_and_disk_adds_below_it(backed):  # noqa: F811
    """`rm -r sub && ln -s b.txt sub` in the mount, then a new file in disk's sub/: every pass
    tried to take sub/new.txt, could not make sub/ over the link, and said "not taken this
    pass: sub/new.txt (open for writing ...)"; `memfs sync work/sub` also said it restored
    sub/c.txt and took nothing. A plain pass keeps the link and lists a type change; a sync
    of the path below the link takes nothing and claims nothing; a sync of sub takes disk's
    directory in the link's place, naming the link it replaced."""
    m, disk = backed
    sh(f"rm -r {m.work}/sub && ln -s b.txt {m.work}/sub")
    (disk / "sub" / "new.txt").write_text("n\n")
    out = m.cli("sync").stdout
    assert "not taken" not in out and "open for writing" not in out, out
    listed = states(m)
    assert listed["work/sub/new.txt"] == ("conflict", "type-changed")
    assert listed["work/sub/c.txt"] == ("workspace-deleted", None)
    assert os.readlink(m.work / "sub") == "b.txt"
    below = m.cli_json("sync", str(m.work / "sub" / "c.txt"))["mounts"]["work"]
    assert below["taken"] == [] and below["discarded"] == [] and below["skipped"] == [], below
    res = m.cli_json("sync", str(m.work / "sub"))["mounts"]["work"]
    assert sorted(res["taken"]) == ["sub/c.txt", "sub/new.txt"] and res["skipped"] == [], res
    assert {"path": "sub", "was": "not-writable", "op": "replaced",
            "over": "symbolic link"} in res["discarded"], res
    assert not os.path.islink(m.work / "sub")
    assert (m.work / "sub" / "c.txt").read_text() == "c1\n"
    assert (m.work / "sub" / "new.txt").read_text() == "n\n"
    assert states(m)["work/sub/new.txt"] == ("synced", None)
