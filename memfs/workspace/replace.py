"""Replacing the live tree by another commit's (undo, restore, branch switch, another host's
commit followed), in one loop turn with the commit lock held: history_ops and hosts call it
through `Workspace._replace_tree` between their last commit and the head move's end.

Directories that survive keep their inode number (a shell's working directory stays valid); a
file or symlink whose committed form changed gets a new inode, and so does every hard-linked
inode (its other names may be in directories not loaded, so it is looked up afresh in the
target commit's inode table). Every changed name and inode is handed to `ws.invalidate`.

`replace_and_cut` is that swap with its before and after: the backing hooks told, and the
handles open for writing that lost their file cut off (memfs.workspace.cutoff keeps them and
the nodes taken out, which `stale` asks about for the FUSE layer). They live here, beside
`replace_tree`, not in a module of their own: they are the replacement's one job seen from
the handles open on the tree.

Loop thread only: everything here reads and changes the live tree, `ws.inodes` and
`ws.writers`, which only the trio loop touches."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from memfs.store.trees import DIR, FILE, LINK, Entry, decode_dir, name_to_bytes, name_to_str
from memfs.workspace import loading
from memfs.workspace.inodes import Inodes
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.cutoff import CutOff
    from memfs.workspace.workspace import Workspace


def replace_and_cut(ws: Workspace, commit_id: str, by: str) -> list[CutOff]:
    """Show another commit's tree, keeping inode numbers for paths that survive; `by`
    names the operation. Returns the handles open for writing on files it took away, now
    cut off (memfs.workspace.cutoff)."""
    at = partial(node_at, ws)
    writing = ws.writers.before(ws._attached, at)
    ws.backing.before_tree_replace()  # which backed files the new tree changes
    told = replace_tree(ws, commit_id)
    ws.backing.tree_replaced()
    ws.writers.took_out(n.id for i in told if (n := ws.nodes.get(i)) is not None
                        and not ws._attached(n))
    return ws.writers.cut(writing, ws._attached, at, by)


def node_at(ws: Workspace, path: bytes) -> Node | None:
    """The live tree's node at `path` (from the store root), or None."""
    node = ws.root
    for part in path.split(b"/"):
        if node.kind != DIR:
            return None
        child = ws.children(node).get(part)
        if child is None:
            return None
        node = child
    return node


def stale(ws: Workspace, node: Node) -> bool:
    """Did a tree replacement take `node` out of the tree? The kernel may still reach
    it through a name it cached until the invalidation lands: an open or a truncate by
    path answers ESTALE, and the kernel looks the name up again (memfs.workspace.cutoff)."""
    return ws.writers.taken_out(node)


def replace_tree(ws: Workspace, commit_id: str) -> list[int]:
    """Show another commit's tree, keeping inode numbers for paths that survive. Returns
    every inode it told the kernel about (those it took out of the tree among them)."""
    tree = ws.store.commit(commit_id).tree  # first: a dropped commit changes nothing
    ws.head = commit_id
    entries: list[tuple[int, bytes]] = []
    inodes: list[int] = []
    old, ws.inodes = ws.inodes, Inodes(ws.store.inode_table(commit_id))
    for node in old.nodes.values():  # linked inodes are never kept (see _remap_dir)
        node.parent, node.nlink = None, 0
        inodes.append(node.id)
    old.nodes.clear()
    ws.root.space, ws.root.nlink = ws.inodes, None
    _remap_dir(ws, ws.root, tree, entries, inodes)
    ws.root.ref, ws.root.dirty = tree, False
    ws.invalidate(entries, inodes)
    return inodes


def _remap_dir(ws: Workspace, top: Node, tree: str, entries: list[tuple[int, bytes]],
               inodes: list[int]) -> None:
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
        fresh = {name_to_bytes(e.name): e for e in decode_dir(ws.store.read_object(tree))}
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
                _empty_subtree(node, inodes)
                entries.append((d.id, name))
                inodes.append(node.id)
        d._children = kids
        for name, e in fresh.items():
            if name not in kids:
                kids[name] = loading.node_from_entry(ws, e, d)
                entries.append((d.id, name))  # the kernel may cache it as missing (lookup)
        d.nlink = 2 + sum(1 for c in kids.values() if c.kind == DIR)


def _empty_subtree(top: Node, inodes: list[int]) -> None:
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


def _same(node: Node, e: Entry) -> bool:
    """Is this clean node exactly the committed entry (content and metadata)?"""
    if node.dirty:
        return False
    # A symlink's row holds its own target (a device's its rdev, which entry() puts in).
    ref = name_to_str(node.target) if node.kind == LINK else e.ref
    return node.entry(ref, node.size()).to_list() == e.to_list() and (
        node.kind != FILE or node.ref == e.ref)


__all__ = ["node_at", "replace_and_cut", "replace_tree", "stale"]
