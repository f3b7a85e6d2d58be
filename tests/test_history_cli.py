"""The history tools as a user meets them (from a user trial): through hard links, special
files in words, undo --to remedies, views that keep modes. Real mounts, real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.mount


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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


def test_odd_names_stay_on_their_line(mounted) -> None:
    """A file named 'a<newline>b' printed raw split its `log --stat` line in two, so one
    name read as two paths (and a diff header as three). Names with control characters,
    a quote, a backslash or a byte that is not UTF-8 are C-quoted, as git quotes them;
    plain names, spaces and non-ASCII letters are printed as they are."""
    mounted.require_real()
    d = mounted.work / "odd"
    d.mkdir()
    mounted.cli("mark", "before")
    for name in (b"a\nb", b"t\tq\"x", b"caf\xc3\xa9 au lait", b"bad\xffname"):
        (d / os.fsdecode(name)).write_bytes(b"x\n")
    stat = mounted.cli("log", "--stat", "-n", "1").stdout.splitlines()
    assert '    A  "work/odd/a\\nb"  2 B' in stat, stat
    assert '    A  "work/odd/t\\tq\\"x"  2 B' in stat, stat
    assert "    A  work/odd/café au lait  2 B" in stat, stat
    assert '    A  "work/odd/bad\\377name"  2 B' in stat, stat
    assert all(line.startswith(("    ", mounted.cli_json("log", "-n", "1")[0]["id"][:12]))
               for line in stat), stat
    diff = mounted.cli("diff", "before", "now").stdout
    assert 'diff "a/work/odd/a\\nb" "b/work/odd/a\\nb"\n--- /dev/null\n+++ "b/work/odd/a\\nb"\n' \
        in diff, diff
    listing = mounted.cli("show", "HEAD:work/odd").stdout
    assert '"a\\nb"' in listing and "\na\n" not in listing, listing


def test_checkpoint_names_refused_say_why_and_the_remedy_is_true(mounted) -> None:
    """The remedy said "use letters, digits, '-', '_'" while spaces were taken, and a name
    with ':' was made though `memfs show a:b` reads the revision 'a' and the path 'b'. A
    refusal now says what is wrong with the name and changes nothing; what the remedy offers
    (inner spaces, '.', '@') works end to end."""
    mounted.require_real()
    (mounted.work / "f.txt").write_text("one\n")
    before = mounted.cli_json("checkpoint", "list")
    for name, why in (("v1:rc", "it holds ':'"), (" v1", "starts or ends with a space"),
                      ("a/b", "it holds '/'"), ("x\x7fy", "control character"),
                      (".hidden", "starts with '.'")):
        res = mounted.cli("checkpoint", "create", name, check=False)
        assert res.returncode == 1 and why in res.stderr, (name, res.stderr)
        assert "inner spaces" in res.stderr, res.stderr
    assert mounted.cli_json("checkpoint", "list") == before
    mounted.cli("checkpoint", "create", "before demo.v2@me")
    assert mounted.cli("show", "before demo.v2@me:work/f.txt").stdout == "one\n"
    view = mounted.mnt / ".memfs" / "checkpoints" / "before demo.v2@me"
    assert (view / "work" / "f.txt").read_text() == "one\n"


def test_a_restore_names_the_way_back(mounted) -> None:
    """From a user trial: the redo `memfs undo` prints (`memfs restore X`), typed after
    another command changed files, moved the branch to X; the newer files left the tree and
    restore said only `head is now X`, so the work was findable only in the reflog. Restore
    now names the head it moved from and the command that brings it back."""
    import re

    mounted.require_real()
    w = mounted.work
    job(w, "sh", "-c", "echo one > one")
    redo = re.search(r"memfs restore ([0-9a-f]+)", mounted.cli("undo").stdout)
    assert redo
    job(w, "sh", "-c", "echo two > two")
    fd = os.open(w / "two", os.O_RDONLY)
    os.fsync(fd)  # durable: the head below holds `two`
    os.close(fd)
    before = mounted.status()["head"]
    said = mounted.cli("restore", redo.group(1)).stdout
    assert not (w / "two").exists()
    assert f"to go back: memfs restore {before[:12]}" in said, said
    mounted.cli("restore", before[:12])
    assert (w / "two").read_text() == "two\n"


def started_writer(script: str, cwd: Path, marker: str, *args: str) -> subprocess.Popen:
    """A Python writer in a process group of its own, once it made `marker` in `cwd`."""
    writer = subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd,
                              start_new_session=True)
    deadline = time.monotonic() + 20
    while not (cwd / marker).exists():
        if time.monotonic() > deadline or writer.poll() is not None:
            writer.kill()
            raise AssertionError(f"the writer never made {marker} (exit {writer.poll()})")
        time.sleep(0.01)
    return writer


# Its second write goes through a descriptor the undo cut off: ESTALE (exit 0), where a
# success (exit 4) would be a write into a file no tree names.
ORPHAN_WRITER = """
import errno, os, sys, time
f = open('w.log', 'a', buffering=1)
f.write('one\\n')
open('first-written', 'w').close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
try:
    f.write('two\\n')  # line-buffered: written at the newline
    code = 4
except OSError as exc:
    code = 0 if exc.errno == errno.ESTALE else 3
os._exit(code)  # no flush at exit: the refused line would only be refused again
"""


def test_undo_after_an_orphaned_writer_takes_back_only_the_named_command(mounted, tmp_path):
    """From a user trial: a writer that goes on writing after an undo took back its file
    made the next commands share one commit, so the next `memfs undo` took back commands it
    does not name (the orphan's write named its writer in the group, which an empty commit
    never cleared).

    Found trying memfs as a user (a dev server's log in the mount): the server writes a line,
    `memfs undo` takes it back, the server writes again through its open descriptor (then
    into the replaced file; now refused with ESTALE, docs/guarantees.md "Files open across
    an undo") and exits. Then `mkdir d` and `sh -c 'echo b >
    d/f'`, each its own process group: both land in one commit labelled
    `sh -c 'echo b > d/f' (+2 others)`, and `memfs undo` answers "undid `sh -c 'echo b > d/f'`
    (1 commit) with it, changes made at the same time by: `python …`, `mkdir d`" and `d` is gone
    too, though the writer had exited and `mkdir d` ended before `sh` started: nothing wrote at
    the same time (docs/guarantees.md: one commit holds one operation's changes then)."""
    mounted.require_real()
    w = mounted.work
    go = tmp_path / "go"  # outside the mount: the writer's signal
    writer = started_writer(ORPHAN_WRITER, w, "first-written", str(go))
    try:
        mounted.cli("undo")  # takes back the writer's w.log (and its marker)
        go.touch()
        assert writer.wait(timeout=30) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
    job(w, "mkdir", "d")
    job(w, "sh", "-c", "echo b > d/f")
    out = mounted.cli("undo").stdout
    assert not (w / "d" / "f").exists(), out
    assert (w / "d").is_dir(), f"undo took back `mkdir d` too, saying: {out}"


def bash_line(cmd: str, cwd: Path) -> None:
    """A command line as a terminal with job control runs it: a process group of its own."""
    subprocess.run(["bash", "-c", cmd], cwd=cwd, check=True, start_new_session=True,
                   timeout=60)


def test_undo_after_bash_c_takes_back_only_the_last_command(mounted):
    """From a user trial: in `bash -c 'A; B'` bash execs its last command in its own
    process, and memfs took the whole group for one operation, so `memfs undo` took back A
    with B. The top's program is now part of the group's identity.

    docs/guarantees.md ("What an operation is"): a shell at the top of its group is a runner, and
    each command it starts is one operation. Found trying memfs as a user:
    `bash -c 'echo x > n1; git add n1; git commit -qm n1'` is one operation named
    `git commit -qm n1`, and `memfs undo` (saying it undid the git commit) also removed n1 and the
    staged index. `bash -c 'echo a > a.txt; cp a.txt b.txt; true'` (nothing exec'd over the
    shell) splits as documented; the same line without `; true` does not."""
    mounted.require_real()
    w = mounted.work
    mounted.cli("mark", "before")
    bash_line("echo a > a.txt; cp a.txt b.txt; true", w)  # control: splits as documented
    mounted.cli("undo")
    assert (w / "a.txt").exists() and not (w / "b.txt").exists()
    mounted.cli("undo")
    assert not (w / "a.txt").exists()

    bash_line("echo a > a.txt; cp a.txt b.txt", w)  # bash execs cp over itself
    out = mounted.cli("undo").stdout
    assert not (w / "b.txt").exists(), out
    assert (w / "a.txt").exists(), (
        f"undo took back the shell's own `echo a > a.txt` with the exec'd `cp`: {out}")


def test_diff_names_the_extended_attributes_that_changed(mounted) -> None:
    """From a user trial: `memfs diff` said "xattrs" for an attribute change without naming
    which; it names each, added (+), removed (-) or changed (~)."""
    mounted.require_real()
    f = mounted.work / "tagged.txt"
    f.write_text("x\n")
    os.setxattr(f, "user.keep", b"1")
    os.setxattr(f, "user.drop", b"1")
    mounted.cli("mark", "before")
    os.setxattr(f, "user.keep", b"2")
    os.removexattr(f, "user.drop")
    os.setxattr(f, "user.new", b"1")
    diff = mounted.cli("diff", "before", "now").stdout
    assert "xattrs +user.new -user.drop ~user.keep" in diff, diff


RUNNING_WRITER = """
import sys, time
f = open('live.log', 'a', buffering=1)
f.write('one\\n')
open('ready', 'w').close()
time.sleep(60)
"""


def test_undo_of_a_command_still_running_says_so(mounted) -> None:
    """From a user trial: undoing a command that was still running gave no word, and what
    it wrote next through its open file went to the replaced one. The undo names it."""
    mounted.require_real()
    w = mounted.work
    writer = started_writer(RUNNING_WRITER, w, "ready")
    try:
        said = mounted.cli("undo").stdout
        assert f"(pid {writer.pid})" in said and "still running: " in said, said
        assert "stop it, and run it again" in said, said
    finally:
        writer.kill()
        writer.wait()
    job(w, "sh", "-c", "echo done > done.txt")
    assert "still running" not in mounted.cli("undo").stdout


@pytest.mark.parametrize("form", ["--commits", "--to"])
def test_undo_by_commits_or_to_a_point_names_a_command_still_running(mounted, form) -> None:
    """`memfs undo --commits N` and `undo --to REV` take back a running writer's changes as
    `memfs undo` does, but named nobody (only the undo of operations filled `procs`)."""
    mounted.require_real()
    w = mounted.work
    (w / "base.txt").write_text("base\n")
    before = mounted.cli_json("mark", "before")["commit"]
    writer = started_writer(RUNNING_WRITER, w, "ready")
    try:
        mounted.cli("sync")
        ids = [c["id"] for c in mounted.cli_json("log", "-n", "100")]
        args = ("--commits", str(ids.index(before))) if form == "--commits" else ("--to", before)
        res = mounted.cli_json("undo", *args)
        assert writer.pid in [pid for pid, _comm in res["procs"]], res
        mounted.cli("restore", res["old_head"])
        said = mounted.cli("undo", *args).stdout
        assert f"(pid {writer.pid})" in said and "still running: " in said, said
    finally:
        writer.kill()
        writer.wait()


def test_one_file_back_from_history_and_revision_typos(mounted) -> None:
    """Found in a user trial: `memfs restore first:work/a.txt` (the spelling `show` takes)
    said "unknown revision 'first:work/a.txt'" though `first` exists, and nothing told how to
    take back one file; `HEAD~1~1` and `HEAD~x` crashed every history command with a
    ValueError traceback, and `HEAD~` read as HEAD (git reads it as HEAD~1); a 4-digit commit
    prefix got "name a branch, a checkpoint or a commit id" with no word of the 6 digits."""
    mounted.require_real()
    w = mounted.work
    job(w, "sh", "-c", "echo one > a.txt")
    mounted.cli("checkpoint", "create", "first")
    job(w, "sh", "-c", "echo two > a.txt")
    job(w, "sh", "-c", "echo three > b.txt")
    head = mounted.cli_json("log", "-n", "1")[0]["id"]
    out = mounted.cli("restore", "first:work/a.txt", check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert ("memfs restore moves the whole branch to a revision; 'first:work/a.txt' names one "
            "file — to take back one file, copy it out of the read-only history: cp -p "
            "MNT/.memfs/history/ID/work/a.txt MNT/work/a.txt (ID: `memfs log -n 1 first`)"
            ) in out.stderr, out.stderr
    assert mounted.cli_json("log", "-n", "1")[0]["id"] == head, "a refusal moved the head"
    # The remedy works as written, and the copy is one operation undo takes back.
    cid = mounted.cli("log", "-n", "1", "first").stdout.split()[0]
    job(w, "cp", "-p", str(mounted.mnt / ".memfs" / "history" / cid / "work" / "a.txt"),
        str(w / "a.txt"))
    assert (w / "a.txt").read_text() == "one\n" and (w / "b.txt").exists()
    assert "cp -p" in mounted.cli("undo").stdout
    assert (w / "a.txt").read_text() == "two\n"
    # REV~N as git reads it: `~` alone is one step, steps add up.
    ids = [c["id"] for c in mounted.cli_json("log", "-n", "3")]
    for spelled, want in (("HEAD~", ids[1]), ("HEAD~~", ids[2]), ("HEAD~1~1", ids[2])):
        shown = mounted.cli("show", spelled, check=False)
        assert shown.returncode == 0 and shown.stdout.startswith(want[:12]), (spelled, shown)
    for cmd in (("show", "HEAD~x"), ("diff", "HEAD~1x"), ("restore", "HEAD~x")):
        bad = mounted.cli(*cmd, check=False)
        assert bad.returncode == 1 and "Traceback" not in bad.stderr, (cmd, bad.stderr)
        assert "after '~' is not a number of commits — write REV~N" in bad.stderr, bad.stderr
    short = mounted.cli("show", head[:4], check=False)
    assert short.returncode == 1
    assert (f"unknown revision '{head[:4]}' — a commit id prefix needs 6 or more hex digits"
            ) in short.stderr, short.stderr


def test_log_of_one_path_lists_only_the_commits_that_changed_it(mounted) -> None:
    """Found in a user trial: `memfs log -- work/a.txt` (git's way to see a file's history)
    said "unknown revision 'work/a.txt'"; log had no way to follow one file.

    What each commit changed is read from its history view against its parent's, not
    assumed: a command's create and its write may fall in two group commits on a loaded
    machine (the test assumed one commit a command and failed under load). `memfs log` after
    each command commits what it left, so no commit holds two commands' changes."""
    mounted.require_real()
    w = mounted.work
    start = mounted.cli_json("log", "-n", "1")[0]["id"]
    for cmd in ("echo one > a.txt", "echo b > b.txt", "echo two > a.txt"):
        job(w, "sh", "-c", cmd)
        mounted.cli("log", "-n", "1")  # commits what the command left before the next starts
    log = mounted.cli_json("log", "-n", "100")
    ids = [c["id"] for c in log]
    new = ids[:ids.index(start)]  # the commands' commits, newest first
    parent = {c["id"]: c["parent"] for c in log}

    def seen(cid: str, name: str) -> bytes | None:
        path = mounted.mnt / ".memfs" / "history" / cid / "work" / name
        return path.read_bytes() if path.exists() else None

    def changed(name: str) -> list[str]:
        return [c for c in new if seen(c, name) != seen(parent[c], name)]

    a, b = changed("a.txt"), changed("b.txt")
    assert seen(new[0], "a.txt") == b"two\n" and seen(new[0], "b.txt") == b"b\n"
    assert a and b and not set(a) & set(b), (new, a, b)  # one command's changes a commit
    first_a = [c for c in a if ids.index(c) > ids.index(b[-1])]  # echo one's, before b's
    assert first_a and first_a != a, (a, b)
    for spelled in (("--", "work/a.txt"), ("work/a.txt",), ("HEAD", "--", "work/a.txt")):
        got = [c["id"] for c in log_json(mounted, *spelled)]
        assert got == a, (spelled, got, a, b)
    here = subprocess.run([sys.executable, "-m", "memfs", "--root", str(mounted.root), "log",
                           "--json", "./a.txt"], cwd=w, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(
                              __file__).resolve().parents[1])})
    assert here.returncode == 0, here.stderr
    assert [c["id"] for c in json.loads(here.stdout)] == a
    assert [c["id"] for c in log_json(mounted, "-n", "1", "--", "work/a.txt")] == [a[0]]
    assert [c["id"] for c in log_json(mounted, b[0], "--", "work/a.txt")] == first_a
    text = mounted.cli("log", "--", "work/a.txt").stdout
    assert "work/a.txt" not in text, "changes are shown only with --stat or --paths"
    stat = mounted.cli("log", "--stat", "-n", "1", "--", "work/a.txt").stdout
    assert "M  work/a.txt" in stat and "b.txt" not in stat, stat
    ops = log_json(mounted, "--ops", "--", "work/b.txt")
    assert [o["cmdline"] for o in ops] == ["sh -c 'echo b > b.txt'"], ops
    assert mounted.cli("log", "--", "work/nope").stdout.strip() == "no commits changed work/nope"
    bad = mounted.cli("log", "nope", check=False)
    assert bad.returncode == 1 and ("'nope' is neither a revision nor a path in the head — give "
                                    "a branch, checkpoint, mark or commit id") in bad.stderr


def log_json(m, *args: str) -> list[dict]:
    """`memfs --json log ARGS`: --json before the command, as after `--` it is a path."""
    return json.loads(m.cli("--json", "log", *args).stdout)
