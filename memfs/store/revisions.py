"""How a revision's name becomes a commit id, on either backend: HEAD, a branch, a
checkpoint, a commit id or a unique prefix of one (six or more characters), each with an
optional ~N that walks N first parents back.

Written once over the backend's interface (memfs.store.backend.StoreBackend: its `head`,
`commit` and Records reads), so both stores read a name alike; only the rows' SQL is each
backend's. Marks are memfs.store.history's (history.resolve tries this first). Reads only:
any thread that may read the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfs.store.store import StoreError, UnknownRevision

if TYPE_CHECKING:
    from memfs.store.backend import StoreBackend

PREFIX_MIN = 6  # a shorter commit-id prefix is no revision (too likely to name several)


def resolve(store: StoreBackend, rev: str) -> str:
    """The commit `rev` names; one the retention policy dropped is refused by name."""
    base, _, back = rev.partition("~")
    steps = int(back) if back else 0
    cid = _resolve_base(store, base)
    for _ in range(steps):
        parent = store.commit(cid).parent
        if parent is None:
            raise StoreError(f"{rev} goes past the first commit", "use a smaller N")
        cid = parent
    store.commit(cid)  # a commit retention dropped is refused by name
    return cid


def _resolve_base(store: StoreBackend, base: str) -> str:
    if base in ("", "HEAD"):
        return store.head()
    head = store.branch_head(base)
    if head is not None:
        return head
    checkpoint = store.checkpoint_row(base)
    if checkpoint is not None:
        return checkpoint[1]
    if len(base) >= PREFIX_MIN:
        ids = store.commits_with_prefix(base)
        if len(ids) == 1:
            return ids[0]
        if not ids:
            gone = store.dropped_with_prefix(base)
            if len(gone) == 1:
                store.commit(gone[0])  # raises CommitDropped: refused by name, not unknown
    raise UnknownRevision(f"unknown revision {base!r}",
                          "name a branch, a checkpoint or a commit id")

