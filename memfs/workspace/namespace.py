"""Namespace changes of the live tree: create, link, unlink, rmdir, rename (POSIX's rules).

Each runs on the trio loop with no await, so it is atomic with respect to every other request;
every refusal is raised before the first change (`ws._touch`), and every change first settles
a pending adoption of what it changes (memfs.backing, through the workspace's hooks). A linked
inode keeps every loaded name in `links`; a file's link count is exact.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from memfs.store.trees import DIR, FILE, new_inode_key
from memfs.workspace import loading
from memfs.workspace.nodes import ROOT_ID, Node, fail, now_ns

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

NAME_MAX = 255
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def create(ws: Workspace, d: Node, name: bytes, kind: str, mode: int, uid: int, gid: int,
           target: bytes = b"", rdev: int = 0) -> Node:
    ws._writable(d)
    _check_name(name)
    ws._live_dir(d)
    kids = ws.children(d)
    if name in kids:
        raise fail(errno.EEXIST)
    ws._settle_first(d, name)
    if d.id == ROOT_ID and kind != DIR:
        raise fail(errno.EPERM, "only directories (store mounts) live at the mount root")
    node = loading.new_node(ws, kind, mode & 0o7777, uid, gid, d.space, (d, name))
    node.target = target
    node.rdev = rdev
    _attach(ws, d, name, node)
    d.mtime_ns = d.ctime_ns = node.mtime_ns
    ws._touch(node)
    return node


def link(ws: Workspace, node: Node, d: Node, name: bytes) -> Node:
    """link(2): one more name for `node`. Its first second name moves it into the inode
    table (its old name's row becomes a hard-link row)."""
    ws._writable(d)
    _check_name(name)
    ws._live_dir(d)
    if node.kind == DIR:
        raise fail(errno.EPERM, "hard links to directories are not allowed")
    if node.readonly or node.id in ws.disk_only or node.space is not d.space:
        raise fail(errno.EXDEV, "only files of the live tree can be linked")
    if not ws._alive(node):
        raise fail(errno.ENOENT)
    kids = ws.children(d)
    if name in kids:
        raise fail(errno.EEXIST)
    if d.id == ROOT_ID:
        raise fail(errno.EPERM, "only directories (store mounts) live at the mount root")
    ws._settle_first(d, name)
    if node.ikey is None:
        assert node.parent is not None and node.space is not None  # alive, in the tree
        node.ikey, node.links, node.row = new_inode_key(), {(node.parent, node.name)}, None
        node.space.nodes[node.ikey] = node
        ws._touch(node.parent)  # its row there becomes a hard-link row
    node.nlink = (node.nlink or 0) + 1  # a file's count (directories are not linked)
    _attach(ws, d, name, node)
    d.mtime_ns = d.ctime_ns = node.ctime_ns = now_ns()
    ws._touch(d)
    ws._touch(node)
    return node


def _attach(ws: Workspace, d: Node, name: bytes, node: Node) -> None:
    ws.children(d)[name] = node
    node.parent, node.name = d, name
    if node.links is not None:
        node.links.add((d, name))
    if node.kind == DIR and d.nlink is not None:
        d.nlink += 1


def _detach(ws: Workspace, d: Node, name: bytes, node: Node) -> None:
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


def unlink(ws: Workspace, d: Node, name: bytes) -> Node:
    ws._writable(d)
    node = ws.lookup(d, name)
    if node.kind == DIR:
        raise fail(errno.EISDIR)
    _remove(ws, d, name, node)
    return node


def rmdir(ws: Workspace, d: Node, name: bytes) -> Node:
    ws._writable(d)
    if name in (b".", b".."):
        raise fail(errno.EINVAL)
    node = ws.lookup(d, name)
    if node.kind != DIR:
        raise fail(errno.ENOTDIR)
    if ws.children(node):
        raise fail(errno.ENOTEMPTY)
    _remove(ws, d, name, node)
    node.nlink = 0  # an open handle on it sees it gone, as on Linux
    return node


def _remove(ws: Workspace, d: Node, name: bytes, node: Node) -> None:
    ws._settle_first(d, name)
    ws._touch(d)
    ws.health.poke()
    if (ws.room.refused or ws.health.full) and ws.lifecycle is not None:
        ws.lifecycle.poke(delay=ws.commit_interval + 0.5)  # once the removal is in
    held = _held_path(ws, d, name, node)
    _detach(ws, d, name, node)
    d.mtime_ns = d.ctime_ns = node.ctime_ns = now_ns()
    _unname(ws, node)
    _note_unlinked(ws, node, held)


def _held_path(ws: Workspace, d: Node, name: bytes, node: Node) -> bytes | None:
    """Before a name goes: its path, if its file is open for writing (an undo that puts a
    file back there cuts that writer off: memfs.workspace.cutoff)."""
    if node.kind != FILE or not ws.writers.holds(node):
        return None
    top = d.path()
    return top + b"/" + name if top else name


def _note_unlinked(ws: Workspace, node: Node, held: bytes | None) -> None:
    if held is not None and not ws._attached(node):
        ws.writers.unlinked(node, held)


def _unname(ws: Workspace, node: Node) -> None:
    """One name fewer for a file (unlink, or replaced by rename)."""
    if node.kind != DIR:
        node.nlink = (node.nlink or 0) - 1  # a file's (int) count
        if node.ikey is not None:
            ws._touch(node)


def rename(ws: Workspace, od: Node, oname: bytes, nd: Node, nname: bytes, flags: int = 0) -> Node | None:
    """POSIX rename; returns the node it replaced (now detached), if any."""
    ws._writable(od)
    ws._writable(nd)
    _check_name(nname)
    ws._live_dir(nd)
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == (
            RENAME_NOREPLACE | RENAME_EXCHANGE):
        raise fail(errno.EINVAL)  # RENAME_WHITEOUT and unknown flags: not ours to fake
    src = ws.lookup(od, oname)
    dst = ws.children(nd).get(nname)
    ws._settle_first(od, oname)
    ws._settle_first(nd, nname)
    if nd.id == ROOT_ID and src.kind != DIR:
        raise fail(errno.EPERM)
    if src.kind == DIR and _is_ancestor(src, nd):
        raise fail(errno.EINVAL)
    if flags & RENAME_EXCHANGE:
        if dst is None:
            raise fail(errno.ENOENT)
        if dst.kind == DIR and _is_ancestor(dst, od):
            raise fail(errno.EINVAL)
        if od.id == ROOT_ID and dst.kind != DIR:
            raise fail(errno.EPERM)
        ws._touch(od)
        ws._touch(nd)
        _detach(ws, od, oname, src)
        _detach(ws, nd, nname, dst)
        _attach(ws, nd, nname, src)
        _attach(ws, od, oname, dst)
        od.mtime_ns = od.ctime_ns = nd.mtime_ns = nd.ctime_ns = now = now_ns()
        src.ctime_ns = dst.ctime_ns = now
        ws._touch(src)
        ws._touch(dst)
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
        if dst.kind == DIR and ws.children(dst):
            raise fail(errno.ENOTEMPTY)
    now = now_ns()
    ws._touch(od)
    _detach(ws, od, oname, src)
    if dst is not None:
        held = _held_path(ws, nd, nname, dst)
        _detach(ws, nd, nname, dst)
        dst.ctime_ns = now
        if dst.kind == DIR:
            dst.nlink = 0
        _unname(ws, dst)
        _note_unlinked(ws, dst, held)
    _attach(ws, nd, nname, src)
    src.ctime_ns = now
    od.mtime_ns = od.ctime_ns = nd.mtime_ns = nd.ctime_ns = now
    ws._touch(src)
    return dst


def _is_ancestor(a: Node, b: Node) -> bool:
    node: Node | None = b
    while node is not None:
        if node is a:
            return True
        node = node.parent
    return False


def _check_name(name: bytes) -> None:
    if len(name) > NAME_MAX:
        raise fail(errno.ENAMETOOLONG)
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise fail(errno.EINVAL)
