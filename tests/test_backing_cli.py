"""attach, sync and ls --states as a user meets them (from a user trial): remedies that fit the
case, what a pass left and why, a path sync after an undone attach. Real mounts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers.mount import memfs_cmd

pytestmark = pytest.mark.mount


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
    # In a mount that is not bound, a store path naming it gets no `here/` prefix: the remedy
    # said "paths go from the store root: work/work/nope" for `memfs sync work/nope` in MNT/work
    res = subprocess.run(memfs_cmd(mounted.root, "sync", "work/nope"), capture_output=True,
                         text=True, cwd=mounted.work, timeout=60)
    assert res.returncode == 1 and "mount 'work' is not bound" in res.stderr, res.stderr
    assert "work/work" not in res.stderr, res.stderr
    ok = subprocess.run(memfs_cmd(mounted.root, "ls", "--states", f"{here}/sub"),
                        capture_output=True, text=True, cwd=here, timeout=60)
    assert ok.returncode == 0 and "synced" in ok.stdout and "p/sub/s.txt" in ok.stdout, ok


def test_a_path_that_names_nothing_is_refused(mounted, tmp_path: Path) -> None:
    """`memfs sync p/typo.txt` said 'p: 0 taken, 0 removed, 0 new conflict(s)' and exit 0,
    and `ls --states p/typo.txt` '(nothing)': a mistyped name looked in step. Both refuse
    (exit 1, the name and where it was looked for); a name on one side only, an empty
    directory and a file deleted on disk still sync."""
    mounted.require_real()
    proj = tmp_path / "proj"
    (proj / "empty").mkdir(parents=True)
    (proj / "a.txt").write_text("a\n")
    (proj / "gone.txt").write_text("g\n")
    mounted.cli("attach", "p", str(proj))
    for verb in (["sync"], ["ls", "--states"]):
        res = mounted.cli(*verb, "p/typo.txt", check=False)
        assert res.returncode == 1, (verb, res.stdout, res.stderr)
        assert "p/typo.txt: no such file or directory" in res.stderr, res.stderr
        assert str(proj / "typo.txt") in res.stderr and "memfs ls --states p" in res.stderr
    assert not (mounted.mnt / "p" / "typo.txt").exists() and not (proj / "typo.txt").exists()
    assert mounted.cli("sync", "p/empty").returncode == 0
    (proj / "new.txt").write_text("n\n")
    assert mounted.cli_json("sync", "p/new.txt")["mounts"]["p"]["taken"] == ["new.txt"]
    (proj / "gone.txt").unlink()
    assert mounted.cli_json("sync", "p/gone.txt")["mounts"]["p"]["removed"] == ["gone.txt"]
    assert not (mounted.mnt / "p" / "gone.txt").exists()


def test_a_first_pass_that_fails_leaves_the_daemon_serving(mount_factory, tmp_path: Path) -> None:
    """An I/O error in a backed mount's first pass at start (a failing disk's EIO, injected
    by the pass-fault hook) ended the daemon: the whole mount went away for one unreadable
    directory. Now the mount serves, status names the failed pass with where to look, and
    once the disk answers `memfs sync` takes disk's file in."""
    from memfs.testing import PASS_FAULT_ENV

    trigger = tmp_path / "pass-fault"
    m = mount_factory(env={PASS_FAULT_ENV: str(trigger)})
    m.require_real()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    m.cli("attach", "p", str(proj))
    m.umount()
    (proj / "late.txt").write_text("late\n")
    trigger.touch()
    m.start()
    (m.work / "still.txt").write_text("serving\n")  # the mount is up and writable
    st = m.cli_json("status")
    assert "Input/output error (injected)" in (st["backing"]["p"]["last_error"] or ""), st
    assert m.proc is not None and m.proc.poll() is None
    res = m.cli("sync", check=False)
    assert res.returncode == 1 and "check the disk that holds" in res.stdout + res.stderr
    trigger.unlink()
    assert m.cli_json("sync")["mounts"]["p"]["taken"] == ["late.txt"]
    assert (m.mnt / "p" / "late.txt").read_text() == "late\n"


def test_attach_of_a_directory_another_mount_is_bound_to_is_refused(backed):
    """`memfs attach B DIR` of a directory mount A is bound to was accepted.

    Found trying memfs as a user (a slip of the mount's name): `memfs attach work ~/proj` while
    `proj` was bound to ~/proj answered "work is bound to ~/proj", took the checkout's files into
    `work` beside everything it held, and left two mounts whose materializes both write ~/proj.
    Attaching one mount to another directory is refused ("already bound to ..., memfs detach
    first"); the same directory under a second mount is not. Bad input should change nothing."""
    m, disk = backed
    (m.mnt / "other").mkdir()
    (m.mnt / "other" / "mine.txt").write_text("mine\n")
    out = m.cli("attach", "other", str(disk), check=False)
    taken = sorted(p.name for p in (m.mnt / "other").iterdir())
    assert out.returncode != 0, (
        f"a second mount bound to {disk} (already bound to work): {out.stdout}{out.stderr}; "
        f"`other` now holds {taken}")
    assert "work" in out.stderr, out.stderr  # names the mount that has the directory
    assert taken == ["mine.txt"]


def test_materialize_of_a_path_naming_nothing_is_refused_like_sync(backed):
    """`memfs materialize PATH` of a path that names nothing answered "nothing owed", exit 0.

    Found trying memfs as a user: a typo (`memfs materialize work/a.tx`) reads as success, while
    `memfs sync work/a.tx` and `memfs ls --states work/a.tx` refuse the same path (exit 1, "no
    such file or directory, on disk ... or in the workspace — check the name"), as docs/cli.md
    says a path naming nothing is refused."""
    m, _disk = backed
    sync = m.cli("sync", "work/a.tx", check=False)
    assert sync.returncode == 1 and "check the name" in sync.stderr, sync
    out = m.cli("materialize", "work/a.tx", check=False)
    assert out.returncode != 0, f"materialize of a typo answered {out.stdout!r}"
    assert "a.tx" in out.stderr and "check the name" in out.stderr, out.stderr


def test_the_remedy_for_a_disk_symlink_fits_a_symlink(backed):
    """The remedy materialize gave for a path that is a symlink on disk said "make the path
    readable", which does not fit: the path is readable, it is a symlink memfs does not follow.

    Found trying memfs as a user: a checkout with `link -> run.sh`; `link` is not in the mount
    (an incomplete region, "symlink (following is off)"); writing a file `link` in the mount,
    `memfs materialize` answers `skipped work/link (unverified): disk unknown: symlink (following
    is off) — make the path readable (or fix the branch intent with a sync of the path), then
    materialize again`. chmod cannot help; the remedies that fit are removing or renaming the
    disk symlink, `--follow-symlinks` at attach, or another name in the mount."""
    m, disk = backed
    os.symlink("a.txt", disk / "link")
    m.cli("sync")
    (m.work / "link").write_text("a file where disk has a symlink\n")
    res = m.cli_json("materialize")["mounts"]["work"]
    skipped = {s["path"]: s for s in res["skipped"]}
    assert "link" in skipped, res
    assert os.path.islink(disk / "link")  # disk's link is kept: right
    remedy = skipped["link"]["remedy"]
    assert "readable" not in remedy and "symlink" in remedy, remedy


def test_attach_inside_or_around_a_bound_directory_is_refused(backed, tmp_path: Path) -> None:
    """Beside the same directory: one inside a bound one, or one holding it, would put the
    same disk files in two mounts; refused with the mount named, nothing bound."""
    m, disk = backed
    inner = tmp_path / "outer" / "inner"
    inner.mkdir(parents=True)
    m.cli("attach", "inner", str(inner))
    for d, mount in ((disk / "sub", "work"), (inner.parent, "inner")):
        out = m.cli("attach", "other", str(d), check=False)
        assert out.returncode == 1, out.stdout
        assert f"which mount '{mount}' is bound to" in out.stderr, out.stderr
        assert f"memfs detach {mount}" in out.stderr, out.stderr
    assert sorted(m.cli_json("status")["backing"]) == ["inner", "work"]


def test_umount_says_which_backing_directory_is_behind(backed):
    """`memfs umount` said "everything was committed" while a draft written in a bound mount
    was in the store only: its backing directory did not have it, and once unmounted
    `memfs status` listed no binding at all, so nothing said disk was behind.

    Found trying memfs as a user: a new file in the mount, `memfs umount`, then looking for it
    in the project directory. The unmount now names each directory that is behind, what it
    owes and the remedy; status without a daemon lists each binding as not reconciled."""
    m, disk = backed
    (m.work / "draft.txt").write_text("only in the mount\n")
    out = m.umount()
    assert "everything was committed" in out.stdout, out.stdout
    assert f"{disk} is behind work: disk owes 1 change(s)" in out.stdout, out.stdout
    assert "memfs materialize work" in out.stdout, out.stdout
    assert not (disk / "draft.txt").exists()
    st = m.cli("status")
    assert f"backed   work -> {disk} (not mounted: not reconciled" in st.stdout, st.stdout
    assert json.loads(m.cli("status", "--json").stdout)["backing"]["work"]["unmounted"]


def test_the_umount_note_names_a_remedy_that_writes_a_workspace_deletion(backed):
    """The unmount's note said a deletion made in the mount is written out by `memfs mount`,
    then `memfs materialize work`; a bare materialize leaves it (`left work/b.txt ...
    --apply-deletions removes it`), so disk stayed behind and the next unmount said the same.
    The command the note names is run here as the user would run it."""
    m, disk = backed
    (m.work / "b.txt").unlink()
    note = [ln for ln in m.umount().stdout.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "1 deletion(s)" in note[0], note
    named = re.findall(r"`(memfs materialize[^`]*)`", note[0])
    assert len(named) == 1, note
    m.remount()
    m.cli(*named[0].split()[1:])
    assert not (disk / "b.txt").exists(), f"{named[0]} left disk behind"
    assert "note:" not in m.umount().stdout


def test_the_umount_note_does_not_tell_a_bare_materialize_to_write_a_conflict(backed):
    """A conflict is sticky until a path sync (disk's side) or a forced materialize of the
    path (the workspace's): the note's remedy for it must name those, not the bare
    materialize that skips it."""
    m, disk = backed
    (m.work / "a.txt").write_text("edited in the mount\n")
    (disk / "a.txt").write_text("edited on disk\n")
    m.cli("sync")
    note = [ln for ln in m.umount().stdout.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "1 conflict(s)" in note[0], note
    assert "--force" in note[0] and "memfs sync" in note[0], note


def test_status_does_not_call_a_starting_daemons_bindings_not_mounted(backed):
    """Without an answer on the control socket, status lists the bindings from the store. A
    process that holds the daemon lock and has no socket yet is a daemon starting (the lock
    is taken before the store is opened and the socket made): its mount may be up, so
    "not mounted ... until `memfs mount`" was untrue and its remedy refused (a second mount
    of the root). A real process holding the real lock stands in for that window."""
    m, disk = backed
    m.umount()
    holder = subprocess.Popen(["flock", "-x", str(m.root / "daemon.lock"), "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while "holds the store" not in (st := m.cli("status").stdout):
            assert time.monotonic() < deadline, st
            time.sleep(0.05)
        assert "not mounted" not in st and "does not answer" in st, st
    finally:
        holder.kill()
        holder.wait()


def _history(m) -> tuple[str, int]:
    """(the branch head, how many commits `memfs log` lists): what a listing must not move."""
    log = m.cli_json("log", "-n", "0")
    return m.cli_json("status")["head"], len(log["commits"] if isinstance(log, dict) else log)


def test_ls_states_writes_no_history_with_the_daemon_dead_or_alive(backed):
    """A user trial saw `memfs ls --states` without a daemon make a commit. It makes none of its
    own: with disk unchanged the head and the commit count stay put, alive, after `memfs
    umount` and after a SIGKILL. The one commit a listing can lead to is disk's change taken in
    by its observation ("reconciler: disk changes in work"), as the daemon's listing takes it
    (docs/reconciliation.md, "States"): the same commit, dead or alive."""
    m, disk = backed
    for step in ("alive", "umount", "kill"):
        if step == "umount":
            m.umount()
        elif step == "kill":
            m.remount()
            m.kill()
        before = _history(m)
        for _ in range(2):
            m.cli("ls", "--states")
            m.cli("ls", "--states", "work/sub")
        if step == "alive":
            m.cli("sync")  # nothing on disk changed: nothing to commit either
        assert _history(m) == before, step
    taken = []
    for step in ("dead", "alive"):
        if step == "alive":
            m.remount()
        (disk / "a.txt").write_text(f"a changed on disk while {step}\n")
        _, count = _history(m)
        m.cli("ls", "--states")
        assert _history(m)[1] == count + 1, step
        assert m.cli("show", "HEAD:work/a.txt").stdout == f"a changed on disk while {step}\n"
        top = m.cli("log", "-n", "1", "--paths").stdout.splitlines()
        taken.append([top[0].split("  ", 2)[2], *top[1:]])  # without its id and time
    assert taken[0] == taken[1] and "work/a.txt" in " ".join(taken[0]), taken


def test_ls_states_lists_a_disk_symlink_as_a_link_not_a_directory(backed):
    """`ls --states` printed every incomplete region with a trailing slash, so a disk symlink
    (not followed) read as a directory: `work/link/ (symlink (following is off))`. It marks
    them as `ls -F` does: a symlink `name@`, a directory `name/` (`.git`, ignored), and says
    which in --json (`kind`)."""
    m, disk = backed
    os.symlink("a.txt", disk / "link")
    os.symlink("sub", disk / "dirlink")
    os.symlink("nowhere", disk / "dangling")
    (disk / ".git").mkdir()
    (disk / "sub" / ".git").write_text("gitdir: ../.git/worktrees/sub\n")  # a worktree's file
    native = subprocess.run(["ls", "-AF", str(disk)], capture_output=True, text=True,
                            check=True).stdout.split()
    assert {"link@", "dirlink@", "dangling@", ".git/"} <= set(native)
    out = m.cli("ls", "--states").stdout
    incomplete = {line.split()[1] for line in out.splitlines() if line.startswith("incomplete")}
    assert incomplete == {"work/link@", "work/dirlink@", "work/dangling@", "work/.git/",
                          "work/sub/.git"}, out
    regions = {r["path"]: r["kind"] for r in m.cli_json("ls", "--states")["mounts"][0]["regions"]}
    assert regions == {"link": "symlink", "dirlink": "symlink", "dangling": "symlink",
                       ".git": "dir", "sub/.git": ""}, regions
    status = {r["path"]: r["kind"] for r in m.cli_json("status")["backing"]["work"]["regions"]}
    assert status == regions
