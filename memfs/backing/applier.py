"""The tree applier: the only code that changes the live tree for the reconciler.

What a pass takes (disk's files put in, removed, shown disk-only, modes taken in place),
attach's mount directory and detach's removal of the disk-only nodes. Loop only, with no await
inside a change: memfs.backing.passes calls `apply_batch` between the check that the nodes a
decision was made on are unchanged and the end of the tree change. Each TreeEdit collects the
kernel invalidations the FUSE layer then drains; one per pass and mount.

Owns `overlay` ((mount, rel) -> the live disk-only node; their ids are also in
`ws.disk_only`, which keeps them out of every commit) and `held` (node id -> writable
descriptors open through the mount, counted by the FUSE layer's open/create and release: a pass
never replaces or removes such a node, or the writes to come would land on a node no longer in
the tree; it is taken by a pass after the last one closes). A replaced tree drops the overlay
nodes that went with it.

Type changes (issue 15): disk may replace a directory by a file or a file by a directory. The
plan only puts a file where the store gives up everything in the way (plan._clashes makes the
rest type-changed conflicts), so here a directory in the way holds nothing the store keeps:
empty directories and disk-only nodes, cleared before the file goes in. Removals run before
puts (Backing's batches), so a file disk made where a directory was agreed replaces it in the
same pass. A directory a removal of disk's leaves empty, which disk no longer has, goes too:
`rm -r sub` on disk leaves no empty `sub/` in the mount.

A directory a take-in makes in the mount gets disk's permission bits (the observation's
`dirs`): a 0700 directory on disk made 0755 in the mount let other users of an allow_other
mount into what disk kept from them. Where disk's bits are unknown it is made 0700 (never
wider than disk could be). Directories already in the mount keep their mode.
"""

from __future__ import annotations

import collections
import errno
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memfs.backing.paths import under as _under
from memfs.reconcile.observe import Observation
from memfs.reconcile.plan import SyncPlan
from memfs.reconcile.rule import ABSENT, MODE_BITS, Content
from memfs.store.trees import DIR, FILE, name_to_bytes, name_to_str
from memfs.workspace.nodes import FileData, Node, WorkspaceError

if TYPE_CHECKING:
    from memfs.backing.storeview import StoreFile, StoreView
    from memfs.workspace.workspace import Workspace

BATCH_BYTES = 32 << 20  # a pass takes disk into the tree in batches of at most this much
BATCH_FILES = 4096
UNKNOWN_DIR_MODE = 0o700  # a directory made where disk's bits are unknown: never wider
NO_DIRS: Mapping[str, int] = {}


@dataclass
class TreeEdit:
    """One pass's edits of one mount's subtree. `overlay` is TreeApplier.overlay, shared and
    changed in place."""

    ws: Workspace
    overlay: dict[tuple[str, str], Node]
    mount: str
    mnode: Node | None
    entries: list[tuple[int, bytes]] = field(default_factory=list)  # (parent id, name)
    inodes: list[int] = field(default_factory=list)

    # -- finding and clearing ------------------------------------------------------------
    def parent(self, rel: str, create: bool, dirs: Mapping[str, int] = NO_DIRS,
               replace: Collection[str] = ()) -> Node | None:
        """The directory holding rel, made on the way if `create` with disk's permission
        bits (`dirs`: Observation.dirs); None if something other than a directory of the
        store's stands in the way, but a symlink or special file at a `replace` path, which
        goes for the directory (a path sync named it: SyncPlan.replace)."""
        d = self.mnode
        at = ""
        for part in rel.split("/")[:-1]:
            if d is None:
                return None
            at = f"{at}/{part}" if at else part
            name = name_to_bytes(part)
            child = self.ws.children(d).get(name)
            if child is not None and create and at in replace and child.kind not in (DIR, FILE):
                self.ws.unlink(d, name)
                self.entries.append((d.id, name))
                self.inodes.append(child.id)
                child = None
            if child is None:
                if not create:
                    return None
                child = self.ws.create(d, name, DIR, dirs.get(at, UNKNOWN_DIR_MODE),
                                       os.getuid(), os.getgid())
                self.entries.append((d.id, name))
            elif child.kind != DIR or child.id in self.ws.disk_only:
                return None
            d = child
        return d

    def _mount_dir(self, dirs: Mapping[str, int]) -> None:
        """A take-in makes the mount's own directory when the branch has none (with the
        backing root's bits): an undo of the attach (or a restore before it) leaves a binding
        without one, and a path sync there takes disk's file in. (Disk-only files never make
        it: they are shown, not kept.)"""
        root, name = self.ws.root, name_to_bytes(self.mount)
        if self.mnode is None and name not in self.ws.children(root):
            self.mnode = self.ws.create(root, name, DIR, dirs.get("", UNKNOWN_DIR_MODE),
                                        os.getuid(), os.getgid())
            self.entries.append((root.id, name))
            self.inodes.append(root.id)

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
    def put_file(self, rel: str, data: bytes, mtime_ns: int, mode: int | None = None,
                 dirs: Mapping[str, int] = NO_DIRS, replace: Collection[str] = ()) -> bool:
        """Put disk's bytes at rel as a new node (a new inode: no cache shows the old), with
        `mode`'s permission bits (None: the old node's, or 0o644); directories it makes get
        `dirs`' bits. A directory in the way that keeps nothing is cleared first; a symlink
        or special file, at rel or above it, goes only at a `replace` path (a path sync named
        it: SyncPlan.replace); False if anything is kept. Bytes that do not fit in the store are refused (ENOSPC)
        before anything changes."""
        self.ws.require_room(len(data))
        self._mount_dir(dirs)
        parent = self.parent(rel, True, dirs, replace)
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
            if old.kind != FILE and rel not in replace:
                return False
            if old.kind == FILE:
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
        """Disk-only files as read-only nodes with their real size and disk's read bits;
        gone ones removed, changed ones made again."""
        # Special files (FIFO, socket, device) are listed disk-only but get no node: reading
        # one through the mount would open it (a FIFO blocks).
        want = {p for p in want if p in obs.files and p not in skipped
                and obs.files[p].kind != "special"}
        for (m, rel), node in list(self.overlay.items()):
            if m != self.mount or not _under(rel, scope) or rel in skipped:
                continue
            fact = obs.files.get(rel)
            stale = fact is None or node.size() != fact.size or \
                node.mtime_ns != fact.fingerprint.mtime_ns or \
                node.mode & MODE_BITS != _shown_mode(fact.mode)
            if rel not in want and isinstance(obs.disk(rel), Content | type(ABSENT)) or (
                    rel in want and stale):
                self.drop_overlay(rel, obs)
        for rel in sorted(want):
            if (self.mount, rel) in self.overlay:
                continue
            parent = self.parent(rel, True, obs.dirs)
            if parent is None:
                continue
            name = name_to_bytes(rel.rsplit("/", 1)[-1])
            old = self.ws.children(parent).get(name)
            if old is not None and (old.kind != DIR or not self._clear(parent, name, rel)):
                continue  # the store holds a file there (a draft): it shows instead
            fact = obs.files[rel]
            node = self.ws.create(parent, name, FILE, _shown_mode(fact.mode), os.getuid(),
                                  os.getgid())
            node.data = FileData(fact.size)
            node.readonly = True
            node.mtime_ns = node.atime_ns = fact.fingerprint.mtime_ns
            self.ws.disk_only[node.id] = (self.mount, rel)
            self.overlay[(self.mount, rel)] = node
            self.entries.append((parent.id, name))
            self.inodes.append(parent.id)


def _shown_mode(disk_mode: int | None) -> int:
    """A disk-only node's bits: disk's read bits, no others (it is read-only). A 0600 file
    shown 0444 let other users of an allow_other mount read it (memfs reads disk for them)."""
    return 0o400 if disk_mode is None else disk_mode & 0o444


def batches(take: Mapping[str, Content | object], obs: Observation) -> list[list[str]]:
    """The paths a pass takes, cut so that one batch reads at most BATCH_BYTES of disk;
    removals first, so a file disk made where a directory was (or the reverse) goes in once
    what stood in its way is gone."""
    out: list[list[str]] = [[]]
    size = 0
    for path in sorted(take, key=lambda p: (isinstance(take[p], Content), p)):
        fact = obs.files.get(path)
        n = fact.size if fact is not None and isinstance(take[path], Content) else 0
        if out[-1] and (size + n > BATCH_BYTES or len(out[-1]) >= BATCH_FILES):
            out.append([])
            size = 0
        out[-1].append(path)
        size += n
    return out if out[-1] else []


class TreeApplier:
    """The live tree's changes for the reconciler (module docstring)."""

    def __init__(self, ws: Workspace, view: StoreView) -> None:
        self.ws = ws
        self.view = view
        self.overlay: dict[tuple[str, str], Node] = {}
        self.held: collections.Counter[int] = collections.Counter()

    def edit(self, mount: str) -> TreeEdit:
        return TreeEdit(self.ws, self.overlay, mount, self.view.mount_node(mount))

    def release(self, node: Node) -> bool:
        """One writable descriptor fewer; True once the last one closed."""
        left = self.held[node.id] - 1
        if left > 0:
            self.held[node.id] = left
            return False
        del self.held[node.id]
        return True

    def tree_replaced(self) -> None:
        self.overlay = {k: n for k, n in self.overlay.items() if n.parent is not None}

    def apply_batch(self, edit: TreeEdit, batch: list[str], take: Mapping[str, object],
                    contents: Mapping[str, bytes], obs: Observation,
                    nodes: Mapping[str, StoreFile], versions: Mapping[str, int],
                    replace: Collection[str] = (),
                    ) -> tuple[list[str], list[str], list[str]]:
        """Take one batch: each path only if the node it was decided on is still there, with
        the same version, and no descriptor has it open for writing; a file goes over a
        symlink or special file only at a `replace` path. (applied, skipped, and of those
        skipped the ones the store had no room for: nothing changed there.)"""
        applied: list[str] = []
        skipped: list[str] = []
        no_room: list[str] = []
        edit.mnode = self.view.mount_node(edit.mount)
        for path in batch:
            t = take[path]
            same, now = self.view.same_as_decided(edit.mount, path, nodes.get(path),
                                                  versions.get(path))
            if not same or (now is not None and now.id in self.held):
                skipped.append(path)  # changed in the workspace since it was decided,
                continue  # or open for writing: the writes to come must reach the tree
            if isinstance(t, Content):
                data = contents.get(path)
                put = False
                if data is not None:
                    try:
                        put = edit.put_file(path, data, obs.files[path].fingerprint.mtime_ns,
                                            t.mode, obs.dirs, replace)
                    except WorkspaceError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        no_room.append(path)  # nothing changed there: decided again next
                (applied if put else skipped).append(path)
            else:
                edit.remove_file(path, obs)
                applied.append(path)
        return applied, skipped, no_room

    def apply_modes(self, edit: TreeEdit, sp: SyncPlan, nodes: Mapping[str, StoreFile],
                    versions: Mapping[str, int]) -> list[str]:
        """Disk's permission bits taken where the store keeps its content (a chmod on disk):
        the node's mode changes in place (no new inode; its attributes are invalidated), if
        it is still the node decided on, unchanged since. Returns the paths skipped."""
        edit.mnode = self.view.mount_node(edit.mount)
        skipped = []
        for path, mode in sorted(sp.take_modes.items()):
            same, node = self.view.same_as_decided(edit.mount, path, nodes.get(path),
                                                   versions.get(path))
            if not same or node is None:
                skipped.append(path)  # changed in the workspace since: decided again next
                continue
            if node.mode & MODE_BITS != mode:
                self.ws.setattr(node, mode=(node.mode & ~MODE_BITS) | mode)
                edit.inodes.append(node.id)
        return skipped

    def ensure_mount_dir(self, mount: str, mode: int = UNKNOWN_DIR_MODE) -> None:
        """Attach: the store mount's top-level directory, made if missing with `mode` (the
        backing root's permission bits)."""
        from memfs.errors import MemfsError

        kids = self.ws.children(self.ws.root)
        name = name_to_bytes(mount)
        if name not in kids:
            self.ws.create(self.ws.root, name, DIR, mode & MODE_BITS, os.getuid(), os.getgid())
            self.ws.invalidate([(self.ws.root.id, name)], [self.ws.root.id])
        elif kids[name].kind != DIR:
            raise MemfsError(f"{mount!r} is not a directory", "pick another mount name")

    def drop_mount(self, mount: str) -> TreeEdit:
        """Detach: the mount's disk-only nodes go (the store's files stay)."""
        edit = self.edit(mount)
        for m, rel in list(self.overlay):
            if m == mount:
                edit.drop_overlay(rel)
        return edit


__all__ = ["BATCH_BYTES", "BATCH_FILES", "TreeApplier", "TreeEdit", "batches"]
