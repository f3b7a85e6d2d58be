"""Undo by operation through a real mount: the command a person or an agent ran, not a timer.

Three ways commands reach memfs, each tested as people run them: a terminal with job
control (an interactive bash on a pseudo-terminal from `script`: every command line is its
own process group), a plain script (one group, its commands children of one bash), and an
agent-style runner that starts one shell per tool call. In each, the README's flow then
`memfs undo` must leave the repository exactly as it was before the last command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.mount import REPO, memfs_cmd
from helpers.tree import diff_snapshots, snapshot

pytestmark = pytest.mark.mount

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "memfs test",
    "GIT_AUTHOR_EMAIL": "test@memfs.invalid",
    "GIT_COMMITTER_NAME": "memfs test",
    "GIT_COMMITTER_EMAIL": "test@memfs.invalid",
    "LC_ALL": "C",
    "TERM": "dumb",
    "GIT_OPTIONAL_LOCKS": "0",  # `git status` refreshes no index: it only looks
}
# Snapshot the current directory into a JSON file: reads only, so it changes nothing it could
# be blamed for.
SNAP_PY = f"""import json, sys
sys.path.insert(0, {str(REPO / 'tests')!r})
from helpers.tree import snapshot
json.dump(snapshot("."), open(sys.argv[1], "w"))
"""
SNAP_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / f"memfs-snap-{os.getpid()}.py"


def env_for(m) -> dict[str, str]:
    SNAP_FILE.write_text(SNAP_PY)
    return {**GIT_ENV, "MEMFS": shlex.join(memfs_cmd(m.root)),
            "SNAP": f"{sys.executable} -B {SNAP_FILE}",
            "GIT_DEFAULT": "-c init.defaultBranch=main -c gc.auto=0"}


def job(m, cwd: Path, *cmd: str) -> str:
    """One command in a process group of its own, as a shell with job control starts it."""
    out = subprocess.run(list(cmd), cwd=cwd, env=env_for(m), capture_output=True, text=True,
                         timeout=300, process_group=0)
    assert out.returncode == 0, f"{cmd}: {out.stderr}{out.stdout}"
    return out.stdout


def git(m, cwd: Path, *args: str) -> str:
    return job(m, cwd, "git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args)


def load(path: Path) -> dict:
    return {k: tuple(v) for k, v in json.loads(path.read_text()).items()}


def head_ops(m, n: int = 1) -> list[dict]:
    return m.cli_json("log", "--ops", "-n", str(n))


README_FLOW = [
    "cd work",
    "git $GIT_DEFAULT init -q",
    "echo hi > a.txt",
    "git add -A",
    "$SNAP {before}",
    "git commit -qm first",
    "$MEMFS undo",
    "$SNAP {after}",
    "printf '%s%s\\n' @@ \"pwd=$(pwd)\"",
    "git status --porcelain | sed 's/^/@@status=/'",
    "git rev-parse -q --verify HEAD || printf '%s\\n' @@no-head",
]


def _markers(text: str) -> list[str]:
    clean = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    return [ln[2:] for ln in clean.splitlines() if ln.startswith("@@")]


def _check_readme_undo(m, tmp: Path, markers: list[str]) -> None:
    diff = diff_snapshots(load(tmp / "before.json"), load(tmp / "after.json"))
    assert not diff, f"undo did not restore the state before `git commit`: {diff}"
    assert f"pwd={m.work}" in markers, markers  # the shell's cwd is still there
    assert "status=A  a.txt" in markers and "no-head" in markers, markers


def test_readme_flow_in_a_terminal_with_job_control(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    flow = [ln.format(before=tmp_path / "before.json", after=tmp_path / "after.json")
            for ln in README_FLOW]
    # The README's one line: with job control each command of an && list is its own group.
    lines = ["set -o | grep -q 'monitor.*on' && printf '%s\\n' @@job-control",
             " && ".join(flow[:6])] + flow[6:] + ["exit"]
    out = subprocess.run(["script", "-qfec", "bash --norc --noprofile -i", "/dev/null"],
                         input="\n".join(lines) + "\n", cwd=mounted.mnt, env=env_for(mounted),
                         capture_output=True, text=True, timeout=300)
    markers = _markers(out.stdout)
    assert "job-control" in markers, out.stdout
    _check_readme_undo(mounted, tmp_path, markers)
    # Each command line was its own process group; what is left is `git add` on top.
    ops = head_ops(mounted, 2)
    assert ops[0]["label"] == "git add -A", ops
    assert ops[0]["pgid"] != ops[1]["pgid"], ops


def test_readme_flow_in_a_plain_script(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    script = tmp_path / "flow.sh"
    script.write_text("set -e\n" + "\n".join(
        ln.format(before=tmp_path / "before.json", after=tmp_path / "after.json")
        for ln in README_FLOW) + "\n")
    out = subprocess.run(["bash", str(script)], cwd=mounted.mnt, env=env_for(mounted),
                         capture_output=True, text=True, timeout=300, process_group=0)
    assert out.returncode == 0, out.stderr
    _check_readme_undo(mounted, tmp_path, _markers(out.stdout))
    # One process group for the whole script; the operations are its commands.
    ops = head_ops(mounted, 3)
    assert [o["label"] for o in ops[:2]] == ["git add -A", f"bash {script}"], ops
    assert len({o["pgid"] for o in ops}) == 1


RUNNER = textwrap.dedent("""
    import json, os, subprocess, sys
    for step in json.load(open(sys.argv[1])):
        if "sh" in step:
            subprocess.run(["sh", "-c", step["sh"]], check=True)
        elif "write" in step:  # the runner's own file tool
            path, text = step["write"]
            with open(path, "w") as f:
                f.write(text)
        elif "mark" in step:
            subprocess.run(os.environ["MEMFS"].split() + ["mark", step["mark"]], check=True,
                           stdout=subprocess.DEVNULL)
        elif "after-batch" in step:  # what an agent with --watch on-agent-action calls
            subprocess.run(os.environ["MEMFS"].split() + ["after-batch"], check=True,
                           stdout=subprocess.DEVNULL)
""")


def run_agent(m, tmp: Path, steps: list[dict]) -> None:
    (tmp / "runner.py").write_text(RUNNER)
    (tmp / "steps.json").write_text(json.dumps(steps))
    job(m, m.work, sys.executable, str(tmp / "runner.py"), str(tmp / "steps.json"))


def test_agent_runner_one_shell_per_tool_call(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    run_agent(mounted, tmp_path, [
        {"sh": "git $GIT_DEFAULT init -q"}, {"sh": "echo hi > a.txt"}, {"sh": "git add -A"},
        {"sh": f"$SNAP {tmp_path / 'before.json'}"},
        {"sh": "git commit -qm first && echo more >> a.txt"}])
    mounted.cli("undo")
    job(mounted, mounted.work, "sh", "-c", f"$SNAP {tmp_path / 'after.json'}")
    assert not diff_snapshots(load(tmp_path / "before.json"), load(tmp_path / "after.json"))
    assert git(mounted, mounted.work, "status", "--porcelain") == "A  a.txt\n"
    assert head_ops(mounted)[0]["label"] == "sh -c 'git add -A'"


def test_agent_runner_that_writes_itself_splits_at_marks(mounted, tmp_path: Path) -> None:
    """A runner whose own file tool writes is one operation by the rule; `memfs mark` after
    each tool call is how it names its boundaries."""
    mounted.require_real()
    run_agent(mounted, tmp_path, [
        {"write": ["notes.txt", "plan\n"]}, {"mark": "call-1"},
        {"sh": "echo one > one.txt"}, {"mark": "call-2"},
        {"write": ["notes.txt", "plan, done\n"]}, {"mark": "call-3"}])
    marks = [m for c in mounted.cli_json("log", "-n", "0") for m in c["marks"]]
    assert marks == ["call-3", "call-2", "call-1"], marks
    mounted.cli("undo")
    assert (mounted.work / "notes.txt").read_text() == "plan\n"
    assert (mounted.work / "one.txt").read_text() == "one\n"
    mounted.cli("undo")
    assert not (mounted.work / "one.txt").exists()
    assert (mounted.work / "notes.txt").read_text() == "plan\n"


def test_after_batch_is_a_boundary(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    run_agent(mounted, tmp_path, [
        {"write": ["out.txt", "batch one\n"]}, {"after-batch": True},
        {"write": ["out.txt", "batch two\n"]}, {"after-batch": True}])
    mounted.cli("undo")
    assert (mounted.work / "out.txt").read_text() == "batch one\n"


HOOK = """#!/bin/sh
{py} -c "import os; f = open('hook-ran', 'w'); f.write('x'); f.flush(); os.fsync(f.fileno())"
"""


def test_git_commit_of_2000_files_is_undone_whole(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    w = mounted.work
    git(mounted, w, "init", "-q")
    for i in range(2000):
        d = w / f"pkg{i % 40}"
        d.mkdir(exist_ok=True)
        (d / f"mod{i}.py").write_text(f"value = {i}\n" * (1 + i % 7))
    git(mounted, w, "add", "-A")
    for name in ("pre-commit", "post-commit"):  # hooks write (and fsync) in the commit
        hook = w / ".git" / "hooks" / name
        hook.write_text(HOOK.format(py=sys.executable))
        hook.chmod(0o755)
    before = snapshot(w)
    git(mounted, w, "commit", "-qm", "two thousand files")
    op = head_ops(mounted)[0]
    assert op["label"].startswith("git -c init.defaultBranch=main -c gc.auto=0 commit"), op
    assert len(op["commits"]) >= 2, f"the hooks' fsyncs cut the commit into several: {op}"

    out = mounted.cli("undo").stdout
    assert "commit -qm 'two thousand files'" in out, out
    assert not diff_snapshots(before, snapshot(w)), "git's state before the commit, whole"
    st = subprocess.run(["git", "status", "--porcelain"], cwd=w, env=GIT_ENV,
                        capture_output=True, text=True)
    assert st.stdout.count("A  ") == 2000, st.stdout[-500:]
    assert "No commits yet" in subprocess.run(["git", "status"], cwd=w, env=GIT_ENV,
                                              capture_output=True, text=True).stdout


def test_two_shells_interleaved_are_undone_one_at_a_time(mounted) -> None:
    mounted.require_real()
    shells = {}
    for name in ("a", "b"):
        shells[name] = subprocess.Popen(["bash", "-s"], cwd=mounted.work, env=env_for(mounted),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, process_group=0)
    try:
        def run(name: str, cmd: str) -> None:
            sh = shells[name]
            sh.stdin.write(cmd + "; echo done\n")
            sh.stdin.flush()
            assert sh.stdout.readline() == "done\n"

        order = [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2")]
        for name, n in order:
            run(name, f"echo {name}{n} | tee {name}{n}.txt > /dev/null")
    finally:
        for sh in shells.values():
            sh.stdin.close()
            sh.wait(timeout=30)
    present = {f"{n}{i}.txt" for n, i in order}
    for name, n in reversed(order):
        assert {p.name for p in mounted.work.iterdir()} == present
        res = mounted.cli_json("undo")
        assert res["undone"] == [f"tee {name}{n}.txt"], res
        present.discard(f"{name}{n}.txt")
    assert list(mounted.work.iterdir()) == []


FAILING = textwrap.dedent("""
    import errno, os, sys
    mnt, work, past = sys.argv[1:4]
    for what, call in [("EROFS", lambda: open(os.path.join(past, "x"), "w")),
                       ("EEXIST", lambda: os.mkdir(work)),
                       ("EPERM", lambda: open(os.path.join(mnt, "file-at-root"), "w"))]:
        try:
            call()
        except OSError as exc:
            assert errno.errorcode[exc.errno] == what, (what, exc)
        else:
            raise AssertionError(what + " did not fail")
    print(os.getpid())
""")


def test_failed_requests_are_never_attributed(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    (mounted.work / "seed").write_text("s\n")
    mounted.cli("status")
    head = mounted.cli_json("log", "-n", "1")[0]["id"]
    past = mounted.mnt / ".memfs" / "history" / head / "work"
    script = tmp_path / "fail.py"
    script.write_text(FAILING)
    pid = int(job(mounted, tmp_path, sys.executable, str(script), str(mounted.mnt),
                  str(mounted.work), str(past)))
    job(mounted, mounted.work, "sh", "-c", "echo after > after.txt && sync after.txt")
    log = mounted.cli_json("log", "-n", "0")
    named = {p["pid"] for c in log for p in c["processes"]}
    assert pid not in named, f"pid {pid} only failed, yet a commit names it"
    assert log[0]["cmdline"] == "sh -c 'echo after > after.txt && sync after.txt'", log[0]
    assert all(c["kind"] is not None for c in log[:-1]), "a commit names nobody"


def test_undo_commits_and_to_a_moment(mounted) -> None:
    """`undo --commits N` goes back N commits and `--to` to a revision or a moment. What each
    commit holds is read from its history view: a command's create and its write may fall in
    two group commits (on a loaded machine `sh` starting `echo` outlasts the 100 ms interval),
    and then the commit two back still holds f1, empty (the test assumed one commit a
    command and failed under load)."""
    mounted.require_real()
    for i in range(3):
        job(mounted, mounted.work, "sh", "-c", f"echo {i} > f{i}")
    mounted.cli("status")  # what the last command left is committed

    def names(where: Path) -> list[str]:
        return sorted(p.name for p in where.iterdir())

    def at(cid: str) -> list[str]:
        return names(mounted.mnt / ".memfs" / "history" / cid / "work")

    log = mounted.cli_json("log", "-n", "3")
    assert at(log[0]["id"]) == ["f0", "f1", "f2"]
    res = mounted.cli_json("undo", "--commits", "2")
    assert res["head"] == log[2]["id"] and res["commits"] == 2
    assert names(mounted.work) == at(log[2]["id"]) and "f2" not in names(mounted.work)
    mounted.cli("restore", res["old_head"])
    res = mounted.cli_json("undo", "--to", log[1]["id"][:10])
    assert names(mounted.work) == at(log[1]["id"])
    mounted.cli("restore", res["old_head"])
    res = mounted.cli_json("undo", "--to", "@%.6f" % (log[1]["time"] + 1e-6))
    assert res["head"] == log[1]["id"]
    bad = mounted.cli("undo", "--to", "not-a-rev-or-time", check=False)
    assert bad.returncode == 1 and "neither a revision nor a time" in bad.stderr
    assert mounted.cli_json("log", "-n", "1")[0]["id"] == log[1]["id"], "refusal moved head"


def test_git_status_between_undos_is_not_an_operation(mounted, tmp_path: Path) -> None:
    """A plain `git status` (optional locks on, as people run it) takes .git/index.lock and
    drops it: nothing is left changed but .git's times. `memfs undo` right after it must
    still take back the `git commit` before it, as a user checking `git status` between
    two undos expects, and `log --ops` must list what undo takes."""
    mounted.require_real()
    w = mounted.work
    git(mounted, w, "init", "-q")
    (w / "a.txt").write_text("hi\n")
    git(mounted, w, "add", "-A")
    before = snapshot(w)
    git(mounted, w, "commit", "-qm", "first")
    env = {k: v for k, v in GIT_ENV.items() if k != "GIT_OPTIONAL_LOCKS"}
    for _ in range(2):
        subprocess.run(["git", "status", "--short"], cwd=w, env=env, check=True,
                       capture_output=True, process_group=0)
    mounted.cli("status")  # what git status left is committed
    ops = head_ops(mounted, 2)
    assert "commit -qm first" in ops[0]["label"], ops
    assert ops[0]["quiet"] == ["git status --short"] * 2, ops[0]
    assert "add -A" in ops[1]["label"], ops
    shown = mounted.cli("diff", "--stat").stdout
    assert "work/.git/COMMIT_EDITMSG" in shown, shown  # what the next undo takes back

    res = mounted.cli_json("undo")
    assert len(res["undone"]) == 1 and "commit -qm first" in res["undone"][0], res
    assert res["quiet"] == ["git status --short"] * 2, res
    assert not diff_snapshots(before, snapshot(w)), "git's state before the commit"
    st = subprocess.run(["git", "status", "--porcelain"], cwd=w, env=env,
                        capture_output=True, text=True, process_group=0)
    assert st.stdout == "A  a.txt\n", st.stdout
    out = mounted.cli("undo").stdout  # that git status is not what the next undo takes
    assert "add -A" in out and "with it, after it, changing only times: `git status" in out, out


def test_a_touch_is_an_operation_undo_takes_alone(mounted) -> None:
    """A `touch` changes only times too, but on purpose: `memfs undo` right after it takes
    back the touch alone (the file's old mtime), never the command before it as well, as it
    does for git status's side effects."""
    mounted.require_real()
    w = mounted.work
    job(mounted, w, "sh", "-c", "echo one > a.txt")
    os.utime(w / "a.txt", ns=(10**18, 10**18))  # an old, known time to come back to
    job(mounted, w, "sh", "-c", "echo two > b.txt")
    b_time = os.stat(w / "b.txt").st_mtime_ns
    job(mounted, w, "touch", "a.txt")
    mounted.cli("status")  # committed
    ops = head_ops(mounted, 1)
    assert ops[0]["label"].startswith("touch") and ops[0]["quiet"] == [], ops
    res = mounted.cli_json("undo")
    assert len(res["undone"]) == 1 and res["undone"][0].startswith("touch"), res
    assert res["quiet"] == [], res
    assert (w / "b.txt").read_text() == "two\n", "the command before the touch stays"
    assert os.stat(w / "b.txt").st_mtime_ns == b_time
    assert os.stat(w / "a.txt").st_mtime_ns == 10**18, "the touch is taken back"
