"""Another host's views and open files survive a GC run here (memfs.store.pg.pins).

Two daemons as two hosts on one database: host a writes the branch, host b follows it
read-only. b shows a history view and holds a file open that a then deletes; a's `memfs gc`,
with every window at 0, drops that history. b had read none of those bytes (its caches are
empty of them), so it reads them from the database: before pins were shared, its reads got
EIO once a's run had swept the rows. b, following a's branch, also pins the commit it shows
(a's next commit leaves it named by no head), published before b shows it.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from helpers.gcstore import keep_nothing_by_age
from helpers.mount import memfs_cmd
from helpers.pg import host_root
from test_pg_hosts import read, wait_for, write_synced

pytestmark = pytest.mark.mount
MiB = 1 << 20
LEASE = {"MEMFS_LEASE_SECONDS": "2"}  # pins then live 8 s without a renewal
# b's periodic look comes far too late (its row, with the default lease, lives 60 s).
LATE = {"MEMFS_PINS_EVERY": "3600"}


def published(url: str, host: str) -> tuple[list[str], list[str]] | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT trees, refs FROM host_pins WHERE host = %s",
                           (host,)).fetchone()
    return None if row is None else (row[0], row[1])


def tree_of(url: str, commit_id: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT tree FROM commits WHERE id = %s", (commit_id,)).fetchone()[0]


def expired(url: str, host: str) -> bool:
    with psycopg.connect(url) as conn:
        return bool(conn.execute("SELECT 1 FROM host_pins WHERE host = %s AND expires <= "
                                 "extract(epoch FROM clock_timestamp())", (host,)).fetchone())


def pinned_refs(url: str, host: str) -> int:
    got = published(url, host)
    return len(got[1]) if got else 0


@pytest.fixture
def host_a(mount_factory, pg_url: str, tmp_path):
    """Host a, mounted first: it writes main."""
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=LEASE)
    a.require_real()
    return a


@pytest.fixture
def host_b(mount_factory, pg_url: str, tmp_path):
    """Host b, mounted when called with its daemon's environment (after host a: it follows
    a's branch)."""
    return lambda env: mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=env)


def collecting(a):
    """a's GC keeps nothing by age and no reflog: a run drops every commit that no head,
    checkpoint or host's pins name."""
    keep_nothing_by_age(a)
    a.cli("config", "keep-reflog", "0")
    return a


@pytest.fixture
def ab(host_a, host_b):
    return collecting(host_a), host_b(LEASE)


def _shown_on_b(a, b) -> tuple[bytes, bytes, str]:
    """a writes `old` (held open on b) and `gone` (shown on b only in a view of its
    commit), then deletes both; b has followed every step."""
    old, gone = os.urandom(2 * MiB), os.urandom(2 * MiB)
    write_synced(a.work / "old", old)
    write_synced(a.work / "gone", gone)
    cid = a.cli_json("log", "-n", "1")[0]["id"]
    wait_for(lambda: (b.work / "gone").exists(), "host b to see a's files")
    return old, gone, cid


def _deleted_on_a(a, b) -> None:
    """a deletes both files (and writes `new`); b has followed."""
    (a.work / "old").unlink()
    (a.work / "gone").unlink()
    write_synced(a.work / "new", b"new")
    wait_for(lambda: read(b.work / "new") == b"new", "host b to follow the deletions")


def test_a_view_and_an_open_file_on_another_host_survive_a_gc_here(ab, pg_url: str) -> None:
    a, b = ab
    old, gone, cid = _shown_on_b(a, b)
    held = open(b.work / "old", "rb")
    view = b.mnt / ".memfs" / "history" / cid / "work" / "gone"
    shown = open(view, "rb")
    try:
        _deleted_on_a(a, b)
        wait_for(lambda: pinned_refs(pg_url, "host-b") >= 2, "host b to publish its pins")
        res = a.cli_json("gc")
        assert res["commits_dropped"] >= 1, res
        assert held.read() == old, "a file open on another host lost its bytes to GC here"
        assert shown.read() == gone, "a view shown on another host lost its bytes to GC here"
    finally:
        held.close()
        shown.close()
    assert a.cli_json("fsck")["ok"]
    # Let go on b (its `du` releases views nothing holds): the next run here frees them.
    # b then pins only the commit it shows (a's head, following it): its tree, and no inode
    # table (no hard links).
    b.cli("du")
    shown = ([tree_of(pg_url, a.cli_json("log", "-n", "1")[0]["id"])], [])
    wait_for(lambda: published(pg_url, "host-b") == shown,
             "host b to publish only the commit it shows")
    res = a.cli_json("gc")
    assert res["chunk_bytes_freed"] >= 4 * MiB, res


def test_a_dead_hosts_pins_expire(ab, pg_url: str) -> None:
    a, b = ab
    _, _, cid = _shown_on_b(a, b)
    shown = open(b.mnt / ".memfs" / "history" / cid / "work" / "gone", "rb")
    try:
        _deleted_on_a(a, b)
        wait_for(lambda: pinned_refs(pg_url, "host-b") >= 1, "host b to publish its pins")
    finally:
        shown.close()
    os.kill(b.proc.pid, signal.SIGKILL)  # b's row is left behind, naming the view
    b.proc.wait()
    res = a.cli_json("gc")  # the view (of `old` and `gone`) is kept by b's row, still live
    assert res["commits_dropped"] >= 1 and res["chunk_bytes_freed"] < 2 * MiB, res
    wait_for(lambda: expired(pg_url, "host-b"), "host b's row to expire (8 s)", timeout=30)
    res = a.cli_json("gc")
    assert res["chunk_bytes_freed"] >= 4 * MiB, "a dead host's pins kept its bytes forever"
    assert published(pg_url, "host-b") is None, "the expired row was not deleted"


@pytest.fixture
def ab_late(host_a, host_b):
    """a and b, b's periodic publisher made late: only the publish before a view is shown
    can keep it (memfs.workspace.pinning)."""
    return collecting(host_a), host_b(LATE)


def test_a_view_opened_just_before_a_gc_elsewhere_reads_every_byte(ab_late) -> None:
    """b opens a file in a view of an old commit, and a's `memfs gc` starts at once: the
    view was published before b's open returned, so the run keeps it (it used to be up to
    2 s late, and b's read got EIO for what it had not cached)."""
    a, b = ab_late
    _, gone, cid = _shown_on_b(a, b)
    _deleted_on_a(a, b)
    with open(b.mnt / ".memfs" / "history" / cid / "work" / "gone", "rb") as shown:
        res = a.cli_json("gc")
        assert res["commits_dropped"] >= 1, res
        assert shown.read() == gone, "a view opened on another host lost its bytes to GC"
    assert a.cli_json("fsck")["ok"]


def test_views_listed_just_before_a_gc_elsewhere_read_every_byte(ab_late) -> None:
    """The same through a listing: `ls` of a by-time day makes a view of each commit in it
    (readdir), published before the listing is answered."""
    a, b = ab_late
    _, gone, cid = _shown_on_b(a, b)
    _deleted_on_a(a, b)
    by_time = b.mnt / ".memfs" / "history" / "by-time"
    entries = [by_time / day / name for day in os.listdir(by_time)
               for name in os.listdir(by_time / day)]
    shown = [e for e in entries if e.name.endswith(cid[:12])]
    assert shown, entries
    res = a.cli_json("gc")
    assert res["commits_dropped"] >= 1, res
    assert read(shown[0] / "work" / "gone") == gone, "a listed view lost its bytes to GC"


def test_a_file_held_open_on_another_host_whose_commit_drops_it_survives_a_gc(ab_late) -> None:
    """b works on a branch of its own, holds open a file a wrote (b has read none of it),
    deletes it and commits: nothing but b's open file names it any more, and a's `memfs gc`
    starts at once. b published the file before its commit moved the head, so it reads every
    byte (b's periodic look, an hour late here, used to be the only publish: up to 2 s)."""
    a, b = ab_late
    _, gone, _ = _shown_on_b(a, b)
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    (a.work / "gone").unlink()  # on main; b-work still has it, b has not read it
    write_synced(a.work / "new", b"new")
    held = open(b.work / "gone", "rb")
    try:
        (b.work / "gone").unlink()
        b.cli("sync")  # b-work's head moves off `gone`
        res = a.cli_json("gc")
        assert res["commits_dropped"] >= 1, res
        assert held.read() == gone, "a file held open on another host lost its bytes to GC"
    finally:
        held.close()
    assert a.cli_json("fsck")["ok"]


def test_a_file_held_open_on_another_host_that_an_undo_takes_out_survives_a_gc(ab_late) -> None:
    """The same with an undo on b: the head moves back past the commit that wrote the file
    b holds open (b published it, though still in the tree, before the head moved)."""
    a, b = ab_late
    _, gone, _ = _shown_on_b(a, b)
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    (a.work / "gone").unlink()  # on main; b-work still has it, b has not read it
    write_synced(a.work / "new", b"new")
    held = open(b.work / "gone", "rb")
    try:
        b.cli("undo", "--commits", "1")  # back before a wrote `gone`
        assert not (b.work / "gone").exists()
        res = a.cli_json("gc")
        assert res["commits_dropped"] >= 1, res
        assert held.read() == gone, "a file held open on another host lost its bytes to GC"
    finally:
        held.close()
    assert a.cli_json("fsck")["ok"]


# Holds a file open in a process of its own, reads it whole once told: the test process
# holds nothing on b's mount while b is stopped (a subprocess it starts closes every
# inherited descriptor, and closing one on a stopped FUSE daemon's mount waits for it).
HOLD = ("import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); "
        "sys.stdin.readline(); sys.stdout.buffer.write(f.read())")


@pytest.mark.parametrize("heard", [True, False], ids=["b-followed-first", "gc-first"])
def test_a_file_held_open_on_a_follower_that_the_writers_commit_drops_survives_a_gc(
        ab_late, heard: bool) -> None:
    """b follows a's branch and holds open a file a wrote (b has read none of it); a deletes
    it and commits, and a's `memfs gc` starts at once. Either b showed a's new commit first
    (the file left b's tree; b's periodic look, an hour late here, would name it) or the run
    came first (b stopped: it still shows a's old commit, which no head names any more). b
    published each commit it shows before showing it, and the one it showed stays in its
    set until the next look: b reads every byte (both used to get EIO)."""
    a, b = ab_late
    _, gone, _ = _shown_on_b(a, b)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(b.work / "gone")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        if not heard:
            os.kill(b.proc.pid, signal.SIGSTOP)  # b hears of nothing until the run is done
        try:
            (a.work / "gone").unlink()
            write_synced(a.work / "new", b"new")
            if heard:
                wait_for(lambda: not (b.work / "gone").exists(), "host b to follow a's commit")
            res = a.cli_json("gc")
        finally:
            if not heard:
                os.kill(b.proc.pid, signal.SIGCONT)
        assert res["commits_dropped"] >= 1, res
        got, _ = holder.communicate(b"read\n", timeout=120)
        assert got == gone, "a file held open on a follower lost its bytes to GC"
    finally:
        holder.kill()
        holder.wait()
    wait_for(lambda: read(b.work / "new") == b"new", "host b to follow a's commit")
    assert a.cli_json("fsck")["ok"]


def test_a_file_held_open_after_a_switch_to_the_writers_branch_survives_a_gc(ab_late) -> None:
    """b works on a branch of its own while a writes `gone` on main, then switches to main:
    b shows a's head, which b never followed. b holds `gone` open (read none of it), a
    deletes it and commits, and a's `memfs gc` starts before b hears of it (b stopped): the
    commit b shows is no head any more. The switch published it before showing it: b reads
    every byte (b's periodic look, an hour late here, was the only publish of it)."""
    a, b = ab_late
    _shown_on_b(a, b)
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    gone = os.urandom(2 * MiB)
    write_synced(a.work / "gone", gone)  # on main; b on b-work shows the older copy
    b.cli("branch", "switch", "main")
    _held_through_a_gc(a, b, gone, "a file held open after a switch lost its bytes to GC")


def _held_through_a_gc(a, b, gone: bytes, lost: str) -> None:
    """A process on b holds b's `gone` open while b is paused; a deletes it, commits and
    collects (the run drops the commit that named it): the holder still reads every byte."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(b.work / "gone")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        os.kill(b.proc.pid, signal.SIGSTOP)  # b hears of nothing until the run is done
        try:
            (a.work / "gone").unlink()
            write_synced(a.work / "new", b"new")
            res = a.cli_json("gc")
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        assert res["commits_dropped"] >= 1, res
        got, _ = holder.communicate(b"read\n", timeout=120)
        assert got == gone, lost
    finally:
        holder.kill()
        holder.wait()
    assert a.cli_json("fsck")["ok"]


# Holds a file open in a process of its own and reads it once told, saying what the read
# got (its length, or its errno).
HOLD_AND_TELL = ("import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); "
                 "sys.stdin.readline()\n"
                 "try:\n    print('read', len(f.read()))\n"
                 "except OSError as exc:\n    print('error', exc.errno)")


def test_a_view_swept_while_its_hosts_row_had_lapsed_is_gone_whole(ab, pg_url: str) -> None:
    """b lists a view of an old commit (its names are then in b's memory), a process holds a
    file of it open (b read none of it), and b is paused past its row's life (8 s here):
    a's `memfs gc` keeps nothing of the lapsed row and drops and sweeps that commit. When b
    resumes, its next publish finds its row no longer live and checks every view's commit,
    not only new views': the swept view is not pinned again (b's row used to name its tree
    again, as if it had been kept, the view held open so nothing else let it go), and it is
    gone here whole: a listing, which b could answer from memory, and a new open say
    absent, and the open file reads EIO."""
    a, b = ab
    _, _, cid = _shown_on_b(a, b)
    _deleted_on_a(a, b)
    view = b.mnt / ".memfs" / "history" / cid / "work"
    assert {"gone", "old"} <= set(os.listdir(view))
    tree = tree_of(pg_url, cid)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_TELL, str(view / "gone")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        wait_for(lambda: tree in (published(pg_url, "host-b") or ([], []))[0],
                 "host b to publish its view")
        os.kill(b.proc.pid, signal.SIGSTOP)  # b renews nothing until the run is done
        try:
            wait_for(lambda: expired(pg_url, "host-b"), "host b's row to lapse (8 s)",
                     timeout=30)
            res = a.cli_json("gc")
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        assert res["commits_dropped"] >= 1 and res["chunk_bytes_freed"] >= 4 * MiB, res
        # The run deleted the lapsed row: the next one is b's publish after it resumed.
        again = wait_for(lambda: published(pg_url, "host-b"), "host b to publish again")
        assert tree not in again[0], "a lapsed row was published again naming a swept view"
        with pytest.raises(FileNotFoundError):
            os.listdir(view)
        with pytest.raises(FileNotFoundError):
            (view / "gone").read_bytes()
        got, _ = holder.communicate(b"read\n", timeout=60)
        assert got == f"error {errno.EIO}\n".encode(), got
    finally:
        holder.kill()
        holder.wait()
    assert "pins had lapsed" in b.log_text()
    pins = b.cli_json("status")["pins"]  # said where the user looks, not only in the log
    assert pins["lapses"] == 1 and pins["last_lapse"]["commits_gone"] >= 1, pins
    text = b.cli("status").stdout
    assert "pins     LAPSED at" in text and "their views are gone here" in text, text
    assert a.cli_json("fsck")["ok"]


def test_a_followers_swept_commit_is_not_published_again_after_a_lapse(ab, pg_url: str
                                                                        ) -> None:
    """b follows a's branch and is paused past its row's life; a deletes a file, commits
    (the commit b shows is then no head) and collects: b's lapsed row kept nothing, so the
    run drops and sweeps the commit b shows. When b resumes, no row of b names that commit's
    tree again (b's first publish used to, the periodic look's or the follow's, as if it had
    been kept): its lapsed check covers the commit it shows too, and b follows a's head."""
    a, b = ab
    write_synced(a.work / "gone", os.urandom(2 * MiB))
    wait_for(lambda: (b.work / "gone").exists(), "host b to follow a's commit")
    shown = tree_of(pg_url, _head(a))
    wait_for(lambda: published(pg_url, "host-b") == ([shown], []), "host b to publish it")
    os.kill(b.proc.pid, signal.SIGSTOP)  # b renews nothing until the run is done
    try:
        wait_for(lambda: expired(pg_url, "host-b"), "host b's row to lapse (8 s)", timeout=30)
        (a.work / "gone").unlink()
        write_synced(a.work / "new", b"new")
        head = _head(a)
        res = a.cli_json("gc")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    assert res["commits_dropped"] >= 1 and res["chunk_bytes_freed"] >= 2 * MiB, res
    rows, deadline = [], time.monotonic() + 5  # every row b publishes meanwhile
    while time.monotonic() < deadline:
        row = published(pg_url, "host-b")
        if row is not None and row not in rows:
            rows.append(row)
        time.sleep(0.01)
    assert not [r for r in rows if shown in r[0]], f"a swept commit was pinned again: {rows}"
    wait_for(lambda: read(b.work / "new") == b"new", "host b to follow a's head")
    wait_for(lambda: published(pg_url, "host-b") == ([tree_of(pg_url, head)], []),
             "host b to publish only the commit it shows")
    assert a.cli_json("fsck")["ok"]


FAULT = "MEMFS_TEST_PINS_FAULT"  # while its file exists, b's pins publishes lose the server


@pytest.fixture
def ab_fault(host_a, host_b, tmp_path):
    """a and b, b's pins publishes made to fail at will (memfs.testing.pins_fault); b's
    periodic look late, so only the publish before a move matters. Returns the trigger."""
    trigger = tmp_path / "pins-fault"
    return host_a, host_b({**LATE, FAULT: str(trigger)}), trigger


def _head(m) -> str:
    return m.cli_json("log", "-n", "1")[0]["id"]


def _refused(out, what: str) -> None:
    assert out.returncode != 0, f"{what} went ahead with its pins unpublished: {out.stdout}"
    assert f"{what} was refused" in out.stderr, out.stderr
    assert "could not be published" in out.stderr and "nothing was changed" in out.stderr
    # What happened first (the server's words), then what it cost: it read as a pins problem.
    cause = out.stderr.index(f"{what} was refused: ") + len(f"{what} was refused: ")
    assert out.stderr.index("could not be published") > cause + 10, out.stderr
    assert not out.stderr[cause:].startswith("what this host shows"), out.stderr
    assert "retry once the PostgreSQL server answers" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("move", ["undo", "restore"])
def test_an_undo_whose_pins_cannot_be_published_first_is_refused(ab_fault, move: str) -> None:
    """b works on a branch of its own and holds a file open that an undo (or a restore to
    before it) would take out of the tree. While b's publish loses the server, the move is
    refused with the reason and the remedy, and nothing changed: head, tree, the open file
    (it used to be logged and the move went ahead, the file's bytes kept by no row).
    Retried once the server answers, it goes through."""
    a, b, trigger = ab_fault
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    before = _head(b)
    data = os.urandom(MiB)
    write_synced(b.work / "f", data)
    b.cli("sync")
    head = _head(b)
    args = ("undo", "--commits", "1") if move == "undo" else ("restore", before)
    with open(b.work / "f", "rb") as held:
        trigger.touch()
        _refused(b.cli(*args, check=False), f"memfs {move}")
        assert _head(b) == head
        assert b.cli_json("branch", "list")["current"] == "b-work"
        assert read(b.work / "f") == data
        assert held.read() == data
        text = b.cli("status").stdout  # status says so, with the remedy, while it fails
        assert "pins     FAILING" in text and "server answers this host" in text, text
        trigger.unlink()  # the server answers again
        b.cli(*args)
        assert _head(b) != head and not (b.work / "f").exists()
        assert b.cli_json("status")["pins"]["failing"] is None
        held.seek(0)
        assert held.read() == data


def test_a_switch_to_another_hosts_branch_whose_head_cannot_be_published_is_refused(
        ab_fault) -> None:
    """b works on a branch of its own while a writes main; b's switch to main would show
    a's head, which b must publish first (a's next commit leaves it named by no head).
    While b's publish loses the server the switch is refused with the reason and the
    remedy, and nothing changed: b's branch, head, tree, and it still writes there (the
    switch used to go ahead, the shown commit published by nobody). Retried once the
    server answers, it goes through."""
    a, b, trigger = ab_fault
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    write_synced(b.work / "mine", b"mine")
    b.cli("sync")
    head = _head(b)
    write_synced(a.work / "theirs", b"theirs")  # on main
    trigger.touch()
    _refused(b.cli("branch", "switch", "main", check=False), "memfs branch switch main")
    assert b.cli_json("branch", "list")["current"] == "b-work"
    assert _head(b) == head
    assert read(b.work / "mine") == b"mine" and not (b.work / "theirs").exists()
    write_synced(b.work / "after", b"after")  # still b-work's writer
    trigger.unlink()  # the server answers again
    b.cli("branch", "switch", "main")
    assert b.cli_json("branch", "list")["current"] == "main"
    assert read(b.work / "theirs") == b"theirs" and not (b.work / "mine").exists()
    b.cli("branch", "switch", "b-work")
    assert read(b.work / "after") == b"after"


def test_a_followers_pins_are_published_at_start(host_a, host_b, pg_url: str) -> None:
    """b mounts to follow a's branch with its periodic look an hour late: the commit it
    shows is in its row as soon as the mount is up. b holds a file of it open at once (read
    none of it) and is stopped; a deletes the file, commits (b's commit is then named by no
    head) and collects: the run keeps it, and b reads every byte."""
    a = collecting(host_a)
    gone = os.urandom(2 * MiB)
    write_synced(a.work / "gone", gone)
    shown = tree_of(pg_url, _head(a))
    b = host_b(LATE)
    assert published(pg_url, "host-b") == ([shown], []), "b's start did not publish its pins"
    _held_through_a_gc(a, b, gone, "a file open on a host that had just started lost its bytes")


GATE = "MEMFS_TEST_PINS_GATE"  # while its file exists, b's pins publishes wait at their start


def test_a_commit_made_while_a_switch_publishes_its_head_is_followed(host_a, host_b,
                                                                      tmp_path) -> None:
    """b switches from a branch of its own to main, which a writes; the switch publishes
    main's head before showing it, and a commits again while that publish is in flight.
    The notice of a's commit reached b while b still showed its own branch, and was passed
    over: b then showed main's older head until a's next commit, which may never come (an
    agent's last file, missing on the host that watches it). Now the switch looks at the
    head once more when it is done."""
    gate = tmp_path / "pins-gate"
    a, b = host_a, host_b({**LATE, GATE: str(gate)})
    b.cli("branch", "create", "b-work")
    b.cli("branch", "switch", "b-work")
    heard = _heard(b)
    write_synced(a.work / "first", b"first")
    wait_for(lambda: _heard(b) > heard, "b to hear a's first commit")
    waiting = gate.with_name(gate.name + ".waiting")
    gate.touch()
    heard = _heard(b)
    switch = subprocess.Popen(memfs_cmd(b.root, "branch", "switch", "main"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(waiting.exists, "b's switch to reach its publish")
        write_synced(a.work / "second", b"second")  # committed: a's fsync returned
        wait_for(lambda: _heard(b) > heard, "b to hear a's second commit")
    finally:
        gate.unlink()
    out, err = switch.communicate(timeout=60)
    assert switch.returncode == 0, err
    assert read(b.work / "first") == b"first"
    wait_for(lambda: read(b.work / "second") == b"second",
             "b to show a's commit made during the switch", timeout=15)
    assert b.cli_json("branch", "list")["current"] == "main"


def _heard(b) -> int:
    """How many notices of other hosts' head moves b's daemon has taken in."""
    return b.status()["hosts"]["heard"]
