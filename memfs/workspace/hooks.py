"""What the workspace and the FUSE layer ask of backing directories, as a typed protocol.

Why a protocol here and not an import of memfs.backing: imports go one way (fs -> backing ->
workspace -> store/reconcile), and the workspace must still tell the backing layer about its
changes (settle a pending adoption first, keep branch intent with a commit, rewind it with an
undo). So the workspace names what it calls (`BackingHooks`), memfs.backing.Backing provides
it and installs itself as `ws.backing`, and a workspace nobody bound anything to keeps
`NO_BACKING`, whose every hook does nothing: callers never ask whether there is one.

Every hook is called on the trio loop. The no-op's state is immutable.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from memfs.workspace.nodes import Node, fail

State = tuple[str, str | None]  # (state, conflict kind) of a backed path


class BackingHooks(Protocol):
    """The calls the live tree (memfs.workspace) and the FUSE layer (memfs.fs) make."""

    @property
    def bindings(self) -> Mapping[str, object]:
        """mount -> its binding; empty when nothing is bound (the per-request hooks then
        have nothing to do, and a caller may skip preparing their arguments)."""
        ...

    # -- the workspace, before and around its changes --------------------------------
    def settle_before_change(self, d: Node, name: bytes) -> None:
        """Before d/name (or anything under it) changes: a pending adoption there settles."""

    def intent_bytes(self) -> dict[str, bytes] | None:
        """The branch intent the next commit keeps (None: no mount is bound)."""

    async def before_rewind(self) -> None:
        """Before a restore rewinds the tree: disk's changes so far are decided first."""

    def before_tree_replace(self) -> None:
        """The tree is about to be replaced (undo, restore, branch switch)."""

    def tree_replaced(self) -> None:
        """The tree was replaced: intent rewinds with it."""

    def status_json(self) -> dict[str, object] | None:
        """The `backing` part of status (None: leave it out), rendered from facts."""

    async def refresh_status(self) -> None:
        """Before status is answered: recount what the facts cannot know by themselves."""

    # -- the FUSE layer ------------------------------------------------------------------
    async def on_access(self, node: Node, name: bytes | None = None) -> bool:
        """Observe what a lookup, opendir or open touches; True if a pass ran."""

    async def state_now(self, node: Node) -> tuple[State | None, bool]:
        """The node's state as a listing of its path would show it now, and whether a pass
        ran to find out."""

    def note_created(self, node: Node, path: bytes) -> None:
        """Files created (or the new name of a rename) through the mount."""

    def note_removed(self, node: Node, path: bytes) -> None:
        """Files removed (or the old name of a rename) through the mount."""

    def hold_writer(self, node: Node) -> None:
        """A writable descriptor was opened on node."""

    def release_writer(self, node: Node) -> None:
        """A writable descriptor on node was closed."""

    async def read_disk(self, node: Node, off: int, size: int) -> bytes:
        """Bytes of a disk-only node, read from disk."""

    def conflict_files(self) -> dict[str, Path | None]:
        """'mount/path' -> the file holding a conflict's recorded disk side."""


class NoBacking:
    """The hooks of a workspace with no backing layer: nothing bound, nothing to do."""

    bindings: Mapping[str, object] = MappingProxyType({})

    def settle_before_change(self, d: Node, name: bytes) -> None:
        return None

    def intent_bytes(self) -> dict[str, bytes] | None:
        return None

    async def before_rewind(self) -> None:
        return None

    def before_tree_replace(self) -> None:
        return None

    def tree_replaced(self) -> None:
        return None

    def status_json(self) -> dict[str, object] | None:
        return None

    async def refresh_status(self) -> None:
        return None

    async def on_access(self, node: Node, name: bytes | None = None) -> bool:
        return False

    async def state_now(self, node: Node) -> tuple[State | None, bool]:
        return None, False

    def note_created(self, node: Node, path: bytes) -> None:
        return None

    def note_removed(self, node: Node, path: bytes) -> None:
        return None

    def hold_writer(self, node: Node) -> None:
        return None

    def release_writer(self, node: Node) -> None:
        return None

    async def read_disk(self, node: Node, off: int, size: int) -> bytes:
        raise fail(errno.ENOENT, "no backing directory is bound")

    def conflict_files(self) -> dict[str, Path | None]:
        return {}


NO_BACKING: BackingHooks = NoBacking()

__all__ = ["BackingHooks", "NO_BACKING", "NoBacking", "State"]
