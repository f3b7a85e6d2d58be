"""Refusals raised by the memory layer; each is a MemfsError so the CLI prints a remedy."""

from __future__ import annotations

from memfs.errors import MemfsError


class InvalidRecord(MemfsError):
    """A record name or content (or Global) that memory will not store. Nothing changed."""


class NoSuchRecord(MemfsError):  # noqa: N818 - reads as a sentence
    """The named record is not in the current generation (a mount maps this to ENOENT)."""


class StaleRevision(MemfsError):
    """A compare-and-swap whose expected revision is no longer current. Never merged."""


class MemoryDamaged(MemfsError):
    """A generation on disk whose content does not hash to its recorded revision."""


class SessionError(MemfsError):
    """A session id, turn or import that the session store refuses."""
