"""How the backing journal's columns hold paths and absent values (memfs.store.journal and
its write-ahead intents, memfs.store.journal_intents, share them). Pure functions.
"""

from __future__ import annotations

ABSENT_COL = ""  # how an absent old/new/prior value is stored in journal_intents


def db_param(path: str) -> str | bytes:
    """A path as a parameter (bound as CAST(? AS TEXT)): a name that is not UTF-8 (a
    surrogate escape, as the walk and the store keep it) goes in as its bytes, so the column
    holds the name's own bytes; everything else as the text it is (existing journals: the same
    bytes either way)."""
    if path.isascii():
        return path
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape")
    return path


def text(raw: bytes) -> str:
    """The connection's text_factory: a column holding a name that is not UTF-8 reads back as
    its surrogate escape (the default factory refuses the whole query over one such row)."""
    return raw.decode("utf-8", "surrogateescape")
