"""Files held open for writing across an undo, a restore and a branch switch, through a real
mount, by real processes (docs/guarantees.md, "Files open across an undo").

The history operation wins: a handle open for writing on a file the operation replaced or
removed is cut off, and its later write, fsync and ftruncate fail with ESTALE, so none of its
bytes land in the new tree (resurrecting a file the undo removed, clobbering restored content)
or vanish with success. Reads through it keep answering what it had. The command names each
writer it cut off (path, comm, pid; `cut_off` in --json); a handle open only for reading is
not named. A file opened after the operation works as usual, and what the writer wrote before
the operation stays in history (one restore away). On a store in PostgreSQL the same holds
when another host takes the branch over (this host follows its commits) and when `memfs
takeover` switches this host's mount.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.files import gone, write_durably
from helpers.pg import host_root

pytestmark = pytest.mark.mount

COMM = "memfs-writer"  # the writer's comm, which the CLI should name

# A process that opens one file and obeys commands on stdin, one a line, answering "ok",
# "ok DATA" (a read's bytes, hex) or "err ERRNONAME" on stdout. It names itself COMM first
# (the daemon reads /proc/PID/comm when the file is opened).
WRITER = r"""
import errno, os, sys
name, path, flags = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open("/proc/self/comm", "w") as f:
    f.write(name)
fd = os.open(path, flags, 0o644)
print("ok", os.getpid(), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.rstrip("\n").partition(" ")
    try:
        if cmd == "write":
            os.write(fd, arg.encode() + b"\n")
            out = "ok"
        elif cmd == "fsync":
            os.fsync(fd)
            out = "ok"
        elif cmd == "truncate":
            os.ftruncate(fd, int(arg))
            out = "ok"
        elif cmd == "read":
            out = "ok " + os.pread(fd, 4096, 0).hex()
        elif cmd == "close":
            os.close(fd)
            out = "ok"
        else:
            out = "err EINVAL"
    except OSError as exc:
        out = "err " + errno.errorcode.get(exc.errno, str(exc.errno))
    print(out, flush=True)
"""


class Holder:
    """A separate process (its own process group: its own operation) holding `path` open."""

    def __init__(self, path: Path, flags: int, name: str = COMM) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, name, str(path), str(flags)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        first = self._answer()
        assert first.startswith("ok "), f"the holder could not open {path}: {first}"
        self.pid = int(first.split()[1])

    def _answer(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the holder died: {self.proc.communicate()}")
        return line.strip()

    def do(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def read(self) -> bytes:
        got = self.do("read")
        assert got.startswith("ok"), f"a read through the held handle failed: {got}"
        return bytes.fromhex(got[3:])

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


WRITE = os.O_RDWR | os.O_APPEND
CREATE = os.O_RDWR | os.O_CREAT | os.O_APPEND


def cli(m, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    return m.cli(*args)


def cli_json(m, *args: str) -> dict:  # noqa: ANN001
    return json.loads(m.cli(*args, "--json").stdout)


def status(m) -> dict:  # noqa: ANN001
    with open(m.mnt / ".memfs" / "status") as f:
        return json.load(f)


def assert_cut_off(w: Holder) -> None:
    """Every later change through the handle is refused with ESTALE."""
    assert w.do("write after") == "err ESTALE"
    assert w.do("fsync") == "err ESTALE"
    assert w.do("truncate 0") == "err ESTALE"
    assert w.do("write again") == "err ESTALE"


def test_a_writer_held_across_undo_is_cut_off(mounted) -> None:
    """A logger's file, made by its own process (its own operation), is taken away by `memfs
    undo`: its next write and fsync answer ESTALE instead of succeeding into a file nobody
    can see; the file stays gone; what it wrote before is in history (restore brings it)."""
    m = mounted
    m.require_real()
    log = m.work / "log.txt"
    with Holder(log, CREATE) as w:
        assert w.do("write one") == "ok"
        assert w.do("fsync") == "ok"
        res = cli_json(m, "undo")
        assert gone(log), "the undo should have taken the logger's file away"
        assert [c["path"] for c in res["cut_off"]] == ["work/log.txt"], res
        assert res["cut_off"][0]["pid"] == w.pid and res["cut_off"][0]["comm"] == COMM, res
        assert_cut_off(w)
        assert w.read() == b"one\n", "a read through the cut-off handle answers what it had"
        assert gone(log), "a write through the cut-off handle brought the file back"
        assert w.do("close") == "ok"
        assert gone(log)
        assert "log.txt" not in os.listdir(m.work)
        cli(m, "restore", res["old_head"])  # nothing written before the undo is lost
        assert log.read_bytes() == b"one\n"


def test_a_writer_held_across_restore_is_cut_off(mounted) -> None:
    """An editor holding doc.txt open for writing while `memfs restore` brings back an older
    version: its later write, ftruncate and fsync fail with ESTALE, and `cat` shows the
    restored content, not the editor's bytes."""
    m = mounted
    m.require_real()
    doc = m.work / "doc.txt"
    write_durably(doc, b"v1\n")
    v1 = status(m)["head"]
    with Holder(doc, WRITE) as w:
        assert w.do("write v2") == "ok"
        assert w.do("fsync") == "ok"
        assert doc.read_bytes() == b"v1\nv2\n"
        res = cli_json(m, "restore", v1)
        assert [(c["path"], c["pid"]) for c in res["cut_off"]] == [("work/doc.txt", w.pid)]
        assert doc.read_bytes() == b"v1\n"
        assert_cut_off(w)
        assert doc.read_bytes() == b"v1\n", "the cut-off handle's bytes clobbered the restore"
        out = subprocess.run(["cat", str(doc)], capture_output=True, check=True)
        assert out.stdout == b"v1\n"


def test_a_writer_held_across_branch_switch_is_cut_off(mounted) -> None:
    """`memfs branch switch` to a branch where the file holds something else: the handle
    open on main's file is cut off, and nothing it writes reaches either branch."""
    m = mounted
    m.require_real()
    doc = m.work / "doc.txt"
    write_durably(doc, b"main\n")
    cli(m, "branch", "create", "other")
    write_durably(doc, b"main two\n")
    with Holder(doc, WRITE) as w:
        res = cli_json(m, "branch", "switch", "other")
        assert [(c["path"], c["comm"], c["pid"]) for c in res["cut_off"]] == [
            ("work/doc.txt", COMM, w.pid)], res
        assert_cut_off(w)
        assert doc.read_bytes() == b"main\n"
        w.close()
    cli(m, "branch", "switch", "main")
    assert doc.read_bytes() == b"main two\n", "a cut-off write reached the branch it left"


def still_running(out: subprocess.CompletedProcess[str], w: Holder, by: str) -> bool:
    """Does the command's text name `w` as a process still running (as `memfs undo` does)?"""
    text = out.stdout + out.stderr
    named = f"still running: {COMM} (pid {w.pid})" in text
    assert not named or f"files the {by} replaced fail (ESTALE)" in text, text
    return named


def test_restore_names_a_process_it_took_changes_of_that_still_runs(mounted) -> None:
    """`memfs restore` to before a logger's writes takes them out of the tree while the
    logger runs on: the command names it (`still running: COMM (pid N)`, its pid and comm in
    `procs` under --json), as `memfs undo` does. A restore forward, which takes nothing of
    its out, names nobody, and once the logger has exited neither does a restore back."""
    m = mounted
    m.require_real()
    write_durably(m.work / "base.txt", b"base\n")
    before = status(m)["head"]
    log = m.work / "log.txt"
    with Holder(log, CREATE) as w:
        assert w.do("write one") == "ok"
        assert w.do("fsync") == "ok"
        after = status(m)["head"]
        assert still_running(cli(m, "restore", before), w, "restore")
        assert gone(log)
        assert not still_running(cli(m, "restore", after), w, "restore")
        assert log.read_bytes() == b"one\n"
        res = cli_json(m, "restore", before)
        assert res["procs"] == [[w.pid, COMM]], res
        assert not cli_json(m, "restore", after)["procs"]
        w.close()
    assert not still_running(cli(m, "restore", before), w, "restore")


def test_restore_and_switch_without_a_daemon_name_a_process_still_running(mounted) -> None:
    """With the mount gone, `memfs restore` and `branch switch` open the store themselves,
    and still name a program whose changes they take out that runs on (it may write there
    again once the mount is back)."""
    m = mounted
    m.require_real()
    write_durably(m.work / "base.txt", b"base\n")
    before = status(m)["head"]
    cli(m, "branch", "create", "other")
    with Holder(m.work / "log.txt", CREATE) as w:
        assert w.do("write one") == "ok"
        assert w.do("fsync") == "ok"
        assert w.do("close") == "ok"
        m.umount()
        res = cli_json(m, "branch", "switch", "other")
        assert res["procs"] == [[w.pid, COMM]], res
        assert not still_running(cli(m, "branch", "switch", "main"), w, "switch")
        assert still_running(cli(m, "restore", before), w, "restore")


def test_branch_switch_names_a_process_whose_changes_it_leaves_that_still_runs(
        mounted) -> None:
    """A logger writes on main after `other` was branched; `memfs branch switch other`
    shows a tree without its file while it runs on: the switch names it, in text and in
    `procs` under --json. Switching back to main, which holds all it wrote, does not; what
    `procs` holds then is the commits only `other` has (a command run there)."""
    m = mounted
    m.require_real()
    write_durably(m.work / "base.txt", b"base\n")
    cli(m, "branch", "create", "other")
    log = m.work / "log.txt"
    with Holder(log, CREATE) as w:
        assert w.do("write on main") == "ok"
        assert w.do("fsync") == "ok"
        assert still_running(cli(m, "branch", "switch", "other"), w, "switch")
        assert gone(log)
        there = subprocess.Popen(["sh", "-c", 'echo x > "$1" && sync "$1"', "sh",
                                  str(m.work / "other.txt")], start_new_session=True)
        assert there.wait(timeout=30) == 0
        assert not still_running(cli(m, "branch", "switch", "main"), w, "switch")
        assert log.read_bytes() == b"on main\n"
        res = cli_json(m, "branch", "switch", "other")
        assert res["procs"] == [[w.pid, COMM]], res  # not the sh of other's own commit
        back = cli_json(m, "branch", "switch", "main")["procs"]
        assert [w.pid, COMM] not in back and there.pid in [p[0] for p in back], back


def test_the_cli_names_writers_not_readers_and_later_opens_work(mounted) -> None:
    """The text output names the cut-off writer (`cut off: PATH, open for writing by COMM
    (pid N)`); a process holding the same file only for reading is not named and keeps
    reading; a file opened after the undo takes writes as usual, and after a remount nothing
    of the cut-off writes is there."""
    m = mounted
    m.require_real()
    log = m.work / "log.txt"
    write_durably(m.work / "keep.txt", b"kept\n")
    with Holder(log, CREATE) as w:
        assert w.do("write one") == "ok"
        assert w.do("fsync") == "ok"
        with Holder(log, os.O_RDONLY, name="memfs-reader") as r:
            assert r.read() == b"one\n"
            out = cli(m, "undo")
            assert f"cut off: {m.mnt / 'work' / 'log.txt'}, open for writing by {COMM} " \
                   f"(pid {w.pid})" in out.stdout + out.stderr, out
            assert "memfs-reader" not in out.stdout + out.stderr
            assert str(r.pid) not in out.stdout + out.stderr
            assert r.read() == b"one\n"
            assert_cut_off(w)
    assert gone(log)
    write_durably(log, b"fresh\n")  # opened after the undo: an ordinary file
    with Holder(log, WRITE) as later:
        assert later.do("write more") == "ok"
        assert later.do("fsync") == "ok"
    assert log.read_bytes() == b"fresh\nmore\n"
    m.remount()
    assert log.read_bytes() == b"fresh\nmore\n"
    assert (m.work / "keep.txt").read_bytes() == b"kept\n"
    assert sorted(os.listdir(m.work)) == ["keep.txt", "log.txt"]


def test_a_writer_on_a_file_the_undo_keeps_is_not_cut_off(mounted) -> None:
    """An undo that leaves a file exactly as it was replaces nothing under its writer: the
    logger goes on appending, and the command names nobody."""
    m = mounted
    m.require_real()
    log = m.work / "log.txt"
    write_durably(log, b"one\n")
    with Holder(log, WRITE) as w:
        assert w.do("write two") == "ok"
        assert w.do("fsync") == "ok"
        subprocess.run(["sh", "-c", 'echo x > "$1" && sync "$1"', "sh",
                        str(m.work / "other.txt")], check=True, start_new_session=True)
        res = cli_json(m, "undo")
        assert gone(m.work / "other.txt"), res
        assert res["cut_off"] == []
        assert w.do("write three") == "ok"
        assert w.do("fsync") == "ok"
    assert log.read_bytes() == b"one\ntwo\nthree\n"



@pytest.mark.parametrize("unlink", [
    ["rm", "-rf", "build"],
    ["sh", "-c", "echo saved > build/log.txt.tmp && mv build/log.txt.tmp build/log.txt"],
], ids=["rm", "rename-over"])
def test_a_writer_whose_file_an_undo_brings_back_is_cut_off(mounted, unlink: list[str]) -> None:
    """A logger holds build/log.txt open while another command unlinks it (`rm -rf build`,
    or an editor-style save renamed over it): its writes go into a file no tree names, as
    on any filesystem. `memfs undo` of that command puts the file back; the logger is then
    cut off like any writer whose file the undo replaced. Before, its later write and fsync
    succeeded and the bytes were in no tree, beside the file the undo brought back (user
    trial: `rm -rf d` undone under a running appender)."""
    m = mounted
    m.require_real()
    (m.work / "build").mkdir()
    log = m.work / "build" / "log.txt"
    write_durably(log, b"base\n")
    with Holder(log, WRITE) as w:
        assert w.do("write one") == "ok"
        assert w.do("fsync") == "ok"
        subprocess.run(unlink, cwd=m.work, check=True, start_new_session=True)
        res = cli_json(m, "undo")
        assert log.read_bytes() == b"base\none\n", res
        assert [(c["path"], c["pid"]) for c in res["cut_off"]] == [
            ("work/build/log.txt", w.pid)], res
        assert_cut_off(w)
        assert log.read_bytes() == b"base\none\n"


def test_a_writer_of_an_unlinked_scratch_file_is_not_cut_off(mounted) -> None:
    """A scratch file unlinked while open for writing (its program's own, no name meant to
    come back) is not cut off by an undo that puts nothing at its path: it keeps writing."""
    m = mounted
    m.require_real()
    scratch = m.work / "scratch"
    with Holder(scratch, CREATE) as w:
        assert w.do("write one") == "ok"
        subprocess.run(["rm", str(scratch)], check=True, start_new_session=True)
        subprocess.run(["sh", "-c", 'echo x > "$1" && sync "$1"', "sh",
                        str(m.work / "other.txt")], check=True, start_new_session=True)
        res = cli_json(m, "undo")
        assert gone(m.work / "other.txt"), res
        assert res["cut_off"] == [], res
        assert w.do("write two") == "ok"
        assert w.do("fsync") == "ok"
        assert w.read() == b"one\ntwo\n"


def test_a_writer_on_a_host_whose_branch_was_taken_over_is_cut_off(mount_factory, pg_url: str,
                                                                     tmp_path: Path) -> None:
    """A store in PostgreSQL: host a's logger holds log.txt open while a pauses past its
    lease, host b takes the branch over and writes log.txt anew. Once a shows b's commit,
    the logger's writes answer ESTALE (not EROFS forever, not a success into a file no tree
    names), a's status and log name it, and b's file is untouched."""
    lease = {"MEMFS_LEASE_SECONDS": "2"}
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=lease)
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=lease)
    log = a.work / "log.txt"
    with Holder(log, CREATE) as w:
        assert w.do("write from a") == "ok"
        assert w.do("fsync") == "ok"
        wait_for(lambda: read(b.work / "log.txt") == b"from a\n", "host b to see a's file")
        assert a.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)  # a pause past the lease
        try:
            wait_for(lambda: b.cli("takeover", "main", check=False).returncode == 0,
                     "a's lease to expire")
            write_durably(b.work / "log.txt", b"b's log\n")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: read(log) == b"b's log\n", "host a to show b's commit")
        assert w.do("write stale") == "err ESTALE"
        assert w.do("fsync") == "err ESTALE"
        assert [(c["path"], c["pid"], c["comm"]) for c in status(a)["cut_off"]] == [
            ("work/log.txt", w.pid, COMM)]
        assert f"cut off: work/log.txt, open for writing by {COMM} (pid {w.pid})" \
            in a.log_text()
    assert read(b.work / "log.txt") == b"b's log\n"
    assert status(a)["cut_off"] == []  # released with the handle


def wait_for(pred, what: str, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def test_a_takeover_that_switches_the_mount_names_the_writers_it_cut_off(
        mount_factory, pg_url: str, tmp_path: Path) -> None:
    """Host b works on a branch of its own with a logger open on its file; host a dies and b
    takes main over, which switches b's mount to main: the logger is cut off and `memfs
    takeover` names it, as a branch switch does."""
    lease = {"MEMFS_LEASE_SECONDS": "2"}
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a", env=lease)
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b", env=lease)
    write_durably(a.work / "main.txt", b"main\n")
    b.cli("branch", "create", "mine")
    b.cli("branch", "switch", "mine")
    with Holder(b.work / "log.txt", CREATE) as w:
        assert w.do("write on mine") == "ok"
        assert w.do("fsync") == "ok"
        a.kill()
        deadline = time.monotonic() + 30
        while (took := b.cli("takeover", "main", "--json", check=False)).returncode != 0:
            assert time.monotonic() < deadline, f"a's lease never expired: {took.stderr}"
            time.sleep(0.1)
        res = json.loads(took.stdout)
        assert res["switched_from"] == "mine", res
        assert [(c["path"], c["comm"], c["pid"]) for c in res["cut_off"]] == [
            ("work/log.txt", COMM, w.pid)], res
        assert w.do("write after") == "err ESTALE"
        assert [(c["path"], c["pid"]) for c in status(b)["cut_off"]] == [
            ("work/log.txt", w.pid)]
    assert not (b.work / "log.txt").exists()
    assert (b.work / "main.txt").read_bytes() == b"main\n"
