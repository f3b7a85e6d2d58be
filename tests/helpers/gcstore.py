"""A store whose garbage collection has every kind of work, and the checks a GC must pass.

Pack 1 ends up mostly dead (a rewrite), pack 2 with a dead range in the middle (a punch);
commits are dropped across a gap whose backed-mount intents must survive on the kept commit
after it; a checkpoint and the branch head are kept. With the policy set to keep nothing by
age, what is kept is exactly the checkpoint and the head. A log appended at every commit is
kept as patches (memfs.store.delta) over a base only a dropped commit names, in the pack that
is rewritten, through patches only dropped commits name: all of it must stay.

Either backend: `build(root, url)` makes it in the PostgreSQL database `url` (no packs then:
the same commits, rows instead of pack ranges, the log's patches as rows too), and `check`
reads whichever the root uses.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import trio

from memfs.store import Store, open_store
from memfs.store.chunks import CHUNK_SIZE, chunk_digest
from memfs.store.retention import Policy
from memfs.store.store import CommitDropped
from memfs.store.trees import DIR, FILE, decode_dir
from memfs.workspace.workspace import Workspace

MiB = 1 << 20
KEEP_NOTHING_BY_AGE = Policy(keep_all=0, hourly=0, daily=0)


def keep_nothing_by_age(m) -> None:
    """KEEP_NOTHING_BY_AGE on a mount's store, through its CLI (`memfs config`)."""
    for key in ("keep-all", "keep-hourly", "keep-daily"):
        m.cli("config", key, "0")


@dataclass
class Expected:
    files: dict[str, dict[str, bytes]]  # kept commit -> path -> bytes
    intents: dict[str, dict[str, bytes]]  # kept commit -> mount -> intent bytes


def is_dropped(store: Store, cid: str) -> bool:
    """Whether `cid` is a commit the retention policy dropped (refused by name)."""
    try:
        store.commit(cid)
    except CommitDropped:
        return True
    return False


def files_at(store: Store, cid: str) -> dict[str, bytes]:
    """path -> bytes of every file in a commit's tree (read from chunks)."""
    out: dict[str, bytes] = {}
    stack = [(store.commit(cid).tree, "")]
    while stack:
        tree, prefix = stack.pop()
        for e in decode_dir(store.read_object(tree)):
            if e.kind == DIR:
                stack.append((e.ref, prefix + e.name + "/"))
            elif e.kind == FILE:
                buf = bytearray(e.size)
                for i, chunk in store.file_chunks(e.ref).items():
                    data = store.read_chunk(chunk)[: max(0, e.size - i * CHUNK_SIZE)]
                    buf[i * CHUNK_SIZE: i * CHUNK_SIZE + len(data)] = data
                out[prefix + e.name] = bytes(buf)
    return out


def entry_ref(store: Store, cid: str, path: str) -> str:
    """The ref (manifest or single chunk) of the file at `path` in commit `cid`."""
    tree = store.commit(cid).tree
    *dirs, name = path.split("/")
    for part in dirs:
        tree = next(e.ref for e in decode_dir(store.read_object(tree)) if e.name == part)
    return next(e.ref for e in decode_dir(store.read_object(tree)) if e.name == name)


def _open(root: Path, url: str | None = None):
    store = open_store(root, url=url)
    if store.kind != "sqlite":
        assert store.claim(store.current_branch()).writable
    return store


def build(root: Path, url: str | None = None) -> Expected:
    rng = random.Random(7)
    small = rng.randbytes(100_000)

    def session(steps) -> list[str]:
        ws = Workspace(_open(root, url), commit_interval=0.05)
        out = []
        try:
            for step in steps:
                step(ws)
                out.append(trio.run(ws.commit))
        finally:
            ws.store.close()
        return out

    def work(ws: Workspace):
        kids = ws.children(ws.root)
        return kids.get(b"work") or ws.create(ws.root, b"work", DIR, 0o755, 0, 0)

    def put(name: str, data: bytes):
        def step(ws: Workspace) -> None:
            d = work(ws)
            f = ws.children(d).get(name.encode()) or ws.create(d, name.encode(), FILE, 0o644,
                                                                0, 0)
            ws.write(f, 0, data)
        return step

    def append(name: str, data: bytes):
        def step(ws: Workspace) -> None:
            f = ws.children(work(ws))[name.encode()]
            ws.write(f, f.size(), data)
        return step

    def rm(name: str):
        return lambda ws: ws.unlink(work(ws), name.encode())

    def both(*steps):
        return lambda ws: [s(ws) for s in steps]

    def line(i: int):
        return append("log", f"line {i} {rng.randbytes(40).hex()}\n".encode())

    c1, c2 = session([both(put("a", small), put("big1", rng.randbytes(3 * MiB)),
                           put("log", rng.randbytes(512 << 10))),
                      both(rm("big1"), line(2))])
    c3, c4, c5 = session([both(put("b", rng.randbytes(2 * MiB)), put("mid", rng.randbytes(MiB)),
                               put("c", rng.randbytes(2 * MiB)), line(3)),
                          both(rm("mid"), line(4)), both(put("a2", small), line(5))])
    store = _open(root, url)
    try:
        store.checkpoint("cp", c2)
        with store.transaction() as tx:  # a backed mount's intent, kept with c3 only
            tx.put_intents(c3, {"m": b"intent kept with c3"})
        store.set_policy(KEEP_NOTHING_BY_AGE)
        patches = store._query("SELECT COUNT(*) FROM chunks WHERE over IS NOT NULL")[0][0]
        assert patches == 4, f"the log's appends were not kept as patches ({patches})"
        if store.kind != "sqlite":
            store.release(store.current_branch())
        return Expected({c2: files_at(store, c2), c5: files_at(store, c5)},
                        {c2: {}, c5: {"m": b"intent kept with c3"}})
    finally:
        store.close()


def check(root: Path, expected: Expected) -> list[str]:
    """What is wrong with the store at `root` (empty: it opens, passes fsck, every chunk
    reads back under its digest, and every kept commit has its files and intents)."""
    try:
        store = open_store(root, create=False)
    except Exception as exc:  # noqa: BLE001 - the finding
        return [f"store does not open: {exc!r}"]
    try:
        problems = store.fsck()
        if store.kind == "sqlite":
            conn = sqlite3.connect(f"file:{root / 'store.db'}?mode=ro", uri=True)
            try:
                ids = [r[0] for r in conn.execute("SELECT id FROM chunks")]
            finally:
                conn.close()
        else:  # from the database itself, never this host's cache
            ids = [r[0] for r in store._query("SELECT id FROM chunks")]
            store.read_chunk = store._db_chunk
        for cid in ids:
            try:
                if chunk_digest(store.read_chunk(cid)) != cid.split(".")[0]:
                    problems.append(f"chunk {cid} does not match its digest")
            except (KeyError, OSError) as exc:
                problems.append(f"chunk {cid}: {exc}")
        for cid, files in expected.files.items():
            try:
                if files_at(store, cid) != files:
                    problems.append(f"kept commit {cid[:12]}: files differ")
                if store.intents_at(cid) != expected.intents[cid]:
                    problems.append(f"kept commit {cid[:12]}: intents {store.intents_at(cid)}")
            except Exception as exc:  # noqa: BLE001
                problems.append(f"kept commit {cid[:12]}: {exc!r}")
        return problems
    finally:
        store.close()
