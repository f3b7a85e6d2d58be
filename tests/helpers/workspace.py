"""The workspace driven directly (no mount, embedded store): opening one, finding a node by
path, and a tree deeper than Python's recursion limit."""

from __future__ import annotations

from pathlib import Path

from memfs.store import Store
from memfs.store.trees import DIR, FILE, Entry, encode_dir
from memfs.workspace.nodes import Node
from memfs.workspace.workspace import Workspace


def new_ws(root: Path) -> Workspace:
    """The root's workspace, committing 50 ms after a change (tests wait little)."""
    return Workspace(Store.open(root), commit_interval=0.05)


def walk(ws: Workspace, path: str) -> Node:
    """The node at `path` ("a/b/c"), looked up name by name from the root."""
    node = ws.root
    for part in path.split("/"):
        node = ws.lookup(node, part.encode())
    return node


def deep_workspace(root: Path, depth: int) -> Workspace:
    """A workspace whose work/ holds `depth` nested directories `d`, committed, with an
    uncommitted file `leaf` ("deep") written at the bottom. The tree is built bottom-up in
    the store (O(depth), not O(depth^2)), then walked down through the workspace."""
    store = Store.open(root)
    with store.transaction() as tx:
        ref = tx.put_object(encode_dir([]))
        for name in ["d"] * depth + ["work"]:
            ref = tx.put_object(encode_dir([Entry(name, DIR, 0o755, 0, 0, 1, 1, 4096, ref)]))
        tx.add_commit(store.head(), ref, "main", "deep", [])
    store.close()
    ws = new_ws(root)
    d = walk(ws, "work")
    for _ in range(depth):
        d = ws.lookup(d, b"d")
    ws.write(ws.create(d, b"leaf", FILE, 0o644, 0, 0), 0, b"deep")
    return ws

