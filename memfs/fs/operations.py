"""pyfuse3 Operations over the workspace: thin translation, no policy of its own.

Every handler runs through `guard` or `reader` (memfs.fs.handlers): a WorkspaceError becomes
its errno, anything else is logged with the operation and answered EIO. Attributes and statfs
are memfs.fs.attrs, the open-file table memfs.fs.handles, telling the kernel what changed
behind it memfs.fs.invalidation, a bound mount's observe-on-access memfs.fs.access. Its own state (lookup counts, request counts, handles) is
the loop's only.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
from collections.abc import Callable
from typing import Any

import pyfuse3
import trio

from memfs.fs.access import BackingAccess
from memfs.fs.attrs import entry_attributes, negative, negative_timeout, statvfs
from memfs.fs.handlers import fuse_error, guard, reader
from memfs.fs.handles import Handle, Handles
from memfs.fs.invalidation import Invalidations
from memfs.fs.memory_view import MemDir, MemFile, MemoryView
from memfs.fs.view_release import ViewEntries
from memfs.fs.virtual import VDir, VFile, VirtualTree
from memfs.fs.xattrs import check_fits, check_settable, user_value
from memfs.workspace.agent_memory import open_memory
from memfs.workspace.nodes import KIND_OF_MODE, Node, WorkspaceError
from memfs.workspace.pinning import views_published
from memfs.workspace.replace import stale
from memfs.workspace.workspace import BLK, CHR, DIR, FILE, LINK, ROOT_ID, Workspace

log = logging.getLogger("memfs.fs")

CONTROL_NAME = b".memfs"


class MemfsOperations(pyfuse3.Operations):
    # No writeback cache: with it the kernel keeps its own size and mtime for regular files
    # and never sends the mtime of a write once the file is closed, so the stored mtime
    # would drift from what stat showed, and a size changed behind the kernel (undo, a
    # backing-disk ingest) would be ignored. Reads are still cached (keep_cache).
    enable_writeback_cache = False
    supports_dot_lookup = True
    virtual: VirtualTree
    mem: MemoryView

    def __init__(self, ws: Workspace, extra_virtual: dict | None = None) -> None:
        super().__init__()
        self.ws = ws
        extra = dict(extra_virtual or {})
        extra[b"memory"] = lambda: self.mem.top
        extra[b"conflicts"] = lambda: self.virtual.path_dir(
            lambda: ws.backing.conflict_files())
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
        self.handles = Handles()
        self.invalidations = Invalidations(self.lookups)
        self.backed = BackingAccess(ws, self.invalidations)  # bound mounts' request hooks
        ws.invalidate = self.invalidations.queue
        ws.held_nodes = lambda: list(self.handles.nodes())
        ws.kernel_refs = self._referenced
        self.views = ViewEntries(ws)  # where views were shown, to release them before GC
        ws.release_views = lambda: self.views.release(self.handles.nodes)

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

    def _attr(self, node: Node | VDir | VFile | MemDir | MemFile) -> pyfuse3.EntryAttributes:
        return entry_attributes(self.ws, self.mem, node)

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

    async def drain_invalidations(self) -> None:
        """Tell the kernel to forget what changed behind it (memfs.fs.invalidation)."""
        await self.invalidations.drain()

    def _ctx(self, ctx) -> None:
        self.ws.note_process(ctx.pid, ctx.uid)

    async def _enter(self, ctx) -> None:
        """Before a request that may change the tree: its operation, a group commit closed
        first if another operation's changes wait in it, and a wait while a history
        operation holds changes off (Workspace.enter). No await between this and the
        change."""
        await self.ws.enter(ctx.pid, ctx.uid)

    # -- lookups and attributes -------------------------------------------------------
    @reader
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._node(parent_inode)
        if isinstance(parent, VDir):
            if parent.prepare_name is not None:
                await parent.prepare_name(name)
            elif parent.prepare is not None:
                await parent.prepare()
            found = self._vlookup(parent, name)
            if isinstance(found, Node) and found.id in await views_published(self.ws):
                raise pyfuse3.FUSEError(errno.ENOENT)  # its commit was dropped meanwhile
            self.views.shown(parent_inode, name, found)
            return self._counted(found)
        if isinstance(parent, MemDir):
            return self._counted(self.mem.lookup(parent, name))
        if isinstance(parent, (VFile, MemFile)):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if parent.id == ROOT_ID and name == CONTROL_NAME:
            return self._counted(self.virtual.top)
        if parent.id != ROOT_ID and self.backed.bound() is not None:
            await self.backed.on_access(parent, wait=False, name=name)
        await self.ws.warm(parent)
        try:
            node = self.ws.lookup(parent, name)
        except WorkspaceError as exc:
            if exc.errno == errno.ENOENT and (timeout := negative_timeout(self.ws, parent)):
                return negative(timeout)
            raise
        return self._counted(node)

    async def forget(self, inode_list):
        # pyfuse3 awaits forget with no error handling: anything raised here, even a
        # FUSEError, would end pyfuse3.main(). So it is not guard-ed; it logs and goes on.
        self.requests["forget"] += 1
        try:
            self._forget(inode_list)
        except Exception:
            log.exception("forget%r failed", inode_list[:4])

    def _referenced(self) -> Callable[[int], bool]:
        """Does the kernel hold this inode now (a counted lookup or an open handle)?"""
        held = {node.id for node in self.handles.nodes()}
        lookups = self.lookups

        def referenced(ino: int) -> bool:
            return ino in held or ino in lookups

        return referenced

    def _forget(self, inode_list) -> None:
        held = {node.id for node in self.handles.nodes()}
        referenced = self._referenced()
        for ino, n in inode_list:
            left = self.lookups.get(ino, 0) - n
            if left > 0:
                self.lookups[ino] = left
                continue
            self.lookups.pop(ino, None)
            if ino not in self.virtual.nodes and ino not in self.mem.nodes and ino not in held:
                self.ws.forget(ino, referenced)

    @reader
    async def getattr(self, inode, ctx=None):
        return self._attr(self._node(inode))

    @guard
    async def setattr(self, inode, attr, fields, fh, ctx):
        mem = self._node(inode)
        if isinstance(mem, MemFile):
            if fields.update_size:
                self.mem.truncate(mem, attr.st_size)
            return self._attr(mem)
        await self._enter(ctx)
        node = self._wnode(inode)
        if fields.update_size:  # ftruncate through a handle a history operation cut off
            self.ws.writers.check(fh)
            if fh is None and stale(self.ws, node):  # truncate(2) by a name the kernel cached
                raise pyfuse3.FUSEError(errno.ESTALE)
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

    @reader
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
        if kind == FILE and self.backed.bound() is not None:
            self.ws.backing.note_created(node, node.path())
        return node

    @guard
    async def mkdir(self, parent_inode, name, mode, ctx):
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, DIR, mode, ctx))

    @guard
    async def symlink(self, parent_inode, name, target, ctx):
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, LINK, 0o777, ctx, target))

    @guard
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        """Regular files, FIFOs, sockets (bind) and devices: memfs keeps them; the kernel
        checks CAP_MKNOD before asking and opens FIFOs and devices itself."""
        kind = KIND_OF_MODE.get(stat.S_IFMT(mode))
        if kind is None or kind in (DIR, LINK):
            raise pyfuse3.FUSEError(errno.EINVAL)
        await self._enter(ctx)
        return self._counted(self._new(parent_inode, name, kind, mode, ctx,
                                       rdev=rdev if kind in (CHR, BLK) else 0))

    @guard
    async def create(self, parent_inode, name, mode, flags, ctx):
        parent = self._node(parent_inode)
        if isinstance(parent, MemDir):
            f = self.mem.create(parent, name)
            fh = self.handles.open(Handle(None, writable=True, mem=f))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False), self._counted(f)
        await self._enter(ctx)
        node = self._new(parent_inode, name, FILE, mode, ctx)
        fh = self.handles.open(Handle(node, writable=True, who=(ctx.pid, ctx.uid)))
        self.ws.backing.hold_writer(node)  # released like any writable handle
        self.ws.writers.opened(fh, node, ctx.pid)  # an undo may cut it off
        return pyfuse3.FileInfo(fh=fh, keep_cache=True), self._counted(node)

    @guard
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
        if node.kind == FILE and self.backed.bound() is not None:
            self.ws.backing.note_created(node, parent.path() + b"/" + new_name)
        return self._counted(node)

    @guard
    async def unlink(self, parent_inode, name, ctx):
        mem = self._node(parent_inode)
        if isinstance(mem, MemDir):
            await self.mem.unlink(mem, name)
            return
        await self._enter(ctx)
        parent = self._wnode(parent_inode)
        self._ctx(ctx)
        if self.backed.bound() is None:
            node = self.ws.unlink(parent, name)
        else:
            if self.backed.disk_only(parent, name):
                raise pyfuse3.FUSEError(errno.EROFS)  # disk-only: shown from disk, read-only
            path = parent.path() + b"/" + name
            node = self.ws.unlink(parent, name)
            self.ws.backing.note_removed(node, path)
        if self.ws.wants_spill(node) and any(h.node is node for h in self.handles.values()):
            await self.ws.spill(node)  # still open: what it holds in memory goes to disk

    @guard
    async def rmdir(self, parent_inode, name, ctx):
        await self._enter(ctx)
        parent = self._wnode(parent_inode)
        self._ctx(ctx)
        if parent.id == ROOT_ID and name == CONTROL_NAME:
            raise pyfuse3.FUSEError(errno.EBUSY)
        self.ws.rmdir(parent, name)

    @guard
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
        backing = self.backed.bound()
        if backing is None:
            self.ws.rename(old, name_old, new, name_new, flags)
            return
        if self.backed.disk_only(old, name_old) or self.backed.disk_only(new, name_new):
            raise pyfuse3.FUSEError(errno.EROFS)
        old_path, new_path = old.path() + b"/" + name_old, new.path() + b"/" + name_new
        # What the rename replaces is removed through the mount: a symlink moved over a file
        # (`ln -sf`) left the file's path with no tombstone, so it read not-in-branch and
        # `materialize --apply-deletions` kept disk's copy of a file the workspace replaced.
        replaced = None if flags & pyfuse3.RENAME_EXCHANGE else \
            self.ws.children(new).get(name_new)
        self.ws.rename(old, name_old, new, name_new, flags)
        moved = self.ws.lookup(new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            backing.note_created(self.ws.lookup(old, name_old), old_path)
        else:
            backing.note_removed(moved, old_path)
            if replaced is not None and replaced is not moved:
                backing.note_removed(replaced, new_path)
        backing.note_created(moved, new_path)

    # -- files ------------------------------------------------------------------------
    @guard
    async def open(self, inode, flags, ctx):
        node = self._node(inode)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND)
        if isinstance(node, MemFile):
            if writing:
                self.mem.open_for_write(node, bool(flags & os.O_TRUNC))
            fh = self.handles.open(Handle(None, writable=bool(writing), mem=node))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if isinstance(node, VFile):
            if writing:
                raise pyfuse3.FUSEError(errno.EROFS)
            if node.prepare is not None:
                await node.prepare()
            fh = self.handles.open(Handle(None, node.render()))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)
        if isinstance(node, (VDir, MemDir)):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if node.kind == DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if stale(self.ws, node):  # a name the kernel cached from before an undo: it looks again
            raise pyfuse3.FUSEError(errno.ESTALE)
        if node.kind == FILE and self.backed.bound() is not None:
            await self.backed.observe_at_open(node)
        if writing and node.readonly:
            raise pyfuse3.FUSEError(errno.EROFS)
        if flags & os.O_TRUNC:  # libfuse asks for atomic O_TRUNC: ours to do (mtime too)
            await self._enter(ctx)
            self.ws.truncate(node, 0)
        fh = self.handles.open(Handle(node, writable=bool(writing), who=(ctx.pid, ctx.uid)))
        if writing:
            self.ws.backing.hold_writer(node)  # a pass leaves this node in place
            self.ws.writers.opened(fh, node, ctx.pid)  # an undo may cut it off
        # A disk-only file is read from disk, which changes without memfs (a same-size rewrite
        # with its mtime kept leaves the same node): the kernel drops its pages at each open.
        return pyfuse3.FileInfo(fh=fh, keep_cache=node.id not in self.ws.disk_only)

    @reader
    async def read(self, fh, off, size):
        h = self.handles[fh]
        if h.mem is not None:
            return self.mem.content(h.mem)[off:off + size]
        if h.node is None:
            return h.data[off:off + size]
        if h.node.id in self.ws.disk_only:
            return await self.ws.backing.read_disk(h.node, off, size)
        if h.node.id in self.ws.swept:  # its view's commit was swept (pinning): never part
            raise pyfuse3.FUSEError(errno.EIO)
        await self.ws.warm(h.node, off, size)
        return self.ws.read(h.node, off, size)

    @guard
    async def write(self, fh, off, buf):
        h = self.handles[fh]
        if h.mem is not None:
            return self.mem.write(h.mem, off, buf)
        if h.node is None:
            raise pyfuse3.FUSEError(errno.EROFS)
        self.ws.writers.check(fh)  # its file was replaced by an undo, restore or switch
        await self.ws.warm(h.node, off, len(buf), writing=True)
        if self.ws.over_dirty_limit():
            await self.ws.commit()
        since = trio.current_time()
        while True:  # changes open, and no commit in flight's bytes counted twice against it
            if h.who is not None:
                await self.ws.enter(*h.who)
            else:
                await self.ws.before_change()
            if not await self.ws.room_settled(h.node, off, len(buf), since):
                break
        self.ws.writers.check(fh)  # a history operation the wait let finish may have cut it off
        n = self.ws.write(h.node, off, buf)
        if self.ws.wants_spill(h.node):  # unlinked but open: its data goes to disk
            await self.ws.spill(h.node)
        return n

    async def flush(self, fh):
        """Every close(2) of every descriptor. A memory record's close-time refusal, and a
        writable file whose changes cannot be stored while commits fail (ENOSPC), must fail
        the writer's close, so flush cannot be ENOSYS for the mount; for a read-only handle
        it is one dict lookup, with no wrapper around it."""
        self.requests["flush"] += 1
        h = self.handles.get(fh)
        if h is None or (h.mem is None and not h.writable):
            return
        try:
            if h.mem is not None:
                await self.mem.flush(h.mem)
            elif h.node is not None:
                await self.ws.before_close(h.node)  # a write that cannot be stored fails here
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped; anything else would end the mount
            raise fuse_error("flush", (fh,), exc) from None

    @reader
    async def release(self, fh):
        h = self.handles.pop(fh, None)
        if h is not None and h.mem is not None and not any(
                o.mem is h.mem for o in self.handles.values()):
            self.mem.released(h.mem)
        if h is not None and h.node is not None and h.writable:
            self.ws.backing.release_writer(h.node)
            self.ws.writers.released(fh)
        if h is not None and h.node is not None and h.node.parent is None \
                and not self.lookups.get(h.node.id):
            self.ws.forget(h.node.id)

    @guard
    async def fsync(self, fh, datasync):
        """A handle a history operation cut off (before or while the commit ran) fails with
        ESTALE: what it would sync is not in the tree."""
        self.ws.writers.check(fh)
        await self._sync()
        self.ws.writers.check(fh)

    async def _sync(self) -> None:
        try:
            await self.ws.sync()
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception as exc:
            log.error("fsync could not commit: %s", exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    # -- directories ------------------------------------------------------------------
    @reader
    async def opendir(self, inode, ctx):
        node = self._node(inode)
        if isinstance(node, (VFile, MemFile)) or (isinstance(node, Node) and node.kind != DIR):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if isinstance(node, Node) and node.id != ROOT_ID and self.backed.bound() is not None:
            await self.backed.on_access(node, wait=True)
        if isinstance(node, Node):
            await self.ws.warm(node)
        fh = self.handles.open(Handle(node if isinstance(node, Node) else None, inode))
        self.handles.dir_snapshots[fh] = []
        return fh

    def _listing(self, ino: int) -> list[tuple[bytes, Any]]:
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
        assert isinstance(node, Node)  # readdir is asked of directories only
        return sorted(self.ws.children(node).items())

    @reader
    async def readdir(self, fh, start_id, token):
        # Offsets 1 and 2 are "." and ".."; then offsets index a snapshot taken when the
        # listing starts, so they stay stable while the directory changes. A rewind
        # (offset 0) takes a fresh snapshot.
        ino = self.handles[fh].data
        if start_id == 0 or not self.handles.dir_snapshots.get(fh):
            if isinstance(listed := self._node(ino), VDir) and listed.prepare is not None:
                await listed.prepare()
            listing = self._listing(ino)
            if isinstance(self._node(ino), VDir):  # its views published before it is seen
                gone = await views_published(self.ws)
                listing = [(n, f) for n, f in listing if not (isinstance(f, Node) and f.id in gone)]
            self.handles.dir_snapshots[fh] = listing
        snap = self.handles.dir_snapshots[fh]
        dir_node = self._node(ino)
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
            if isinstance(dir_node, VDir):
                self.views.shown(ino, name, node)

    @reader
    async def releasedir(self, fh):
        self.handles.close_dir(fh)

    @guard
    async def fsyncdir(self, fh, datasync):
        await self._sync()

    # -- filesystem -------------------------------------------------------------------
    @reader
    async def statfs(self, ctx):
        return statvfs(self.ws)

    # -- extended attributes ------------------------------------------------------------
    @guard
    async def setxattr(self, inode, name, value, ctx):
        if isinstance(self._node(inode), (MemDir, MemFile)):
            raise pyfuse3.FUSEError(errno.ENOTSUP)  # memory holds no xattrs: `sed -i` and
            # `cp -p` then skip the ACL quietly, as on a filesystem without them (EPERM warned)
        self._wnode(inode)
        check_settable(name)
        await self._enter(ctx)
        node = self._wnode(inode)  # after the wait: an undo may have replaced it
        check_fits(node.xattrs, name, value)
        self.ws.set_xattr(node, name, value)

    async def getxattr(self, inode, name, ctx):
        """The kernel asks for security.capability before every write(2) (FUSE never marks an
        inode S_NOSEC without KILLPRIV_V2, which libfuse 3.14 cannot ask for). memfs keeps only
        user.* attributes (setxattr refuses others), so any other name is answered here, first
        thing, without touching the tree."""
        self.requests["getxattr"] += 1
        if not name.startswith(b"user."):
            raise pyfuse3.FUSEError(errno.ENODATA)
        try:
            return await user_value(self.ws, self._node(inode), name, self.backed.drain_later)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped; anything else would end the mount
            raise fuse_error("getxattr", (inode, name), exc) from None

    @reader
    async def listxattr(self, inode, ctx):
        node = self._node(inode)
        if not isinstance(node, Node):
            return []
        return list(node.xattrs)  # never the state xattrs (memfs.fs.xattrs.user_value)

    @guard
    async def removexattr(self, inode, name, ctx):
        await self._enter(ctx)
        node = self._wnode(inode)
        self.ws.remove_xattr(node, name)

    @reader
    async def access(self, inode, mode, ctx):
        return True

    def destroy(self) -> None:
        self.lookups.clear()
        self.handles.clear()


__all__ = ["MemfsOperations", "FILE"]
