"""The workspace: the live tree of the selected branch, group commit, undo and branches.

All tree changes run on the trio loop with no `await` in the middle, so each operation is
atomic with respect to the others. Durable work (packs, SQLite) runs in one worker thread:
a commit snapshots the dirty nodes on the loop, writes them in the thread, and marks clean
only what did not change in the meantime.

The durability contract: a change is visible at once and durable after the group commit
that follows within `commit_interval` seconds; `sync()` forces one and returns only when
every change made before the call is durable.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import sqlite3
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import trio

from memfs.liveness import DaemonRecord
from memfs.store import StoreBackend as Store
from memfs.store import history, open_store
from memfs.store.backend import NO_RETENTION
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.history import OpRecord, ProcRef
from memfs.store.space import Reserve, Space, headroom
from memfs.store.trees import (
    BLK,
    CHR,
    DIR,
    FILE,
    HARD,
    LINK,
    Entry,
    decode_dir,
    decode_manifest,
    encode_manifest,
    encode_row,
    encode_rows,
    hard_entry,
    name_to_bytes,
    name_to_str,
    new_inode_key,
)
from memfs.workspace import unload
from memfs.workspace.attribution import CURRENT, Attribution
from memfs.workspace.health import CommitError, CommitHealth
from memfs.workspace.history_ops import HistoryOps
from memfs.workspace.inodes import Inodes, TablePlan
from memfs.workspace.nodes import (
    FileData,
    Node,
    WorkspaceError,
    fail,
    now_ns,
    saw_kernel_time,
)
from memfs.workspace.spill import SPILL_AT, spill_pieces

log = logging.getLogger("memfs.workspace")

ROOT_ID = 1
# Inode numbers (docs/architecture.md, "Inode numbers"). A live-tree node's number is derived
# from its place, (its parent's number, its name), so the same tree loaded again after a
# restart shows the same numbers and git's index (which keys on st_ino) stays valid; a
# hard-linked inode's comes from its inode-table key. They lie in [PLACED_BASE, 2**63). Below
# 1 << 40 are counted numbers (the root, history and branch views), and from 1 << 40 the
# generated .memfs files (memfs.fs.virtual).
PLACED_BASE = 1 << 41
PLACED_SPAN = (1 << 63) - PLACED_BASE
NAME_MAX = 255
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
DIRTY_BYTES_SOON = 16 << 20  # commit early when this much data waits in memory
DIRTY_BYTES_MAX = 48 << 20  # writers wait for a commit beyond this (bounds the daemon's RSS)

# The commit snapshot, undo's remap, fsck and GC walk trees of any depth without recursion;
# the backing layer's walks (reconcile.observe.walk_dir, Backing._files_of) still recurse per
# level, so the limit stays raised for them: a 4 KiB path can be 2048 levels deep.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

Invalidator = Callable[[list[tuple[int, bytes]], list[int]], None]


@dataclass
class _FileJob:
    node: Node
    ver: int
    size: int
    chunks: dict[int, str]
    pieces: dict[int, bytes]
    gens: dict[int, int]
    ref: str = ""
    row: tuple | None = None  # its row in the parent's object, cached once clean


@dataclass
class _DirJob:
    node: Node
    ver: int
    entries: list[tuple[object, object]]  # (Entry, child job) or (final row, None)
    ref: str = ""
    row: tuple | None = None


@dataclass
class _Plan:
    jobs: list[object] = field(default_factory=list)
    root: _DirJob | None = None
    clean: list[tuple[Node, int]] = field(default_factory=list)  # symlinks etc.
    seq: int = 0
    processes: list[dict] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)  # in the order of their last change
    intents: dict[str, bytes] | None = None  # backed mounts' branch intent (backing.py)
    inodes: TablePlan | None = None  # the inode table's part (memfs.workspace.inodes)


class Workspace(HistoryOps):
    def __init__(self, store: Store, commit_interval: float = 0.1) -> None:
        self.store = store
        self.commit_interval = commit_interval
        self.branch = store.current_branch()
        self.head = store.head(self.branch)
        self.nodes: dict[int, Node] = {}
        self._next_id = ROOT_ID
        self.inodes = Inodes(store.inode_table(self.head))  # the live tree's linked inodes
        self.root = self._load_root(store.commit(self.head).tree, self.inodes)
        self.invalidate: Invalidator = lambda entries, inodes: None
        self.mutation_seq = 0
        self.durable_seq = 0
        self.dirty_since: float | None = None
        self.last_error: str | None = None
        self.served_by: DaemonRecord | None = None  # the daemon serving it (status shows it)
        # Why this host may not change the branch (another host holds its writer lease:
        # memfs.workspace.hosts), or None. On the embedded store every claim succeeds.
        claim = store.claim(self.branch)
        self.read_only: str | None = None if claim.writable else claim.reason()
        self.hosts = None  # memfs.workspace.hosts.Hosts, while a daemon serves it
        # The operations whose changes the next commit holds (key -> record, requesters),
        # in the order of their last change; attribution.py says who a request is.
        self.attribution = Attribution()
        self._group: dict[str, tuple[OpRecord, dict[int, ProcRef]]] = {}
        self._last_op: str | None = None
        self._commit_lock = trio.Lock()
        self._wake = trio.Event()  # set by the first change after a commit
        self._urgent = trio.Event()  # set when dirty data should not wait for the interval
        self._durable = trio.Event()
        self.commit_count = 0  # commits made by this process (auto-materialize follows them)
        self._committed = trio.Event()
        self._views: OrderedDict[tuple[str, str], Node] = OrderedDict()
        self._view_keys: dict[int, tuple[str, str]] = {}
        self._view_roots: dict[int, Node] = {}  # every view root until the kernel forgets it
        self._immutable: set[int] = set()
        self._space: tuple[float, Space] | None = None  # (when, what): statvfs, cached briefly
        self.health = CommitHealth()
        # The full-disk reserve is the embedded store's (SQLite needs room to delete); a
        # store in PostgreSQL keeps nothing of its own on this disk but caches.
        self.reserve = Reserve(store.root) if store.kind == "sqlite" else None
        self.lifecycle = None  # the daemon's GC (memfs.workspace.lifecycle) installs itself
        self.space_refused = False  # the last write that needed space was refused
        # Nodes the FUSE layer holds open (operations sets it): what GC must keep for them.
        self.held_nodes: Callable[[], Iterable[Node]] = lambda: ()
        self._reserve_checked = 0.0
        self._dirty_files: set[Node] = set()
        self.stopped = False
        # Backing directories (memfs.workspace.backing installs itself here): disk-only nodes
        # are shown from disk and never committed.
        self.backing = None
        self.disk_only: dict[int, tuple[str, str]] = {}

    @classmethod
    def open(cls, root, commit_interval: float = 0.1) -> Workspace:
        """The workspace of the store at `root` (created if missing)."""
        return cls(open_store(root), commit_interval)

    # -- node table --------------------------------------------------------------
    def _new_id(self) -> int:
        nid = self._next_id
        self._next_id += 1
        return nid

    def _placed_id(self, seed: bytes) -> int:
        """The number a live node's place (or inode key) gives it: the same on every load. One
        still held under that number (a replaced file the kernel has not forgotten, so never
        reused: its cached size and pages must not show for the new one) or, rarely, a hash
        collision moves it to the next free number."""
        digest = hashlib.blake2b(seed, digest_size=8).digest()
        nid = PLACED_BASE + int.from_bytes(digest, "little") % PLACED_SPAN
        while nid in self.nodes:
            nid = PLACED_BASE + (nid - PLACED_BASE + 1) % PLACED_SPAN
        return nid

    def _new_node(self, kind: str, mode: int, uid: int, gid: int, space: Inodes | None,
                  place: tuple[Node, bytes] | None = None, key: str | None = None) -> Node:
        """A node numbered by its `place` (parent, name) or inode-table `key` in the live tree;
        a view's (read-only) nodes and the root are counted."""
        if key is not None:
            nid = self._placed_id(b"inode-table\0" + key.encode())
        elif place is not None and not place[0].readonly:
            nid = self._placed_id(place[0].id.to_bytes(8, "little") + place[1])
        else:
            nid = self._new_id()
        node = Node(nid, kind, mode, uid, gid, now_ns())
        node.space = space
        self.nodes[nid] = node
        return node

    def _load_root(self, tree: str, space: Inodes) -> Node:
        # The mount root belongs to whoever runs the daemon, as any mountpoint would.
        root = self._new_node(DIR, 0o755, os.getuid(), os.getgid(), space)
        root.ref, root.dirty, root._children, root.nlink = tree, False, None, None
        return root

    def _node_from_entry(self, e: Entry, parent: Node) -> Node:
        """The node of one directory row; a hard-link row's is its inode's (one per tree)."""
        name = name_to_bytes(e.name)
        if e.kind == HARD:
            return self._linked(parent, name, e.ref)
        node = self._new_node(e.kind, e.mode, e.uid, e.gid, parent.space, (parent, name))
        node.apply_entry(e)
        node.parent, node.name = parent, name
        node.readonly = parent.readonly
        return node

    def _linked(self, d: Node, name: bytes, key: str) -> Node:
        space = d.space
        node = space.nodes.get(key)
        if node is None:
            e = space.load_rows(self.store).get(key)
            if e is None:
                raise fail(errno.EIO, f"{name_to_str(d.path() + b'/' + name)} names inode {key}, "
                                      "which its commit's inode table lacks: run `memfs fsck`")
            node = self._new_node(e.kind, e.mode, e.uid, e.gid, space,
                                  key=None if d.readonly else key)
            node.apply_entry(e)
            node.nlink = e.nlink or 1
            node.ikey, node.links, node.readonly = key, set(), d.readonly
            space.nodes[key] = node
        self.nodes.setdefault(node.id, node)  # a name found again after the kernel forgot it
        node.links.add((d, name))
        if node.parent is None:
            node.parent, node.name = d, name
        return node

    def get(self, nid: int) -> Node:
        node = self.nodes.get(nid)
        if node is None:
            raise fail(errno.ESTALE)
        return node

    def forget(self, nid: int, referenced: Callable[[int], bool] = lambda _: False) -> None:
        """The kernel dropped its last reference: a detached node goes, with its data; a
        view of history goes; a clean directory unloads what is below it, a clean file its
        chunk map (memfs.workspace.unload). `referenced` says which node ids the FUSE layer
        still holds (open handles, counted lookups)."""
        node = self.nodes.get(nid)
        if node is None or nid == ROOT_ID:
            return
        if node.readonly and node.parent is None:
            unload.drop_view(self, node, referenced)
        elif not node.readonly and not self._alive(node):
            del self.nodes[nid]
            self._dirty_files.discard(node)
            if node.data is not None and node.data.spill is not None:
                node.data.spill.close()  # its disk space goes back
        elif node.kind == DIR and not self._backed(node):
            unload.unload_dir(self, node, referenced)
        elif node.kind == FILE:
            unload.unload_file(node)

    def _backed(self, node: Node) -> bool:
        """Is the node in a store mount bound to a backing directory? Those keep their nodes:
        the backing layer knows them by id (disk-only files, held writers, states)."""
        if self.backing is None or not self.backing.bindings:
            return False
        while node.parent is not None and node.parent is not self.root:
            node = node.parent
        return name_to_str(node.name) in self.backing.bindings

    def _alive(self, node: Node) -> bool:
        """Has it a name? A linked inode may have names only in directories not loaded yet."""
        return node.parent is not None or (
            node.ikey is not None and node.nlink > 0 and node.space is self.inodes)

    def children(self, d: Node) -> dict[bytes, Node]:
        if d.kind != DIR:
            raise fail(errno.ENOTDIR)
        if d._children is None:
            kids: dict[bytes, Node] = {}
            if d.ref:
                for e in decode_dir(self.store.read_object(d.ref)):
                    kids[name_to_bytes(e.name)] = self._node_from_entry(e, d)
            d._children = kids
            d.nlink = 2 + sum(1 for c in kids.values() if c.kind == DIR)
        return d._children

    def dir_nlink(self, d: Node) -> int:
        """2 + subdirectories (counted from its listing for entries of older stores)."""
        if d.nlink is None:
            self.children(d)
        return d.nlink

    def _load_data(self, f: Node) -> FileData:
        if not f._data_loaded:
            size = f.data.size
            f.data = FileData(size, self.store.file_chunks(f.ref or ""))
            f._data_loaded = True
        return f.data

    def _fetch(self, chunk: str, start: int, length: int) -> bytes:
        return self.store.read_chunk_range(chunk, start, length)

    # -- change tracking -----------------------------------------------------------
    def _touch(self, node: Node | None) -> None:
        if self.stopped:
            raise fail(errno.EROFS, "memfs has stopped")
        if node is not None and node.ikey is not None and node.space.nodes.get(node.ikey) is node:
            node.space.changed.add(node)  # its row is in the inode table, not a directory
            if node.parent is None:
                node.dirty = True
                node.ver += 1
                node = self.root  # the table is committed with the root
        while node is not None:
            node.dirty = True
            node.ver += 1
            node.row = None
            node = node.parent
        self.mutation_seq += 1
        self._attribute()
        if self.dirty_since is None:  # only the first change wakes the commit loop
            self.dirty_since = time.monotonic()
            self._wake.set()

    def _attribute(self) -> None:
        """The change just made belongs to this task's operation (a failed request never
        gets here: every refusal is raised before the first _touch)."""
        op = CURRENT.get() or self.attribution.unattributed
        entry = self._group.get(op.key)
        if entry is None:
            entry = self._group[op.key] = (op, {})
        elif self._last_op != op.key:
            self._group[op.key] = self._group.pop(op.key)  # the newest change goes last
        self._last_op = op.key
        if op.pid not in entry[1]:
            entry[1][op.pid] = ProcRef(op.pid, op.comm, op.uid)

    def note_process(self, pid: int, uid: int) -> OpRecord:
        """The operation of a FUSE request from `pid`: changes this task makes from now on
        are its (operations.py clears it when the request ends)."""
        op = self.attribution.of_request(pid, uid)
        CURRENT.set(op)
        return op

    async def enter(self, pid: int, uid: int) -> OpRecord:
        """note_process, then `boundary()`: before a FUSE request that may change the tree."""
        op = self.note_process(pid, uid)
        await self.boundary()
        return op

    async def boundary(self) -> None:
        """Close the group commit first when another operation's changes wait in it (this
        task's operation is about to change the tree): a commit holds one operation's changes
        whenever two do not write at the same time. Once a group is mixed (two writers at
        once) the interval closes it; a commit per switch would turn two busy writers into a
        commit per request."""
        op = CURRENT.get() or self.attribution.unattributed
        group = self._group
        if len(group) == 1 and op.key not in group and not self.stopped:
            try:
                await self.commit()
            except Exception as exc:  # noqa: BLE001 - the commit loop retries; the change goes on
                log.warning("boundary commit failed (the changes stay pending): %s", exc)

    def _writable(self, node: Node) -> None:
        if node.readonly:
            raise fail(errno.EROFS)
        if self.read_only is not None:
            raise fail(errno.EROFS, self.read_only)

    def _settle_first(self, d: Node | None, name: bytes) -> None:
        """Seed 002: every change first settles a pending adoption of what it changes (only a
        crash leaves one outside a pass, so this is one dict check almost always)."""
        if d is not None and self.backing is not None and self.backing.pending_adopts:
            self.backing.settle_before_change(d, name)

    def _live_dir(self, d: Node) -> None:
        """A directory removed (by rmdir, undo or a branch switch) takes no new entries:
        they could never be committed. POSIX says ENOENT."""
        node = d
        while node.parent is not None:
            node = node.parent
        if node is not self.root:
            raise fail(errno.ENOENT)

    # -- namespace operations ------------------------------------------------------
    def lookup(self, d: Node, name: bytes) -> Node:
        if name == b".":
            return d
        if name == b"..":
            return d.parent or d
        if len(name) > NAME_MAX:
            raise fail(errno.ENAMETOOLONG)
        child = self.children(d).get(name)
        if child is None:
            raise fail(errno.ENOENT)
        return child

    def create(self, d: Node, name: bytes, kind: str, mode: int, uid: int, gid: int,
               target: bytes = b"", rdev: int = 0) -> Node:
        self._writable(d)
        _check_name(name)
        self._live_dir(d)
        kids = self.children(d)
        if name in kids:
            raise fail(errno.EEXIST)
        self._settle_first(d, name)
        if d.id == ROOT_ID and kind != DIR:
            raise fail(errno.EPERM, "only directories (store mounts) live at the mount root")
        node = self._new_node(kind, mode & 0o7777, uid, gid, d.space, (d, name))
        node.target = target
        node.rdev = rdev
        self._attach(d, name, node)
        d.mtime_ns = d.ctime_ns = node.mtime_ns
        self._touch(node)
        return node

    def link(self, node: Node, d: Node, name: bytes) -> Node:
        """link(2): one more name for `node`. Its first second name moves it into the inode
        table (its old name's row becomes a hard-link row)."""
        self._writable(d)
        _check_name(name)
        self._live_dir(d)
        if node.kind == DIR:
            raise fail(errno.EPERM, "hard links to directories are not allowed")
        if node.readonly or node.id in self.disk_only or node.space is not d.space:
            raise fail(errno.EXDEV, "only files of the live tree can be linked")
        if not self._alive(node):
            raise fail(errno.ENOENT)
        kids = self.children(d)
        if name in kids:
            raise fail(errno.EEXIST)
        if d.id == ROOT_ID:
            raise fail(errno.EPERM, "only directories (store mounts) live at the mount root")
        self._settle_first(d, name)
        if node.ikey is None:
            node.ikey, node.links, node.row = new_inode_key(), {(node.parent, node.name)}, None
            node.space.nodes[node.ikey] = node
            self._touch(node.parent)  # its row there becomes a hard-link row
        node.nlink += 1
        self._attach(d, name, node)
        d.mtime_ns = d.ctime_ns = node.ctime_ns = now_ns()
        self._touch(d)
        self._touch(node)
        return node

    def _attach(self, d: Node, name: bytes, node: Node) -> None:
        self.children(d)[name] = node
        node.parent, node.name = d, name
        if node.links is not None:
            node.links.add((d, name))
        if node.kind == DIR and d.nlink is not None:
            d.nlink += 1

    def _detach(self, d: Node, name: bytes, node: Node) -> None:
        """Take one name away; a linked inode keeps another of its loaded names as `parent`."""
        kids = d._children
        if kids is not None and kids.get(name) is node:
            del kids[name]
            if node.kind == DIR and d.nlink is not None:
                d.nlink -= 1
        if node.links is None:
            node.parent = None
            return
        node.links.discard((d, name))
        if node.parent is d and node.name == name:
            node.parent, node.name = next(iter(node.links), (None, name))

    def unlink(self, d: Node, name: bytes) -> Node:
        self._writable(d)
        node = self.lookup(d, name)
        if node.kind == DIR:
            raise fail(errno.EISDIR)
        self._remove(d, name, node)
        return node

    def rmdir(self, d: Node, name: bytes) -> Node:
        self._writable(d)
        if name in (b".", b".."):
            raise fail(errno.EINVAL)
        node = self.lookup(d, name)
        if node.kind != DIR:
            raise fail(errno.ENOTDIR)
        if self.children(node):
            raise fail(errno.ENOTEMPTY)
        self._remove(d, name, node)
        node.nlink = 0  # an open handle on it sees it gone, as on Linux
        return node

    def _remove(self, d: Node, name: bytes, node: Node) -> None:
        self._settle_first(d, name)
        self._touch(d)
        self.health.poke()
        if (self.space_refused or self.health.full) and self.lifecycle is not None:
            self.lifecycle.poke(delay=self.commit_interval + 0.5)  # once the removal is in
        self._detach(d, name, node)
        d.mtime_ns = d.ctime_ns = node.ctime_ns = now_ns()
        self._unname(node)

    def _unname(self, node: Node) -> None:
        """One name fewer for a file (unlink, or replaced by rename)."""
        if node.kind != DIR:
            node.nlink -= 1
            if node.ikey is not None:
                self._touch(node)

    def rename(self, od: Node, oname: bytes, nd: Node, nname: bytes, flags: int = 0) -> Node | None:
        """POSIX rename; returns the node it replaced (now detached), if any."""
        self._writable(od)
        self._writable(nd)
        _check_name(nname)
        self._live_dir(nd)
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
                RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise fail(errno.EINVAL)  # RENAME_WHITEOUT and unknown flags: not ours to fake
        src = self.lookup(od, oname)
        dst = self.children(nd).get(nname)
        self._settle_first(od, oname)
        self._settle_first(nd, nname)
        if nd.id == ROOT_ID and src.kind != DIR:
            raise fail(errno.EPERM)
        if src.kind == DIR and self._is_ancestor(src, nd):
            raise fail(errno.EINVAL)
        if flags & RENAME_EXCHANGE:
            if dst is None:
                raise fail(errno.ENOENT)
            if dst.kind == DIR and self._is_ancestor(dst, od):
                raise fail(errno.EINVAL)
            if od.id == ROOT_ID and dst.kind != DIR:
                raise fail(errno.EPERM)
            self._touch(od)
            self._touch(nd)
            self._detach(od, oname, src)
            self._detach(nd, nname, dst)
            self._attach(nd, nname, src)
            self._attach(od, oname, dst)
            od.mtime_ns = od.ctime_ns = nd.mtime_ns = nd.ctime_ns = now = now_ns()
            src.ctime_ns = dst.ctime_ns = now
            self._touch(src)
            self._touch(dst)
            return None
        if dst is src:
            return None
        if dst is not None:
            if flags & RENAME_NOREPLACE:
                raise fail(errno.EEXIST)
            if src.kind == DIR and dst.kind != DIR:
                raise fail(errno.ENOTDIR)
            if src.kind != DIR and dst.kind == DIR:
                raise fail(errno.EISDIR)
            if dst.kind == DIR and self.children(dst):
                raise fail(errno.ENOTEMPTY)
        now = now_ns()
        self._touch(od)
        self._detach(od, oname, src)
        if dst is not None:
            self._detach(nd, nname, dst)
            dst.ctime_ns = now
            if dst.kind == DIR:
                dst.nlink = 0
            self._unname(dst)
        self._attach(nd, nname, src)
        src.ctime_ns = now
        od.mtime_ns = od.ctime_ns = nd.mtime_ns = nd.ctime_ns = now
        self._touch(src)
        return dst

    @staticmethod
    def _is_ancestor(a: Node, b: Node) -> bool:
        node: Node | None = b
        while node is not None:
            if node is a:
                return True
            node = node.parent
        return False

    # -- data ------------------------------------------------------------------------
    def read(self, f: Node, off: int, size: int) -> bytes:
        if f.kind != FILE:
            raise fail(errno.EISDIR)
        return self._load_data(f).read(off, size, self._fetch)

    _dirty_bytes = 0

    def write(self, f: Node, off: int, data: bytes) -> int:
        self._writable(f)
        self._settle_first(f.parent, f.name)
        fd = self._load_data(f)
        # What the write adds to the changed pieces is what its commit will store (a hole
        # before it takes nothing). It must fit in what is free, less what already waits.
        growth = fd.growth(off, len(data))
        self.require_room(growth)
        before = fd.dirty_bytes() if len(fd.dirty) < 64 else None
        n = fd.write(off, data, self._fetch)
        self._dirty_bytes += fd.dirty_bytes() - before if before is not None else growth
        self._dirty_files.add(f)
        f.mtime_ns = f.ctime_ns = now_ns()
        self._touch(f)
        if self._dirty_bytes >= DIRTY_BYTES_SOON:
            self._urgent.set()
        return n

    def wants_spill(self, f: Node) -> bool:
        """A file that left the tree (never committed again) holding SPILL_AT changed bytes."""
        return (f.kind == FILE and f.data is not None and f._data_loaded and not f.readonly
                and len(f.data.dirty) > 0 and f.data.dirty_bytes() >= SPILL_AT
                and not self._attached(f))

    async def spill(self, f: Node) -> None:
        """Move a detached file's changed pieces to its scratch file (memfs.workspace.spill)."""
        await spill_pieces(f, self.store.root)

    def over_dirty_limit(self) -> bool:
        return self._dirty_bytes >= DIRTY_BYTES_MAX

    def truncate(self, f: Node, size: int) -> None:
        self._writable(f)
        if f.kind != FILE:
            raise fail(errno.EISDIR)
        self._settle_first(f.parent, f.name)
        fd = self._load_data(f)
        if size > fd.size and size - fd.size > self.free_bytes() + (1 << 40):
            raise fail(errno.EFBIG)
        before = fd.dirty_bytes()
        if size < fd.size:
            self.health.poke()
        fd.truncate(size, self._fetch)
        self._dirty_bytes = max(0, self._dirty_bytes + fd.dirty_bytes() - before)
        self._dirty_files.add(f)
        f.mtime_ns = f.ctime_ns = now_ns()
        self._touch(f)

    def stored_bytes(self, f: Node) -> int:
        """Bytes a file really holds (its pieces, not its holes): st_blocks for du, tar -S."""
        if f.kind != FILE or not f.data.size:
            return 0
        fd = self._load_data(f)
        present = set(fd.chunks) | set(fd.dirty) | set(fd.spill.present if fd.spill else ())
        return sum(min(CHUNK_SIZE, fd.size - i * CHUNK_SIZE) for i in present if i * CHUNK_SIZE < fd.size)

    def space_changed(self) -> None:
        """Space was given back (GC): read it again before the next write is let in."""
        self._space = None

    def require_room(self, nbytes: int) -> None:
        """Refuse (ENOSPC) `nbytes` of new data that would not fit in what is free, less what
        already waits, or while commits fail for space. The reconciler asks before it replaces
        a file with disk's bytes, so a take-in that cannot be stored changes nothing."""
        if not nbytes:
            return
        if not self.health.full and nbytes > self.free_bytes():
            self._space = None  # a refusal is decided on fresh figures (space freed just now)
        if self.health.full or nbytes > self.free_bytes():
            self._refuse_for_space()
        self.space_refused = False

    def _refuse_for_space(self) -> None:
        if not self.space_refused and self.lifecycle is not None:
            self.lifecycle.poke()  # a GC may make room
        self.space_refused = True
        raise fail(errno.ENOSPC)

    def space(self) -> Space:
        """The store filesystem's space, read at most every 0.5 s (and again after each
        commit, which moves pending bytes from memory to disk)."""
        now = time.monotonic()
        if self._space is None or now - self._space[0] > 0.5:
            self._space = (now, Space.of(self.store.root))
        return self._space[1]

    @property
    def pending_bytes(self) -> int:
        """Bytes of changed file pieces waiting in memory for a commit."""
        return self._dirty_bytes

    def free_bytes(self) -> int:
        """What writes may still take: the store filesystem's available space, less what
        waits in memory to be committed and the headroom its commits need."""
        sp = self.space()
        return max(0, sp.avail - self._dirty_bytes - headroom(sp.size))

    def _not_root(self, node: Node) -> None:
        """The mount root has no entry of its own in the store, so its metadata cannot be
        kept: changing it is refused rather than accepted and lost at the next load."""
        if node is self.root:
            raise fail(errno.EPERM, "the mount root's attributes are fixed")

    def setattr(self, node: Node, *, mode: int | None = None, uid: int | None = None,
                gid: int | None = None, atime_ns: int | None = None,
                mtime_ns: int | None = None, size: int | None = None) -> None:
        self._writable(node)
        self._not_root(node)
        if size is not None:
            self.truncate(node, size)
        if mode is not None:
            node.mode = mode & 0o7777
        if uid is not None:
            node.uid = uid
        if gid is not None:
            node.gid = gid
        if atime_ns is not None:
            node.atime_ns = atime_ns
            saw_kernel_time(atime_ns)
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns
            saw_kernel_time(mtime_ns)
        node.ctime_ns = now_ns()
        self._touch(node)
        if atime_ns is not None or mtime_ns is not None:
            self._note_set_times()

    def _note_set_times(self) -> None:
        """The operation that just changed the tree set a time on purpose (utimes: touch, tar,
        cp -p): its own times-only change is no side effect to fold away (memfs.store.undo)."""
        entry = self._group.get(self._last_op) if self._last_op else None
        if entry is not None and not entry[0].set_times:
            self._group[entry[0].key] = (replace(entry[0], set_times=True), entry[1])

    def set_xattr(self, node: Node, name: bytes, value: bytes) -> None:
        self._writable(node)
        self._not_root(node)
        node.xattrs[name] = value
        node.ctime_ns = now_ns()
        self._touch(node)

    def remove_xattr(self, node: Node, name: bytes) -> None:
        self._writable(node)
        if name not in node.xattrs:
            raise fail(errno.ENODATA)
        del node.xattrs[name]
        node.ctime_ns = now_ns()
        self._touch(node)

    # -- group commit ----------------------------------------------------------------
    async def run(self) -> None:
        """The group-commit loop: commit within commit_interval of the first change."""
        await trio.to_thread.run_sync(self.take_reserve)
        while not self.stopped:
            await self._wake.wait()
            self._wake = trio.Event()
            if self.dirty_since is None:
                continue
            if self.health.failure is not None:  # a failed commit (perhaps an fsync's): retry
                await self.health.wait_to_retry()
            elif self._dirty_bytes < DIRTY_BYTES_SOON:
                delay = self.dirty_since + self.commit_interval - time.monotonic()
                with trio.move_on_after(max(0.0, delay)):
                    await self._urgent.wait()
            self._urgent = trio.Event()
            try:
                await self.commit()
            except Exception:  # noqa: BLE001 - a failed commit is retried, never fatal
                self._wake.set()  # logged by health.failed; the retry waits at the top
                continue
            if time.monotonic() - self._reserve_checked > 5.0:  # it may have been given back
                await trio.to_thread.run_sync(self.take_reserve)

    def take_reserve(self) -> None:
        """Hold the space reserve (memfs.store.space) when there is room for it."""
        self._reserve_checked = time.monotonic()
        if self.reserve is None:
            return
        try:
            self.reserve.ensure()
        except OSError as exc:
            log.warning("could not take the space reserve: %s", exc)

    async def before_close(self, f: Node) -> None:
        """close() of a writable file: while commits fail, a file whose changes are not
        stored tries one commit and fails the close with its errno (ENOSPC), so a writer
        learns at close, not later, that what it wrote is not on disk yet."""
        if f.data is None or not f.data.dirty or not self._attached(f):
            return
        if self.health.failure is not None or self._space_short():
            await self.sync()

    def _space_short(self) -> bool:
        """Does the space free right now (read again) fall short of what waits in memory?
        Someone else may have filled the disk since the writes were let in."""
        self._space = None
        sp = self.space()
        return sp.avail < self._dirty_bytes + headroom(sp.size) // 2

    async def final_commit(self, message: str, limit: float) -> None:
        """The mount has ended: commit what is pending, retrying a failing commit (a full
        disk someone may still clear) for up to `limit` seconds before giving up loudly."""
        deadline = time.monotonic() + limit
        while True:
            try:
                await self.commit(message)
                return
            except CommitError as exc:
                if time.monotonic() >= deadline:
                    log.error("giving up: %d change(s) made before the unmount could not be "
                              "committed and are lost: %s", self.mutation_seq - self.durable_seq,
                              exc)
                    raise
                await self.health.wait_to_retry()

    async def wait_for_commit(self, after: int) -> int:
        """Return the commit count once a commit beyond `after` has been made."""
        while self.commit_count <= after:
            await self._committed.wait()
        return self.commit_count

    async def sync(self) -> None:
        """Return once every change made before this call is durable (fsync semantics)."""
        target = self.mutation_seq
        while self.durable_seq < target:
            await self.commit()

    async def commit(self, message: str = "") -> str | None:
        """Commit what is dirty now; return the new commit id (None if nothing changed)."""
        async with self._commit_lock:
            return await self._commit_locked(message)

    async def _commit_locked(self, message: str = "", *, on_loop: bool = False) -> str | None:
        if not self.root.dirty:
            self.durable_seq = max(self.durable_seq, self.mutation_seq)
            self.dirty_since = None
            self._recount_dirty()
            return None
        plan = self._snapshot()
        self.dirty_since = None
        text = _message(plan.ops, message)
        try:
            if on_loop:
                commit = self._write_errno(plan, text)
            else:
                commit = await trio.to_thread.run_sync(self._write_errno, plan, text)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._regroup(plan)  # the retry still names who made these changes
            self.dirty_since = time.monotonic()
            self._wake.set()  # the commit loop retries, whoever asked for this commit,
            self._urgent.set()  # at the retry pace, not after the commit interval
            self._space = None
            space = None
            try:
                space = self.space()
            except OSError:
                pass
            error = self.health.failed(exc, space, str(self.store.root),
                                       self.mutation_seq - self.durable_seq,
                                       self.store.kind != "sqlite")
            if self.health.full and self.lifecycle is not None:
                self.lifecycle.poke()  # a GC may make the room
            raise error from exc
        self.last_error = None
        self.health.succeeded()
        self._apply(plan)
        self._recount_dirty()
        self._space = None  # the committed bytes left memory for the disk
        self.head = commit.id
        self.durable_seq = max(self.durable_seq, plan.seq)
        self.commit_count += 1
        self._committed.set()
        self._committed = trio.Event()
        if self.root.dirty and self.dirty_since is None:
            self.dirty_since = time.monotonic()
            self._wake.set()
        return commit.id

    def _recount_dirty(self) -> None:
        """Pending bytes are those a commit will take: a file unlinked (detached) holds its
        bytes only for the handles still open on it, and they are never committed."""
        self._dirty_files = {f for f in self._dirty_files
                             if f.data and f.data.dirty and self._attached(f)}
        self._dirty_bytes = sum(f.data.dirty_bytes() for f in self._dirty_files)

    def _attached(self, node: Node) -> bool:
        if node.ikey is not None:
            return self._alive(node)
        while node.parent is not None:
            node = node.parent
        return node is self.root

    def _snapshot(self) -> _Plan:
        plan = _Plan(seq=self.mutation_seq)
        plan.ops = [op.with_pids(list(procs.values())) for op, procs in self._group.values()]
        plan.processes = [
            {"pid": p.pid, "uid": p.uid, "comm": p.comm, "pgid": op.pgid, "sid": op.sid,
             "cmdline": op.label, "kind": op.kind}
            for op in plan.ops for p in op.pids]
        self._group, self._last_op = {}, None
        self.attribution.forget_processes()
        if self.backing is not None:
            plan.intents = self.backing.intent_bytes()
        plan.root = self._snap_dir(self.root, plan)
        plan.inodes = self.inodes.snapshot(self.store, self._alive, self._snap_file)
        plan.jobs.extend(plan.inodes.file_jobs)
        return plan

    def _snap_dir(self, top: Node, plan: _Plan) -> _DirJob:
        """The dirty directories under `top`: file jobs as they are met, then every directory
        job, children before parents (the order the commit thread writes them in). A work
        list, not recursion: a tree may be deeper than Python's recursion limit (cd-and-mkdir
        in a loop has no PATH_MAX); one plain loop per directory, so a directory of 20k
        entries costs the loop what it did."""
        root = _DirJob(top, top.ver, [])
        dirs: list[_DirJob] = []
        work = [root]
        while work:
            job = work.pop()
            dirs.append(job)
            entries = job.entries
            disk_only = self.disk_only
            for name, child in self.children(job.node).items():
                row = child.row  # a clean child's cached row: the common case, inline
                if row is not None and child.ikey is None and child.id not in disk_only:
                    entries.append((row, None))
                else:
                    self._snap_child(name, child, entries, work, plan)
        plan.jobs.extend(reversed(dirs))
        return root

    def _snap_child(self, name: bytes, child: Node, entries: list, work: list[_DirJob],
                    plan: _Plan) -> None:
        if child.id in self.disk_only:
            return
        if child.ikey is not None:  # a hard-linked inode: its row is in the inode table
            entries.append((encode_row(hard_entry(name_to_str(name), child.ikey)), None))
            return
        if child.kind == DIR and (child.dirty or child.ref is None):
            sub = _DirJob(child, child.ver, [])
            entries.append((child.entry("", 0), sub))
            work.append(sub)
        elif child.kind == FILE and (child.dirty or child.ref is None):
            fjob = self._snap_file(child)
            plan.jobs.append(fjob)
            entries.append((child.entry("", fjob.size), fjob))
        else:
            # A clean child's row is cached: a commit in a directory of 20k entries
            # must not rebuild 20k rows on the loop.
            row = child.row
            if row is None:
                if child.kind == LINK:
                    ref = name_to_str(child.target)
                    if child.dirty:
                        plan.clean.append((child, child.ver))
                else:
                    ref = child.ref or ""
                row = encode_row(child.entry(ref, child.size()))
                if not child.dirty:
                    child.row = row
            entries.append((row, None))

    def _snap_file(self, f: Node) -> _FileJob:
        fd = self._load_data(f)
        pieces = {i: bytes(b) for i, b in fd.dirty.items()}
        return _FileJob(f, f.ver, fd.size, dict(fd.chunks), pieces, dict(fd.gen))

    def _write_errno(self, plan: _Plan, message: str):
        """_write, with SQLite's disk-full and I/O errors as the errno fsync should answer."""
        try:
            return self._write(plan, message)
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
                raise OSError(errno.ENOSPC, f"store is full: {exc}") from exc
            if code is not None and code & 0xFF == sqlite3.SQLITE_IOERR:
                raise OSError(errno.EIO, f"store I/O error: {exc}") from exc
            raise

    def _write(self, plan: _Plan, message: str):
        """Commit thread: chunks, then objects bottom-up, then the commit — one transaction."""
        with self.store.transaction() as tx:
            files = [j for j in plan.jobs if isinstance(j, _FileJob)]
            order = [(j, i) for j in files for i in sorted(j.pieces)]
            ids = tx.put_chunks([j.pieces[i] for j, i in order]) if order else []
            for (j, i), cid in zip(order, ids, strict=True):
                j.chunks[i] = cid
            for j in files:
                j.ref = _file_ref(tx, j.size, j.chunks)
            for j in plan.jobs:
                if isinstance(j, _DirJob):
                    rows = []
                    for e, child in j.entries:
                        if child is not None:
                            e.ref = child.ref
                            child.row = encode_row(e)
                            rows.append(child.row)
                        else:
                            rows.append(e)
                    j.ref = tx.put_object(encode_rows(rows))
            plan.inodes.write(tx)
            _maybe_crash("after-objects")
            commit = tx.add_commit(self.head, plan.root.ref, self.branch, message,
                                   plan.processes, plan.inodes.table)
            history.put_ops(tx, commit.id, plan.ops)
            if plan.intents is not None:
                tx.put_intents(commit.id, plan.intents)
            return commit

    def _regroup(self, plan: _Plan) -> None:
        """A failed commit's operations go back in front of what came since."""
        merged: dict[str, tuple[OpRecord, dict[int, ProcRef]]] = {}
        for op in plan.ops:
            merged[op.key] = (op, {p.pid: p for p in op.pids})
        for key, (op, procs) in self._group.items():
            if key in merged:
                merged[key][1].update(procs)
                if op.set_times and not merged[key][0].set_times:
                    merged[key] = (op, merged[key][1])
                merged[key] = merged.pop(key)
            else:
                merged[key] = (op, procs)
        self._group = merged

    def _apply(self, plan: _Plan) -> None:
        """Back on the loop: mark clean what did not change while the commit ran."""
        for j in plan.jobs:
            node = j.node
            if isinstance(j, _FileJob):
                fd = node.data
                if node._data_loaded and fd is not None:
                    for i, cid in j.chunks.items():
                        if i in j.pieces and fd.gen.get(i) == j.gens.get(i) and i in fd.dirty:
                            del fd.dirty[i]
                            del fd.gen[i]
                            if i * CHUNK_SIZE < fd.size:
                                fd.chunks[i] = cid
            if node.ver == j.ver:
                node.ref, node.dirty, node.row = j.ref, False, j.row
        for node, ver in plan.clean:
            if node.ver == ver:
                node.dirty = False
        plan.inodes.apply()

    # -- history ----------------------------------------------------------------------
    # The history operations hold the commit lock and move the branch head with no await
    # between their last commit and the tree replacement, so no change can slip in between
    # and be lost. The head move is one small SQLite transaction, run on the loop for that
    # reason.
    async def _settle_locked(self, message: str) -> None:
        """Commit until nothing is dirty; the caller's next step runs in the same loop turn.

        Changes made while a commit runs in its thread would otherwise be replaced away
        with the tree. A steady writer can keep the tree dirty round after round, so after
        three rounds the rest — what arrived during the last round, a small amount — is
        committed on the loop itself, where nothing can slip in before the caller's step.
        """
        for _ in range(3):
            await self._commit_locked(message)
            if not self.root.dirty:
                return
        await self._commit_locked(message, on_loop=True)

    async def restore(self, rev: str) -> str:
        """Move the branch head to `rev` (the old head stays in the reflog)."""
        resolved = None
        if self.backing is not None:
            # `rev` as it reads now; then disk's changes so far, against this tree (the
            # restore rewinds past whatever that pass commits).
            async with self._commit_lock:
                await self._settle_locked("before restore")
                resolved = (self.branch, history.resolve(self.store, rev))
            await self.backing.before_rewind()
        async with self._commit_lock:
            await self._settle_locked("before restore")
            same = resolved is not None and resolved[0] == self.branch
            target = resolved[1] if same else history.resolve(self.store, rev)  # type: ignore[index]
            self.store.reset_head(self.branch, target, f"restore {rev}")
            self._replace_tree(target)
            return target

    async def switch_branch(self, name: str) -> str:
        self.store.head(name)  # an unknown branch is refused before anything moves
        claim = await trio.to_thread.run_sync(self.store.claim, name)  # its writer lease
        async with self._commit_lock:
            old = self.branch
            await self._settle_locked("before switch")
            head = self.store.head(name)
            self.store.set_current_branch(name)
            self.branch = name
            self.read_only = None if claim.writable else claim.reason()
            self._replace_tree(head)
        if old != name:
            await trio.to_thread.run_sync(self.store.release, old)
        return head

    async def create_branch(self, name: str, at: str | None) -> str:
        async with self._commit_lock:
            await self._settle_locked("before branch")
            return self.store.create_branch(name, at)

    def _replace_tree(self, commit_id: str) -> None:
        """Show another commit's tree, keeping inode numbers for paths that survive."""
        if self.backing is not None:
            self.backing.before_tree_replace()  # which backed files the new tree changes
        self.head = commit_id
        tree = self.store.commit(commit_id).tree
        entries: list[tuple[int, bytes]] = []
        inodes: list[int] = []
        old, self.inodes = self.inodes, Inodes(self.store.inode_table(commit_id))
        for node in old.nodes.values():  # linked inodes are never kept (see _remap_dir)
            node.parent, node.nlink = None, 0
            inodes.append(node.id)
        old.nodes.clear()
        self.root.space, self.root.nlink = self.inodes, None
        self._remap_dir(self.root, tree, entries, inodes)
        self.root.ref, self.root.dirty = tree, False
        self.invalidate(entries, inodes)
        if self.backing is not None:
            self.backing.tree_replaced()

    def _remap_dir(self, top: Node, tree: str, entries: list, inodes: list) -> None:
        """Directories keep their inode (a shell's cwd survives an undo); a file or link
        whose committed form differs becomes a new inode, because with the writeback cache
        the kernel keeps its own size and mtime for a cached regular file. A hard-linked inode
        always becomes a new one: its other names may be in directories not loaded. A work
        list, not recursion: trees of any depth."""
        work = [(top, tree)]
        while work:
            d, tree = work.pop()
            inodes.append(d.id)
            old = d._children
            d._children = None
            d.ref, d.dirty = tree, False
            if old is None:
                continue
            fresh = {name_to_bytes(e.name): e for e in decode_dir(self.store.read_object(tree))}
            kids: dict[bytes, Node] = {}
            for name, node in old.items():
                e = fresh.get(name)
                if e is not None and e.kind == node.kind == DIR:
                    children_loaded = node._children
                    node.apply_entry(e)
                    node._children = children_loaded
                    node.space = d.space
                    work.append((node, e.ref))
                    kids[name] = node
                elif (e is not None and e.kind == node.kind and node.ikey is None
                      and _same(node, e)):
                    node.space = d.space
                    kids[name] = node
                else:
                    node.parent, node.nlink = None, 0
                    self._empty_subtree(node, inodes)
                    entries.append((d.id, name))
                    inodes.append(node.id)
            d._children = kids
            for name, e in fresh.items():
                if name not in kids:
                    kids[name] = self._node_from_entry(e, d)
                    entries.append((d.id, name))  # the kernel may cache it as missing (lookup)
            d.nlink = 2 + sum(1 for c in kids.values() if c.kind == DIR)

    def _empty_subtree(self, top: Node, inodes: list) -> None:
        """A removed directory, and every directory below it that a shell may still be
        in, reads empty (as after rm -r) instead of showing the old entries."""
        work = [top]
        while work:
            node = work.pop()
            if node.kind != DIR or node._children is None:
                continue
            for child in node._children.values():
                inodes.append(child.id)
                child.nlink = 0
                work.append(child)
            node._children, node.ref = {}, None

    def view(self, commit_id: str, place: str = "history", *, immutable: bool = False) -> Node:
        """A read-only tree of a past commit (for .memfs/history, checkpoints, branches),
        whose times are the commit's own.

        Cached per place it is reached from (`place`, e.g. "branches/main"), never shared
        between two places: one directory inode under two names would make the kernel move
        its dentry (a shell's cwd would jump from history/ to branches/). `immutable`: a
        past commit reached by its id (HistoryOps._remember_view)."""
        commit = self.store.commit(commit_id)
        key = (place, commit_id)
        node = self._views.get(key)
        if node is None:
            table = self.store.inode_table(commit_id)
            node = self._new_node(DIR, 0o555, 0, 0, Inodes(table))
            node.ref, node.dirty, node._children, node.readonly = commit.tree, False, None, True
            node.nlink = None
            node.mtime_ns = node.ctime_ns = node.atime_ns = commit.time_ns
            self._remember_view(key, node, immutable)
        else:
            self._views.move_to_end(key)
        return node

    def space_status(self) -> dict:
        """statfs's figures and what memfs keeps of them (bytes)."""
        sp = self.space()
        return {**sp.to_json(), "pending_bytes": self._dirty_bytes, "writable": self.free_bytes(),
                "headroom": headroom(sp.size),
                "reserve": self.reserve.held() if self.reserve is not None else 0}

    def retention_status(self) -> dict:
        if self.store.kind != "sqlite":
            return {"policy": None, "summary": NO_RETENTION}
        policy = self.store.policy()
        return {**policy.to_json(), "summary": policy.summary()}

    def status(self) -> dict:
        mounts = sorted(name_to_str(n) for n in self.children(self.root))
        return {
            "root": str(self.store.root),
            "branch": self.branch,
            "head": self.head,
            "pending": self.mutation_seq - self.durable_seq,
            "pending_bytes": self._dirty_bytes,
            "nodes": len(self.nodes),
            "durable": self.mutation_seq == self.durable_seq,
            "commit_interval_ms": int(self.commit_interval * 1000),
            "last_commit_error": self.last_error,
            "commit_failure": self.health.failure.to_json() if self.health.failure else None,
            "space": self.space_status(),
            "retention": self.retention_status(),
            **({"gc": self.lifecycle.status()} if self.lifecycle is not None else {}),
            "mounts": mounts,
            "daemon": self.served_by.identity() if self.served_by else None,
            "read_only": self.read_only,
            **({"backing": self.backing.status()} if self.backing is not None else {}),
        }


def _message(ops: list[OpRecord], given: str) -> str:
    """A commit's message: what made it (its last operation, and how many others)."""
    if not ops:
        return given or "changes"
    last = ops[-1].label
    more = len({o.label for o in ops}) - 1
    return last + (f" (+{more} other{'s' if more > 1 else ''})" if more > 0 else "")


def _same(node: Node, e: Entry) -> bool:
    """Is this clean node exactly the committed entry (content and metadata)?"""
    if node.dirty:
        return False
    return node.entry(e.ref, node.size()).to_list() == e.to_list() and (
        node.kind != FILE or node.ref == e.ref)


def _file_ref(tx, size: int, chunks: dict[int, str]) -> str:
    if size == 0 and not chunks:
        return ""
    if list(chunks) == [0] and size <= CHUNK_SIZE:
        return "c:" + chunks[0] if size else ""
    return "m:" + tx.put_object(encode_manifest(size, chunks))


def _check_name(name: bytes) -> None:
    if len(name) > NAME_MAX:
        raise fail(errno.ENAMETOOLONG)
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise fail(errno.EINVAL)


def _maybe_crash(point: str) -> None:
    """Test hook: MEMFS_CRASH_AT=<point> kills the process there (ordering tests)."""
    if os.environ.get("MEMFS_CRASH_AT") == point:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["Workspace", "WorkspaceError", "Node", "ROOT_ID", "DIR", "FILE", "LINK", "CHR", "BLK",
           "RENAME_NOREPLACE", "RENAME_EXCHANGE", "decode_manifest"]
