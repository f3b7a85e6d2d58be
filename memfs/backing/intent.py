"""Branch intent of backed mounts: tombstones, store origin, conflicts, and rewind marks.

Owns, on the trio loop only:
- `tables`: mount -> IntentTable of the selected branch. Loaded from the head commit at open
  and whenever the tree is replaced (undo, restore, switch), so it rewinds with the branch;
  every change marks the workspace root dirty, so the next group commit keeps the new bytes
  (memfs.workspace.snapshot asks `to_keep()`).
- `restored`: mount -> the files an undo or restore changed, until a pass decides each (in
  memory only: the pass every binding gets right after the rewind decides them). Cleared by a
  branch switch (another branch is its own rule, not a rewind of this one).
- the refs of every backed file just before a tree replacement, to tell afterwards which files
  a rewind changed (`before_replace` / `replaced`).
- `_index`: mount -> (the table, path -> the entry's encoded member, in path order), kept
  with each change by `set_entry` and built again when a table is replaced whole: a pass over
  one path finds the entries under it by range (`paths_under`) instead of reading every
  draft's entry, and a commit's bytes are the members joined (`encoded`), where encoding the
  whole table again for each group commit cost milliseconds at thousands of drafts, on the
  loop. `_encoded`: the bytes last made for each mount's table, while it is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from memfs.backing.paths import keys_under, under
from memfs.reconcile import intent as intent_mod
from memfs.reconcile.intent import IntentTable
from memfs.reconcile.plan import SyncPlan
from memfs.reconcile.rule import Conflict, PathIntent
from memfs.store.trees import DIR, FILE
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

FileRefs = Callable[[str], dict[str, "str | None"]]


class BranchIntent:
    def __init__(self, ws: Workspace, mounts: Callable[[], Iterable[str]]) -> None:
        self.ws = ws
        self._mounts = mounts
        self.tables: dict[str, IntentTable] = {}
        self.restored: dict[str, set[str]] = {}
        self._refs_before: dict[str, dict[str, str | None]] | None = None
        self._tree_branch = ws.branch  # the branch the tree showed last (switch vs rewind)
        self._index: dict[str, tuple[IntentTable, SortedDict]] = {}
        self._encoded: dict[str, tuple[IntentTable, bytes]] = {}
        self.load()

    def load(self) -> None:
        mounts = list(self._mounts())
        kept = self.ws.store.intents_at(self.ws.head) if mounts else {}
        self.tables = {m: intent_mod.decode(kept[m]) if m in kept else IntentTable()
                       for m in mounts}  # no intent was kept: nothing to say

    def table(self, mount: str) -> IntentTable:
        return self.tables.get(mount, IntentTable())

    def encoded(self) -> dict[str, bytes] | None:
        """What the next commit keeps (Workspace._snapshot asks, on the loop)."""
        mounts = list(self._mounts())
        if not mounts:
            return None
        return {m: self._encode(m) for m in mounts}

    def _encode(self, mount: str) -> bytes:
        table = self.table(mount)
        last = self._encoded.get(mount)
        if last is None or last[0] is not table:
            members = self._members(mount)  # its keys iterate in C, and so does this map
            data = (intent_mod.encode(table) if table.damaged else
                    intent_mod.encode_members(map(members.__getitem__, members)))
            last = self._encoded[mount] = (table, data)
        return last[1]

    def _members(self, mount: str) -> SortedDict:
        """The mount's table's entries in path order, each its encoded member."""
        current = self.table(mount)
        got = self._index.get(mount)
        if got is None or got[0] is not current:
            got = (current, SortedDict({p: intent_mod.member(p, i)
                                        for p, i in current.entries.items()}))
            self._index[mount] = got
        return got[1]

    def paths_under(self, mount: str, scope: str, table: IntentTable) -> list[str] | None:
        """The paths of `table` (this mount's, or for_pass's over `scope`) at or below a
        scope, by range over the mount's index; None where plan_pass reads them itself (the
        whole mount, a damaged table, a table replaced for one pass)."""
        current = self.table(mount)
        if not scope or table.damaged or current.damaged:
            return None
        marks = self.restored.get(mount)
        if table is not current and not marks:
            return None
        out = keys_under(self._members(mount), scope)
        if table is not current:  # for_pass's: the mount's, and its rewind marks there
            out.extend(p for p in marks or () if under(p, scope))
        return out

    def set_entry(self, mount: str, path: str, pi: PathIntent | None) -> None:
        table = self.tables.setdefault(mount, IntentTable())
        new = table.with_entry(path, pi)
        # Only `path` can differ (and a damaged table's replaced paths): comparing the whole
        # tables read every entry for each file made through the mount.
        if new.entries.get(path) != table.entries.get(path) or new.replaced != table.replaced:
            self.tables[mount] = new
            got = self._index.get(mount)
            if got is not None and got[0] is table:
                members = got[1]
                if path in new.entries:
                    members[path] = intent_mod.member(path, new.entries[path])
                else:
                    members.pop(path, None)
                self._index[mount] = (new, members)
            self.ws._touch(self.ws.root)  # the next group commit keeps the new intent

    def replace_table(self, mount: str, table: IntentTable) -> None:
        self.tables[mount] = table
        self.ws._touch(self.ws.root)

    def bound(self, mount: str) -> None:
        self.tables.setdefault(mount, IntentTable())
        self.ws._touch(self.ws.root)

    def unbound(self, mount: str) -> None:
        self.tables.pop(mount, None)

    # -- changes through the mount ---------------------------------------------------------
    def note(self, backed: Callable[[bytes], tuple[str | None, str]], node: Node, path: bytes,
             *, removed: bool) -> None:
        """Files removed through the mount get a tombstone, files created store origin."""
        for rel_path in self._files_of(node, path):
            mount, rel = backed(rel_path)
            if mount is not None and rel:
                old = self.table(mount).get(rel)
                if not old.damaged:
                    self.set_entry(mount, rel, PathIntent(removed, not removed, old.conflict))

    def _files_of(self, node: Node, path: bytes) -> Iterator[bytes]:
        if node.kind == FILE:
            yield path
        elif node.kind == DIR:
            for name, child in self.ws.children(node).items():
                yield from self._files_of(child, path + b"/" + name)

    # -- a pass's outcome ------------------------------------------------------------------
    def for_pass(self, mount: str, scope: str) -> IntentTable:
        """The table a pass decides with: the mount's, plus the files an undo or restore
        changed and no pass has decided since, marked restored (a damaged table is left as
        it is: every path there is unverified anyway)."""
        table = self.table(mount)
        marks = self.restored.get(mount)
        if not marks or table.damaged:
            return table
        for p in sorted(p for p in marks if under(p, scope)):
            table = table.with_entry(p, replace(table.get(p), restored=True))
        return table

    def apply(self, mount: str, sp: SyncPlan, skipped: set[str]) -> None:
        """The intent a pass's sync plan clears and the conflicts it records."""
        table = self.table(mount)
        for path in sp.clear_intent:
            if path not in skipped:
                self.set_entry(mount, path, None)
        for path, c in sp.record_conflicts.items():
            if path in skipped or not isinstance(c, Conflict):
                continue
            old = table.get(path)
            self.set_entry(mount, path, PathIntent(old.tombstone, old.origin_store, c))

    def decided(self, mount: str, paths: Iterable[str]) -> None:
        """A pass decided these paths: their rewind marks go."""
        marks = self.restored.get(mount)
        if marks:
            marks.difference_update(paths)

    # -- tree replacement ------------------------------------------------------------------
    def before_replace(self, refs: FileRefs) -> None:
        self._refs_before = {m: refs(m) for m in self._mounts()}

    def replaced(self, refs: FileRefs) -> None:
        """Intent rewinds with the tree. After an undo or restore (the branch is the one
        `before_replace` saw), every file the rewind changed is marked restored."""
        before, self._refs_before = self._refs_before, None
        was, self._tree_branch = self._tree_branch, self.ws.branch
        self.load()
        if before is None or was != self.ws.branch:
            self.restored.clear()  # another branch: its own rule, not a rewind of this one
            return
        for mount, old in before.items():
            now = refs(mount)
            marks = self.restored.setdefault(mount, set())
            marks.update(p for p, ref in now.items() if ref is None or old.get(p) != ref)

    def conflict_tables(self) -> Mapping[str, IntentTable]:
        return self.tables


__all__ = ["BranchIntent"]
