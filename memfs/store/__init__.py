"""The store: commits of immutable trees on named branches. Embedded (SQLite + packs, the
default) or PostgreSQL; `open_store` opens whichever a root uses (memfs.store.backend)."""

from memfs.store.backend import StoreBackend, open_store, open_store_readonly
from memfs.store.store import DEFAULT_BRANCH, Commit, Store, StoreError

__all__ = ["DEFAULT_BRANCH", "Commit", "Store", "StoreBackend", "StoreError", "open_store",
           "open_store_readonly"]
