"""Surprises from a third user trial, each through a real mount and real processes."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from helpers.mount import REPO, force_unmount, memfs_cmd

from memfs.store.space import size_text

pytestmark = pytest.mark.mount


def job(cwd: Path, *cmd: str) -> None:
    """One command in a process group of its own, as a shell with job control starts it:
    its own operation for `memfs undo`."""
    out = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=60,
                         process_group=0)
    assert out.returncode == 0, f"{cmd}: {out.stderr}"


def test_history_tools_see_a_hard_linked_file(mounted) -> None:
    """A file with a second name lives in the commit's inode table (git makes every object
    that way: link the temporary file, unlink it). log --stat, diff, show and undo read the
    file's bytes and changes through that table, as the mount shows them: a write through
    one name is a content change of both names, never "changing only times"."""
    mounted.require_real()
    hl = mounted.work / "hl"
    hl.mkdir()
    job(hl, "sh", "-c", "echo one > f")
    job(hl, "ln", "f", "g")
    job(hl, "sh", "-c", "echo two >> f")
    stat = mounted.cli("log", "--stat", "-n", "1").stdout
    assert "M  work/hl/f  4 B -> 8 B" in stat, stat
    assert "M  work/hl/g  4 B -> 8 B" in stat, stat
    linked = mounted.cli("log", "--stat", "-n", "1", "HEAD~1").stdout
    assert "A  work/hl/g  4 B" in linked and "D  work/hl/f" not in linked, linked
    diff = mounted.cli("diff").stdout
    assert "diff a/work/hl/f b/work/hl/f\n--- a/work/hl/f\n+++ b/work/hl/f\n" in diff, diff
    assert "+two\n" in diff and "'h' entry" not in diff, diff
    assert mounted.cli("show", "HEAD:work/hl/g").stdout == "one\ntwo\n"
    listing = mounted.cli("show", "HEAD:work/hl").stdout
    assert "-0644           8  f" in listing and "h0000" not in listing, listing
    undo = mounted.cli("undo").stdout
    assert "echo two >> f" in undo and "changing only times" not in undo, undo
    assert (hl / "f").read_text() == "one\n"
    assert (hl / "g").stat().st_ino == (hl / "f").stat().st_ino  # `ln` stays: its own operation
    # A name in a directory the write did not change is still a changed name: here hl/
    # changes too (a new file), so a diff that stopped at the names it read would miss it.
    (mounted.work / "other").mkdir()
    job(mounted.work, "ln", "hl/f", "other/h")
    job(hl, "sh", "-c", "echo new > new.txt; echo three >> f")
    stat = mounted.cli("log", "--stat", "-n", "1").stdout
    for name in ("hl/f", "hl/g", "other/h"):
        assert f"M  work/{name}  4 B -> 10 B" in stat, stat
    assert "A  work/hl/new.txt  4 B" in stat, stat
    assert "changing only times" not in mounted.cli("undo").stdout
    assert (mounted.work / "other" / "h").read_text() == "one\n"


def test_a_dry_run_says_how_much_it_would_give_back(mounted) -> None:
    """`memfs gc --dry-run` is how a user asks what a run would give back: it says the bytes
    (what `memfs du` calls reclaimable), in the conditional, and claims nothing was freed."""
    mounted.require_real()
    (mounted.work / "gone").write_bytes(os.urandom(3 << 20))
    mounted.cli("mark", "written")
    (mounted.work / "gone").unlink()
    mounted.cli("mark", "removed")
    for key in ("keep-all", "keep-hourly", "keep-daily", "keep-reflog"):
        mounted.cli("config", key, "0")
    reclaimable = mounted.cli_json("du")["reclaimable"]
    assert reclaimable >= 3 << 20
    text = mounted.cli("gc", "--dry-run").stdout
    assert f"would give back {size_text(reclaimable)}" in text, text
    assert "freed" not in text and "gave back" not in text and "punched" not in text, text
    assert mounted.cli_json("du")["reclaimable"] == reclaimable, "the dry run changed the store"


def test_undo_to_something_neither_says_both_forms(mounted) -> None:
    """`memfs undo --to` takes a time or a revision: text that is neither gets a remedy
    naming both (it named only revisions, so a mistyped time was never explained); a
    revision's own refusal (`HEAD~N` past the first commit) keeps its remedy."""
    mounted.require_real()
    (mounted.work / "f").write_text("x")
    head = mounted.cli_json("log", "-n", "1")[0]["id"]
    bad = mounted.cli("undo", "--to", "99:99", check=False)
    assert bad.returncode == 1 and "'99:99' is neither a revision nor a time" in bad.stderr
    assert "10:32" in bad.stderr and "branch" in bad.stderr, bad.stderr
    far = mounted.cli("undo", "--to", "HEAD~100000", check=False)
    assert far.returncode == 1 and "use a smaller N" in far.stderr, far.stderr
    assert mounted.cli_json("log", "-n", "1")[0]["id"] == head, "a refusal moved the head"


def test_attach_names_what_is_wrong_with_the_directory(mounted, tmp_path: Path) -> None:
    """A file is not 'not existing' (the remedy said 'create it'), and a missing directory
    gets the command that creates it; neither refusal binds anything."""
    mounted.require_real()
    f = tmp_path / "project" / "README.md"
    f.parent.mkdir()
    f.write_text("hi")
    res = mounted.cli("attach", "proj", str(f), check=False)
    assert res.returncode == 1 and f"'{f}' is not a directory" in res.stderr, res.stderr
    assert "create it" not in res.stderr and "not a file in it" in res.stderr, res.stderr
    gone = tmp_path / "no such dir"
    res = mounted.cli("attach", "proj", str(gone), check=False)
    assert res.returncode == 1 and "does not exist" in res.stderr, res.stderr
    assert f"mkdir -p '{gone}'" in res.stderr, res.stderr
    assert mounted.cli_json("status")["backing"] == {}


def test_restoring_from_a_view_keeps_the_modes(mounted, tmp_path: Path) -> None:
    """The history views are read-only by refusing writes (EROFS), as a snapshot directory
    is: they show each entry's own mode. Stripping the write bits made `cp -a` (or `rsync -a`)
    from a checkpoint back into the live tree turn every file and directory read-only, and a
    plain `cp` of one file made a 0444 copy."""
    mounted.require_real()
    w = mounted.work
    (w / "src").mkdir()
    (w / "src" / "a.txt").write_text("a\n")
    (w / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (w / "run.sh").chmod(0o755)
    (w / "secret").write_text("s\n")
    (w / "secret").chmod(0o600)
    mounted.cli("checkpoint", "create", "good")
    view = mounted.mnt / ".memfs" / "checkpoints" / "good" / "work"
    modes = {p: (w / p).stat().st_mode for p in ("src", "src/a.txt", "run.sh", "secret")}
    assert {p: (view / p).stat().st_mode for p in modes} == modes
    with pytest.raises(OSError) as err:
        (view / "src" / "a.txt").write_text("no")
    assert err.value.errno == 30  # EROFS: the view refuses, whatever the mode says
    out = tmp_path / "restored"
    subprocess.run(["cp", "-a", str(view), str(out)], check=True, timeout=60)
    subprocess.run(["cp", str(view / "src" / "a.txt"), str(tmp_path / "one.txt")], check=True,
                   timeout=60)
    assert {p: (out / p).stat().st_mode for p in modes} == modes
    assert (tmp_path / "one.txt").stat().st_mode & 0o777 == 0o644 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_path_sync_after_undoing_the_attach_takes_disk(mounted, tmp_path: Path) -> None:
    """`memfs undo` right after `memfs attach` takes the take-in back, mount directory and
    all; the binding stays and lists disk's files not-in-branch. `memfs sync MOUNT/PATH`
    takes disk there (docs/cli.md): it planned the take, then skipped it because the mount's
    directory was gone, and said '0 taken' with no reason."""
    mounted.require_real()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "important.txt").write_text("keep me\n")
    mounted.cli("attach", "p2", str(proj))
    mounted.cli("undo")
    assert not (mounted.mnt / "p2").exists()
    states = mounted.cli("ls", "--states", "p2").stdout
    assert "not-in-branch" in states and "p2/important.txt" in states, states
    res = mounted.cli_json("sync", "p2/important.txt")["mounts"]["p2"]
    assert res["taken"] == ["important.txt"] and res["skipped"] == [], res
    assert (mounted.mnt / "p2" / "important.txt").read_text() == "keep me\n"
    assert "synced" in mounted.cli("ls", "--states", "p2/important.txt").stdout
    assert (proj / "important.txt").read_text() == "keep me\n"


def test_sync_says_what_it_left_for_a_writer(mounted, tmp_path: Path) -> None:
    """A path sync that cannot take disk's file because the mount has it open for writing
    said '0 taken, 0 removed, 0 new conflict(s)', as if disk had nothing new: the path it
    left (only under --json) is named, with what to do."""
    mounted.require_real()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "f.txt").write_text("one\n")
    mounted.cli("attach", "p", str(proj))
    with open(mounted.mnt / "p" / "f.txt", "a"):
        (proj / "f.txt").write_text("disk's\n")
        text = mounted.cli("sync", "p/f.txt").stdout
        assert "not taken this pass: f.txt" in text and "sync again" in text, text
    text = mounted.cli("sync", "p/f.txt").stdout
    assert text.startswith("p: 1 taken") and "not taken" not in text, text
    assert (mounted.mnt / "p" / "f.txt").read_text() == "disk's\n"


def test_attach_says_which_regions_it_left_out_and_why(mounted, tmp_path: Path) -> None:
    """Attaching a copy of a git repository said '1 incomplete region(s)' and nothing more:
    the summary names each region with its reason (a few, then how many more)."""
    mounted.require_real()
    proj = tmp_path / "repo"
    proj.mkdir()
    subprocess.run(["git", "init", "-q", str(proj)], check=True, timeout=60)
    (proj / "a.txt").write_text("a\n")
    (proj / "dangling").symlink_to("nowhere")
    text = mounted.cli("attach", "r", str(proj)).stdout
    assert "2 incomplete region(s), not taken in: .git (vcs), dangling (symlink" in text, text
    assert "memfs ls --states" in text, text


def test_diff_and_show_name_special_files_in_words(mounted) -> None:
    """A FIFO or a socket read 'added ('p' entry)' and 'a 's' entry (no bytes to show)':
    the store's one-letter kind codes. They are named as people call them."""
    mounted.require_real()
    d = mounted.work / "sp"
    d.mkdir()
    mounted.cli("mark", "before")
    os.mkfifo(d / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))
    diff = mounted.cli("diff", "before", "now").stdout
    assert "diff a/work/sp/pipe b/work/sp/pipe\nadded (a FIFO)\n" in diff, diff
    assert "diff a/work/sp/sock b/work/sp/sock\nadded (a socket)\n" in diff, diff
    assert mounted.cli("show", "HEAD:work/sp/pipe").stdout == \
        "work/sp/pipe: a FIFO (no bytes to show)\n"
    assert "'p'" not in diff and "'s'" not in diff


def test_mount_refuses_a_negative_commit_interval(tmp_path: Path) -> None:
    """`memfs mount MNT --commit-interval -5` mounted, taking the delay as 0 without a
    word: a typo is refused before anything starts, and nothing is mounted."""
    root, mnt = tmp_path / "root", tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(memfs_cmd(root, "mount", str(mnt), "--commit-interval", "-5"),
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    try:
        assert res.returncode == 2, res
        assert "--commit-interval: -5 is negative" in res.stderr, res.stderr
        assert "0 commits at once" in res.stderr, res.stderr
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)


def test_a_path_given_from_inside_a_backed_mount_gets_the_store_path(mounted, tmp_path) -> None:
    """`memfs ls --states sub` run in MNT/p answered "mount 'sub' is not bound to a backing
    directory — `memfs attach sub DIR` binds it": a remedy that would bind a new mount. The
    refusal now names the store path meant from there (p/sub) and the absolute one."""
    mounted.require_real()
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "sub" / "s.txt").write_text("s\n")
    mounted.cli("attach", "p", str(proj))
    here = mounted.mnt / "p"
    for args in (("ls", "--states", "sub"), ("sync", "sub/s.txt"), ("materialize", "sub")):
        res = subprocess.run(memfs_cmd(mounted.root, *args), capture_output=True, text=True,
                             cwd=here, timeout=60)
        assert res.returncode == 1, (args, res)
        assert "paths go from the store root: p/" in res.stderr, (args, res.stderr)
        assert f"(or {here}/" in res.stderr and "memfs attach" not in res.stderr, res.stderr
    ok = subprocess.run(memfs_cmd(mounted.root, "ls", "--states", f"{here}/sub"),
                        capture_output=True, text=True, cwd=here, timeout=60)
    assert ok.returncode == 0 and "synced" in ok.stdout and "p/sub/s.txt" in ok.stdout, ok
