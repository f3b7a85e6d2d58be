"""The embedded store: SQLite + content-addressed chunks; knows nobody above it."""

from memfs.store.store import DEFAULT_BRANCH, Commit, Store, StoreError

__all__ = ["DEFAULT_BRANCH", "Commit", "Store", "StoreError"]
