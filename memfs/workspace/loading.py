"""The live tree's nodes as they are loaded from the store, and their inode numbers.

A directory's children, a file's chunk map and a hard-linked inode's row are read from the
store the first time they are wanted, never before (a tree of a million files costs nothing
until it is walked). Numbers (docs/architecture.md, "Inode numbers"): a live node's is derived
from its place, (its parent's number, its name), so the same tree loaded again after a restart
shows the same numbers and git's index (which keys on st_ino) stays valid; a hard-linked
inode's comes from its inode-table key. They lie in [PLACED_BASE, 2**63). Below 1 << 40 are
counted numbers (the root, history and branch views), and from 1 << 40 the generated .memfs
files (memfs.fs.virtual).

State is the workspace's node table (`ws.nodes`, `ws._next_id`) and each tree's Inodes; these
are its functions. Loop thread only; the store reads are short reader-connection queries.
"""

from __future__ import annotations

import errno
import hashlib
import os
from typing import TYPE_CHECKING

from memfs.store.store import Commit
from memfs.store.trees import DIR, HARD, Entry, decode_dir, name_to_bytes, name_to_str
from memfs.workspace.inodes import Inodes
from memfs.workspace.nodes import FileData, Node, fail, now_ns

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

PLACED_BASE = 1 << 41
PLACED_SPAN = (1 << 63) - PLACED_BASE


def placed_id(ws: Workspace, seed: bytes) -> int:
    """The number a live node's place (or inode key) gives it: the same on every load. One
    still held under that number (a replaced file the kernel has not forgotten, so never
    reused: its cached size and pages must not show for the new one) or, rarely, a hash
    collision moves it to the next free number."""
    digest = hashlib.blake2b(seed, digest_size=8).digest()
    nid = PLACED_BASE + int.from_bytes(digest, "little") % PLACED_SPAN
    while nid in ws.nodes:
        nid = PLACED_BASE + (nid - PLACED_BASE + 1) % PLACED_SPAN
    return nid


def new_node(ws: Workspace, kind: str, mode: int, uid: int, gid: int, space: Inodes | None,
             place: tuple[Node, bytes] | None = None, key: str | None = None) -> Node:
    """A node numbered by its `place` (parent, name) or inode-table `key` in the live tree;
    a view's (read-only) nodes and the root are counted."""
    if key is not None:
        nid = placed_id(ws, b"inode-table\0" + key.encode())
    elif place is not None and not place[0].readonly:
        nid = placed_id(ws, place[0].id.to_bytes(8, "little") + place[1])
    else:
        nid = ws._next_id
        ws._next_id += 1
    node = Node(nid, kind, mode, uid, gid, now_ns())
    node.space = space
    ws.nodes[nid] = node
    return node


def load_root(ws: Workspace, tree: str, space: Inodes) -> Node:
    # The mount root belongs to whoever runs the daemon, as any mountpoint would.
    root = new_node(ws, DIR, 0o755, os.getuid(), os.getgid(), space)
    root.ref, root.dirty, root._children, root.nlink = tree, False, None, None
    return root


def load_children(ws: Workspace, d: Node) -> dict[bytes, Node]:
    """A directory's children read from its committed tree object (its first listing)."""
    kids: dict[bytes, Node] = {}
    if d.ref:
        for e in decode_dir(ws.store.read_object(d.ref)):
            kids[name_to_bytes(e.name)] = node_from_entry(ws, e, d)
    d._children = kids
    d.nlink = 2 + sum(1 for c in kids.values() if c.kind == DIR)
    return kids


def node_from_entry(ws: Workspace, e: Entry, parent: Node) -> Node:
    """The node of one directory row; a hard-link row's is its inode's (one per tree)."""
    name = name_to_bytes(e.name)
    if e.kind == HARD:
        return _linked(ws, parent, name, e.ref)
    node = new_node(ws, e.kind, e.mode, e.uid, e.gid, parent.space, (parent, name))
    node.apply_entry(e)
    node.parent, node.name = parent, name
    node.readonly = parent.readonly
    return node


def _linked(ws: Workspace, d: Node, name: bytes, key: str) -> Node:
    space = d.space
    assert space is not None  # every node of a tree (live or a view) knows its tree
    node = space.nodes.get(key)
    if node is None:
        e = space.load_rows(ws.store).get(key)
        if e is None:
            raise fail(errno.EIO, f"{name_to_str(d.path() + b'/' + name)} names inode {key}, "
                                  "which its commit's inode table lacks: run `memfs fsck`")
        node = new_node(ws, e.kind, e.mode, e.uid, e.gid, space,
                        key=None if d.readonly else key)
        node.apply_entry(e)
        node.nlink = e.nlink or 1
        node.ikey, node.links, node.readonly = key, set(), d.readonly
        space.nodes[key] = node
    ws.nodes.setdefault(node.id, node)  # a name found again after the kernel forgot it
    assert node.links is not None  # a linked inode's loaded names
    node.links.add((d, name))
    if node.parent is None:
        node.parent, node.name = d, name
    return node


def load_data(ws: Workspace, f: Node) -> FileData:
    """A file's data with its chunk map read from the store (once)."""
    data = f.data
    assert data is not None  # a file's (callers read and write files only)
    if not f._data_loaded:
        data = f.data = FileData(data.size, ws.store.file_chunks(f.ref or ""))
        f._data_loaded = True
    return data


def view_root(ws: Workspace, commit_id: str, commit: Commit) -> Node:
    """The read-only root of a past commit's tree, whose times are the commit's own."""
    node = new_node(ws, DIR, 0o555, 0, 0, Inodes(ws.store.inode_table(commit_id)))
    node.ref, node.dirty, node._children, node.readonly = commit.tree, False, None, True
    node.nlink = None
    node.mtime_ns = node.ctime_ns = node.atime_ns = commit.time_ns
    return node
