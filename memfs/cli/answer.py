"""A command's answer: the running daemon's, or, when no daemon serves the root, what the
command computes on the store opened directly (for writing; the daemon's absence means no
other writer holds it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memfs.control import NoDaemon, call
from memfs.store import StoreBackend as Store
from memfs.store import open_store


def ask(root: Path, op: str, direct: Callable[[Store], object], **kw) -> object:
    """The daemon's answer to `op`, or `direct(store)` on the store opened for writing."""
    try:
        return call(root, op, **kw)
    except NoDaemon:
        store = open_store(root, create=False)
        try:
            return direct(store)
        finally:
            store.close()
