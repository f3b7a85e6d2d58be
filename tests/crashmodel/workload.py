"""Crash-model workload, run as a child under the shim: `workload.py ROOT STATES SEED OPS`.

Drives a real Store + Workspace (no FUSE): random creates, writes, appends (kept as patches,
memfs.store.delta), truncates, renames, unlinks and mkdirs, background group commits, and `sync()` (what an fsync on the mount
calls) now and then. After mutation i it marks the log "mut i" and appends the whole tree's
state to STATES (one JSON line: path -> sha256 or "dir"); after a sync() that returned it
marks "synced i". STATES may hold an earlier run's lines: this run continues from the last,
with file contents from STATES with the suffix .files (hex), which it rewrites at the end.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import random
import sys
from pathlib import Path

import trio

from memfs.store import Store
from memfs.workspace.workspace import DIR, FILE, Node, Workspace

_mark = ctypes.CDLL(None).crashlog_mark  # defined only when the shim is preloaded


def mark(label: str) -> None:
    _mark(label.encode())


class Model:
    """What the tree must hold: the workload's own account, independent of memfs."""

    def __init__(self, state: dict[str, str], files: dict[str, bytes]) -> None:
        self.dirs = {p for p, v in state.items() if v == "dir"}
        self.files = files

    def state(self) -> dict[str, str]:
        out = {d: "dir" for d in self.dirs}
        out.update({p: hashlib.sha256(b).hexdigest() for p, b in self.files.items()})
        return out


def node_at(ws: Workspace, path: str) -> Node:
    node = ws.root
    for part in path.split("/"):
        node = ws.lookup(node, part.encode())
    return node


def split(path: str) -> tuple[str, bytes]:
    head, _, name = path.rpartition("/")
    return head, name.encode()


def payload(rng: random.Random, model: Model) -> bytes:
    r = rng.random()
    if r < 0.1 and model.files:  # same bytes as another file: a shared chunk
        return model.files[rng.choice(sorted(model.files))]
    if r < 0.14:
        return rng.randbytes(rng.randint(1 << 20, (1 << 20) + 100_000))  # two chunks
    if r < 0.45:
        return rng.randbytes(rng.randint(5_000, 60_000))
    return rng.randbytes(rng.randint(0, 3000))


def step(ws: Workspace, model: Model, rng: random.Random) -> None:
    """One mutation, applied to the workspace and the model alike (no await inside)."""
    dirs = sorted(model.dirs)
    files = sorted(model.files)
    kind = rng.choice(["mkdir", "create", "create", "write", "write", "append", "append",
                       "truncate", "rename", "unlink"] if files else ["mkdir", "create"])
    if kind == "mkdir" or not dirs:
        parent = rng.choice(dirs) if dirs and rng.random() < 0.7 else ""
        path = f"{parent}/d{rng.randrange(1000)}".lstrip("/")
        if path in model.dirs or path in model.files:
            return step(ws, model, rng)
        head, name = split(path)
        ws.create(node_at(ws, head) if head else ws.root, name, DIR, 0o755, 0, 0)
        model.dirs.add(path)
    elif kind == "create":
        path = f"{rng.choice(dirs)}/f{rng.randrange(1000)}"
        if path in model.dirs or path in model.files:
            return step(ws, model, rng)
        head, name = split(path)
        data = payload(rng, model)
        f = ws.create(node_at(ws, head), name, FILE, 0o644, 0, 0)
        if data:
            ws.write(f, 0, data)
        model.files[path] = data
    elif kind == "write":
        path = rng.choice(files)
        old = model.files[path]
        off = rng.randint(0, len(old))
        data = payload(rng, model)[:100_000]
        ws.write(node_at(ws, path), off, data)
        model.files[path] = old[:off] + data + old[off + len(data):]
    elif kind == "append":  # a log's line: the store keeps it as a patch of the last chunk
        path = rng.choice(files)
        data = rng.randbytes(rng.randint(1, 300))
        ws.write(node_at(ws, path), len(model.files[path]), data)
        model.files[path] += data
    elif kind == "truncate":
        path = rng.choice(files)
        old = model.files[path]
        size = rng.randint(0, len(old) + 5000)
        ws.truncate(node_at(ws, path), size)
        model.files[path] = old[:size] + bytes(max(0, size - len(old)))
    elif kind == "rename":
        src = rng.choice(files)
        dst = rng.choice(files) if rng.random() < 0.3 else f"{rng.choice(dirs)}/r{rng.randrange(1000)}"
        if dst == src or dst in model.dirs:
            return step(ws, model, rng)
        (sh, sn), (dh, dn) = split(src), split(dst)
        ws.rename(node_at(ws, sh), sn, node_at(ws, dh), dn)
        model.files[dst] = model.files.pop(src)
    else:
        path = rng.choice(files)
        head, name = split(path)
        ws.unlink(node_at(ws, head), name)
        del model.files[path]


async def run(root: Path, states_path: Path, seed: int, ops: int) -> None:
    lines = states_path.read_text().splitlines()
    start = json.loads(lines[-1])
    saved = states_path.with_suffix(".files")
    files = json.loads(saved.read_text()) if saved.exists() else {}
    model = Model(start["state"], {p: bytes.fromhex(h) for p, h in files.items()})
    i = start["i"]
    rng = random.Random(seed)
    store = Store.open(root)
    ws = Workspace(store, commit_interval=0.01)
    with states_path.open("a") as out:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ws.run)
            for _ in range(ops):
                step(ws, model, rng)
                i += 1
                mark(f"mut {i}")
                out.write(json.dumps({"i": i, "state": model.state()}) + "\n")
                r = rng.random()
                if r < 0.25:
                    await ws.sync()
                    mark(f"synced {i}")
                elif r < 0.5:
                    await trio.sleep(rng.uniform(0, 0.03))  # let a group commit run
            await ws.sync()
            mark(f"synced {i}")
            nursery.cancel_scope.cancel()
    store.close()
    states_path.with_suffix(".files").write_text(
        json.dumps({p: b.hex() for p, b in model.files.items()}))


if __name__ == "__main__":
    trio.run(run, Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
