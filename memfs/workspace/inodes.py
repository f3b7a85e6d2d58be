"""The inode table of one tree: its hard-linked inodes, and what a group commit writes of them.

An inode with a second name lives in its commit's inode table (memfs.store.trees): directory
rows name it by key, the table keeps its metadata, content and link count once. `Inodes` holds
one tree's (the live tree's, or one history view's): every such Node loaded, so a second name
found later is the same Node, and those the next commit must rewrite. Loop thread only, except
`TablePlan.write`, which the commit thread runs on the plan's own copy of the rows.

A row leaves the table when its inode is down to one name and that name is loaded (`untable`):
the directory holding the name gets a plain row again in the same commit. git writes every
object as a temporary file, links it to its name and unlinks the temporary one, so without this
a repository's table held a row per object forever, and every commit that changed any row
stored the whole table again (44 of 61 MB of objects in a 5k-file `git add`, on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memfs.store.trees import FILE, LINK, Entry, encode_inodes, encode_row, name_to_str

if TYPE_CHECKING:
    from memfs.workspace.nodes import Node
    from memfs.workspace.snapshot import FileJob


class Inodes:
    __slots__ = ("table", "rows", "encoded", "nodes", "changed", "dropped")

    def __init__(self, table: str | None) -> None:
        self.table = table  # the committed table's object id (None: no hard links)
        self.rows: dict[str, Entry] | None = None  # its rows, decoded on first use
        # Rows as the table holds them (encode_row), those encoded so far: a commit re-encodes
        # only the rows it changes (git links every object it writes, so a repository's table
        # holds a row per object, and re-encoding them all took most of each commit's CPU).
        self.encoded: dict[str, tuple[str, bytes]] = {}
        self.nodes: dict[str, Node] = {}
        self.changed: set[Node] = set()  # rows the next commit rewrites (or drops)
        # Keys of inodes back in a directory (untable): their committed rows go at the next
        # commit, with the directory now holding the inode's row.
        self.dropped: set[str] = set()

    def load_rows(self, store) -> dict[str, Entry]:
        if self.rows is None:
            self.rows = store.inodes(self.table)
        return self.rows

    def untable(self, node: Node) -> bool:
        """Loop, as `node` changes: if it has one name and that name is loaded, it leaves the
        table (True): a plain node again, whose directory the caller marks dirty. Its
        inode number stays (the kernel knows it by that number)."""
        links = node.links
        key = node.ikey
        if key is None or node.nlink != 1 or not links or len(links) != 1 \
                or self.nodes.get(key) is not node:
            return False
        assert next(iter(links)) == (node.parent, node.name)  # _detach keeps a loaded name
        del self.nodes[key]
        self.changed.discard(node)
        self.dropped.add(key)
        node.ikey = node.links = None
        return True

    def snapshot(self, store, alive: Callable[[Node], bool], snap_file: Callable) -> TablePlan:
        """On the loop, with the rest of the commit snapshot: the changed rows, with a
        content job (snap_file's) for each dirty file among them, and the rows that go."""
        plan = TablePlan(self, self.table)
        if self.dropped:  # a key never committed has no row to drop
            committed = self.load_rows(store) if self.table else {}
            self.dropped &= committed.keys()
        if not self.changed and not self.dropped:
            return plan
        plan.rows = dict(self.load_rows(store))
        plan.encoded = dict(self.encoded)
        plan.jobs = []
        plan.drops = list(self.dropped)
        for node in self.changed:
            key = node.ikey
            assert key is not None  # a node is in `changed` for its row in the table
            if not alive(node):  # its last name is gone: the row goes
                plan.jobs.append(InodeJob(node, node.ver, key, None))
            elif node.kind == FILE and (node.dirty or node.ref is None):
                fjob = snap_file(node)
                plan.file_jobs.append(fjob)
                plan.jobs.append(InodeJob(node, node.ver, key, node.entry("", fjob.size), fjob))
            else:
                ref = name_to_str(node.target) if node.kind == LINK else node.ref or ""
                plan.jobs.append(InodeJob(node, node.ver, key, node.entry(ref, node.size())))
        return plan


@dataclass
class InodeJob:
    """One changed row: the entry (its ref set from `file` once the content is written), or
    None to drop the row."""

    node: Node
    ver: int
    key: str
    entry: Entry | None
    file: FileJob | None = None  # the content job of a dirty file (memfs.workspace.snapshot)


@dataclass
class TablePlan:
    space: Inodes
    table: str | None  # the table the commit names: the committed one while unchanged
    jobs: list[InodeJob] | None = None  # None: the table is unchanged
    rows: dict[str, Entry] | None = None  # a copy of the committed rows, changed by write()
    encoded: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # of `rows`, so far
    file_jobs: list = field(default_factory=list)
    drops: list[str] = field(default_factory=list)  # keys of rows that leave the table

    def write(self, tx) -> None:
        """Commit thread, after the content jobs: the new table (None once empty)."""
        if self.jobs is None:
            return
        rows, encoded = self.rows, self.encoded
        assert rows is not None  # the snapshot copied them with the jobs
        for key in self.drops:
            rows.pop(key, None)
            encoded.pop(key, None)
        for j in self.jobs:
            encoded.pop(j.key, None)
            if j.entry is None:
                rows.pop(j.key, None)
                continue
            if j.file is not None:
                j.entry.ref = j.file.ref
            rows[j.key] = j.entry
        for key, e in rows.items():
            if key not in encoded:
                encoded[key] = encode_row(e)
        self.table = tx.put_object(encode_inodes(list(encoded.values()))) if rows else None

    def apply(self) -> None:
        """Back on the loop once durable: clean what did not change meanwhile."""
        if self.jobs is None:
            return
        space = self.space
        space.table, space.rows, space.encoded = self.table, self.rows, self.encoded
        space.dropped.difference_update(self.drops)
        for j in self.jobs:
            node = j.node
            if node.ver != j.ver:
                continue
            space.changed.discard(node)
            node.dirty = False
            if j.entry is None:
                space.nodes.pop(j.key, None)
