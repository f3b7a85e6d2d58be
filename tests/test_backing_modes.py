"""Permission bits through a backing directory (issue 12, item 5), through a real mount.

The reconciler carries each file's permission bits (0o777) in both directions by the same
three-way rule as content, with the mode disk last agreed on kept in the evidence: take-in
keeps disk's mode, materialize writes the store's, a chmod on disk is a disk change, a chmod
in the mount a draft, and a mode changed on both sides a conflict. Hard links, FIFOs and
sockets found on disk stay disk-only; a hard link made in the mount is listed by materialize
as not writable, with the reason. A directory either side makes gets the other side's bits
(a 0700 directory stays private); a later chmod of a directory is not carried (a limit).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from helpers.backing_mount import sh, states, xattr

SCRIPT = b"#!/bin/sh\necho hello from $(basename \"$0\")\n"


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def repo(mounted, tmp_path: Path):
    """A git checkout with a 755 script and a 644 file, bound to `work` (watch off)."""
    mounted.require_real()
    if shutil.which("git") is None:
        pytest.fail("git is missing (Debian package git; scripts/_setup.sh installs it)")
    disk = tmp_path / "proj"
    disk.mkdir()
    git(disk, "init", "-q")
    (disk / "run.sh").write_bytes(SCRIPT)
    (disk / "run.sh").chmod(0o755)
    (disk / "notes.txt").write_text("notes\n")
    (disk / "notes.txt").chmod(0o644)
    git(disk, "add", "run.sh", "notes.txt")
    git(disk, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    mounted.cli("attach", "work", str(disk), "--watch", "off")
    return mounted, disk


def test_a_755_script_round_trips(repo):
    m, disk = repo
    script = m.work / "run.sh"
    assert mode(script) == 0o755 and mode(m.work / "notes.txt") == 0o644  # take-in keeps it
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "hello from run.sh\n"  # runs in the mount
    assert states(m)["work/run.sh"] == ("synced", None)

    # A chmod in the mount is a draft; materialize writes the mode; git sees no change
    # (it tracks the executable bit only).
    script.chmod(0o775)
    assert xattr(script) == "workspace-draft"
    assert m.status()["backing"]["work"]["owed"]["changes"] == 1
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["written"] == ["run.sh"]
    assert mode(disk / "run.sh") == 0o775 and (disk / "run.sh").read_bytes() == SCRIPT
    assert git(disk, "status", "--porcelain") == "" and git(disk, "diff") == ""
    assert states(m)["work/run.sh"] == ("synced", None)

    # Dropping the executable bit in the mount reaches disk too: git sees exactly that.
    script.chmod(0o644)
    m.cli("materialize")
    assert mode(disk / "run.sh") == 0o644
    assert "old mode 100755\nnew mode 100644" in git(disk, "diff")

    # A chmod on disk is a disk change: taken in, and git is clean again.
    (disk / "run.sh").chmod(0o755)
    m.cli("sync")
    assert mode(script) == 0o755 and states(m)["work/run.sh"] == ("synced", None)
    assert git(disk, "diff") == ""
    assert m.cli_json("materialize")["mounts"]["work"]["written"] == []


def test_mode_changes_on_either_side_merge_and_on_both_conflict(repo):
    m, disk = repo
    notes = m.work / "notes.txt"
    # Content in the mount, mode on disk: both kept (disk's mode, the workspace's content).
    notes.write_text("edited in the mount\n")
    (disk / "notes.txt").chmod(0o600)
    m.cli("sync")
    assert mode(notes) == 0o600 and notes.read_text() == "edited in the mount\n"
    assert states(m)["work/notes.txt"] == ("workspace-draft", None)
    m.cli("materialize")
    assert (disk / "notes.txt").read_text() == "edited in the mount\n"
    assert mode(disk / "notes.txt") == 0o600
    # Mode in the mount, content on disk: disk's content taken with the workspace's mode.
    notes.chmod(0o640)
    (disk / "notes.txt").write_text("edited on disk\n")
    m.cli("sync")
    assert notes.read_text() == "edited on disk\n" and mode(notes) == 0o640
    m.cli("materialize")
    assert mode(disk / "notes.txt") == 0o640
    assert states(m)["work/notes.txt"] == ("synced", None)
    # The mode changed on both sides, differently: a conflict, neither taken.
    notes.chmod(0o644)
    (disk / "notes.txt").chmod(0o664)
    assert states(m)["work/notes.txt"] == ("conflict", "both-changed")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert [s["path"] for s in res["skipped"]] == ["notes.txt"]
    assert mode(disk / "notes.txt") == 0o664 and mode(notes) == 0o644
    # A forced materialize of the path takes the workspace's side.
    m.cli("materialize", "--force", "work/notes.txt")
    assert mode(disk / "notes.txt") == 0o644
    assert states(m)["work/notes.txt"] == ("synced", None)
    # The same conflict again, resolved toward disk by a path sync.
    notes.chmod(0o600)
    (disk / "notes.txt").chmod(0o640)
    assert states(m)["work/notes.txt"] == ("conflict", "both-changed")
    m.cli("sync", "work/notes.txt")
    assert mode(notes) == 0o640 and states(m)["work/notes.txt"] == ("synced", None)


def test_set_id_bits_are_not_carried(repo):
    """Only the permission bits travel: a setuid bit from the workspace never reaches disk."""
    m, disk = repo
    (m.work / "run.sh").chmod(0o4755)
    m.cli("sync")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert res["written"] == [] and mode(disk / "run.sh") == 0o755
    (m.work / "new.sh").write_bytes(SCRIPT)
    (m.work / "new.sh").chmod(0o2750)
    m.cli("materialize")
    assert mode(disk / "new.sh") == 0o750


def test_hard_links_fifos_and_sockets_on_disk_stay_disk_only(repo):
    m, disk = repo
    os.link(disk / "notes.txt", disk / "twin.txt")  # both names now have two links
    (disk / "solo.txt").write_text("solo\n")
    os.link(disk / "solo.txt", disk / "solo-link.txt")
    os.mkfifo(disk / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(disk / "sock"))
    try:
        listed = states(m)  # would block on the FIFO if it were opened
        assert listed["work/twin.txt"] == ("disk-only", None)
        assert listed["work/solo.txt"] == ("disk-only", None)
        assert listed["work/pipe"] == ("disk-only", None)
        assert listed["work/sock"] == ("disk-only", None)
        assert listed["work/notes.txt"] == ("synced", None)  # tracked before it was linked
        entries = {e["path"]: e for e in m.cli_json("ls", "--states")["mounts"][0]["entries"]}
        assert entries["pipe"]["mime"] == "inode/fifo"
        assert entries["sock"]["mime"] == "inode/socket"
        assert (m.work / "twin.txt").read_text() == "notes\n"  # read from disk, read-only
        with pytest.raises(OSError) as exc:
            (m.work / "twin.txt").write_text("x")
        assert exc.value.errno == errno.EROFS
        assert "pipe" not in os.listdir(m.work)  # listed, never shown (opening would block)
        # The tracked, linked file is never written through: the other name keeps its bytes.
        (m.work / "notes.txt").write_text("draft\n")
        res = m.cli_json("materialize")["mounts"]["work"]
        assert res["written"] == [] and "hard links" in res["skipped"][0]["reason"]
        assert (disk / "twin.txt").read_text() == "notes\n"
    finally:
        sock.close()


def test_a_hard_link_made_in_the_mount_is_listed_as_not_writable(repo):
    m, disk = repo
    os.link(m.work / "notes.txt", m.work / "linked.txt")  # hard links exist (issue 12)
    res = m.cli_json("materialize")["mounts"]["work"]
    reasons = {s["path"]: s for s in res["skipped"]}
    assert reasons["linked.txt"]["state"] == "not-writable"
    assert "hard link" in reasons["linked.txt"]["reason"]
    assert not (disk / "linked.txt").exists()
    sh(f"mkfifo {m.work}/fifo")
    res = m.cli_json("materialize", "--force", "work/fifo")["mounts"]["work"]
    assert [s["state"] for s in res["skipped"]] == ["not-writable"]
    assert not (disk / "fifo").exists()


def test_ls_states_lists_what_no_materialize_writes(repo):
    """A FIFO made in the mount was in no `ls --states` listing at all (the rule decides
    files only), though materialize names it `not-writable`: the listing says the same,
    with the reason, and a hard-linked file keeps its state with the reason beside it."""
    m, disk = repo
    sh(f"mkfifo {m.work}/fifo")
    os.link(m.work / "notes.txt", m.work / "linked.txt")
    rows = {e["path"]: e for e in m.cli_json("ls", "--states", "work")["mounts"][0]["entries"]}
    assert rows["fifo"]["state"] == "not-writable", rows
    assert "a FIFO in the workspace" in rows["fifo"]["note"], rows
    assert "hard link" in rows["linked.txt"]["note"], rows
    assert rows["linked.txt"]["state"] != "not-writable", rows  # its state is the rule's
    text = m.cli("ls", "--states", "work/fifo").stdout
    assert text.startswith("not-writable") and "work/fifo (a FIFO in the workspace" in text, text
    m.cli("sync", "work/fifo")  # a scope naming a FIFO: walked into as a directory (ENOTDIR)
    assert not (disk / "fifo").exists()


def test_a_symlink_made_in_a_bound_mount_is_written_or_named(backed):
    """A symlink made in a bound mount: materialize never writes it, and nothing said so.

    Found trying memfs as a user: `ln -s README mlink` in a mount bound to a git checkout, then
    `memfs materialize` wrote every draft but the link, `memfs ls --states` did not list it (a
    FIFO or a hard link made in the mount is listed as not-writable, with the reason), and
    `memfs materialize work/mlink` answered "nothing owed". The link is silently never on disk."""
    m, disk = backed
    os.symlink("a.txt", m.work / "mlink")
    res = m.cli_json("materialize")["mounts"]["work"]
    written = set(res["written"])
    skipped = {s["path"]: s for s in res["skipped"]}
    on_disk = os.path.islink(disk / "mlink")
    # Either the link reaches disk, or materialize names it (as it does a FIFO or hard link).
    assert on_disk or "mlink" in skipped, (res, written)
    rows = {e["path"]: e for e in m.cli_json("ls", "--states", "work")["mounts"][0]["entries"]}
    if not on_disk:
        assert "mlink" in rows, f"ls --states does not list the unwritten symlink: {sorted(rows)}"
        assert rows["mlink"]["state"] == "not-writable", rows["mlink"]
    text = m.cli("materialize", "work/mlink").stdout
    assert on_disk or "nothing owed" not in text, text


def test_a_private_directory_on_disk_stays_private_in_the_mount(backed):
    """A 0700 directory on disk (keys, a private checkout) is made 0755 in the mount, whose
    files keep their 0644: on a mount with allow_other (every mount made by root) other users
    read what disk kept from them."""
    m, disk = backed
    (disk / "private").mkdir(mode=0o700)
    (disk / "private" / "key.txt").write_text("secret\n")
    (disk / "private" / "key.txt").chmod(0o644)
    m.cli("sync")
    assert (m.work / "private" / "key.txt").read_text() == "secret\n"
    assert mode(m.work / "private") == 0o700


def test_nested_private_directories_on_disk_keep_their_modes_in_the_mount(backed):
    """Each directory a take-in makes gets disk's bits, at every depth, whether a whole pass
    or a path sync (which opens the parents without walking them) takes the file in."""
    m, disk = backed
    (disk / "outer" / "inner").mkdir(parents=True)
    (disk / "outer").chmod(0o750)
    (disk / "outer" / "inner").chmod(0o700)
    (disk / "outer" / "inner" / "key.txt").write_text("secret\n")
    (disk / "shared").mkdir()
    (disk / "shared").chmod(0o775)  # wider than the daemon's umask makes: disk's, exactly
    (disk / "shared" / "f.txt").write_text("f\n")
    m.cli("sync")
    assert (m.work / "outer" / "inner" / "key.txt").read_text() == "secret\n"
    assert mode(m.work / "outer") == 0o750
    assert mode(m.work / "outer" / "inner") == 0o700
    assert mode(m.work / "shared") == 0o775
    (disk / "p1" / "p2").mkdir(parents=True)
    (disk / "p1").chmod(0o700)
    (disk / "p1" / "p2").chmod(0o710)
    (disk / "p1" / "p2" / "k.txt").write_text("k\n")
    m.cli("sync", "work/p1/p2/k.txt")
    assert (m.work / "p1" / "p2" / "k.txt").read_text() == "k\n"
    assert mode(m.work / "p1") == 0o700 and mode(m.work / "p1" / "p2") == 0o710


def test_a_private_directory_made_in_the_mount_stays_private_on_disk(backed):
    """The reverse: directories materialize makes on disk get the workspace's bits (exactly,
    whatever the daemon's umask; no set-id bit), never the umask's 0755."""
    m, disk = backed
    (m.work / "keys" / "deep").mkdir(parents=True)
    (m.work / "keys").chmod(0o700)
    (m.work / "keys" / "deep").chmod(0o750)
    (m.work / "keys" / "deep" / "id.txt").write_text("secret\n")
    (m.work / "keys" / "deep" / "id.txt").chmod(0o644)
    (m.work / "team").mkdir()
    (m.work / "team").chmod(0o2775)  # group-shared: the bits travel, the set-gid bit not
    (m.work / "team" / "notes.txt").write_text("n\n")
    res = m.cli_json("materialize")["mounts"]["work"]
    assert sorted(res["written"]) == ["keys/deep/id.txt", "team/notes.txt"], res
    assert (disk / "keys" / "deep" / "id.txt").read_text() == "secret\n"
    assert mode(disk / "keys") == 0o700
    assert mode(disk / "keys" / "deep") == 0o750
    assert mode(disk / "team") == 0o775
    assert mode(disk / "keys" / "deep" / "id.txt") == 0o644
    # A directory disk already has keeps its mode (a later chmod is not carried: a limit),
    # and one made in a set-gid directory of disk's keeps the bit the kernel gives it (a
    # group-shared tree stays shared).
    (disk / "sub").chmod(0o2711)
    (m.work / "sub" / "new.txt").write_text("new\n")
    (m.work / "sub" / "grp").mkdir(mode=0o750)
    (m.work / "sub" / "grp" / "g.txt").write_text("g\n")
    m.cli("materialize")
    assert mode(disk / "sub") == 0o2711
    assert mode(disk / "sub" / "grp") == 0o2750


def test_a_private_disk_only_file_is_not_readable_by_others_in_the_mount(backed):
    """A disk-only file (binary: shown from disk, never taken in) was shown 0444 whatever
    disk's mode: a 0600 keystore was readable by every user of an allow_other mount, memfs
    reading disk for them. It shows disk's read bits; a chmod on disk shows at the next pass."""
    m, disk = backed
    (disk / "store.p12").write_bytes(b"\x00\x01binary secret\x00")
    (disk / "store.p12").chmod(0o600)
    m.cli("sync")
    assert states(m)["work/store.p12"] == ("disk-only", None)
    assert mode(m.work / "store.p12") == 0o400
    assert (m.work / "store.p12").read_bytes() == b"\x00\x01binary secret\x00"
    (disk / "store.p12").chmod(0o644)
    m.cli("sync")
    assert mode(m.work / "store.p12") == 0o444


def test_a_hard_linked_draft_is_not_carried_not_owed(repo):
    """A hard link made in a bound mount (`cp -a`, `tar -x` there) is a draft no materialize
    writes (it refuses hard links, forced or not), yet status counted it in "disk owes" for
    good: `memfs materialize` ran, and disk still owed it. Status says it apart, not carried,
    and an edit of the linked file is not owed either; the listing keeps the rule's state."""
    m, disk = repo
    sh(f"cd {m.work} && mkdir tree && echo t > tree/a && ln tree/a tree/b && "
       f"cp -a tree copied")
    m.cli("materialize")
    st = m.status()["backing"]["work"]
    assert st["owed"]["changes"] == 0, st["owed"]
    assert st["not_carried"] == 4, st  # tree/a, tree/b, copied/a, copied/b
    text = m.cli("status").stdout
    assert "disk owes 0 change(s)" in text and \
        "not carried: 4 change(s) no materialize writes (hard links," in text, text
    rows = {e["path"]: e for e in m.cli_json("ls", "--states", "work")["mounts"][0]["entries"]}
    assert rows["tree/b"]["state"] == "workspace-draft" and "hard link" in rows["tree/b"]["note"]
    assert not (disk / "tree").exists()
    # A plain file is still owed, and a file that gets a second name leaves "owed".
    (m.work / "notes.txt").write_text("edited\n")
    assert m.status()["backing"]["work"]["owed"]["changes"] == 1
    os.link(m.work / "notes.txt", m.work / "notes-twin.txt")
    st = m.status()["backing"]["work"]
    assert st["owed"]["changes"] == 0 and st["not_carried"] == 6, st


def test_attach_makes_the_mount_directory_with_the_backing_roots_bits(mounted, tmp_path: Path):
    """`memfs attach p D` with no `p` in the mount makes it with D's bits: a 0750 project
    directory is not 0755 in the mount."""
    mounted.require_real()
    disk = tmp_path / "proj"
    (disk / "private").mkdir(parents=True)
    (disk / "private" / "k.txt").write_text("k\n")
    (disk / "private").chmod(0o700)
    disk.chmod(0o750)
    mounted.cli("attach", "proj", str(disk), "--watch", "off")
    assert mode(mounted.mnt / "proj") == 0o750
    assert mode(mounted.mnt / "proj" / "private") == 0o700
    assert (mounted.mnt / "proj" / "private" / "k.txt").read_text() == "k\n"
