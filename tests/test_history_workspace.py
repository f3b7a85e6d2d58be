"""Attribution and operation boundaries in the workspace, driven directly (no mount), with
real processes for /proc to describe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from memfs.store import open_store
from memfs.store.history import History
from memfs.store.trees import DIR, FILE
from memfs.workspace.attribution import CURRENT, Attribution, acting, read_proc
from memfs.workspace.workspace import Workspace

pytestmark = pytest.mark.usefixtures("store_env")  # both backends (tests/conftest.py)


def new_ws(root: Path) -> Workspace:
    return Workspace(open_store(root), commit_interval=10)


def ops_of(ws: Workspace, cid: str) -> list:
    got = History(ws.store, cid).get(0)
    return list(got.ops or [])


def test_a_process_tree_is_read_as_group_and_command(tmp_path: Path) -> None:
    """bash (its own process group, as a shell with job control starts a script) runs
    `sleep`: the group is bash's, the command is sleep, bash's own requests are 'top'."""
    flag = tmp_path / "ready"
    sh = subprocess.Popen(["bash", "-c", f"sleep 30 & echo $! > {flag}.tmp && mv {flag}.tmp "
                          f"{flag}; wait"], process_group=0)
    try:
        for _ in range(500):
            if flag.exists():
                break
            time.sleep(0.01)
        child = int(flag.read_text())
        a = Attribution()
        top, cmd = a.of_request(sh.pid, 0), a.of_request(child, 0)
        assert top.group == cmd.group and top.pgid == sh.pid == cmd.pgid
        assert top.command == "top" and top.top_self and top.top_shell
        assert cmd.command.startswith(f"{child}@") and not cmd.top_self
        assert cmd.label == "sleep 30" and cmd.leader.startswith("bash -c")
        mine = a.of_request(os.getpid(), 0)  # another group altogether
        assert mine.group != cmd.group
        a.mark()
        assert a.of_request(child, 0).group != cmd.group, "a mark starts new operations"
    finally:
        os.killpg(sh.pid, signal.SIGKILL)  # its own group: bash and its sleep
        sh.wait()


def test_stat_with_spaces_and_parens_in_the_name(tmp_path: Path) -> None:
    odd = tmp_path / "a (b) c"
    os.symlink(sys.executable, odd)
    p = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(200):
            info = read_proc(p.pid)
            if info is not None and info.comm.startswith("a (b)"):
                break
            time.sleep(0.01)
        assert info is not None and info.comm == "a (b) c" and info.ppid == os.getpid()
    finally:
        p.kill()
        p.wait()
    assert read_proc(p.pid) is None, "a gone process reads as None"


def test_only_a_change_names_its_process_and_a_failed_commit_keeps_the_names(
        tmp_path: Path) -> None:
    ws = new_ws(tmp_path / "root")
    me = ws.attribution.of_request(os.getpid(), os.getuid())

    async def main() -> None:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)  # unattributed: direct API
        await ws.commit()
        with acting(me):
            try:
                ws.create(work.parent, b"work", DIR, 0o755, 0, 0)  # EEXIST: no change
            except OSError:
                pass
        assert ws._group == {}, "a refused request joined the group"
        real = ws._write

        def fail_once(plan, message):
            ws._write = real
            raise OSError(28, "No space left on device (test)")

        with acting(me):
            ws.write(ws.create(work, b"f", FILE, 0o644, 0, 0), 0, b"x")
        ws._write = fail_once
        try:
            await ws.commit()
        except OSError:
            pass
        else:
            raise AssertionError("the commit should have failed")
        cid = await ws.commit()
        assert [o.pid for o in ops_of(ws, cid)] == [os.getpid()], "the retry names nobody"

    trio.run(main)
    first = History(ws.store, ws.head).get(1)
    assert first.op.kind == "memfs" and first.commit.message == "changes"


def test_a_boundary_closes_the_other_operations_group(tmp_path: Path) -> None:
    ws = new_ws(tmp_path / "root")
    a, b = ws.attribution.system("memfs", "A"), ws.attribution.system("memfs", "B")

    async def main() -> None:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        await ws.commit()
        for op, name in [(a, b"a1"), (b, b"b1"), (a, b"a2")]:
            with acting(op):
                await ws.boundary()
                ws.create(work, name, FILE, 0o644, 0, 0)
        with acting(a):  # the same operation again: no commit
            before = ws.commit_count
            await ws.boundary()
            ws.create(work, b"a3", FILE, 0o644, 0, 0)
            assert ws.commit_count == before
        await ws.commit()

    trio.run(main)
    labels = [c.commit.message for c in History(ws.store, ws.head)][:3]
    assert labels == ["A", "B", "A"], labels
    assert CURRENT.get() is None


def test_threads_of_one_process_are_one_command(tmp_path: Path) -> None:
    """FUSE names the requesting thread; a writer's threads are still its one process."""
    code = ("import threading, time; threading.Thread(target=time.sleep, args=(30,), "
            "daemon=True).start(); print(threading.get_native_id(), flush=True); time.sleep(30)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         process_group=0)
    try:
        main_tid = int(p.stdout.readline())
        tids = [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
        other = next(t for t in tids if t != main_tid)
        a = Attribution()
        assert a.of_request(other, 0).key == a.of_request(p.pid, 0).key
        assert a.of_request(other, 0).pid == p.pid
    finally:
        p.kill()
        p.wait()


@pytest.mark.embedded_only  # the retention policy's tombstones are the embedded store's
def test_history_walks_over_commits_the_retention_policy_dropped(tmp_path: Path) -> None:
    """lifecycle's GC deletes a commit row and keeps a tombstone with its parent: log, undo
    and `log --ops` walk over it as Store.log does."""
    ws = new_ws(tmp_path / "root")

    async def main() -> list[str]:
        work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        ids = [await ws.commit()]
        for name in (b"a", b"b", b"c"):
            ws.create(work, name, FILE, 0o644, 0, 0)
            ids.append(await ws.commit())
        return ids

    ids = trio.run(main)
    conn = ws.store._writer
    conn.execute("CREATE TABLE IF NOT EXISTS dropped_commits (id TEXT PRIMARY KEY, parent TEXT, "
                 "seq INTEGER NOT NULL, branch TEXT NOT NULL, time_ns INTEGER NOT NULL, "
                 "dropped_ns INTEGER NOT NULL, reason TEXT NOT NULL) WITHOUT ROWID")
    for gone in ids[1:3]:
        c = ws.store.commit(gone)
        conn.execute("INSERT INTO dropped_commits VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (c.id, c.parent, c.seq, c.branch, c.time_ns, c.time_ns, "test"))
        conn.execute("DELETE FROM commits WHERE id = ?", (gone,))
    walked = [c.id for c in History(ws.store, ws.head)]
    assert walked[:2] == [ids[3], ids[0]], walked
