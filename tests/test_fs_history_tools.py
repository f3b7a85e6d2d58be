"""What changed, and names for states, through a real mount: `memfs log --stat/--json`,
`memfs diff`, `memfs show` (with the daemon and without it), checkpoints, and the labels
of the commits memfs makes itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.files import write_durably as fsynced
from helpers.mount import REPO, memfs_cmd

pytestmark = pytest.mark.mount

BIN_OLD = bytes(range(256)) * 4
BIN_NEW = b"\0" + bytes(range(255, 0, -1)) * 4


def cli(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(memfs_cmd(root, *args), capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    if check:
        assert out.returncode == 0, f"memfs {' '.join(args)}: {out.stderr}"
    return out


def two_states(m) -> None:
    w = m.work
    (w / "a.txt").write_text("one\ntwo\nthree\n")
    (w / "bin.dat").write_bytes(BIN_OLD)
    (w / "move-me.txt").write_text("I move\n")
    (w / "gone.txt").write_text("bye\n")
    m.cli("checkpoint", "create", "A")
    (w / "a.txt").write_text("one\nTWO\nthree\n")
    (w / "bin.dat").write_bytes(BIN_NEW)
    (w / "move-me.txt").rename(w / "moved.txt")
    (w / "gone.txt").unlink()
    (w / "new.txt").write_text("fresh")  # no newline at the end
    m.cli("checkpoint", "create", "B")


EXPECTED_DIFF = """\
diff a/work/a.txt b/work/a.txt
--- a/work/a.txt
+++ b/work/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff a/work/bin.dat b/work/bin.dat
Binary files a/work/bin.dat and b/work/bin.dat differ
diff a/work/gone.txt b/work/gone.txt
--- a/work/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff a/work/move-me.txt b/work/moved.txt
rename from work/move-me.txt
rename to work/moved.txt
diff a/work/new.txt b/work/new.txt
--- /dev/null
+++ b/work/new.txt
@@ -0,0 +1 @@
+fresh
\\ No newline at end of file
"""


def test_diff_and_show_against_known_content(mounted) -> None:
    mounted.require_real()
    two_states(mounted)
    for daemon in (True, False):  # the same answers with no daemon (store opened read-only)
        if not daemon:
            mounted.umount()
        root = mounted.root
        assert cli(root, "diff", "A", "B").stdout == EXPECTED_DIFF
        only = cli(root, "diff", "A", "B", "--", "work/a.txt").stdout
        assert only == EXPECTED_DIFF.split("diff a/work/bin.dat")[0]
        stat = cli(root, "diff", "--json", "A", "B").stdout
        assert '"status": "R"' in stat and '"old_path": "work/move-me.txt"' in stat
        show = subprocess.run(memfs_cmd(root, "show", "A:work/bin.dat"), capture_output=True,
                              cwd=REPO, timeout=60)
        assert show.returncode == 0 and show.stdout == BIN_OLD
        assert cli(root, "show", "B:work/a.txt").stdout == "one\nTWO\nthree\n"
        assert "moved.txt" in cli(root, "show", "B:work").stdout
        missing = cli(root, "show", "A:work/new.txt", check=False)
        assert missing.returncode == 1 and "work/new.txt is not in A" in missing.stderr


def test_a_path_from_the_current_directory_gets_a_remedy_that_fits(mounted) -> None:
    """Standing in MNT/work/proj, `memfs show HEAD:z.txt` names a path from the store root
    (there is none): the remedy names the path that is meant; `memfs diff -- z.txt` says
    the path is in neither state instead of answering "no differences"."""
    mounted.require_real()
    proj = mounted.work / "proj"
    proj.mkdir()
    (proj / "z.txt").write_text("one\n")
    mounted.cli("status")
    (proj / "z.txt").write_text("two\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(memfs_cmd(mounted.root, *args), capture_output=True, text=True,
                              cwd=proj, timeout=60)

    out = run("show", "HEAD:z.txt")
    assert out.returncode == 1 and "memfs show HEAD:work/proj/z.txt" in out.stderr \
        and "HEAD:./z.txt from here" in out.stderr, out.stderr
    assert run("show", "HEAD:./z.txt").stdout == "two\n"
    out = run("diff", "HEAD~1", "--", "z.txt")
    assert out.returncode == 1 and "z.txt is in neither state" in out.stderr \
        and "-- work/proj/z.txt" in out.stderr, (out.stdout, out.stderr)
    assert "+two" in run("diff", "HEAD~1", "--", "./z.txt").stdout
    out = run("show", "HEAD:work/nosuch")  # nothing meant from here: the listing remedy
    assert out.returncode == 1 and "memfs show HEAD:work" in out.stderr, out.stderr
    # From the store root already, from anywhere: the remedy said "e.g. -- work/work/nosuch"
    for cwd in (proj, mounted.root):
        out = subprocess.run(memfs_cmd(mounted.root, "diff", "HEAD~1", "HEAD", "--",
                                       "work/proj/nosuch"),
                             capture_output=True, text=True, cwd=cwd, timeout=60)
        assert out.returncode == 1 and "work/proj/nosuch is in neither state" in out.stderr
        assert "work/work" not in out.stderr and "memfs show HEAD:work/proj" in out.stderr, \
            out.stderr


def test_a_negative_count_is_refused(mounted) -> None:
    """`memfs log -n -1` listed every commit (a typo read as "all")."""
    (mounted.work / "f").write_text("1\n")
    for args in (("log", "-n", "-1"), ("log", "--ops", "-n", "-3"), ("reflog", "-n", "-1")):
        out = mounted.cli(*args, check=False)
        assert out.returncode == 2 and "is negative (0 lists all)" in out.stderr, (args, out)
        assert out.stdout == ""


def test_diff_with_no_states_is_the_last_operation(mounted) -> None:
    mounted.require_real()
    (mounted.work / "keep.txt").write_text("k\n")
    subprocess.run(["sh", "-c", "echo last > last.txt"], cwd=mounted.work, check=True,
                   process_group=0)
    out = mounted.cli("diff").stdout
    assert "+++ b/work/last.txt" in out and "keep.txt" not in out, out


def test_log_stat_and_json_name_every_commit(mounted) -> None:
    mounted.require_real()
    code = "import os; open('by-child.txt','w').write('child'); print(os.getpid())"
    pid = int(subprocess.run([sys.executable, "-c", code], cwd=mounted.work, check=True,
                             capture_output=True, text=True, process_group=0).stdout)
    log = mounted.cli_json("log", "-n", "0", "--stat")
    for c in log:
        assert {"pid", "pgid", "sid", "uid", "cmdline", "kind", "changes"} <= set(c), c
    assert all(c["cmdline"] and c["pid"] for c in log), "a commit names nobody"
    assert log[-1]["cmdline"] == "init" and log[-1]["kind"] == "memfs"
    # The child's create and its write are two requests; a timed group commit may land
    # between them (seen under load), so its operation is one commit or two, newest first.
    mine = [c for c in log if c["pid"] == pid]
    assert log[:len(mine)] == mine and len(mine) in (1, 2), log[:3]
    for c in mine:
        assert c["pgid"] == pid and c["uid"] == os.getuid(), c
        assert c["cmdline"].startswith(sys.executable) and c["kind"] == "process", c
    added = {"status": "A", "path": "work/by-child.txt", "kind": "f", "old_size": None}
    if len(mine) == 1:
        assert mine[0]["changes"] == [{**added, "size": 5}]
        text = mounted.cli("log", "--stat", "-n", "1").stdout
        assert "A  work/by-child.txt  5 B" in text and "1 path: 1 added; +5 B" in text, text
    else:
        assert mine[1]["changes"] == [{**added, "size": 0}]
        assert mine[0]["changes"] == [{"status": "M", "path": "work/by-child.txt", "kind": "f",
                                       "size": 5, "old_size": 0, "detail": "content"}]


def test_checkpoints_list_refuse_a_move_and_delete(mounted) -> None:
    mounted.require_real()
    (mounted.work / "f").write_text("1\n")
    assert mounted.cli("checkpoint", "list").stdout.startswith("no checkpoints")
    assert mounted.cli_json("checkpoint", "list") == [], "`list` made a checkpoint"
    first = mounted.cli_json("checkpoint", "create", "cp")["commit"]
    (mounted.work / "f").write_text("2\n")
    moved = mounted.cli("checkpoint", "create", "cp", check=False)
    assert moved.returncode == 1 and "already names" in moved.stderr and "--force" in moved.stderr
    assert [c["commit"] for c in mounted.cli_json("checkpoint", "list")] == [first]
    assert (mounted.mnt / ".memfs" / "checkpoints" / "cp" / "work" / "f").read_text() == "1\n"
    second = mounted.cli_json("checkpoint", "create", "cp", "--force")
    assert second["moved_from"] == first and second["commit"] != first
    assert (mounted.mnt / ".memfs" / "checkpoints" / "cp" / "work" / "f").read_text() == "2\n"
    mounted.cli("checkpoint", "bare")  # the bare form still creates
    mounted.cli("checkpoint", "delete", "cp")
    assert [c["name"] for c in mounted.cli_json("checkpoint", "list")] == ["bare"]
    assert not (mounted.mnt / ".memfs" / "checkpoints" / "cp").exists()
    gone = mounted.cli("checkpoint", "delete", "cp", check=False)
    assert gone.returncode == 1 and "no checkpoint named 'cp'" in gone.stderr
    moves = [(r["branch"], r["reason"], r["old"], r["new"])
             for r in mounted.cli_json("reflog") if r["branch"].startswith("checkpoints/")]
    assert moves == [
        ("checkpoints/cp", "checkpoint delete cp", second["commit"], ""),
        ("checkpoints/bare", "checkpoint create bare", None, moves[1][3]),
        ("checkpoints/cp", "checkpoint move cp", first, second["commit"]),
        ("checkpoints/cp", "checkpoint create cp", None, first)]


def test_a_name_that_another_revision_would_shadow_is_refused(mounted) -> None:
    """A checkpoint named like a branch, HEAD, `now` or a commit id could never be reached
    by that name (`memfs show main` is the branch), so it is refused, and nothing changes;
    likewise a branch named like a checkpoint and a mark named like either."""
    mounted.require_real()
    (mounted.work / "f").write_text("1\n")
    mounted.cli("checkpoint", "create", "cp")
    head = mounted.cli_json("log", "-n", "1")[0]["id"]
    cases = [
        (("checkpoint", "create", "main"), "a branch is named 'main'"),
        (("checkpoint", "create", "HEAD"), "'HEAD' names a revision already"),
        (("checkpoint", "create", "now"), "'now' names a revision already"),
        (("checkpoint", "create", head[:8]), "reads as a commit id"),
        (("checkpoint", "main"), "a branch is named 'main'"),
        (("branch", "create", "cp"), "a checkpoint is named 'cp'"),
        (("branch", "create", "HEAD"), "'HEAD' names a revision already"),
        (("mark", "cp"), "a checkpoint is named 'cp'"),
        (("mark", "main"), "a branch is named 'main'"),
    ]
    for args, why in cases:
        out = mounted.cli(*args, check=False)
        assert out.returncode == 1 and why in out.stderr and "pick another name" in out.stderr, \
            (args, out.stderr)
    assert [c["name"] for c in mounted.cli_json("checkpoint", "list")] == ["cp"]
    assert list(mounted.cli_json("branch", "list")["branches"]) == ["main"]
    assert mounted.cli_json("log", "-n", "1")[0]["marks"] == []
    assert mounted.cli("show", "main").stdout == mounted.cli("show", head).stdout


def test_reconciler_commits_are_labelled(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a1\n")
    mounted.cli("attach", "work", str(disk))
    (disk / "b.txt").write_text("from disk\n")
    mounted.cli("sync", "work")
    log = mounted.cli_json("log", "-n", "5")
    took = next(c for c in log if any(ch == "work/b.txt" for ch in _paths(mounted, c["id"])))
    assert took["message"] == "reconciler: disk changes in work", took
    assert took["kind"] == "reconciler" and took["pid"] == mounted.proc.pid
    first = next(c for c in log if any(ch == "work/a.txt" for ch in _paths(mounted, c["id"])))
    assert first["message"] == f"attach: work -> {disk}" and first["kind"] == "attach"


def _paths(m, cid: str) -> list[str]:
    return [c["path"] for c in m.cli_json("show", cid)["changes"]]


def test_history_views_hold_every_commit_with_its_time(mounted) -> None:
    mounted.require_real()
    f = mounted.work / "counter"
    for i in range(300):
        fsynced(f, b"%d\n" % i)  # each fsync is a commit
    log = {c["id"]: c for c in mounted.cli_json("log", "-n", "0")}
    assert len(log) >= 301
    by_time = mounted.mnt / ".memfs" / "history" / "by-time"
    seen = {}
    for day in sorted(os.listdir(by_time)):
        for name in os.listdir(by_time / day):
            st = os.stat(by_time / day / name)
            seen[name.rsplit("-", 1)[1]] = (st.st_mtime_ns, by_time / day / name)
    assert sorted(seen) == sorted(cid[:12] for cid in log), "by-time lists every commit"
    for cid, c in log.items():
        mtime, path = seen[cid[:12]]
        assert mtime == round(c["time"] * 1e9) or abs(mtime - c["time"] * 1e9) < 1000, path
    newest = max(log.values(), key=lambda c: c["time"])
    assert (seen[newest["id"][:12]][1] / "work" / "counter").read_text() == "299\n"
    index = (mounted.mnt / ".memfs" / "history" / "INDEX").read_text()
    assert f"{len(log)} commits kept" in index and "by-time/YYYY-MM-DD/HH:MM:SS-ID/" in index
    assert sorted(os.listdir(mounted.mnt / ".memfs" / "history")) == ["INDEX", "by-time"]
    past = mounted.mnt / ".memfs" / "history" / newest["id"][:8] / "work" / "counter"
    assert past.read_text() == "299\n", "a commit opens by a unique prefix of its id"


def seed_commits(root: Path, n: int, days: int) -> list[str]:
    """n commits of one tree, evenly over the last `days` days, written straight into the
    database (a long-lived store's history without waiting for it)."""
    import hashlib
    import sqlite3
    import time

    from memfs.store import Store

    s = Store.open(root)
    head = s.head()
    tree = s.commit(head).tree
    s.close()
    conn = sqlite3.connect(root / "store.db")
    seq = conn.execute("SELECT MAX(seq) FROM commits").fetchone()[0]
    t0 = time.time_ns() - days * 86400 * 10**9
    step = days * 86400 * 10**9 // n
    rows, parent, ids = [], head, []
    for i in range(n):
        cid = hashlib.blake2b(b"seed %d" % i, digest_size=20).hexdigest()
        rows.append((cid, seq + 1 + i, parent, tree, "main", t0 + i * step, f"seed {i}", "[]"))
        parent = cid
        ids.append(cid)
    conn.executemany("INSERT INTO commits VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.execute("UPDATE branches SET head = ? WHERE name = 'main'", (parent,))
    conn.commit()
    conn.close()
    return ids


@pytest.mark.embedded_only  # seed_commits writes the commits straight into SQLite
def test_history_lists_every_one_of_100k_commits(mount_factory, tmp_path: Path) -> None:
    """No cap: every commit is under by-time (each day one directory, read by an indexed
    query, kept until the database changes). scripts' figures: docs/performance.md."""
    root = tmp_path / "root"
    cli(root, "init")
    ids = seed_commits(root, 100_000, 4)
    m = mount_factory(root=root)
    by_time = m.mnt / ".memfs" / "history" / "by-time"
    listed = set()
    for day in os.listdir(by_time):
        names = os.listdir(by_time / day)
        listed.update(n.rsplit("-", 1)[1] for n in names)
    assert {i[:12] for i in ids} <= listed and len(listed) >= 100_000
    # init, the seeds, and the mount's `mkdir work`
    assert "100002 commits kept" in (m.mnt / ".memfs" / "history" / "INDEX").read_text()
    ops = m.cli_json("log", "--ops", "-n", "3")
    assert [o["label"] for o in ops[1:]] == ["seed 99999", "seed 99998"]
