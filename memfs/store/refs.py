"""What a stored thing names: the one place that knows the tree format's references.

GC's mark (memfs.store.gc) and fsck walk the same graph through these two functions, so a new
kind of entry or object (hard links' inode table, special files) is taught to both here, once.

Nodes of the graph: a directory object (TREE), a file manifest (MANIFEST), an opaque object
such as a mount's branch-intent bytes (BLOB), and a content chunk (CHUNK). Objects live in the
`objects` table, chunks in packs (`chunks` table).
"""

from __future__ import annotations

from typing import NamedTuple

from memfs.store.trees import DIR, FILE, LINK, Entry, decode_dir, decode_manifest

TREE, MANIFEST, BLOB, CHUNK = "tree", "manifest", "blob", "chunk"
OBJECT_KINDS = (TREE, MANIFEST, BLOB)


class Ref(NamedTuple):
    kind: str
    id: str


class UnknownEntry(ValueError):
    """An entry of a kind this version cannot follow (fsck reports it; GC refuses to sweep)."""


def file_refs(ref: str) -> list[Ref]:
    """A file entry's content reference: '' (empty), 'c:<chunk>', 'm:<manifest object>'."""
    if not ref:
        return []
    if ref.startswith("c:"):
        return [Ref(CHUNK, ref[2:])]
    if ref.startswith("m:"):
        return [Ref(MANIFEST, ref[2:])]
    raise UnknownEntry(f"file reference {ref!r}")


def entry_refs(e: Entry) -> list[Ref]:
    """What one directory entry names in the store."""
    if e.kind == DIR:
        return [Ref(TREE, e.ref)]
    if e.kind == FILE:
        return file_refs(e.ref)
    if e.kind == LINK:
        return []  # the target is the reference itself
    raise UnknownEntry(f"{e.name}: unknown kind {e.kind!r}")


def references(ref: Ref, data: bytes) -> list[Ref]:
    """What the stored object `ref` (its bytes `data`) names."""
    if ref.kind == TREE:
        out: list[Ref] = []
        for e in decode_dir(data):
            out += entry_refs(e)
        return out
    if ref.kind == MANIFEST:
        return [Ref(CHUNK, c) for c in decode_manifest(data)[1].values()]
    if ref.kind == BLOB:
        return []
    raise UnknownEntry(f"{ref.kind} {ref.id} is not an object")
