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


def at_or_below(select: str) -> str:
    """`select` (a statement without WHERE over a table keyed by (mount, path)) limited to a
    mount's rows at or below a prefix: the row itself, then the range below it ('0' follows
    '/'), as two searches of the key. One `path = ? OR (path >= ? AND path < ?)` made SQLite
    search by mount alone, so every row of the mount was read: 8 ms a statement at 55,000
    files, twice for each lookup of a new name in a bound mount. Parameters: at_or_below_args."""
    return (f"{select} WHERE mount=? AND path=CAST(? AS TEXT) UNION ALL {select} "
            "WHERE mount=? AND path >= CAST(? AS TEXT) AND path < CAST(? AS TEXT)")


def at_or_below_args(mount: str, prefix: str) -> tuple[str, str | bytes, str, str | bytes,
                                                        str | bytes]:
    """The parameters of an at_or_below statement."""
    return (mount, db_param(prefix), mount, db_param(prefix + "/"), db_param(prefix + "0"))
