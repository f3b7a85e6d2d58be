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
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from memfs.liveness import DaemonRecord
from memfs.store import StoreBackend as Store
from memfs.store import open_store
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.history import OpRecord, ProcRef
from memfs.store.retention import Policy
from memfs.store.space import Space
from memfs.store.store import Commit
from memfs.store.trees import (
    BLK,
    CHR,
    DIR,
    FILE,
    LINK,
    decode_manifest,
)
from memfs.workspace import groupcommit, loading, namespace, snapshot, unload, warm
from memfs.workspace import status as ws_status
from memfs.workspace.attribution import CURRENT, Attribution
from memfs.workspace.cutoff import CutOff, OpenWriters
from memfs.workspace.health import CommitHealth
from memfs.workspace.history_ops import HistoryOps
from memfs.workspace.hold import ChangeHold
from memfs.workspace.hooks import NO_BACKING, BackingHooks
from memfs.workspace.inodes import Inodes
from memfs.workspace.namespace import NAME_MAX, RENAME_EXCHANGE, RENAME_NOREPLACE
from memfs.workspace.nodes import (
    DIRTY_BYTES_SOON,
    ROOT_ID,
    FileData,
    Node,
    WorkspaceError,
    fail,
    now_ns,
    own,
    saw_kernel_time,
)
from memfs.workspace.replace import replace_and_cut
from memfs.workspace.room import Room
from memfs.workspace.spill import SPILL_AT, spill_pieces

if TYPE_CHECKING:
    from memfs.workspace.hosts import Hosts
    from memfs.workspace.lifecycle import Lifecycle
    from memfs.workspace.pinning import PinPublisher

log = logging.getLogger("memfs.workspace")

# st_blocks counts a file's pieces in the block a native filesystem allocates (ext4's and
# tmpfs's 4 KiB page), not in bytes: `du` of a 1-byte file is 4 KiB on both.
ALLOC_UNIT = 4096
DIRTY_BYTES_MAX = 48 << 20  # writers wait for a commit beyond this (bounds the daemon's RSS)

# The commit snapshot, undo's remap, fsck and GC walk trees of any depth without recursion;
# the backing layer's walks (reconcile.observe.walk_dir, BranchIntent._files_of) still recurse per
# level, so the limit stays raised for them: a 4 KiB path can be 2048 levels deep.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

Invalidator = Callable[[list[tuple[int, bytes]], list[int]], None]


async def _no_views() -> int:
    return 0


class Workspace(HistoryOps):
    def __init__(self, store: Store, commit_interval: float = 0.1) -> None:
        self.store = store
        self.commit_interval = commit_interval
        self.branch = store.current_branch()
        self.head = store.head(self.branch)
        self.nodes: dict[int, Node] = {}
        self._next_id = ROOT_ID
        self.inodes = Inodes(store.inode_table(self.head))  # the live tree's linked inodes
        self.root = loading.load_root(self, store.commit(self.head).tree, self.inodes)
        self.invalidate: Invalidator = lambda entries, inodes: None
        self.mutation_seq = 0
        self.unload_seq = 0  # bumped when a directory's loaded nodes go (memfs.workspace.unload)
        self.durable_seq = 0
        self.dirty_since: float | None = None
        self.last_error: str | None = None
        self.served_by: DaemonRecord | None = None  # the daemon serving it (status shows it)
        # Why this host may not change the branch (another host holds its writer lease:
        # memfs.workspace.hosts), or None. On the embedded store every claim succeeds.
        claim = store.claim(self.branch)
        self.read_only: str | None = None if claim.writable else claim.reason()
        self.hosts: Hosts | None = None  # while a daemon serves it
        # The operations whose changes the next commit holds (key -> record, requesters),
        # in the order of their last change; attribution.py says who a request is.
        self.attribution = Attribution()
        self._group: dict[str, tuple[OpRecord, dict[int, ProcRef]]] = {}
        self._last_op: str | None = None
        self._commit_lock = trio.Lock()
        self.hold = ChangeHold()  # new changes wait while a history operation finishes
        # Handles open for writing, and those a tree replacement cut off (the FUSE layer
        # registers them; memfs.workspace.cutoff).
        self.writers = OpenWriters()
        self._wake = trio.Event()  # set by the first change after a commit
        self._urgent = trio.Event()  # set when dirty data should not wait for the interval
        self._durable = trio.Event()
        self.commit_count = 0  # commits made by this process (auto-materialize follows them)
        self._committed = trio.Event()
        self._views: OrderedDict[tuple[str, str], Node] = OrderedDict()
        self._view_keys: dict[int, tuple[str, str]] = {}
        self._view_roots: dict[int, Node] = {}  # every view root until the kernel forgets it
        self.swept: set[int] = set()  # nodes of views dropped as swept (HistoryOps)
        self._immutable: set[int] = set()
        # On a store in PostgreSQL, the daemon's publisher of this host's pins: it hears of
        # each new view root, published before the kernel sees it (memfs.workspace.pinning).
        self.pin_gate: PinPublisher | None = None
        self.health = CommitHealth()
        self.lifecycle: Lifecycle | None = None  # the daemon's GC (memfs.workspace.lifecycle)
        self.policy_seen: Policy | None = None  # the last retention policy read (status.py keeps it)
        self.room = Room(self)  # space for writes, refusals, the reserve (memfs.workspace.room)
        # Nodes the FUSE layer holds open (operations sets it): what GC must keep for them.
        self.held_nodes: Callable[[], Iterable[Node]] = lambda: ()
        # What the kernel holds now (counted lookups, open handles), as a test of a node id:
        # what may be unloaded outside a forget (the FUSE layer installs it; without a kernel
        # nothing is held).
        self.kernel_refs: Callable[[], Callable[[int], bool]] = lambda: lambda _: False
        # Before GC decides what to keep: let the kernel forget the views under .memfs no
        # process holds (memfs.fs.view_release; without a kernel there is nothing to forget).
        self.release_views: Callable[[], Awaitable[int]] = _no_views
        self._dirty_files: set[Node] = set()
        self.stopped = False
        # Backing directories (memfs.backing.Backing installs itself here; until then the
        # hooks do nothing): disk-only nodes are shown from disk and never committed.
        self.backing: BackingHooks = NO_BACKING
        self.disk_only: dict[int, tuple[str, str]] = {}

    @classmethod
    def open(cls, root, commit_interval: float = 0.1) -> Workspace:
        """The workspace of the store at `root` (created if missing)."""
        return cls(open_store(root), commit_interval)

    # -- node table (loading and numbering: memfs.workspace.loading) ----------------------
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
            self.writers.forgot(nid)
            self._dirty_files.discard(node)
            if node.data is not None and node.data.spill is not None:
                node.data.spill.close()  # its disk space goes back
        elif node.kind == DIR:
            unload.unload_dir(self, node, referenced)
        elif node.kind == FILE:
            unload.unload_file(node)

    def _alive(self, node: Node) -> bool:
        """Has it a name? A linked inode may have names only in directories not loaded yet."""
        return node.parent is not None or (
            node.ikey is not None and (node.nlink or 0) > 0 and node.space is self.inodes)

    def children(self, d: Node) -> dict[bytes, Node]:
        if d.kind != DIR:
            raise fail(errno.ENOTDIR)
        if d._children is None:
            return loading.load_children(self, d)
        return d._children

    def dir_nlink(self, d: Node) -> int:
        """2 + subdirectories (counted from its listing for entries of older stores)."""
        if d.nlink is None:
            self.children(d)
        return d.nlink or 0  # counted by the listing just loaded

    async def warm(self, node: Node, off: int = 0, size: int = 0, writing: bool = False) -> None:
        """Before a request that loads from the store: what a remote store's caches miss is
        read in a worker thread, not on the loop (memfs.workspace.warm)."""
        await warm.warm(self, node, off, size, writing)

    def _load_data(self, f: Node) -> FileData:
        return loading.load_data(self, f)

    def _fetch(self, chunk: str, start: int, length: int) -> bytes:
        return self.store.read_chunk_range(chunk, start, length)

    # -- change tracking -----------------------------------------------------------
    def _touch(self, node: Node | None) -> None:
        if self.stopped:
            raise fail(errno.EROFS, "memfs has stopped")
        if node is not None and node.ikey is not None:
            node = self._touch_linked(node)
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

    def _touch_linked(self, node: Node) -> Node:
        """A linked inode changes: its row is in the inode table (or leaves it, down to one
        loaded name, for its directory to hold again); one with no loaded name dirties the
        root, which the table is committed with."""
        space = node.space
        if space is None or space.nodes.get(node.ikey or "") is not node:
            return node
        if space is self.inodes and space.untable(node):
            return node
        space.changed.add(node)
        if node.parent is not None:
            return node
        node.dirty = True
        node.ver += 1
        return self.root

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
        are its (memfs.fs.handlers.guard clears it when the request ends)."""
        op = self.attribution.of_request(pid, uid)
        CURRENT.set(op)
        return op

    async def enter(self, pid: int, uid: int) -> OpRecord:
        """note_process, then `before_change()`: before a FUSE request that may change the
        tree."""
        op = self.note_process(pid, uid)
        await self.before_change()
        return op

    async def before_change(self) -> None:
        """`boundary()`, and wait while a history operation holds changes off
        (memfs.workspace.hold): the caller changes the tree with no await after this."""
        await self.boundary()
        while self.hold.held:
            await self.hold.wait()
            await self.boundary()  # the group the history operation left may be another's

    async def changes_open(self) -> None:
        """Wait while a history operation holds changes off; the caller changes the tree (or
        checks what it decided on) with no await after this."""
        await self.hold.wait()

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
        """First thing in every change, before anything moved."""
        if node.readonly:
            raise fail(errno.EROFS)
        if self.read_only is not None:
            raise fail(errno.EROFS, self.read_only)
        if self.hold.held:  # a caller skipped before_change/changes_open: refuse, not lose
            log.error("a change reached the tree while a history operation held changes off "
                      "(a bug: its caller must wait first); refused")
            raise fail(errno.EIO, "a history operation is replacing the tree")

    def _settle_first(self, d: Node | None, name: bytes) -> None:
        """Seed 002: every change first settles a pending adoption of what it changes (only a
        crash leaves one outside a pass, so this is one dict check almost always)."""
        if d is not None:
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

    # The changes themselves: memfs.workspace.namespace.
    def create(self, d: Node, name: bytes, kind: str, mode: int, uid: int, gid: int,
               target: bytes = b"", rdev: int = 0) -> Node:
        return namespace.create(self, d, name, kind, mode, uid, gid, target, rdev)

    def link(self, node: Node, d: Node, name: bytes) -> Node:
        return namespace.link(self, node, d, name)

    def unlink(self, d: Node, name: bytes) -> Node:
        return namespace.unlink(self, d, name)

    def rmdir(self, d: Node, name: bytes) -> Node:
        return namespace.rmdir(self, d, name)

    def rename(self, od: Node, oname: bytes, nd: Node, nname: bytes, flags: int = 0) -> Node | None:
        """POSIX rename; returns the node it replaced (now detached), if any."""
        return namespace.rename(self, od, oname, nd, nname, flags)

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

    def allocated_bytes(self, f: Node) -> int:
        """What a file takes as a native filesystem counts it, for st_blocks (du, ls -s,
        tar -S): each piece that holds data, not the holes, its part of the file rounded up to
        ALLOC_UNIT (a 1-byte file takes 4 KiB, as on ext4 and tmpfs). A piece counts its whole
        part of the file, written or committed alike, so the figure never moves at a commit."""
        if f.kind != FILE or f.data is None or not f.data.size:
            return 0
        fd = self._load_data(f)
        present = set(fd.chunks) | set(fd.dirty) | set(fd.spill.present if fd.spill else ())
        return sum(-(-min(CHUNK_SIZE, fd.size - i * CHUNK_SIZE) // ALLOC_UNIT) * ALLOC_UNIT
                   for i in present if i * CHUNK_SIZE < fd.size)

    async def room_settled(self, f: Node, off: int, size: int, since: float) -> bool:
        """Before a write: wait for a commit in flight if the write does not fit until its
        bytes are counted once (memfs.workspace.room.Room.settle); True if it waited."""
        if f.kind != FILE or not self.room.commit_in_flight:
            return False
        return await self.room.settle(self._load_data(f).growth(off, size), since)

    def require_room(self, nbytes: int) -> None:
        """ENOSPC for `nbytes` of new data that would not fit (memfs.workspace.room)."""
        self.room.require(nbytes)

    def space(self) -> Space:
        return self.room.space()

    @property
    def pending_bytes(self) -> int:
        """Bytes of changed file pieces waiting in memory for a commit."""
        return self._dirty_bytes

    def free_bytes(self) -> int:
        """What writes may still take (memfs.workspace.room)."""
        return self.room.free_bytes()

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
        node.xattrs = own(node.xattrs)
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
        """The group-commit loop (memfs.workspace.groupcommit.run)."""
        await groupcommit.run(self)

    async def before_close(self, f: Node) -> None:
        """close() of a writable file: while commits fail, a file whose changes are not
        stored tries one commit and fails the close with its errno (ENOSPC), so a writer
        learns at close, not later, that what it wrote is not on disk yet."""
        if f.data is None or not f.data.dirty or not self._attached(f):
            return
        if self.health.failure is not None or self.room.short():
            await self.sync()

    async def final_commit(self, message: str, limit: float) -> None:
        """Commit what is pending at the mount's end (memfs.workspace.groupcommit)."""
        await groupcommit.final_commit(self, message, limit)

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

    async def _commit_locked(self, message: str = "") -> str | None:
        """One commit, the commit lock held (memfs.workspace.groupcommit.commit_locked)."""
        return await groupcommit.commit_locked(self, message)

    def _recount_dirty(self) -> None:
        """Pending bytes are those a commit will take: a file unlinked (detached) holds its
        bytes only for the handles still open on it, and they are never committed."""
        self._dirty_files = {f for f in self._dirty_files
                             if f.data and f.data.dirty and self._attached(f)}
        self._dirty_bytes = sum(f.data.dirty_bytes() for f in self._dirty_files
                                if f.data is not None)

    def _attached(self, node: Node) -> bool:
        if node.ikey is not None:
            return self._alive(node)
        while node.parent is not None:
            node = node.parent
        return node is self.root

    def _write(self, plan: snapshot.CommitPlan, message: str) -> Commit:
        """The commit thread's step (memfs.workspace.snapshot.write)."""
        return snapshot.write(self, plan, message)

    # -- history (operations: memfs.workspace.history_ops; the tree's swap: .replace) -----
    def _replace_tree(self, commit_id: str, by: str) -> list[CutOff]:
        """history_ops' and hosts' step: memfs.workspace.replace.replace_and_cut."""
        return replace_and_cut(self, commit_id, by)

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
            node = loading.view_root(self, commit_id, commit)
            self._remember_view(key, node, immutable)
        else:
            self._views.move_to_end(key)
        return node

    async def refresh_policy(self) -> None:
        """Read the retention policy for a status (memfs.workspace.status)."""
        await ws_status.refresh_policy(self)

    def status(self) -> dict:
        """The mount's status document (memfs.workspace.status)."""
        return ws_status.status(self)

__all__ = ["Workspace", "WorkspaceError", "Node", "ROOT_ID", "DIR", "FILE", "LINK", "CHR", "BLK",
           "RENAME_NOREPLACE", "RENAME_EXCHANGE", "decode_manifest"]
