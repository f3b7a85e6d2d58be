"""A group commit's three steps: the snapshot on the loop, the write in the commit thread, the
apply back on the loop (memfs.workspace.workspace runs them in `_commit_locked`).

1. `take(ws)` (loop, no await): copies of the dirty nodes' metadata and changed pieces, the
   operations the commit holds, the backed mounts' branch intent, the inode table's part.
   Clean children keep their cached rows, so a directory of 20k entries costs what changed.
2. `write(ws, plan, message)` (commit thread, the store's writer lock): chunks, then objects
   bottom-up, then the commit, in one transaction; SQLite's disk-full and I/O errors become
   the errno fsync should answer.
3. `apply(plan)` (loop): marks clean only the nodes whose version did not move meanwhile.

The plan is the only state, owned by the commit that made it.
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memfs.store import history
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.history import OpRecord
from memfs.store.store import Commit
from memfs.store.trees import (
    DIR,
    FILE,
    LINK,
    Entry,
    encode_manifest,
    encode_row,
    encode_rows,
    hard_entry,
    name_to_str,
)
from memfs.testing import commit_gate, crash_point
from memfs.workspace.inodes import TablePlan
from memfs.workspace.nodes import Node
from memfs.workspace.unload import unload_inline

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

Row = tuple[Any, ...]  # an encoded directory row (memfs.store.trees.encode_row)
# A clean child keeps its encoded row only in a directory this wide: there, rebuilding every
# row at each commit would stall the loop (20k rows ~60 ms); in a narrower one rebuilding
# costs under a millisecond, and a row kept per file (~250 bytes) is most of what a big
# tree of small directories holds once loaded (a bound mount loads all of it).
ROWS_KEPT_FROM = 256


def keeps_row(node: Node) -> bool:
    """Is `node`'s directory wide enough to keep its rows (ROWS_KEPT_FROM)?"""
    d = node.parent
    return d is not None and d._children is not None and len(d._children) >= ROWS_KEPT_FROM


@dataclass
class FileJob:
    node: Node
    ver: int
    size: int
    chunks: dict[int, str]
    pieces: dict[int, bytes]
    gens: dict[int, int]
    ref: str = ""
    row: Row | None = None  # its row in the parent's object, cached once clean


@dataclass
class DirJob:
    node: Node
    ver: int
    # (entry, the child's job: its ref is set once written) or (the final row, None)
    entries: list[tuple[Entry, FileJob | DirJob] | tuple[Row, None]]
    ref: str = ""
    row: Row | None = None


@dataclass
class CommitPlan:
    root: DirJob
    inodes: TablePlan
    seq: int = 0
    jobs: list[FileJob | DirJob] = field(default_factory=list)
    # Symlinks and special files written as rows: (node, ver, the row's ref)
    clean: list[tuple[Node, int, str]] = field(default_factory=list)
    processes: list[dict[str, object]] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)  # in the order of their last change
    intents: dict[str, bytes] | None = None  # backed mounts' branch intent (memfs.backing)


def take(ws: Workspace, ops: list[OpRecord]) -> CommitPlan:
    """Step 1 (loop): `ops` are the operations whose changes the commit holds."""
    jobs: list[FileJob | DirJob] = []
    clean: list[tuple[Node, int, str]] = []
    root = _snap_dir(ws, ws.root, jobs, clean)
    inodes = ws.inodes.snapshot(ws.store, ws._alive, lambda f: snap_file(ws, f))
    jobs.extend(inodes.file_jobs)
    processes: list[dict[str, object]] = [
        {"pid": p.pid, "uid": p.uid, "comm": p.comm, "pgid": op.pgid, "sid": op.sid,
         "cmdline": op.label, "kind": op.kind}
        for op in ops for p in op.pids]
    return CommitPlan(root, inodes, ws.mutation_seq, jobs, clean, processes, ops,
                      ws.backing.intent_bytes())


def _snap_dir(ws: Workspace, top: Node, jobs: list[FileJob | DirJob],
              clean: list[tuple[Node, int, str]]) -> DirJob:
    """The dirty directories under `top`: file jobs as they are met, then every directory
    job, children before parents (the order the commit thread writes them in). A work
    list, not recursion: a tree may be deeper than Python's recursion limit (cd-and-mkdir
    in a loop has no PATH_MAX); one plain loop per directory, so a directory of 20k
    entries costs the loop what it did."""
    root = DirJob(top, top.ver, [])
    dirs: list[DirJob] = []
    work = [root]
    disk_only = ws.disk_only
    while work:
        job = work.pop()
        dirs.append(job)
        entries = job.entries
        for name, child in ws.children(job.node).items():
            row = child.row  # a clean child's cached row: the common case, inline
            if row is not None and child.ikey is None and child.id not in disk_only:
                entries.append((row, None))
            else:
                _snap_child(ws, name, child, entries, work, jobs, clean)
    jobs.extend(reversed(dirs))
    return root


def _snap_child(ws: Workspace, name: bytes, child: Node,
                entries: list[tuple[Entry, FileJob | DirJob] | tuple[Row, None]],
                work: list[DirJob], jobs: list[FileJob | DirJob],
                clean: list[tuple[Node, int, str]]) -> None:
    if child.id in ws.disk_only:
        return
    if child.ikey is not None:  # a hard-linked inode: its row is in the inode table
        entries.append((encode_row(hard_entry(name_to_str(name), child.ikey)), None))
        return
    if child.kind == DIR and (child.dirty or child.ref is None):
        sub = DirJob(child, child.ver, [])
        entries.append((child.entry("", 0), sub))
        work.append(sub)
    elif child.kind == FILE and (child.dirty or child.ref is None):
        fjob = snap_file(ws, child)
        jobs.append(fjob)
        entries.append((child.entry("", fjob.size), fjob))
    else:
        # A clean child's row is cached: a commit in a directory of 20k entries
        # must not rebuild 20k rows on the loop.
        row = child.row
        if row is None:
            entry = child.entry(name_to_str(child.target) if child.kind == LINK
                                else child.ref or "", child.size())
            row = encode_row(entry)
            if child.dirty:  # a symlink or special file: its row is all it has to write
                clean.append((child, child.ver, entry.ref))
            elif keeps_row(child):
                child.row = row
        entries.append((row, None))


def snap_file(ws: Workspace, f: Node) -> FileJob:
    fd = ws._load_data(f)
    pieces = {i: bytes(b) for i, b in fd.dirty.items()}
    return FileJob(f, f.ver, fd.size, dict(fd.chunks), pieces, dict(fd.gen))


def write(ws: Workspace, plan: CommitPlan, message: str) -> Commit:
    """Step 2 (commit thread), with SQLite's disk-full and I/O errors as the errno fsync
    should answer."""
    try:
        return _write(ws, plan, message)
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
            raise OSError(errno.ENOSPC, f"store is full: {exc}") from exc
        if code is not None and code & 0xFF == sqlite3.SQLITE_IOERR:
            raise OSError(errno.EIO, f"store I/O error: {exc}") from exc
        raise


def _write(ws: Workspace, plan: CommitPlan, message: str) -> Commit:
    """Chunks, then objects bottom-up, then the commit — one transaction."""
    with ws.store.transaction() as tx:
        files = [j for j in plan.jobs if isinstance(j, FileJob)]
        order = [(j, i) for j in files for i in sorted(j.pieces)]
        # The chunk each piece replaces (still in the job's map until the loop below): the
        # store may keep a small change to a big file as a delta of it (memfs.store.delta).
        replacing = [j.chunks.get(i) for j, i in order]
        ids = tx.put_chunks([j.pieces[i] for j, i in order], replacing) if order else []
        for (j, i), cid in zip(order, ids, strict=True):
            j.chunks[i] = cid
        commit_gate()  # a test holds the commit here: its chunks on disk, still pending
        for j in files:
            j.ref = file_ref(tx, j.size, j.chunks)
        for d in plan.jobs:
            if isinstance(d, DirJob):
                rows: list[Any] = []
                for e, child in d.entries:
                    if child is not None:
                        assert isinstance(e, Entry)
                        e.ref = child.ref
                        child.row = encode_row(e)
                        rows.append(child.row)
                    else:
                        rows.append(e)
                d.ref = tx.put_object(encode_rows(rows))
        plan.inodes.write(tx)
        crash_point("after-objects")
        commit = tx.add_commit(ws.head, plan.root.ref, ws.branch, message,
                               plan.processes, plan.inodes.table)
        history.put_ops(tx, commit.id, plan.ops)
        if plan.intents is not None:
            tx.put_intents(commit.id, plan.intents)
        return commit


def apply(plan: CommitPlan) -> None:
    """Step 3 (loop): mark clean what did not change while the commit ran."""
    for j in plan.jobs:
        node = j.node
        if isinstance(j, FileJob):
            fd = node.data
            if node._data_loaded and fd is not None:
                for i, cid in j.chunks.items():
                    if i in j.pieces and fd.gen.get(i) == j.gens.get(i) and i in fd.dirty:
                        fd.committed(i, cid)
        if node.ver == j.ver:
            node.ref, node.dirty = j.ref, False
            node.row = j.row if keeps_row(node) else None
            if isinstance(j, FileJob):
                unload_inline(node)
    for node, ver, ref in plan.clean:
        if node.ver == ver:  # as apply_entry would leave it: a clean directory can unload
            node.ref, node.dirty = ref, False
    plan.inodes.apply()


def message_of(ops: list[OpRecord], given: str) -> str:
    """A commit's message: what made it (its last operation, and how many others)."""
    if not ops:
        return given or "changes"
    last = ops[-1].label
    more = len({o.label for o in ops}) - 1
    return last + (f" (+{more} other{'s' if more > 1 else ''})" if more > 0 else "")


def file_ref(tx: Any, size: int, chunks: dict[int, str]) -> str:  # noqa: ANN401 - a Transaction
    if size == 0 and not chunks:
        return ""
    if list(chunks) == [0] and size <= CHUNK_SIZE:
        return "c:" + chunks[0] if size else ""
    return "m:" + tx.put_object(encode_manifest(size, chunks))


__all__ = ["CommitPlan", "DirJob", "FileJob", "apply", "file_ref", "message_of", "snap_file",
           "take", "write"]
