"""Replay a crashlog: what could a power cut at record k leave on disk?

The rules (the strict POSIX reading, nothing the kernel does beyond it):
- A file's data (write, truncate) is durable once an fsync/fdatasync of that file follows it.
- A name (create, mkdir, rename, unlink) is durable once an fsync of every directory it
  touches follows it. A file whose name is not durable is lost, whatever its data.
- Anything else may or may not have reached the disk. A `Policy` picks which: drop all of
  it, keep all of it, or a random subset: data in pieces of `grain` bytes (a 4 KiB page as
  writeback does, or a 512 B sector) in any order; names each on its own coin ("random", all
  POSIX allows) or as a random prefix in log order ("prefix", what a journaling filesystem
  does).
- SQLite's `-shm` is dropped: it is rebuilt from the WAL on open and never needed to recover.

The log names inodes and fds; the replayer turns them into objects (one per file or
directory ever created), so a reused inode number or fd never mixes two files.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

RECORD = struct.Struct("<IiQqQII")  # op, fd, ino, off, len, path_len, path2_len (shim.c)
OPEN, WRITE, TRUNC, SYNC, CLOSE, RENAME, UNLINK, MKDIR, RMDIR, MARK = range(1, 11)
O_CREAT = os.O_CREAT
PAGE = 4096
ROOT = 0  # the watched directory: it exists, durably, before the log starts


class NotModelled(Exception):
    """The log holds something the replayer cannot place (e.g. a file older than the log)."""


@dataclass(frozen=True)
class Event:
    """One step with objects resolved. `dirs` are the directories a name change touches."""

    idx: int
    kind: str  # "data" | "sync" | "ns" | "mark"
    obj: int = -1
    op: tuple = ()
    dirs: tuple[int, ...] = ()
    label: str = ""


@dataclass(frozen=True)
class Policy:
    """What happens to the steps no sync covered. data: "drop", "keep" or "random" (by
    `grain`-byte pieces); names: "drop", "keep", "random" or "prefix"."""

    data: str = "drop"
    names: str = "drop"
    seed: int = 0
    grain: int = PAGE

    def __str__(self) -> str:
        return f"data={self.data}/{self.grain},names={self.names},seed={self.seed}"


def append_mark(log: Path, label: str) -> None:
    """Write a MARK record as the shim would: the harness notes process boundaries this way."""
    raw = label.encode()
    with log.open("ab") as f:
        f.write(RECORD.pack(MARK, -1, 0, 0, 0, len(raw), 0) + raw)


def read_log(path: Path) -> list[tuple]:
    """(op, fd, ino, off, path, path2, data) per record, in the order the calls took effect."""
    raw = path.read_bytes()
    out: list[tuple] = []
    pos = 0
    while pos < len(raw):
        op, fd, ino, off, n, pl, p2l = RECORD.unpack_from(raw, pos)
        pos += RECORD.size
        p1 = raw[pos:pos + pl].decode("utf-8", "surrogateescape")
        pos += pl
        p2 = raw[pos:pos + p2l].decode("utf-8", "surrogateescape")
        pos += p2l
        data = raw[pos:pos + n]
        pos += n
        out.append((op, fd, ino, off, p1, p2, data))
    return out


def snapshot(top: Path) -> dict[str, bytes | None]:
    """What a directory holds before a log starts (relative path -> bytes, None for a dir)."""
    out: dict[str, bytes | None] = {}
    for p in sorted(top.rglob("*")):
        out[str(p.relative_to(top))] = None if p.is_dir() else p.read_bytes()
    return out


def resolve(records: list[tuple], watched: Path, base: dict[str, bytes | None] | None = None
            ) -> tuple[list[Event], dict[int, str]]:
    """Follow the live namespace through the log; return events and each object's kind.

    `base` is what the watched directory held, durably, before the log began (a `snapshot`,
    e.g. an earlier crash image): it becomes events at index -1, which every cut keeps.
    """
    top = os.path.realpath(watched)
    live: dict[str, int] = {top: ROOT}
    kinds: dict[int, str] = {ROOT: "dir"}
    fds: dict[tuple[int, int], int] = {}  # (process, fd) -> object
    proc = 0
    events: list[Event] = []

    def new(kind: str) -> int:
        kinds[len(kinds)] = kind
        return len(kinds) - 1

    def parent(path: str) -> tuple[int, str]:
        head, name = os.path.split(path)
        if head not in live:
            raise NotModelled(f"parent of {path} is not in the log")
        return live[head], name

    for rel, content in sorted((base or {}).items()):
        path = os.path.join(top, rel)
        obj = new("dir" if content is None else "file")
        d, name = parent(path)
        live[path] = obj
        events.append(Event(-1, "ns", op=("link", d, name, obj)))
        if content:
            events.append(Event(-1, "data", obj, ("w", 0, content)))

    for idx, (op, fd, _ino, off, p1, p2, data) in enumerate(records):
        if op == MARK:
            if p1.startswith("process "):
                proc += 1  # fds of a new process are a new namespace
            events.append(Event(idx, "mark", label=p1))
        elif op == OPEN:
            obj = live.get(p1)
            if obj is None:
                if not off & O_CREAT:
                    raise NotModelled(f"{p1} predates the log")
                obj = new("file")
                d, name = parent(p1)
                live[p1] = obj
                events.append(Event(idx, "ns", op=("link", d, name, obj), dirs=(d,)))
            fds[(proc, fd)] = obj
        elif op in (WRITE, TRUNC, SYNC):
            obj = fds.get((proc, fd))
            if obj is None:
                raise NotModelled(f"record {idx}: fd {fd} was never opened under the log")
            if op == WRITE:
                events.append(Event(idx, "data", obj, ("w", off, data)))
            elif op == TRUNC:
                events.append(Event(idx, "data", obj, ("t", off)))
            else:
                events.append(Event(idx, "sync", obj))
        elif op == CLOSE:
            fds.pop((proc, fd), None)
        elif op == MKDIR:
            d, name = parent(p1)
            obj = new("dir")
            live[p1] = obj
            events.append(Event(idx, "ns", op=("link", d, name, obj), dirs=(d,)))
        elif op in (UNLINK, RMDIR):
            if p1 not in live:  # a socket or fifo (bind, mknod are not logged): no file data
                continue
            d, name = parent(p1)
            obj = live.pop(p1)
            events.append(Event(idx, "ns", op=("unlink", d, name, obj), dirs=(d,)))
        elif op == RENAME:
            if not p1:
                raise NotModelled(f"{p2} was renamed in from outside the log")
            d1, n1 = parent(p1)
            obj = live[p1]
            if not p2:  # renamed out of the watched tree: gone, as far as we can see
                del live[p1]
                events.append(Event(idx, "ns", op=("unlink", d1, n1, obj), dirs=(d1,)))
                continue
            d2, n2 = parent(p2)
            for path in [p for p in live if p == p1 or p.startswith(p1 + "/")]:
                live[p2 + path[len(p1):]] = live.pop(path)
            events.append(Event(idx, "ns", op=("rename", d1, n1, d2, n2, obj), dirs=(d1, d2)))
        else:
            raise NotModelled(f"record {idx}: unknown op {op}")
    return events, kinds


def crash_image(events: list[Event], kinds: dict[int, str], cut: int, policy: Policy,
                dest: Path) -> None:
    """Write into `dest` (an empty directory) what a power cut before record `cut` may leave."""
    rng = random.Random(f"{policy.seed}:{cut}")
    before = [e for e in events if e.idx < cut]
    last_sync: dict[int, int] = {}
    for e in before:
        if e.kind == "sync":
            last_sync[e.obj] = e.idx

    contents: dict[int, bytearray] = {o: bytearray() for o, k in kinds.items() if k == "file"}
    for e in before:
        if e.kind != "data":
            continue
        if e.idx < 0 or e.idx < last_sync.get(e.obj, -1):
            _apply_data(contents[e.obj], e.op)
        elif policy.data == "keep":
            _apply_data(contents[e.obj], e.op)
        elif policy.data == "random":
            _apply_some_pieces(contents[e.obj], e.op, policy.grain, rng)

    names = [e for e in before if e.kind == "ns"]
    unsynced = [e for e in names if e.idx >= 0 and
                not all(last_sync.get(d, -1) > e.idx for d in e.dirs)]
    if policy.names == "random":
        kept = {id(e) for e in unsynced if rng.random() < 0.5}
    else:
        upto = {"drop": 0, "keep": len(unsynced),
                "prefix": rng.randint(0, len(unsynced))}[policy.names]
        kept = {id(e) for e in unsynced[:upto]}
    dirs: dict[int, dict[str, int]] = {ROOT: {}}
    unsynced_ids = {id(e) for e in unsynced}
    for e in names:
        if id(e) in unsynced_ids and id(e) not in kept:
            continue
        _apply_name(dirs, kinds, e.op)
    _materialize(dirs, kinds, contents, ROOT, dest, set())


def _apply_data(buf: bytearray, op: tuple) -> None:
    if op[0] == "w":
        _, off, data = op
        if len(buf) < off:
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(data)] = data
    else:
        size = op[1]
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))


def _apply_some_pieces(buf: bytearray, op: tuple, grain: int, rng: random.Random) -> None:
    """Writeback of an unsynced step: each aligned piece of a write, or a truncate, or not."""
    if op[0] == "t":
        if rng.random() < 0.5:
            _apply_data(buf, op)
        return
    _, off, data = op
    pos = off
    while pos < off + len(data):
        end = min(off + len(data), (pos // grain + 1) * grain)
        if rng.random() < 0.5:
            _apply_data(buf, ("w", pos, data[pos - off:end - off]))
        pos = end


def _apply_name(dirs: dict[int, dict[str, int]], kinds: dict[int, str], op: tuple) -> None:
    """One name change on the durable namespace; a change whose source is absent is a no-op."""
    if op[0] == "link":
        _, d, name, obj = op
        if d in dirs:
            dirs[d][name] = obj
            if kinds[obj] == "dir":
                dirs.setdefault(obj, {})
    elif op[0] == "unlink":
        _, d, name, obj = op
        if dirs.get(d, {}).get(name) == obj:
            del dirs[d][name]
    else:
        _, d1, n1, d2, n2, obj = op
        if dirs.get(d1, {}).get(n1) == obj and d2 in dirs:
            del dirs[d1][n1]
            dirs[d2][n2] = obj


def _materialize(dirs: dict[int, dict[str, int]], kinds: dict[int, str],
                 contents: dict[int, bytearray], d: int, dest: Path, seen: set[int]) -> None:
    seen.add(d)
    for name, obj in dirs.get(d, {}).items():
        if name.endswith("-shm"):
            continue
        path = dest / name
        if kinds[obj] == "dir":
            if obj in seen:
                continue
            path.mkdir()
            _materialize(dirs, kinds, contents, obj, path, seen)
        else:
            path.write_bytes(contents[obj])
