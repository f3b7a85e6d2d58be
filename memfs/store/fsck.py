"""memfs fsck: every commit's objects and chunks exist, and its link counts add up.

Follows exactly what Store.references says each entry and commit holds, so GC and fsck can
never disagree on what is reachable. A directory object's facts (its hard-link names by inode
key, its number of subdirectories) depend only on its id, so each object is read once however
many commits share it. Runs in the calling thread; touches only the store's reader.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from memfs.store.trees import DIR, HARD, KINDS, decode_dir

# Trees are walked recursively; a 4 KiB path can be 2048 levels deep.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


@dataclass
class _TreeFacts:
    links: Counter = field(default_factory=Counter)  # inode key -> names below this tree
    subdirs: int = 0


@dataclass
class _Check:
    store: object
    problems: list[str] = field(default_factory=list)
    trees: dict[str, _TreeFacts] = field(default_factory=dict)
    chunks: set[str] = field(default_factory=set)

    def refs(self, item, where: str):
        try:
            return self.store.references(item)
        except Exception as exc:  # noqa: BLE001 - fsck reports, never raises
            self.problems.append(f"{where}: {exc}")
            return None

    def content(self, refs, where: str) -> None:
        for chunk in refs.chunks:
            if chunk in self.chunks:
                continue
            self.chunks.add(chunk)
            try:
                self.store.read_chunk(chunk)
            except (KeyError, OSError) as exc:
                self.problems.append(f"{where}: chunk {chunk}: {exc}")

    def tree(self, oid: str, where: str) -> _TreeFacts:
        facts = self.trees.get(oid)
        if facts is not None:
            return facts
        facts = self.trees[oid] = _TreeFacts()
        try:
            entries = decode_dir(self.store.read_object(oid))
        except Exception as exc:  # noqa: BLE001
            self.problems.append(f"tree {oid} ({where or '/'}): {exc}")
            return facts
        for e in entries:
            path = f"{where}/{e.name}"
            if e.kind not in KINDS and e.kind != HARD:
                self.problems.append(f"{path}: unknown kind {e.kind!r}")
                continue
            refs = self.refs(e, path)
            if refs is None:
                continue
            self.content(refs, path)
            if refs.inode is not None:
                facts.links[refs.inode] += 1
            for sub in refs.trees:
                below = self.tree(sub, path)
                facts.links.update(below.links)
                facts.subdirs += 1
                if e.nlink is not None and e.nlink != 2 + below.subdirs:
                    self.problems.append(f"{path}: directory link count {e.nlink}, but it has "
                                         f"{below.subdirs} subdirectories (want "
                                         f"{2 + below.subdirs})")
        return facts

    def commit(self, commit) -> None:
        where = f"commit {commit.id[:12]}"
        refs = self.refs(commit, where)
        if refs is None:
            return
        links: Counter = Counter()
        for oid in refs.trees:
            links.update(self.tree(oid, "").links)
        table = {e.name: e for e in refs.inodes}
        for key, e in table.items():
            if e.kind == DIR or e.kind == HARD:
                self.problems.append(f"{where}: inode {key} is a {e.kind!r} (not linkable)")
            sub = self.refs(e, f"{where} inode {key}")
            if sub is not None:
                self.content(sub, f"{where} inode {key}")
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
