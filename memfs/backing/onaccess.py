"""On-access: what the FUSE layer's requests reach on disk.

A lookup, an opendir or an open of a backed mount observes its scope first (at most once a
second per scope, never waiting for a running pass), the state xattrs observe their file, and
a disk-only node's bytes are read from disk through a contained open.

Owns the fast path's facts, written on the trio loop only, from what each pass's gather
returned (`learn`): the last full pass's files per mount with when and how it looked, and the
files small scoped passes saw (at most SEEN_PATHS_KEPT, then cleared). A lookup or open of a
file first compares one lstat (in a worker thread, which is handed the fingerprint to compare
with: it reads no shared state) with what the last pass over it saw; if disk still holds that
file no pass runs. A fact is superseded by the next pass's; a detach forgets the mount's.
Also the root each mount's last gather held, for disk-only reads.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import trio

from memfs.backing.binding import ACCESS_WATCH, Binding, Bindings
from memfs.backing.gate import Gate
from memfs.backing.gather import Gathered, Seen
from memfs.backing.paths import under
from memfs.backing.states import States
from memfs.reconcile.contained import Refused, RootId, RootUnavailable, pread_contained
from memfs.reconcile.observe import RACY_NS, FileFact, Fingerprint
from memfs.store.trees import DIR, FILE, name_to_str
from memfs.workspace.nodes import Node, WorkspaceError

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")

ACCESS_INTERVAL = 1.0  # an on-access pass observes a scope at most once a second
SEEN_PATHS_PER_PASS = 64  # a scoped pass this small records its files for on-access
SEEN_PATHS_KEPT = 8192
RunPass = Callable[[str, str], Awaitable[object]]


def as_seen(path: str, seen: tuple[Fingerprint, Seen] | None) -> bool:
    """Does disk still hold, at path, the file a pass saw? One lstat by path, compared with
    that pass's fingerprint under the walk's trust rule (a ctime-keeping filesystem, the
    root's device, both timestamps older than the racy window before the pass looked). Yes
    means a pass would decide nothing new from disk, so an open or a lookup skips it (~5 ms
    at 2,000 files); anything else runs the pass. A path reached through a swapped-in symlink
    cannot match: its inode, device and ctime would all have to be the same file's. Worker
    thread: it reads nothing but its arguments."""
    if seen is None:
        return False
    fp, how = seen
    if not how.trusted:
        return False
    try:
        now = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return False
    return (stat.S_ISREG(now.st_mode) and now.st_dev == how.dev and Fingerprint.of(now) == fp
            and now.st_mtime_ns < how.at_ns - RACY_NS and now.st_ctime_ns < how.at_ns - RACY_NS)


class OnAccess:
    def __init__(self, ws: Workspace, bindings: Bindings, states: States, gate: Gate,
                 run_pass: RunPass) -> None:
        self.ws = ws
        self.bindings = bindings
        self.states = states
        self.gate = gate
        self.run_pass = run_pass
        self._facts: dict[str, Mapping[str, FileFact]] = {}  # mount -> last full pass's files
        self._facts_seen: dict[str, Seen] = {}
        self._seen_paths: dict[tuple[str, str], tuple[Fingerprint, Seen]] = {}
        # mount -> the root the last gather held: the journal's recorded root (the gather
        # opens the root expecting it; the first pass records the one it held)
        self.roots: dict[str, RootId] = {}

    # -- what passes saw -------------------------------------------------------------------
    def learn(self, mount: str, scope: str, got: Gathered) -> None:
        """A gather's facts, on the loop once its thread returned."""
        self.roots[mount] = RootId(got.obs.root.dev, got.obs.root.ino)
        if not scope:
            self._facts[mount] = got.files
            self._facts_seen[mount] = got.seen
        elif len(got.files) <= SEEN_PATHS_PER_PASS:  # an open's or a lookup's own pass
            if len(self._seen_paths) > SEEN_PATHS_KEPT:
                self._seen_paths.clear()
            for path, fact in got.files.items():
                self._seen_paths[(mount, path)] = (fact.fingerprint, got.seen)

    def forget(self, mount: str) -> None:
        self._facts.pop(mount, None)
        self._facts_seen.pop(mount, None)
        self.roots.pop(mount, None)

    def _seen(self, mount: str, rel: str) -> tuple[Fingerprint, Seen] | None:
        seen = self._seen_paths.get((mount, rel))
        if seen is not None:
            return seen
        fact = (self._facts.get(mount) or {}).get(rel)
        full = self._facts_seen.get(mount)
        return None if fact is None or full is None else (fact.fingerprint, full)

    # -- the FUSE layer's requests ---------------------------------------------------------
    def live(self, node: Node) -> bool:
        """Is the node in the live tree (not a history or branch view, not unlinked)?"""
        while node.parent is not None:
            node = node.parent
        return node is self.ws.root

    async def on_access(self, node: Node, name: bytes | None = None) -> bool:
        """Observe the scope a lookup (node + name), an opendir (a directory node) or an open
        (a file node) touches, at most once a second per scope; never waits for a pass already
        running. True if a pass ran.

        A lookup of a directory the tree already has observes nothing: listing it does. A
        lookup of a name the tree lacks observes that one path (one stat), limited per path
        only, so a file just made on disk opens by name at once. An open observes its file (one
        stat; the fingerprint cache vouches for the bytes), unless a scope above it was observed
        within the second. Nodes of the read-only history and branch views are never observed:
        their paths only look like a live mount's."""
        if not self.bindings.bindings or not self.live(node):
            return False
        mount, rel = self.bindings.backed(node.path())
        if mount is None or self.gate.stopped or self.ws.hold.held:
            return False  # a history operation is replacing the tree: this access does not wait
        missing = False
        if name is not None:
            if name in (b".", b"..") or b"/" in name:
                return False
            child = self.ws.children(node).get(name) if node.kind == DIR else None
            if child is not None and child.kind == DIR and child.id not in self.ws.disk_only:
                return False
            missing = child is None
            rel = f"{rel}/{name_to_str(name)}" if rel else name_to_str(name)
        b = self.bindings.bindings[mount]
        if b.watch not in ACCESS_WATCH or self.gate.lock(mount).locked():
            return False
        st = self.states.of(mount)
        now = time.monotonic()
        if len(st.observed) > 4096:
            st.observed = {k: t for k, t in st.observed.items() if now - t < ACCESS_INTERVAL}
        target = node if name is None else self.ws.children(node).get(name)
        # A disk-only file is disk's alone and may change at any moment: a listing's window
        # over its directory does not cover it (reading one that grew within a second of a
        # listing gave its old length), only its own path's last observation does (which
        # keeps the kernel's one retry of an open answered ESTALE from observing again).
        own = missing or (target is not None and target.id in self.ws.disk_only)
        for scope, at in st.observed.items():
            if now - at < ACCESS_INTERVAL and (scope == rel if own else under(rel, scope)):
                return False
        if target is not None and target.kind == FILE and await trio.to_thread.run_sync(
                as_seen, os.path.join(b.dir, rel), self._seen(mount, rel)):
            st.observed[rel] = time.monotonic()
            return False  # disk holds what the last pass saw there: nothing to decide again
        try:
            await self.run_pass(mount, rel)
        except Exception as exc:  # noqa: BLE001 - a failed observation never fails a lookup
            log.warning("on-access pass of %s/%s failed: %s", mount, rel, exc)
            st.last_error = str(exc)
            return False
        finally:
            # The window counts from the end too: a slow pass is not followed at once by
            # another (the kernel's retry of an open answered ESTALE relies on this).
            st.observed[rel] = time.monotonic()
        return True

    async def state_now(self, node: Node, state_of: Callable[[str, str], object]
                        ) -> tuple[object, bool]:
        """(state, whether a pass ran) of a node as a listing of its one path would show it
        now: a file's path is observed first, in every watch mode, as `memfs ls --states PATH`
        does (the xattrs are a listing's question). Without this the xattrs gave the last
        listing's answer: `synced` for a draft made since, `workspace-draft` for a draft disk
        has since changed too. A directory gives the last listing's answer (observing it would
        walk its subtree)."""
        mount, rel = self.bindings.backed(node.path())
        if mount is None or not rel:
            return None, False
        if node.kind != FILE or not self.live(node) or self.gate.stopped or self.ws.hold.held:
            return state_of(mount, rel), False
        try:
            await self.run_pass(mount, rel)
        except Exception as exc:  # noqa: BLE001 - the answer says unverified instead
            log.warning("state pass of %s/%s failed: %s", mount, rel, exc)
            self.states.of(mount).last_error = str(exc)
            return ("unverified", None), False
        return state_of(mount, rel), True

    async def read_disk(self, node: Node, off: int, size: int) -> bytes:
        """A disk-only node's bytes, from disk (a replaced root reads EIO, a vanished or
        swapped file ENOENT), checked against the root the last pass over the mount held:
        the one the journal records, known without asking it (a FUSE read never waits for a
        pass's journal write). A disk-only node exists only after such a pass."""
        mount, rel = self.ws.disk_only[node.id]
        b: Binding | None = self.bindings.get(mount)
        if b is None:
            raise WorkspaceError(errno.ENOENT, "the mount is no longer bound")
        root = self.roots.get(mount)
        try:
            return await trio.to_thread.run_sync(pread_contained, b.dir, root, rel, off, size)
        except RootUnavailable as exc:
            raise WorkspaceError(errno.EIO, exc.message) from None
        except Refused:
            raise WorkspaceError(errno.ENOENT) from None


__all__ = ["ACCESS_INTERVAL", "OnAccess", "as_seen"]
