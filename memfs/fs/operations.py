"""pyfuse3 Operations over the workspace: thin translation, no policy of its own.

Every handler runs through `_guard`: a WorkspaceError becomes its errno, anything else is
logged with the operation and answered EIO, because an exception other than FUSEError
would end pyfuse3.main() and leave a dead mount behind.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable

import pyfuse3
import trio

from memfs.fs.memory_view import MemDir, MemError, MemFile, MemoryView
from memfs.fs.virtual import VDir, VFile, VirtualTree
from memfs.workspace.agent_memory import open_memory
from memfs.workspace.attribution import CURRENT
from memfs.workspace.nodes import KIND_OF_MODE, Node, WorkspaceError
from memfs.workspace.workspace import BLK, CHR, DIR, FILE, LINK, ROOT_ID, Workspace

log = logging.getLogger("memfs.fs")

CACHE_TIMEOUT = 300.0  # safe: every change made behind the kernel's back is invalidated
CONTROL_NAME = b".memfs"
BLKSIZE = 128 * 1024
HISTORY_TIMEOUT = 60.0  # a past commit's tree never changes (garbage collection aside)
STATE_XATTRS = (b"user.memfs.state", b"user.memfs.conflict")  # backed mounts (backing.py)


def _guard(fn: Callable) -> Callable:
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self, *args, **kwargs):
        self.requests[name] += 1
        token = CURRENT.set(None)  # a request's operation ends with it (attribution.py)
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except (WorkspaceError, MemError) as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            log.error("%s%r failed: %s", fn.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception:
            log.exception("%s%r failed", fn.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            CURRENT.reset(token)

    return wrapper


class Handle:
    __slots__ = ("node", "data", "writable", "mem", "who")

    def __init__(self, node: Node | None, data: bytes | None = None, writable: bool = False,
                 mem: MemFile | None = None, who: tuple[int, int] | None = None):
        self.node, self.data, self.writable, self.mem = node, data, writable, mem
        # (pid, uid) of the opener: pyfuse3 passes no context to write(), and the commit
        # should still say which process changed the file.
        self.who = who


class MemfsOperations(pyfuse3.Operations):
    # No writeback cache: with it the kernel keeps its own size and mtime for regular files
    # and never sends the mtime of a write once the file is closed, so the stored mtime
    # would drift from what stat showed, and a size changed behind the kernel (undo, a
    # backing-disk ingest) would be ignored. Reads are still cached (keep_cache).
    enable_writeback_cache = False
    supports_dot_lookup = True

    def __init__(self, ws: Workspace, extra_virtual: dict | None = None) -> None:
        super().__init__()
        self.ws = ws
        extra = dict(extra_virtual or {})
        extra[b"memory"] = lambda: self.mem.top
        extra[b"conflicts"] = lambda: self.virtual.path_dir(
            lambda: ws.backing.conflict_files() if ws.backing is not None else {})
        self.virtual = VirtualTree(ws, ws.store.root, extra)
        self.mem = MemoryView(
            open_memory(ws.store.root),
            lambda: [n.decode("utf-8", "surrogateescape") for n in ws.children(ws.root)],
            self.virtual._id,
        )
        self.lookups: dict[int, int] = {}
        # Requests answered, by operation: `memfs status --requests` and scripts/bench read it
        # (one dict increment per request; the loop is its only writer).
        self.requests: collections.Counter[str] = collections.Counter()
        self.handles: dict[int, Handle] = {}
        self._next_fh = 1
        self._dir_snapshots: dict[int, list[tuple[bytes, object]]] = {}
        self._pending_inval: list[tuple[list[tuple[int, bytes]], list[int]]] = []
        ws.invalidate = self._queue_invalidation

    # -- helpers -----------------------------------------------------------------
    def _node(self, ino: int) -> Node | VDir | VFile | MemDir | MemFile:
        if ino in self.virtual.nodes:
            return self.virtual.nodes[ino]
        if ino in self.mem.nodes:
            return self.mem.nodes[ino]
        return self.ws.get(ino)

    def _wnode(self, ino: int) -> Node:
        node = self._node(ino)
        if isinstance(node, (MemDir, MemFile)):
            raise pyfuse3.FUSEError(errno.EPERM)
        if not isinstance(node, Node):
            raise pyfuse3.FUSEError(errno.EROFS)
        return node

    def _attr(self, node: Node | VDir | VFile) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.entry_timeout = CACHE_TIMEOUT
        a.attr_timeout = CACHE_TIMEOUT
        a.st_blksize = BLKSIZE
        if isinstance(node, Node):
            a.st_ino = node.id
            a.st_mode = node.st_mode()
            if node.readonly:
                a.st_mode &= ~0o222
            # Exact link counts: a file's names (0 once unlinked but still open), a directory's
            # 2 + subdirectories (0 once removed), as ext4 says.
            a.st_nlink = self.ws.dir_nlink(node) if node.kind == DIR else node.nlink
            a.st_rdev = node.rdev
            if node.readonly:  # views of branches move with the branch head: never cached;
                # a past commit's never changes
                a.entry_timeout = a.attr_timeout = HISTORY_TIMEOUT if \
                    self.ws.immutable_view(node) else 0
            a.st_uid, a.st_gid = node.uid, node.gid
            a.st_size = node.size()
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = node.atime_ns, node.mtime_ns, node.ctime_ns
        else:
            a.st_ino = node.id
            a.entry_timeout, a.attr_timeout = getattr(node, "timeouts", (0, 0))
            if isinstance(node, (MemDir, MemFile)):
                a.st_mode = self.mem.mode(node)
                if isinstance(node, MemFile):
                    a.st_size = len(self.mem.content(node))
            elif isinstance(node, VDir):
                a.st_mode = stat.S_IFDIR | 0o555
            else:
                a.st_mode = stat.S_IFREG | 0o444
                a.st_size = len(node.render())
            a.st_nlink = 1
            a.st_uid, a.st_gid = os.getuid(), os.getgid()
            when = getattr(node, "mtime", None)  # history views: their commit's time
            mtime = when() if when is not None else None
            if mtime is None:
                mtime = self.ws.store.root.stat().st_mtime_ns
            a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime
        if isinstance(node, Node) and node.kind == FILE:
            a.st_blocks = (self.ws.stored_bytes(node) + 511) // 512
        else:
            a.st_blocks = (a.st_size + 511) // 512
        return a

    def _counted(self, node) -> pyfuse3.EntryAttributes:
        attr = self._attr(node)
        self.lookups[attr.st_ino] = self.lookups.get(attr.st_ino, 0) + 1
        return attr

    def _vlookup(self, vdir: VDir, name: bytes):
        cached = vdir.cache.get(name)
        if cached is not None and not isinstance(cached, Node):
            if name in (vdir.listing() if vdir is not self.virtual.top else [name]):
                return cached
        found = vdir.lookup(name)
        if found is None:
            vdir.cache.pop(name, None)
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not isinstance(found, Node):  # a view is looked up each time (and may be forgotten)
            vdir.cache[name] = found
        return found

    def _queue_invalidation(self, entries: list[tuple[int, bytes]], inodes: list[int]) -> None:
        self._pending_inval.append((entries, inodes))

    async def drain_invalidations(self) -> None:
        """Tell the kernel to forget what changed behind it (from a thread: see NOTES)."""
        while self._pending_inval:
            entries, inodes = self._pending_inval.pop(0)
            known = [i for i in inodes if self.lookups.get(i)]
            known_entries = [(p, n) for p, n in entries if self.lookups.get(p) or p == ROOT_ID]
            await trio.to_thread.run_sync(_invalidate, known_entries, known)

    async def _on_access(self, node: Node, wait: bool, name: bytes | None = None) -> None:
        """Backed mounts: observe the scope first (rate-limited in backing.on_access). Inside
        a lookup the kernel holds the parent's lock, so invalidating names under it must not
        be awaited there: the drain then runs as its own task."""
        if await self.ws.backing.on_access(node, name):
            if wait:
                await self.drain_invalidations()
            else:
                trio.lowlevel.spawn_system_task(self._drain_quietly)

    async def _observe_at_open(self, node: Node) -> None:
        """Backed mounts: an open observes its file first (one contained stat against the
        fingerprint cache, rate-limited in backing.on_access), because the kernel keeps the name
        and attributes and sends no lookup. A disk change the rule takes replaces the file by a
        new node (new inode); the kernel resolved the path to the old one before this open, so
        the open answers ESTALE and the kernel walks the path once more, revalidating every name
        (LOOKUP_REVAL), and opens the new inode (or finds the name gone). A descriptor opened
        before for reading keeps the old bytes, as with a file replaced by rename on a local
        filesystem; one open for writing keeps the node in place (Backing.held_writers)."""
        if node.parent is None:
            return  # already unlinked (an open through /proc/PID/fd): no path to observe
        if not await self.ws.backing.on_access(node):
            return
        trio.lowlevel.spawn_system_task(self._drain_quietly)
        if node.parent is None:
            raise pyfuse3.FUSEError(errno.ESTALE)

    async def _drain_quietly(self) -> None:
        """A drain on its own (system) task: an error is logged, never ends the mount."""
        try:
            await self.drain_invalidations()
        except Exception:  # noqa: BLE001
            log.exception("invalidation after an on-access pass failed")

    def _disk_only(self, parent: Node, name: bytes) -> bool:
        child = self.ws.children(parent).get(name) if parent.kind == DIR else None
        return child is not None and child.id in self.ws.disk_only

    def _ctx(self, ctx) -> None:
        self.ws.note_process(ctx.pid, ctx.uid)

    async def _enter(self, ctx) -> None:
        """Before a request that may change the tree: its operation, and a group commit
        closed first if another operation's changes wait in it (Workspace.enter)."""
        await self.ws.enter(ctx.pid, ctx.uid)

    # -- lookups and attributes -------------------------------------------------------
    @_guard
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._node(parent_inode)
        if isinstance(parent, VDir):
            return self._counted(self._vlookup(parent, name))
        if isinstance(parent, MemDir):
            return self._counted(self.mem.lookup(parent, name))
        if isinstance(parent, (VFile, MemFile)):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if parent.id == ROOT_ID and name == CONTROL_NAME:
            return self._counted(self.virtual.top)
        if parent.id != ROOT_ID and self.ws.backing is not None:
            await self._on_access(parent, wait=False, name=name)
        return self._counted(self.ws.lookup(parent, name))

    async def forget(self, inode_list):
        # pyfuse3 awaits forget with no error handling: anything raised here, even a
        # FUSEError, would end pyfuse3.main(). So it is not _guard-ed; it logs and goes on.
        self.requests["forget"] += 1
        try:
            self._forget(inode_list)
        except Exception:
            log.exception("forget%r failed", inode_list[:4])

    def _forget(self, inode_list) -> None:
        for ino, n in inode_list:
            left = self.lookups.get(ino, 0) - n
            if left > 0:
                self.lookups[ino] = left
                continue
            self.lookups.pop(ino, None)
            if ino not in self.virtual.nodes and ino not in self.mem.nodes and not any(
                h.node is not None and h.node.id == ino for h in self.handles.values()
            ):
                self.ws.forget(ino)

    @_guard
    async def getattr(self, inode, ctx=None):
        return self._attr(self._node(inode))

    @_guard
    async def setattr(self, inode, attr, fields, fh, ctx):
        mem = self._node(inode)
        if isinstance(mem, MemFile):
            if fields.update_size:
                self.mem.truncate(mem, attr.st_size)
            return self._attr(mem)
        await self._enter(ctx)
        node = self._wnode(inode)
        self._ctx(ctx)
        self.ws.setattr(
            node,
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            size=attr.st_size if fields.update_size else None,
        )
        return self._attr(node)

    @_guard
    async def readlink(self, inode, ctx):
        node = self._node(inode)
        if not isinstance(node, Node) or node.kind != LINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.target

    # -- namespace changes -----------------------------------------------------------
    def _new(self, parent_inode, name, kind, mode, ctx, target=b"", rdev=0) -> Node:
        parent = self._wnode(parent_inode)
        self._ctx(ctx)
        if parent.id == ROOT_ID and name == CONTROL_NAME:
            raise pyfuse3.FUSEError(errno.EEXIST)
        mode = mode & ~ctx.umask & 0o7777
        gid = ctx.gid
        if parent.mode & stat.S_ISGID:  # BSD group semantics, as ext4 does
            gid = parent.gid
            if kind == DIR:
                mode |= stat.S_ISGID
        node = self.ws.create(parent, name, kind, mode, ctx.uid, gid, target, rdev)
        if self.ws.backing is not None and kind == FILE:
            self.ws.backing.note_created(node, node.path())
        return node

    @_guard
    async def mkdir(self, parent_inode, name, mode, ctx):
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, DIR, mode, ctx))

    @_guard
    async def symlink(self, parent_inode, name, target, ctx):
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, LINK, 0o777, ctx, target))

    @_guard
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        """Regular files, FIFOs, sockets (bind) and devices: memfs keeps them; the kernel
        checks CAP_MKNOD before asking and opens FIFOs and devices itself."""
        kind = KIND_OF_MODE.get(stat.S_IFMT(mode))
        if kind is None or kind in (DIR, LINK):
            raise pyfuse3.FUSEError(errno.EINVAL)
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, kind, mode, ctx,
                                       rdev=rdev if kind in (CHR, BLK) else 0))

    @_guard
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent = self._node(parent_inode)
        if isinstance(parent, MemDir):
            f = self.mem.create(parent, name)
            fh = self._open_handle(Handle(None, writable=True, mem=f))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), self._counted(f)
        await self._enter(ctx)
        node = self._new(parent_inode, name, FILE, mode, ctx)
        fh = self._open_handle(Handle(node, writable=True, who=(ctx.pid, ctx.uid)))
        if self.ws.backing is not None:
            self.ws.backing.held_writers[node.id] += 1  # released like any writable handle
        return pyfuse3.FileInfo(fh=fh, keep_cache=True), self._counted(node)

    @_guard
    async def link(self, inode, new_parent_inode, new_name, ctx):
        node = self._node(inode)
        if not isinstance(node, Node):
            raise pyfuse3.FUSEError(errno.EXDEV)  # .memfs/ files are generated, not stored
        await self._enter(ctx)
        parent = self._wnode(new_parent_inode)
        self._ctx(ctx)
        if parent.id == ROOT_ID and new_name == CONTROL_NAME:
            raise pyfuse3.FUSEError(errno.EEXIST)
        self.ws.link(node, parent, new_name)
        if self.ws.backing is not None and node.kind == FILE:
            self.ws.backing.note_created(node, parent.path() + b"/" + new_name)
        return self._counted(node)

    @_guard
    async def unlink(self, parent_inode, name, ctx):
        mem = self._node(parent_inode)
        if isinstance(mem, MemDir):
            await self.mem.unlink(mem, name)
            return
        await self._enter(ctx)
        parent = self._wnode(parent_inode)
        self._ctx(ctx)
        if self.ws.backing is None:
            self.ws.unlink(parent, name)
            return
        if self._disk_only(parent, name):
            raise pyfuse3.FUSEError(errno.EROFS)  # disk-only: shown from disk, read-only
        path = parent.path() + b"/" + name
        self.ws.backing.note_removed(self.ws.unlink(parent, name), path)

    @_guard
    async def rmdir(self, parent_inode, name, ctx):
        await self._enter(ctx)
        parent = self._wnode(parent_inode)
        self._ctx(ctx)
        if parent.id == ROOT_ID and name == CONTROL_NAME:
            raise pyfuse3.FUSEError(errno.EBUSY)
        self.ws.rmdir(parent, name)

    @_guard
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        mo, mn = self._node(parent_inode_old), self._node(parent_inode_new)
        if isinstance(mo, MemDir) and isinstance(mn, MemDir):
            if flags:
                raise pyfuse3.FUSEError(errno.EINVAL)
            await self.mem.rename(mo, name_old, mn, name_new)
            return
        await self._enter(ctx)
        old, new = self._wnode(parent_inode_old), self._wnode(parent_inode_new)
        self._ctx(ctx)
        if CONTROL_NAME in (name_old, name_new) and ROOT_ID in (old.id, new.id):
            raise pyfuse3.FUSEError(errno.EBUSY)
        backing = self.ws.backing
        if backing is None:
            self.ws.rename(old, name_old, new, name_new, flags)
            return
        if self._disk_only(old, name_old) or self._disk_only(new, name_new):
            raise pyfuse3.FUSEError(errno.EROFS)
        old_path, new_path = old.path() + b"/" + name_old, new.path() + b"/" + name_new
        self.ws.rename(old, name_old, new, name_new, flags)
        moved = self.ws.lookup(new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            backing.note_created(self.ws.lookup(old, name_old), old_path)
        else:
            backing.note_removed(moved, old_path)
        backing.note_created(moved, new_path)

    # -- files ------------------------------------------------------------------------
    def _open_handle(self, h: Handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = h
        return fh

    @_guard
    async def open(self, inode, flags, ctx):
        node = self._node(inode)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
        if isinstance(node, MemFile):
            if writing:
                self.mem.open_for_write(node, bool(flags & os.O_TRUNC))
            fh = self._open_handle(Handle(None, writable=bool(writing), mem=node))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if isinstance(node, VFile):
            if writing:
                raise pyfuse3.FUSEError(errno.EROFS)
            fh = self._open_handle(Handle(None, node.render()))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if isinstance(node, (VDir, MemDir)):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if node.kind == DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if node.kind == FILE and self.ws.backing is not None:
            await self._observe_at_open(node)
        if writing and node.readonly:
            raise pyfuse3.FUSEError(errno.EROFS)
        if flags & os.O_TRUNC:  # libfuse asks for atomic O_TRUNC: ours to do (mtime too)
            await self._enter(ctx)
            self.ws.truncate(node, 0)
        fh = self._open_handle(Handle(node, writable=bool(writing), who=(ctx.pid, ctx.uid)))
        if writing and self.ws.backing is not None:
            self.ws.backing.held_writers[node.id] += 1  # a pass leaves this node in place
        # A disk-only file is read from disk, which changes without memfs (a same-size rewrite
        # with its mtime kept leaves the same node): the kernel drops its pages at each open.
        return pyfuse3.FileInfo(fh=fh, keep_cache=node.id not in self.ws.disk_only)

    @_guard
    async def read(self, fh, off, size):
        h = self.handles[fh]
        if h.mem is not None:
            return self.mem.content(h.mem)[off:off + size]
        if h.node is None:
            return h.data[off:off + size]
        if h.node.id in self.ws.disk_only:
            return await self.ws.backing.read_disk(h.node, off, size)
        return self.ws.read(h.node, off, size)

    @_guard
    async def write(self, fh, off, buf):
        h = self.handles[fh]
        if h.mem is not None:
            return self.mem.write(h.mem, off, buf)
        if h.node is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        if self.ws.over_dirty_limit():
            await self.ws.commit()
        if h.who is not None:
            await self.ws.enter(*h.who)
        return self.ws.write(h.node, off, buf)

    @_guard
    async def flush(self, fh):
        h = self.handles.get(fh)
        if h is not None and h.mem is not None:
            await self.mem.flush(h.mem)

    @_guard
    async def release(self, fh):
        h = self.handles.pop(fh, None)
        if h is not None and h.mem is not None and not any(
                o.mem is h.mem for o in self.handles.values()):
            self.mem.released(h.mem)
        if h is not None and h.node is not None and h.writable and self.ws.backing is not None:
            self.ws.backing.release_writer(h.node)
        if h is not None and h.node is not None and h.node.parent is None \
                and not self.lookups.get(h.node.id):
            self.ws.forget(h.node.id)

    @_guard
    async def fsync(self, fh, datasync):
        await self._sync()

    async def _sync(self) -> None:
        try:
            await self.ws.sync()
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception as exc:
            log.error("fsync could not commit: %s", exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    # -- directories ------------------------------------------------------------------
    @_guard
    async def opendir(self, inode, ctx):
        node = self._node(inode)
        if isinstance(node, (VFile, MemFile)) or (isinstance(node, Node) and node.kind != DIR):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if isinstance(node, Node) and node.id != ROOT_ID and self.ws.backing is not None:
            await self._on_access(node, wait=True)
        fh = self._open_handle(Handle(node if isinstance(node, Node) else None))
        self._dir_snapshots[fh] = []
        self.handles[fh].data = inode  # type: ignore[assignment]
        return fh

    def _listing(self, ino: int) -> list[tuple[bytes, object]]:
        node = self._node(ino)
        if isinstance(node, MemDir):
            return self.mem.listing(node)
        if isinstance(node, VDir):
            out = []
            for name in node.listing():
                try:
                    out.append((name, self._vlookup(node, name)))
                except pyfuse3.FUSEError:
                    continue
            return out
        return sorted(self.ws.children(node).items())

    @_guard
    async def readdir(self, fh, start_id, token):
        # Offsets 1 and 2 are "." and ".."; then offsets index a snapshot taken when the
        # listing starts, so they stay stable while the directory changes. A rewind
        # (offset 0) takes a fresh snapshot.
        ino = self.handles[fh].data
        if start_id == 0 or not self._dir_snapshots.get(fh):
            self._dir_snapshots[fh] = self._listing(ino)  # type: ignore[arg-type]
        snap = self._dir_snapshots[fh]
        dir_node = self._node(ino)  # type: ignore[arg-type]
        if start_id < 1 and not pyfuse3.readdir_reply(token, b".", self._attr(dir_node), 1):
            return
        if start_id < 2:
            parent = dir_node.parent if isinstance(dir_node, Node) and dir_node.parent else dir_node
            if not pyfuse3.readdir_reply(token, b"..", self._attr(parent), 2):
                return
        # The kernel takes no reference for "." and "..", so they are not counted.
        for i in range(max(0, start_id - 2), len(snap)):
            name, node = snap[i]
            if isinstance(node, Node) and isinstance(dir_node, Node) and \
                    self.ws.children(dir_node).get(name) is not node:
                continue  # removed since the snapshot
            if not pyfuse3.readdir_reply(token, name, self._attr(node), i + 3):
                return
            self.lookups[node.id] = self.lookups.get(node.id, 0) + 1

    @_guard
    async def releasedir(self, fh):
        self._dir_snapshots.pop(fh, None)
        self.handles.pop(fh, None)

    @_guard
    async def fsyncdir(self, fh, datasync):
        await self._sync()

    # -- filesystem -------------------------------------------------------------------
    @_guard
    async def statfs(self, ctx):
        st = self.ws.store.stat_space()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        scale = st.f_frsize / 4096
        s.f_blocks = int(st.f_blocks * scale)
        free = self.ws.free_bytes() // 4096
        s.f_bfree = s.f_bavail = max(0, min(int(st.f_bavail * scale), free))
        s.f_files = max(st.f_files, 1 << 20)
        s.f_ffree = s.f_favail = max(st.f_ffree, 1 << 19)
        s.f_namemax = 255
        return s

    # -- extended attributes ------------------------------------------------------------
    @_guard
    async def setxattr(self, inode, name, value, ctx):
        node = self._wnode(inode)
        if not name.startswith(b"user."):
            raise pyfuse3.FUSEError(errno.ENOTSUP)
        if name.startswith(b"user.memfs."):
            raise pyfuse3.FUSEError(errno.EPERM)
        await self._enter(ctx)
        self.ws.set_xattr(node, name, value)

    @_guard
    async def getxattr(self, inode, name, ctx):
        node = self._node(inode)
        if name in STATE_XATTRS and isinstance(node, Node) and self.ws.backing is not None:
            state, ran = await self.ws.backing.state_now(node)  # observes the path first
            if ran:
                trio.lowlevel.spawn_system_task(self._drain_quietly)
            value = None if state is None else state[name == STATE_XATTRS[1]]
            if value is None:
                raise pyfuse3.FUSEError(errno.ENODATA)
            return value.encode()
        if not isinstance(node, Node) or name not in node.xattrs:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return node.xattrs[name]

    @_guard
    async def listxattr(self, inode, ctx):
        node = self._node(inode)
        if not isinstance(node, Node):
            return []
        # The state xattrs are answered by name only, never listed: `cp -a` and `rsync -X`
        # copy every listed xattr, and would stamp a user's own files with memfs's states.
        return list(node.xattrs)

    @_guard
    async def removexattr(self, inode, name, ctx):
        await self._enter(ctx)
        node = self._wnode(inode)
        self.ws.remove_xattr(node, name)

    @_guard
    async def access(self, inode, mode, ctx):
        return True

    def destroy(self) -> None:
        self.lookups.clear()
        self.handles.clear()


def _invalidate(entries: list[tuple[int, bytes]], inodes: list[int]) -> None:
    for parent, name in entries:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except (FileNotFoundError, OSError):
            pass
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino)
        except (FileNotFoundError, OSError):
            pass


__all__ = ["MemfsOperations", "FILE"]
