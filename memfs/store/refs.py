"""What a stored thing names: the one place that knows the store's references.

GC's mark (memfs.store.gc) and fsck (memfs.store.fsck) walk the same graph through these
functions, so a new kind of entry, object or per-commit table is taught to both here, once.

Nodes of the graph: a directory object (TREE), a commit's inode table (INODES: rows like a
directory's, keyed by inode key, for the tree's hard-linked inodes), a file manifest
(MANIFEST), an opaque object such as a mount's branch-intent bytes (BLOB), and a content chunk
(CHUNK). Objects live in the `objects` table, chunks in packs (`chunks` table).

A commit names its tree, its inode table (`commit_inodes`) and its intents' objects
(`commit_intents`). Its other rows name no object: `commit_ops` (who made it) and `marks`
(names people gave it). When the retention policy drops a commit (`forget_commits`), the rows
that name objects go with its `commits` row, so what only they named is swept; the rows that
say who made it and what it was called stay with its tombstone (retention's
`dropped_commits`), so `log` and `undo` can still explain the gap.

Entries: a directory (its tree), a file (its chunk or manifest), a symlink (its target is the
reference itself), a special file (its st_rdev), and a hard-link row `[name, "h", key]`, which
names a row of its commit's inode table: the table, named by the commit, holds the content.

Pure functions of their inputs, except `commit_refs` and `forget_commits`, which read and
write through the connection they are given (any thread that owns it).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from memfs.store.trees import (
    DIR,
    FILE,
    HARD,
    LINK,
    SPECIAL,
    Entry,
    decode_dir,
    decode_manifest,
)

TREE, INODES, MANIFEST, BLOB, CHUNK = "tree", "inodes", "manifest", "blob", "chunk"
OBJECT_KINDS = (TREE, INODES, MANIFEST, BLOB)


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
    """What one directory entry (or inode-table row) names in the store."""
    if e.kind == DIR:
        return [Ref(TREE, e.ref)]
    if e.kind == FILE:
        return file_refs(e.ref)
    if e.kind == LINK or e.kind in SPECIAL or e.kind == HARD:
        return []  # a target or st_rdev is the row itself; a hard link's row is its table's
    raise UnknownEntry(f"{e.name}: unknown kind {e.kind!r}")


def inode_key(e: Entry) -> str | None:
    """The inode-table key a hard-link row names (None for any other entry)."""
    return e.ref if e.kind == HARD else None


def inode_rows(data: bytes) -> dict[str, Entry]:
    """An inode table's rows by key; a row that cannot have several names is refused."""
    rows = {e.name: e for e in decode_dir(data)}
    for key, e in rows.items():
        if e.kind == DIR or e.kind == HARD:
            raise UnknownEntry(f"inode {key} is a {e.kind!r} (not linkable)")
    return rows


def object_refs(ref: Ref, data: bytes) -> list[Ref]:
    """What the stored object `ref` (its bytes `data`) names."""
    if ref.kind == TREE:
        out: list[Ref] = []
        for e in decode_dir(data):
            out += entry_refs(e)
        return out
    if ref.kind == INODES:
        out = []
        for e in inode_rows(data).values():
            out += entry_refs(e)
        return out
    if ref.kind == MANIFEST:
        return [Ref(CHUNK, c) for c in decode_manifest(data)[1].values()]
    if ref.kind == BLOB:
        return []
    raise UnknownEntry(f"{ref.kind} {ref.id} is not an object")


def intent_objects(data: str | None) -> list[Ref]:
    """The objects a `commit_intents` row names (a mount's intent bytes, by mount)."""
    return [Ref(BLOB, oid) for oid in json.loads(data).values()] if data else []


@dataclass(frozen=True)
class CommitRefs:
    """What one commit names directly (its own rows; an ancestor's intents row it reads
    through Store.intents_at is that ancestor's)."""

    tree: str
    inodes: str | None  # its inode table object (None: the tree has no hard links)
    intents: tuple[Ref, ...] = ()

    def roots(self) -> list[Ref]:
        return [Ref(TREE, self.tree), *([Ref(INODES, self.inodes)] if self.inodes else []),
                *self.intents]


def commit_refs(conn: sqlite3.Connection, cid: str, tree: str) -> CommitRefs:
    row = conn.execute("SELECT inodes FROM commit_inodes WHERE commit_id = ?", (cid,)).fetchone()
    intents = conn.execute("SELECT data FROM commit_intents WHERE commit_id = ?",
                           (cid,)).fetchone()
    return CommitRefs(tree, row[0] if row else None,
                      tuple(intent_objects(intents[0] if intents else None)))


# What each table beside `commits` does when the retention policy drops the commit.
FORGET = ("commit_inodes", "commit_intents")  # name objects: they go, and so may the objects
KEEP = ("commit_ops", "marks")  # who made it, what it was called: kept with the tombstone,
# for the reflog window (expire_tombstone_rows); the tombstone itself stays


def forget_commits(conn: sqlite3.Connection, cids: Iterable[str]) -> None:
    """Inside the transaction that writes the tombstones: the dropped commits' rows that
    name objects go with their `commits` rows (a kept child took a copy of the intents it
    read through them first: memfs.store.gc)."""
    args = [(c,) for c in cids]
    conn.executemany("DELETE FROM commits WHERE id = ?", args)
    for table in FORGET:
        conn.executemany(f"DELETE FROM {table} WHERE commit_id = ?", args)


def expire_tombstone_rows(conn: sqlite3.Connection, before_ns: int) -> int:
    """The KEEP rows of commits dropped before `before_ns` go (the reflog window has passed:
    nothing can go back there), so what tombstones keep besides themselves stays bounded.
    Returns how many commits lost them."""
    old = "SELECT id FROM dropped_commits WHERE dropped_ns < ?"
    n = conn.execute(f"DELETE FROM commit_ops WHERE commit_id IN ({old})", (before_ns,)).rowcount
    conn.execute(f"DELETE FROM marks WHERE commit_id IN ({old})", (before_ns,))
    return n
