"""What a pass changes in the live tree: disk's files put in, removed, shown disk-only.

Runs on the trio loop with no await (Backing.run_pass calls it between the check that the nodes
a decision was made on are unchanged and the end of the tree change), and collects the kernel
invalidations the FUSE layer then drains. One TreeEdit per pass and mount.

Type changes (issue 15): disk may replace a directory by a file or a file by a directory. The
plan only puts a file where the store gives up everything in the way (plan._clashes makes the
rest type-changed conflicts), so here a directory in the way holds nothing the store keeps:
empty directories and disk-only nodes, cleared before the file goes in. Removals run before
puts (Backing's batches), so a file disk made where a directory was agreed replaces it in the
same pass. A directory a removal of disk's leaves empty, which disk no longer has, goes too:
`rm -r sub` on disk leaves no empty `sub/` in the mount.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memfs.reconcile.observe import Observation
from memfs.reconcile.rule import ABSENT, MODE_BITS, Content
from memfs.store.trees import DIR, FILE, name_to_bytes, name_to_str
from memfs.workspace.nodes import FileData, Node, WorkspaceError

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + "/")


@dataclass
class TreeEdit:
    """One pass's edits of one mount's subtree. `overlay` is Backing.overlay (mount, rel) ->
    the live disk-only node, shared and changed in place."""

    ws: Workspace
    overlay: dict[tuple[str, str], Node]
    mount: str
    mnode: Node | None
    entries: list[tuple[int, bytes]] = field(default_factory=list)  # (parent id, name)
    inodes: list[int] = field(default_factory=list)

    # -- finding and clearing ------------------------------------------------------------
    def parent(self, rel: str, create: bool) -> Node | None:
        """The directory holding rel, made on the way if `create`; None if something other
        than a directory of the store's stands in the way."""
        d = self.mnode
        for part in rel.split("/")[:-1]:
            if d is None:
                return None
            name = name_to_bytes(part)
            child = self.ws.children(d).get(name)
            if child is None:
                if not create:
                    return None
                child = self.ws.create(d, name, DIR, 0o755, os.getuid(), os.getgid())
                self.entries.append((d.id, name))
            elif child.kind != DIR or child.id in self.ws.disk_only:
                return None
            d = child
        return d

    def _keeps_nothing(self, node: Node) -> bool:
        """A directory whose subtree holds only directories and disk-only nodes."""
        for child in self.ws.children(node).values():
            if child.kind == DIR:
                if not self._keeps_nothing(child):
                    return False
            elif child.id not in self.ws.disk_only:
                return False
        return True

    def _clear(self, parent: Node, name: bytes, rel: str) -> bool:
        """Remove the directory parent/name if it keeps nothing (its disk-only nodes go
        from the overlay too); False, touching nothing, if it keeps anything."""
        node = self.ws.children(parent).get(name)
        if node is None:
            return True
        if node.kind != DIR or not self._keeps_nothing(node):
            return False
        self._clear_dir(node, rel)
        self.ws.rmdir(parent, name)
        self.entries.append((parent.id, name))
        self.inodes.extend((node.id, parent.id))
        return True

    def _clear_dir(self, node: Node, rel: str) -> None:
        for name, child in list(self.ws.children(node).items()):
            sub = f"{rel}/{name_to_str(name)}"
            if child.kind == DIR:
                self._clear_dir(child, sub)
                self.ws.rmdir(node, name)
            else:
                self.overlay.pop((self.mount, sub), None)
                self.ws.unlink(node, name)
            self.entries.append((node.id, name))
            self.inodes.append(child.id)

    def _prune(self, d: Node, rel_dir: str, obs: Observation) -> None:
        """Directories emptied by a removal of disk's, up to the mount, while disk lacks them
        (never listed, and proven absent): a directory disk still has stays."""
        while d is not self.mnode and d.parent is not None and rel_dir:
            if self.ws.children(d) or rel_dir in obs.listed or obs.disk(rel_dir) is not ABSENT:
                return
            parent = d.parent
            self.ws.rmdir(parent, d.name)
            self.entries.append((parent.id, d.name))
            self.inodes.extend((d.id, parent.id))
            d, rel_dir = parent, rel_dir.rpartition("/")[0]

    # -- taking disk in ----------------------------------------------------------------------
    def put_file(self, rel: str, data: bytes, mtime_ns: int, mode: int | None = None) -> bool:
        """Put disk's bytes at rel as a new node (a new inode: no cache shows the old), with
        `mode`'s permission bits (None: the old node's, or 0o644). A directory in the way that
        keeps nothing is cleared first; False if anything is kept. Bytes that do not fit in
        the store are refused (ENOSPC) before anything changes."""
        self.ws.require_room(len(data))
        parent = self.parent(rel, True)
        if parent is None:
            return False
        name = name_to_bytes(rel.rsplit("/", 1)[-1])
        old = self.ws.children(parent).get(name)
        new_mode = mode
        mode, uid, gid = 0o644, os.getuid(), os.getgid()
        if old is not None and old.kind == DIR:
            if not self._clear(parent, name, rel):
                return False
            old = None
        if old is not None:
            if old.kind != FILE:
                return False
            mode, uid, gid = old.mode, old.uid, old.gid
            self.ws.unlink(parent, name)
            self.inodes.append(old.id)
        node = self.ws.create(parent, name, FILE, mode if new_mode is None else
                              (mode & ~MODE_BITS) | new_mode, uid, gid)
        if data:
            self.ws.write(node, 0, data)
        node.mtime_ns = node.atime_ns = mtime_ns
        self.entries.append((parent.id, name))
        self.inodes.append(parent.id)
        return True

    def remove_file(self, rel: str, obs: Observation) -> None:
        parent = self.parent(rel, False)
        if parent is None:
            return
        name = name_to_bytes(rel.rsplit("/", 1)[-1])
        old = self.ws.children(parent).get(name)
        if old is None or old.kind != FILE or old.id in self.ws.disk_only:
            return
        self.ws.unlink(parent, name)
        self.entries.append((parent.id, name))
        self.inodes.extend((old.id, parent.id))
        self._prune(parent, rel.rpartition("/")[0], obs)

    # -- disk-only nodes -----------------------------------------------------------------
    def drop_overlay(self, rel: str, obs: Observation | None = None) -> None:
        node = self.overlay.pop((self.mount, rel), None)
        if node is None or node.parent is None:
            return
        parent = node.parent
        try:
            self.ws.unlink(parent, node.name)
        except WorkspaceError:
            return
        self.entries.append((parent.id, node.name))
        self.inodes.extend((node.id, parent.id))
        if obs is not None:
            self._prune(parent, rel.rpartition("/")[0], obs)

    def apply_overlay(self, scope: str, obs: Observation, want: Iterable[str],
                      skipped: set[str]) -> None:
        """Disk-only files as read-only nodes with their real size; gone ones removed."""
        # Special files (FIFO, socket, device) are listed disk-only but get no node: reading
        # one through the mount would open it (a FIFO blocks).
        want = {p for p in want if p in obs.files and p not in skipped
                and obs.files[p].kind != "special"}
        for (m, rel), node in list(self.overlay.items()):
            if m != self.mount or not _under(rel, scope) or rel in skipped:
                continue
            fact = obs.files.get(rel)
            stale = fact is None or node.size() != fact.size or \
                node.mtime_ns != fact.fingerprint.mtime_ns
            if rel not in want and isinstance(obs.disk(rel), Content | type(ABSENT)) or (
                    rel in want and stale):
                self.drop_overlay(rel, obs)
        for rel in sorted(want):
            if (self.mount, rel) in self.overlay:
                continue
            parent = self.parent(rel, True)
            if parent is None:
                continue
            name = name_to_bytes(rel.rsplit("/", 1)[-1])
            old = self.ws.children(parent).get(name)
            if old is not None and (old.kind != DIR or not self._clear(parent, name, rel)):
                continue  # the store holds a file there (a draft): it shows instead
            fact = obs.files[rel]
            node = self.ws.create(parent, name, FILE, 0o444, os.getuid(), os.getgid())
            node.data = FileData(fact.size)
            node.readonly = True
            node.mtime_ns = node.atime_ns = fact.fingerprint.mtime_ns
            self.ws.disk_only[node.id] = (self.mount, rel)
            self.overlay[(self.mount, rel)] = node
            self.entries.append((parent.id, name))
            self.inodes.append(parent.id)


__all__ = ["TreeEdit"]
