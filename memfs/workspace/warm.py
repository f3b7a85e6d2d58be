"""What a remote store would read on the FUSE loop, read first in a worker thread.

The live tree loads lazily and synchronously (memfs.workspace.loading): a directory's listing,
a file's chunk map and its chunks are read the first time they are wanted, on the loop. The
embedded store answers from this host's SQLite and packs; a store on a server
(memfs.store.pg) answers a miss of its host's caches with a round trip, so a slow, locked or
unreachable server would hold every request of the mount, even those its caches could serve.
Before a lookup, listing, read or write that would miss, the handler awaits `warm`, which reads
the missing objects and chunks into the caches in a worker thread; the loader then finds them
there. Only that request waits for the server.

Loop thread only (it reads nodes); the store's fill runs in a worker thread. Best effort: a
cache that dropped a copy in between (full) makes the loader read it on the loop, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from memfs.store.chunks import CHUNK_SIZE
from memfs.store.trees import DIR, FILE
from memfs.workspace.loading import load_data

if TYPE_CHECKING:
    from memfs.workspace.nodes import Node
    from memfs.workspace.workspace import Workspace


async def warm(ws: Workspace, node: Node, off: int = 0, size: int = 0,
               writing: bool = False) -> None:
    """Make `node`'s listing (a directory) or its chunk map and bytes [off, off+size) (a file)
    readable from the store's caches; `writing`: only the pieces a write keeps part of.
    Nothing to do on a store whose reads are local."""
    if not ws.store.remote:
        return
    for _ in range(2):  # a file's chunk map first, then the chunks it names
        objects, chunks = wanted(node, off, size, writing)
        if (not objects and not chunks) or ws.store.cached(objects, chunks):
            return
        await trio.to_thread.run_sync(ws.store.fill_cache, objects, chunks)
        if chunks or node.kind != FILE or not size:
            return
        load_data(ws, node)  # from the cache just filled


def wanted(node: Node, off: int, size: int,
           writing: bool = False) -> tuple[list[str], list[str]]:
    """(objects, chunks) the loaders would read for this request, cached or not."""
    if node.kind == DIR:
        return ([node.ref] if node._children is None and node.ref else []), []
    if node.kind != FILE or node.data is None:
        return [], []
    if not node._data_loaded:
        ref = node.ref or ""
        if ref.startswith("c:"):
            return [], [ref[2:]] if size else []
        return ([ref[2:]] if ref else []), []
    data, out = node.data, []
    end = min(data.size, off + size)
    for idx in range(off // CHUNK_SIZE, (end + CHUNK_SIZE - 1) // CHUNK_SIZE if end > off else 0):
        if idx in data.dirty or (data.spill is not None and idx in data.spill.present):
            continue
        whole = off <= idx * CHUNK_SIZE and off + size >= (idx + 1) * CHUNK_SIZE
        cid = data.chunks.get(idx)
        if cid is not None and not (writing and whole):
            out.append(cid)
    return [], out
