"""What the kernel is told about a node: its attributes and how long it may cache them, a
missing name's negative entry, and statfs's figures.

Translation only, from the workspace's nodes and the generated `.memfs` views; no state of its
own. Loop thread only (MemfsOperations calls it from its handlers).
"""

from __future__ import annotations

import os
import stat

import pyfuse3

from memfs.fs.memory_view import MemDir, MemFile, MemoryView
from memfs.fs.virtual import VDir, VFile
from memfs.store.trees import DIR, FILE, LINK, name_to_str
from memfs.workspace.nodes import ROOT_ID, Node
from memfs.workspace.workspace import Workspace

CACHE_TIMEOUT = 300.0  # safe: every change made behind the kernel's back is invalidated
HISTORY_TIMEOUT = 60.0  # a past commit's tree never changes (garbage collection aside)
BLKSIZE = 128 * 1024


def entry_attributes(ws: Workspace, mem: MemoryView,
                     node: Node | VDir | VFile | MemDir | MemFile) -> pyfuse3.EntryAttributes:
    """The attributes of a live or history node, or of a generated `.memfs` one."""
    a = pyfuse3.EntryAttributes()
    a.entry_timeout = CACHE_TIMEOUT
    a.attr_timeout = CACHE_TIMEOUT
    a.st_blksize = BLKSIZE
    a.st_ino = node.id
    if isinstance(node, Node):
        _node_attributes(ws, node, a)
    else:
        _generated_attributes(ws, mem, node, a)
    if isinstance(node, Node) and node.kind == FILE:
        a.st_blocks = ws.allocated_bytes(node) // 512
    elif isinstance(node, Node) and node.kind == LINK:
        a.st_blocks = 0  # its target is kept with the entry, as ext4's and tmpfs's short links
    else:
        a.st_blocks = (a.st_size + 511) // 512
    return a


def _node_attributes(ws: Workspace, node: Node, a: pyfuse3.EntryAttributes) -> None:
    # A view of history shows each entry's own mode, as a snapshot directory does: it is
    # read-only by refusing every change (EROFS), so a copy back keeps the modes.
    a.st_mode = node.st_mode()
    # Exact link counts: a file's names (0 once unlinked but still open), a directory's
    # 2 + subdirectories (0 once removed), as ext4 says.
    a.st_nlink = ws.dir_nlink(node) if node.kind == DIR else (node.nlink or 0)
    a.st_rdev = node.rdev
    if node.readonly:  # views of branches move with the branch head: never cached;
        # a past commit's never changes
        a.entry_timeout = a.attr_timeout = HISTORY_TIMEOUT if ws.immutable_view(node) else 0
    a.st_uid, a.st_gid = node.uid, node.gid
    a.st_size = node.size()
    a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = node.atime_ns, node.mtime_ns, node.ctime_ns


def _generated_attributes(ws: Workspace, mem: MemoryView, node: VDir | VFile | MemDir | MemFile,
                          a: pyfuse3.EntryAttributes) -> None:
    a.entry_timeout, a.attr_timeout = getattr(node, "timeouts", (0, 0))
    if isinstance(node, (MemDir, MemFile)):
        a.st_mode = mem.mode(node)
        if isinstance(node, MemFile):
            a.st_size = len(mem.content(node))
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
        mtime = ws.store.root.stat().st_mtime_ns
    a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime


def negative(timeout: float) -> pyfuse3.EntryAttributes:
    """A lookup's answer that the name does not exist, which the kernel caches for `timeout`
    (an ENOENT error is never cached): inode 0, holding no reference to forget."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = 0
    a.entry_timeout = timeout
    a.attr_timeout = 0
    return a


def negative_timeout(ws: Workspace, parent: Node) -> float:
    """How long the kernel may remember that a name is missing in `parent` (0: not at
    all). A live directory's names only appear through the kernel (which replaces the
    negative entry itself) or from behind it, by an undo, a restore or a branch switch,
    which invalidate every name they add (memfs.workspace.replace). A directory of a bound
    mount is not cached: a lookup of a missing name is what observes a file just made on
    disk. A past commit's view never changes; a branch's view moves with its head."""
    if parent.readonly:
        return HISTORY_TIMEOUT if ws.immutable_view(parent) else 0.0
    bindings = ws.backing.bindings
    if bindings and parent.id != ROOT_ID:
        top = parent
        while top.parent is not None and top.parent.id != ROOT_ID:
            top = top.parent
        if top.parent is None or name_to_str(top.name) in bindings:
            return 0.0
    return CACHE_TIMEOUT


def statvfs(ws: Workspace) -> pyfuse3.StatvfsData:
    """The store filesystem's own size and use (df on the mount and on the store's disk
    agree), with what waits in memory counted as used and the headroom commits need
    (memfs.store.space) kept out of what is available. Inode counts are the store
    filesystem's: a file here takes none of them, so they bound nothing of memfs's."""
    sp = ws.space()
    s = pyfuse3.StatvfsData()
    s.f_bsize = s.f_frsize = 4096
    s.f_blocks = sp.size // 4096
    s.f_bfree = max(0, sp.free - ws.pending_bytes) // 4096
    s.f_bavail = min(s.f_bfree, ws.free_bytes() // 4096)
    s.f_files, s.f_ffree, s.f_favail = sp.files, sp.ffree, sp.favail
    s.f_namemax = 255
    return s
