"""memfs fsck: every commit's objects and chunks exist, each chunk's bytes (a delta's rebuilt
over its base) match its digest, and its link counts add up.

Follows exactly what memfs.store.refs says each commit, entry and object names, the graph GC's
mark walks too, so GC and fsck can never disagree on what is reachable. A directory object's
facts (its hard-link names by inode key, its number of subdirectories) depend only on its id,
so each object is read once however many commits share it. Work lists, not recursion: a tree
of any depth is checked. Runs in the calling thread; touches only the store's reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from memfs.store.chunks import chunk_digest
from memfs.store.refs import (
    CHUNK,
    INODES,
    TREE,
    Ref,
    UnknownEntry,
    entry_refs,
    inode_key,
    inode_rows,
    object_refs,
)
from memfs.store.trees import Entry, decode_dir


@dataclass
class _TreeFacts:
    links: Counter = field(default_factory=Counter)  # inode key -> names below this tree
    subdirs: int = 0


@dataclass
class _Frame:
    """A directory being walked: its entries still to look at, what it found so far, and
    the entry its parent names it by (checked against its facts once it is done)."""

    oid: str
    where: str
    entries: Iterator[Entry]
    facts: _TreeFacts
    named_by: Entry | None


@dataclass
class _Check:
    store: object
    problems: list[str] = field(default_factory=list)
    trees: dict[str, _TreeFacts] = field(default_factory=dict)
    seen: set[Ref] = field(default_factory=set)  # manifests, blobs and chunks read once

    def leaf(self, ref: Ref, where: str) -> None:
        """A chunk, manifest or blob: it exists, and what it names exists."""
        stack = [ref]
        while stack:
            r = stack.pop()
            if r in self.seen:
                continue
            self.seen.add(r)
            try:
                if r.kind == CHUNK:  # a delta is read through its base: both checked
                    if chunk_digest(self.store.read_chunk(r.id)) != r.id.split(".")[0]:
                        self.problems.append(f"{where}: {r.kind} {r.id}: its bytes do not "
                                             "match its digest")
                else:
                    stack += object_refs(r, self.store.read_object(r.id))
            except Exception as exc:  # noqa: BLE001 - fsck reports, never raises
                self.problems.append(f"{where}: {r.kind} {r.id}: {exc}")

    def _open(self, oid: str, where: str, named_by: Entry | None) -> _Frame:
        facts = _TreeFacts()
        try:
            entries = decode_dir(self.store.read_object(oid))
        except Exception as exc:  # noqa: BLE001
            self.problems.append(f"tree {oid} ({where or '/'}): {exc}")
            entries = []
        return _Frame(oid, where, iter(entries), facts, named_by)

    def tree(self, oid: str) -> _TreeFacts:
        """The facts of one root tree, every directory below it walked once (post-order)."""
        if oid in self.trees:
            return self.trees[oid]
        stack = [self._open(oid, "", None)]
        while True:
            frame = stack[-1]
            e = next(frame.entries, None)
            if e is None:
                stack.pop()
                self.trees[frame.oid] = frame.facts
                if not stack:
                    return frame.facts
                self._counted(stack[-1].facts, frame.facts, frame.named_by, frame.where)
                continue
            path = f"{frame.where}/{e.name}"
            try:
                refs = entry_refs(e)
            except UnknownEntry as exc:
                self.problems.append(f"{path}: {exc}")
                continue
            key = inode_key(e)
            if key is not None:
                frame.facts.links[key] += 1
            for ref in refs:
                if ref.kind != TREE:
                    self.leaf(ref, path)
                elif ref.id in self.trees:
                    self._counted(frame.facts, self.trees[ref.id], e, path)
                else:
                    stack.append(self._open(ref.id, path, e))

    def _counted(self, parent: _TreeFacts, below: _TreeFacts, e: Entry | None,
                 path: str) -> None:
        parent.links.update(below.links)
        parent.subdirs += 1
        if e is not None and e.nlink is not None and e.nlink != 2 + below.subdirs:
            self.problems.append(f"{path}: directory link count {e.nlink}, but it has "
                                 f"{below.subdirs} subdirectories (want {2 + below.subdirs})")

    def commit(self, commit) -> None:
        where = f"commit {commit.id[:12]}"
        try:
            refs = self.store.commit_refs(commit)
        except Exception as exc:  # noqa: BLE001
            self.problems.append(f"{where}: {exc}")
            return
        links = self.tree(refs.tree).links
        for ref in refs.intents:
            self.leaf(ref, f"{where} intents")
        table: dict[str, Entry] = {}
        if refs.inodes is not None:
            try:
                table = inode_rows(self.store.read_object(refs.inodes))
            except Exception as exc:  # noqa: BLE001
                self.problems.append(f"{where}: {INODES} {refs.inodes}: {exc}")
        for key, e in table.items():
            for ref in entry_refs(e):
                self.leaf(ref, f"{where} inode {key}")
            if links[key] != (e.nlink or 0):
                self.problems.append(f"{where}: inode {key} records {e.nlink} link(s) but "
                                     f"{links[key]} name(s) point at it")
        for key in links.keys() - table.keys():
            self.problems.append(f"{where}: {links[key]} name(s) point at inode {key}, which its "
                                 "inode table lacks (dangling)")


def check_store(store) -> list[str]:
    check = _Check(store)
    for cid in store.commit_ids():
        check.commit(store.commit(cid))
    return check.problems
