"""What the FUSE layer needs of agent memory and consolidation, so it imports only the
workspace package (fs → workspace → memory/consolidate)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from memfs.memory.records import (
    INDEX_NAME,
    MAX_GLOBAL_BYTES,
    MAX_RECORD_BYTES,
    RECORD_SUFFIX,
    validate_name,
)
from memfs.memory.shared import open_memory_store
from memfs.memory.store import MemoryStore

log = logging.getLogger("memfs.workspace")


def open_memory(root: Path) -> MemoryStore:
    return open_memory_store(root)


def shared_receipt_bodies(root: Path) -> Callable[[], dict[str, str]] | None:
    """Where `.memfs/receipts/` reads a shared store's receipts (review id -> Markdown), or
    None when they are files under the root."""
    from memfs.consolidate.shared_receipts import open_shared_receipts

    shared = open_shared_receipts(root)
    return None if shared is None else shared.bodies


def recover_reviews(root: Path) -> None:
    """Finish consolidation reviews a crash left `committing` (never asks a model)."""
    from memfs.consolidate.committer import recover_receipts

    try:
        report = recover_receipts(root)
        log.info("receipt recovery: %s", report)
    except Exception as exc:  # noqa: BLE001 - files are still served; `memfs recover` retries
        log.error("receipt recovery failed (run `memfs recover`): %s", exc)


__all__ = ["INDEX_NAME", "MAX_GLOBAL_BYTES", "MAX_RECORD_BYTES", "RECORD_SUFFIX", "MemoryStore",
           "open_memory", "recover_reviews", "shared_receipt_bodies", "validate_name"]
