"""Durability against a crash model that keeps ONLY what was synced (issue 2's contract).

A SIGKILL keeps the page cache, so a kill test proves ordering, never that an fsync was made.
Here a real workload (Store + Workspace with group commit and `sync()`, or a real mount with
fsync) runs under an LD_PRELOAD shim that logs every write, truncate, sync and name change
under the store root; the replayer then rebuilds, for many cut points, what a power cut could
leave (only synced data, only names whose directory was synced, and adversarial mixes of the
rest). Each image must open with memfs's own Store, pass fsck, have every chunk read back
under its digest, and show on the branch head a tree the workspace really had, no older than
the last `sync()` (or fsync) that returned.

What this trusts: that the kernel and disk honour fsync/fdatasync (the model starts there).
What it does not model: torn sectors, a lying disk cache. See docs/guarantees.md, "Crash model".
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crashmodel.replay import (
    Event,
    Policy,
    append_mark,
    crash_image,
    read_log,
    resolve,
    snapshot,
)
from helpers.mount import REPO, force_unmount, fuse_missing_reason, is_mounted, memfs_cmd
from helpers.require import require_tool

from memfs.store import Store
from memfs.store.chunks import CHUNK_SIZE, chunk_digest
from memfs.store.trees import DIR, FILE, decode_dir

MODEL = Path(__file__).parent / "crashmodel"
PAGE = 4096  # the kernel's page: where it may split one write into two FUSE requests


@dataclass
class Recording:
    """One recorded run: the log's events, and the tree after each numbered mutation."""

    root: Path
    events: list[Event]
    kinds: dict[int, str]
    states: dict[int, str]  # mutation number -> canonical JSON of the tree
    marks: list[tuple[int, str, int]]  # (log index, "mut" | "synced", mutation number)
    # mutation number -> the trees it passes through on its way (drive_mount: a write the
    # kernel sends as two requests); a cut may land between them unless a sync followed it
    partial: dict[int, set[str]] = field(default_factory=dict)

    def bounds(self, cut: int) -> tuple[int, int]:
        """(last mutation a sync() promised, last mutation made) before record `cut`."""
        synced = made = 0
        for idx, kind, i in self.marks:
            if idx >= cut:
                break
            if kind == "synced":
                synced = i
            made = i
        return synced, made

    def sync_cuts(self) -> list[int]:
        """Just after each sync() returned, and just before and after every fsync."""
        cuts = {idx + 1 for idx, kind, _ in self.marks if kind == "synced"}
        for e in self.events:
            if e.kind == "sync":
                cuts |= {e.idx, e.idx + 1}
        return sorted(cuts)


def record(shim: Path, tmp: Path, runs: list[tuple[int, int]], *, init: bool = True,
           skip_sync: str = "", start: dict[str, bytes | None] | None = None) -> Recording:
    """`memfs init` (unless init=False), then one workload process per (seed, ops).

    With `start`, tmp/root already holds a store (e.g. a crash image) whose head has these
    files: the log's base is what the root holds now, and the workload continues from them.
    """
    root, log, states = tmp / "root", tmp / "crash.log", tmp / "states.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    base = snapshot(root)
    states.write_text(json.dumps({"i": 0, "state": state_of(start or {})}) + "\n")
    if start:
        states.with_suffix(".files").write_text(
            json.dumps({p: b.hex() for p, b in start.items() if b is not None}))
    env = dict(os.environ, LD_PRELOAD=str(shim), MEMFS_CRASHLOG=str(log),
               MEMFS_CRASHLOG_DIR=str(root), MEMFS_CRASHLOG_SKIP_SYNC=skip_sync,
               PYTHONPATH=str(REPO))
    cmds = [[sys.executable, "-m", "memfs", "--root", str(root), "init"]] if init else []
    cmds += [[sys.executable, str(MODEL / "workload.py"), str(root), str(states), str(seed),
              str(ops)] for seed, ops in runs]
    for n, cmd in enumerate(cmds):
        append_mark(log, f"process {n}")
        res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"{cmd}: {res.stdout}{res.stderr}"
    events, kinds = resolve(read_log(log), root, base)
    table = {}
    for line in states.read_text().splitlines():
        row = json.loads(line)
        table[row["i"]] = json.dumps(row["state"], sort_keys=True)
    return Recording(root, events, kinds, table, marks_of(events))


def marks_of(events: list[Event]) -> list[tuple[int, str, int]]:
    """(log index, "mut" | "synced", mutation number) of the workload's marks."""
    out = []
    for e in events:
        word, _, num = e.label.partition(" ")
        if e.kind == "mark" and word in ("mut", "synced"):
            out.append((e.idx, word, int(num)))
    return out


def file_bytes(store: Store, ref: str, size: int) -> bytes:
    buf = bytearray(size)
    for i, chunk in store.file_chunks(ref).items():
        data = store.read_chunk(chunk)[: max(0, size - i * CHUNK_SIZE)]
        buf[i * CHUNK_SIZE: i * CHUNK_SIZE + len(data)] = data
    return bytes(buf)


def tree_files(store: Store, tree: str, prefix: str = "") -> dict[str, bytes | None]:
    """Path -> bytes (None for a directory) of a committed tree."""
    out: dict[str, bytes | None] = {}
    for e in decode_dir(store.read_object(tree)):
        path = prefix + e.name
        if e.kind == DIR:
            out[path] = None
            out.update(tree_files(store, e.ref, path + "/"))
        elif e.kind == FILE:
            out[path] = file_bytes(store, e.ref, e.size)
    return out


def state_of(files: dict[str, bytes | None]) -> dict[str, str]:
    return {p: "dir" if b is None else hashlib.sha256(b).hexdigest() for p, b in files.items()}


def chunk_problems(store: Store, db: Path) -> list[str]:
    """Stricter than fsck's length check: every chunk reads back under its own digest."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        ids = [row[0] for row in conn.execute("SELECT id FROM chunks")]
    finally:
        conn.close()
    bad = []
    for cid in ids:
        try:
            if chunk_digest(store.read_chunk(cid)) != cid.split(".")[0]:
                bad.append(f"chunk {cid}: bytes differ from its digest")
        except OSError as exc:
            bad.append(f"chunk {cid}: {exc}")
    return bad


def check_cut(rec: Recording, cut: int, policy: Policy, scratch: Path) -> str | None:
    """None if the image a power cut at `cut` leaves keeps the contract, else what broke."""
    img = scratch / "img"
    shutil.rmtree(img, ignore_errors=True)
    img.mkdir(parents=True)
    crash_image(rec.events, rec.kinds, cut, policy, img)
    synced, made = rec.bounds(cut)
    where = f"cut {cut} ({policy}; synced through mutation {synced}, made {made})"
    try:
        store = Store.open(img)
    except Exception as exc:  # noqa: BLE001 - any refusal to open is the finding
        return f"{where}: store does not open: {exc!r}"
    try:
        problems = store.fsck() + chunk_problems(store, img / "store.db")
        if problems:
            return f"{where}: fsck: {problems[:3]}"
        head = json.dumps(state_of(tree_files(store, store.commit(store.head()).tree)),
                          sort_keys=True)
    except Exception as exc:  # noqa: BLE001
        return f"{where}: reading the head failed: {exc!r}"
    finally:
        store.close()
    allowed = {rec.states[i] for i in range(synced, made + 1)}
    allowed |= {t for i in range(synced + 1, made + 1) for t in rec.partial.get(i, ())}
    if head not in allowed:
        older = [i for i in range(synced) if rec.states[i] == head]
        return f"{where}: head is {f'mutation {older[-1]}' if older else 'a tree never made'}"
    return None


def failures(rec: Recording, plan: list[tuple[int, Policy]], scratch: Path, *,
             stop_after: int = 10**9) -> list[str]:
    out = []
    for cut, policy in plan:
        msg = check_cut(rec, cut, policy, scratch)
        if msg:
            out.append(msg)
            if len(out) >= stop_after:
                break
    return out


SCENARIO = """
import os, sys
d = sys.argv[1]
fd = os.open(f"{d}/a", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b"hello")
os.fsync(fd)                          # a's bytes are durable, its name not yet
os.write(fd, b" world" + b"p" * 9000)  # never synced: three pages of writeback
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
os.mkdir(f"{d}/sub")
os.fsync(dfd)                         # now the names a and sub are durable
fb = os.open(f"{d}/sub/b", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fb, b"x")
os.fsync(fb)                          # b's bytes durable; sub/ never synced, so b's name not
os.rename(f"{d}/a", f"{d}/c")         # never synced
"""


def image_of(rec_events: list[Event], kinds: dict[int, str], cut: int, policy: Policy,
             dest: Path) -> dict[str, bytes | None]:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    crash_image(rec_events, kinds, cut, policy, dest)
    return {str(p.relative_to(dest)): None if p.is_dir() else p.read_bytes()
            for p in sorted(dest.rglob("*"))}


def test_replay_keeps_only_what_was_synced(shim: Path, tmp_path: Path) -> None:
    """The model's rules, on a small script whose every call we know."""
    root, log = tmp_path / "root", tmp_path / "log"
    root.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(shim), MEMFS_CRASHLOG=str(log),
               MEMFS_CRASHLOG_DIR=str(root))
    append_mark(log, "process 0")
    subprocess.run([sys.executable, "-c", SCENARIO, str(root)], env=env, check=True)
    events, kinds = resolve(read_log(log), root)
    end = max(e.idx for e in events) + 1
    img = tmp_path / "img"
    assert image_of(events, kinds, end, Policy("drop", "drop"), img) == {
        "a": b"hello", "sub": None}
    tail = b" world" + b"p" * 9000
    assert image_of(events, kinds, end, Policy("keep", "keep"), img) == {
        "c": b"hello" + tail, "sub": None, "sub/b": b"x"}
    dir_sync = next(e.idx for e in events if e.kind == "sync" and kinds[e.obj] == "dir")
    assert image_of(events, kinds, dir_sync, Policy("drop", "drop"), img) == {}
    # Random writeback: each 4 KiB page of the unsynced write lands or not, independently.
    seen = set()
    for seed in range(12):
        got = image_of(events, kinds, end, Policy("random", "drop", seed), img)["a"]
        full = b"hello" + tail
        assert got[:5] == b"hello"
        for lo, hi in ((5, 4096), (4096, 8192), (8192, len(full))):
            part = got[lo:hi]  # the new bytes, a hole, or past the end (b"")
            assert part in (full[lo:hi], bytes(len(part))), (seed, lo)
        seen.add(got)
    assert len(seen) > 2


def test_synced_state_survives_every_cut(shim: Path, tmp_path: Path, scratch: Path) -> None:
    """`memfs init`, then two workload processes (a reopen in between), cut everywhere."""
    rec = record(shim, tmp_path, [(11, 45), (12, 45)])
    synced_marks = [idx + 1 for idx, kind, _ in rec.marks if kind == "synced"]
    assert len(synced_marks) >= 10
    end = max(e.idx for e in rec.events) + 1
    rng = random.Random(5)
    plan = [(cut, Policy("drop", "drop")) for cut in rec.sync_cuts()]
    plan += [(cut, Policy("keep", "keep")) for cut in synced_marks]
    for n, cut in enumerate(sorted(rng.sample(range(end + 1), 60)) + [0, end]):
        plan += [(cut, Policy("drop", "drop")), (cut, Policy("random", "random", n)),
                 (cut, Policy("random", "drop", n, grain=512)),
                 (cut, Policy("drop", "random", n)), (cut, Policy("keep", "prefix", n))]
    assert not failures(rec, plan, scratch)
    # Every mutation was synced at the end: a cut after the whole log keeps the last state.
    assert rec.bounds(end) == (max(rec.states), max(rec.states))


def recovered_files(root: Path, scratch: Path) -> dict[str, bytes | None]:
    """The head a store at `root` recovers to, read from a copy (opening changes the files)."""
    probe = scratch / "probe"
    shutil.rmtree(probe, ignore_errors=True)
    shutil.copytree(root, probe)
    store = Store.open(probe)
    try:
        return tree_files(store, store.commit(store.head()).tree)
    finally:
        store.close()
        shutil.rmtree(probe)


def test_a_second_cut_after_recovery(shim: Path, tmp_path: Path, scratch: Path) -> None:
    """Power cut, recovery, more work, another power cut. The recovered root carries what a
    cut leaves (dead pack tails, holes, a WAL with an unsynced tail, names that did not land);
    the work after it must keep the contract just the same."""
    first = record(shim, tmp_path / "first", [(31, 30)])
    end = max(e.idx for e in first.events) + 1
    rng = random.Random(9)
    policies = [Policy("random", "random", 1), Policy("random", "drop", 2, grain=512),
                Policy("keep", "prefix", 3)]
    recovered_bytes = 0
    for n, policy in enumerate(policies):
        cut = rng.randrange(end // 3, end)
        assert check_cut(first, cut, policy, scratch) is None
        again = tmp_path / f"again{n}"
        (again / "root").mkdir(parents=True)
        crash_image(first.events, first.kinds, cut, policy, again / "root")
        start = recovered_files(again / "root", scratch)
        recovered_bytes += sum(len(b) for b in start.values() if b)
        rec = record(shim, again, [(40 + n, 25)], init=False, start=start)
        plan = [(c, Policy("drop", "drop")) for c in rec.sync_cuts()]
        plan += [(idx + 1, Policy("random", "random", n)) for idx, kind, _ in rec.marks
                 if kind == "synced"]
        assert not failures(rec, plan, scratch)
    assert recovered_bytes, "no cut left any file behind: the second run started empty"


def drive_mount(mnt: Path, log: Path, seed: int, ops: int
                ) -> tuple[dict[int, str], dict[int, set[str]]]:
    """Shell-like steps through a real mount, each one system call that changes the tree.

    Each is one FUSE request but a write that crosses a page boundary: the kernel sends a
    partly written page it does not hold in its page cache as a request of its own, so the
    daemon may commit the write's first part alone (seen in full runs on a loaded machine: a
    head holding the first 4096 bytes of a write). What the file holds at each page boundary
    of such a write is a state of that mutation too (the second table), as on a native
    filesystem, where a crash may keep one page of a write and not the next.

    "mut i" goes into the log before step i (so a commit that races the mark is covered) and
    "synced i" after an fsync of a file or a directory returned. Returns the states table
    and the partial states.
    """
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    dirs = {"work"}
    states = {0: json.dumps({}, sort_keys=True)}
    partial: dict[int, set[str]] = {}

    def state() -> str:
        out = {d: "dir" for d in dirs}
        out.update({p: hashlib.sha256(b).hexdigest() for p, b in files.items()})
        return json.dumps(out, sort_keys=True)

    def step(i: int) -> None:
        append_mark(log, f"mut {i}")
        if i == 1:
            (mnt / "work").mkdir()
            return
        names = sorted(files)
        kind = rng.choice(["mkdir", "create", "write", "write", "write", "truncate", "rename",
                           "unlink"] if names else ["create", "mkdir"])
        if kind == "mkdir":
            path = f"{rng.choice(sorted(dirs))}/d{i}"
            (mnt / path).mkdir()
            dirs.add(path)
        elif kind == "create":
            path = f"{rng.choice(sorted(dirs))}/f{i}"
            os.close(os.open(mnt / path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            files[path] = b""
        elif kind == "write":  # at most 3000 bytes: one or two FUSE writes (see above)
            path = rng.choice(names)
            old, data = files[path], rng.randbytes(rng.randint(1, 3000))
            off = rng.randint(0, len(old))
            for cut in range(off // PAGE * PAGE + PAGE, off + len(data), PAGE):
                files[path] = old[:off] + data[:cut - off] + old[cut:]
                partial.setdefault(i, set()).add(state())
            fd = os.open(mnt / path, os.O_WRONLY)
            try:
                assert os.pwrite(fd, data, off) == len(data)
            finally:
                os.close(fd)
            files[path] = old[:off] + data + old[off + len(data):]
        elif kind == "truncate":
            path = rng.choice(names)
            size = rng.randint(0, len(files[path]) + 2000)
            os.truncate(mnt / path, size)
            files[path] = files[path][:size] + bytes(max(0, size - len(files[path])))
        elif kind == "rename":
            src = rng.choice(names)
            dst = rng.choice(names) if rng.random() < 0.3 else f"{rng.choice(sorted(dirs))}/r{i}"
            os.rename(mnt / src, mnt / dst)
            files[dst] = files.pop(src)
        else:
            path = rng.choice(names)
            os.unlink(mnt / path)
            del files[path]

    for i in range(1, ops + 1):
        step(i)
        states[i] = state()
        if rng.random() < 0.3:
            target = mnt / rng.choice(sorted(files) if files and rng.random() < 0.6 else
                                      sorted(dirs))
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)  # fsync or fsyncdir: either forces the group commit
            finally:
                os.close(fd)
            append_mark(log, f"synced {i}")
        elif rng.random() < 0.2:
            time.sleep(rng.uniform(0, 0.05))  # let a timed group commit run
    return states, partial


@pytest.mark.mount
@pytest.mark.parametrize(("skip", "expect"), [("", None), ("-wal", "head is")])
def test_fsync_through_the_mount_survives_every_cut(shim: Path, tmp_path: Path, scratch: Path,
                                                    skip: str, expect: str | None) -> None:
    """The contract as a user meets it: fsync on the mount, the daemon under the shim; and
    with SQLite's WAL syncs made no-ops by the shim, the same check must fail."""
    require_tool(fuse_missing_reason())
    root, mnt, log = tmp_path / "root", tmp_path / "mnt", tmp_path / "crash.log"
    root.mkdir()
    mnt.mkdir()
    env = dict(os.environ, LD_PRELOAD=str(shim), MEMFS_CRASHLOG=str(log),
               MEMFS_CRASHLOG_DIR=str(root), MEMFS_CRASHLOG_SKIP_SYNC=skip,
               PYTHONPATH=str(REPO))
    append_mark(log, "process init")
    subprocess.run(memfs_cmd(root, "init"), env=env, cwd=REPO, check=True, capture_output=True,
                   timeout=60)
    append_mark(log, "process daemon")
    with open(tmp_path / "daemon.log", "wb") as out:
        daemon = subprocess.Popen(
            memfs_cmd(root, "mount", str(mnt), "--foreground", "--commit-interval", "20"),
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (is_mounted(mnt) and os.path.ismount(mnt)):
            assert daemon.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "daemon.log").read_text(errors="replace")
            time.sleep(0.05)
        states, partial = drive_mount(mnt, log, seed=7, ops=80)
    finally:
        if daemon.poll() is None:
            os.kill(daemon.pid, signal.SIGKILL)  # the log is complete: every cut is modelled
            daemon.wait(timeout=30)
        force_unmount(mnt)
    events, kinds = resolve(read_log(log), root)
    marks = marks_of(events)
    rec = Recording(root, events, kinds, states, marks, partial)
    assert sum(1 for _, kind, _ in marks if kind == "synced") >= 10
    plan = [(cut, Policy("drop", "drop")) for cut in rec.sync_cuts()]
    plan += [(idx + 1, Policy("random", "random", n)) for n, (idx, kind, _) in enumerate(marks)
             if kind == "synced"]
    found = failures(rec, plan, scratch, stop_after=1 if expect else 10**9)
    if expect is None:
        assert not found
    else:
        assert found and expect in found[0], found


def test_first_process_on_a_fresh_root(shim: Path, tmp_path: Path, scratch: Path) -> None:
    """`memfs mount` on a root nobody initialized: one process creates and uses the store.

    Found by this model: packs/ was created without fsyncing the root, after SQLite's only
    root fsync (at WAL creation), so a power cut could take every pack away from commits that
    were durable. Fixed in addcee9 (store directories fsynced into their parents).
    """
    rec = record(shim, tmp_path, [(21, 30)], init=False)
    assert not failures(rec, [(c, Policy("drop", "drop")) for c in rec.sync_cuts()], scratch)


@pytest.mark.parametrize(("skip", "expect"), [
    (".pack", "shorter than the store says"),  # pack bytes never synced, SQLite refers to them
    ("/packs", "No such file"),  # a new pack whose directory was never synced is gone
    ("-wal", "head is"),  # SQLite's commits never synced: what sync() promised falls back
])
def test_the_model_catches_a_missing_sync(shim: Path, tmp_path: Path, scratch: Path,
                                          skip: str, expect: str) -> None:
    """The shim makes one kind of sync a no-op (memfs is unchanged): the check must fail."""
    rec = record(shim, tmp_path, [(11, 45)], skip_sync=skip)
    found = failures(rec, [(c, Policy("drop", "drop")) for c in rec.sync_cuts()], scratch,
                     stop_after=3)
    assert found, f"with {skip} syncs skipped, no cut broke the contract"
    assert all(expect in msg for msg in found), found
