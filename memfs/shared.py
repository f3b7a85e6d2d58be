"""One object per repeated value, for what memfs keeps per file: CPython shares only the ints
-5..256, so a time, a size or a device number equal across files is otherwise a 32-byte int
of its own in every record that holds it (a bound mount keeps records per file: the walk's,
the journal's snapshot).

`shared_int` hands out the first object seen for a value from a bounded table, emptied when
full (a miss only costs the sharing). Any thread: a dict's get and set are atomic under the
interpreter lock, and a race loses at most an entry.
"""

from __future__ import annotations

_INTS: dict[int, int] = {}
INTS_KEPT = 1 << 14


def shared_int(v: int) -> int:
    if -5 <= v <= 256:
        return v
    got = _INTS.get(v)
    if got is None:
        if len(_INTS) >= INTS_KEPT:
            _INTS.clear()
        got = _INTS[v] = v
    return got
