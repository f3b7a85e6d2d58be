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
    steps = _steps_back(rev, back) if "~" in rev else 0
    cid = _resolve_base(store, base)
    for _ in range(steps):
        parent = store.commit(cid).parent
        if parent is None:
            raise StoreError(f"{rev} goes past the first commit", "use a smaller N")
        cid = parent
    store.commit(cid)  # a commit retention dropped is refused by name
    return cid


def _steps_back(rev: str, back: str) -> int:
    """N of REV~N, as git reads it: `~` alone is one step and steps add up (`HEAD~~`,
    `HEAD~1~2`). Anything else after a `~` is refused by name (it was a ValueError traceback)."""
    steps = 0
    for part in back.split("~"):
        if part and not (part.isascii() and part.isdigit()):
            raise StoreError(f"{rev!r}: {part!r} after '~' is not a number of commits",
                             "write REV~N with N a whole number: HEAD~2 is two commits back")
        steps += int(part) if part else 1
    return steps


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
    short = base and len(base) < PREFIX_MIN and all(c in "0123456789abcdef" for c in base.lower())
    raise UnknownRevision(f"unknown revision {base!r}",
                          f"a commit id prefix needs {PREFIX_MIN} or more hex digits (`memfs log` "
                          "shows the ids); or name a branch or a checkpoint" if short else
                          "name a branch, a checkpoint or a commit id")

