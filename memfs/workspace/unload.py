"""Unloading what the kernel has forgotten, so the daemon's memory follows the kernel's cache
and not everything ever browsed (`find` over a 1M-file tree, `ls` over all of history).

The kernel forgets a directory's inode only after every dentry below it is gone (a child
dentry pins its parent), so when a directory is forgotten nothing loaded below it is in the
kernel's hands any more; the FUSE layer still says what it holds (open handles, counted
lookups), and anything held, dirty, or shown from a backing directory keeps the whole
directory loaded. An unloaded directory is a stub: its committed tree id is kept and its
children are read from the store again (with new inode numbers, which the kernel no longer
knows) at the next lookup.

Loop thread only (called from Workspace.forget).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from memfs.store.trees import DIR, FILE
from memfs.workspace.nodes import Node, unloaded

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

Referenced = Callable[[int], bool]


def loaded_below(d: Node) -> list[Node]:
    """Every node loaded under `d` (not `d`), by a work list."""
    out: list[Node] = []
    work = [d]
    while work:
        node = work.pop()
        if node.kind == DIR and node._children is not None:
            for child in node._children.values():
                out.append(child)
                work.append(child)
    return out


def unload_dir(ws: Workspace, d: Node, referenced: Referenced) -> bool:
    """Drop what is loaded below a clean directory, keeping `d` as a stub; False (nothing
    changed) if anything there is dirty, held, or backed, or is a hard-linked inode (its
    other names may be in directories still loaded, which keep pointing at its node)."""
    if d.kind != DIR or d._children is None or d.dirty or d.ref is None:
        return False
    below = loaded_below(d)
    for node in below:
        if (node.dirty or node.ref is None or referenced(node.id) or node.id in ws.disk_only
                or node.ikey is not None):
            return False
    for node in below:
        ws.nodes.pop(node.id, None)
    d._children = None
    d.row = None
    ws.unload_seq += 1
    return True


def unload_clean(ws: Workspace, d: Node, referenced: Referenced) -> int:
    """Unload every clean subtree below `d` nothing holds (a take-in's just-committed files
    the kernel never looked up: their rows in the store are the truth, and a lookup or a
    pass reads them again). The largest such subtrees go whole, by a work list; returns
    how many directories became stubs."""
    done, before = 0, len(ws.nodes)
    work = [d]
    while work:
        node = work.pop()
        # A directory the kernel holds keeps its listing (an open one's readdir snapshot
        # names its nodes); what is below it may go.
        if not referenced(node.id) and unload_dir(ws, node, referenced):
            done += 1
        elif node._children is not None:
            work.extend(c for c in node._children.values()
                        if c.kind == DIR and c._children is not None)
    if len(ws.nodes) < before // 2:  # a dict keeps its table when emptied: a new one
        ws.nodes = dict(ws.nodes)
    return done


def unload_file(f: Node) -> None:
    """A clean file's chunk map goes; it is read from its manifest again when needed."""
    if f.kind == FILE and f._data_loaded and not f.dirty and f.data is not None \
            and not f.data.dirty and f.ref is not None:
        f.data = unloaded(f.data.size)
        f._data_loaded = False


def unload_inline(f: Node) -> None:
    """A file just committed clean whose ref holds its one chunk id (`c:<id>`, or "" for an
    empty file): its chunk map goes at once, as the ref gives it back with no read
    (Store.file_chunks). Most files of a tree are this small, and a map per file is the
    biggest part of a loaded node (a bound mount loads every file it takes in)."""
    fd = f.data
    if (f.kind == FILE and f._data_loaded and not f.dirty and fd is not None
            and not fd.dirty and fd.spill is None and f.ref is not None
            and (f.ref == "" or f.ref.startswith("c:"))):
        f.data = unloaded(fd.size)
        f._data_loaded = False


def drop_view(ws: Workspace, top: Node, referenced: Referenced) -> bool:
    """A view of history (read-only, no parent) the kernel forgot: it and what is loaded below
    it go, unless something below is still held."""
    below = loaded_below(top)
    if any(referenced(n.id) for n in below):
        return False
    for node in below:
        ws.nodes.pop(node.id, None)
    ws.forget_view(top)
    return True
