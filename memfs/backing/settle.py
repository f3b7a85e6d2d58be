"""Settling before a change (seed 002): a pending adoption a crash left is resolved by the
first change through the mount to what it adopted, before that change lands.

Owns, on the trio loop: `known` (every pending adoption of every branch, read from the journal
at open and after a journal reopen, in a worker thread once serving), `pending` ((mount, path)
-> those of the selected branch: chosen from `known` again when the tree is replaced, with no
journal read on the loop) and `settles` (how many this process settled: a pass gathering in its
thread meanwhile read the intents and P from before, so it counts as a change of view and the
pass gathers again). A pass forgets the entries it settled itself; accepting a replaced root
forgets the mount's (the journal abandoned them).

Only a crash leaves an adoption pending outside a pass, so a change costs one empty-dict
check almost always.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from memfs.backing.paths import under
from memfs.errors import MemfsError
from memfs.store.journal import Intent, Journal
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.backing.storeview import StoreView

log = logging.getLogger("memfs.backing")


class Settler:
    def __init__(self, journal: Journal, view: StoreView) -> None:
        self.journal = journal
        self.view = view
        self.known: list[Intent] = []
        self.pending: dict[tuple[str, str], Intent] = {}
        self.settles = 0

    def read(self, mounts: Iterable[str]) -> list[Intent]:
        """Every pending adoption of these mounts, any branch (a worker thread's part, or
        the constructor's before serving)."""
        try:
            return [i for mount in mounts for i in self.journal.pending_intents(mount)
                    if i.op == "adopt"]
        except MemfsError as exc:  # a poisoned journal: every pass refuses until reopened
            log.warning("pending adoptions not read: %s", exc)
            return []

    def load(self, known: list[Intent], branch: str) -> None:
        self.known = known
        self.select(branch)

    def select(self, branch: str) -> None:
        """The selected branch's (after a tree replacement: no journal read)."""
        self.pending = {(i.mount, i.path): i for i in self.known if i.branch == branch}

    def forget_mount(self, mount: str) -> None:
        self.known = [i for i in self.known if i.mount != mount]
        self.pending = {k: i for k, i in self.pending.items() if k[0] != mount}

    def settled_by_pass(self, mount: str, still_pending: set[int]) -> None:
        self.known = [i for i in self.known if i.mount != mount or i.id in still_pending]
        for key in [k for k, i in self.pending.items() if k[0] == mount and
                    i.id not in still_pending]:
            del self.pending[key]

    def before_change(self, backed: Callable[[bytes], tuple[str | None, str]], d: Node,
                      name: bytes) -> None:
        """A pending adoption at d/name (or under it) is settled first — done if the tree
        shows its new value, not done if the old — so a later write can never pass for an old
        adoption's outcome. A tree showing neither is left for the next pass to call
        interrupted."""
        if not self.pending:
            return
        mount, rel = backed(d.path() + b"/" + name)
        if mount is None:
            return
        for key in [k for k in self.pending if k[0] == mount and under(k[1], rel)]:
            intent = self.pending.pop(key)
            self.known = [i for i in self.known if i.id != intent.id]
            if not any(p.id == intent.id for p in self.journal.pending_intents(*key)):
                continue  # a pass settled it already
            node = self.view.node_at(*key)
            now = None if node is None else self.view.digest_now(node)
            if now in (intent.new, intent.old):
                self._settle(intent, done=now == intent.new)

    def _settle(self, intent: Intent, *, done: bool) -> None:
        """A pass's thread may settle the same intent first (the same way, from the same
        tree), which is no failure of the change that asked."""
        try:
            if done:
                self.journal.complete_intent(intent.id)
            else:
                self.journal.abandon_intent(intent.id)
        except MemfsError:
            if any(p.id == intent.id for p in self.journal.pending_intents(intent.mount,
                                                                           intent.path)):
                raise
            return
        self.settles += 1


__all__ = ["Settler"]
