"""A chunk stored as the changes from the chunks it replaced: the bytes a small write to a
big file costs in the store, instead of its whole 1 MiB piece again.

A chunk keeps its name (the digest of its full content: manifests, dedup and fixed piece
positions see no difference); only how its bytes are kept differs. A delta is a *patch* (the
byte ranges that differ from the version before it, found by comparing the two in BLOCK
pieces and trimming each changed run to its first and last differing byte) over a flat list
of what it is read through: a full base chunk, then the patches of the versions between the
base and it, oldest first. Each is stored once (the previous version's own row), so a piece
changed a little at every commit costs what changed each time, not everything since its
base: a log appended a line per commit grows the store by the lines, not quadratically.

The list is flat and every entry is a patch or the base: a read is the base plus at most
MAX_LAYERS small patches, never a chain of rebuilds. Past MAX_LAYERS, or when the patches add
up to more than the chunk itself, the next version is patched against the base alone (when
that patch is under 1/FRACTION of the chunk) or stored whole, and becomes the next base.

A patch, little-endian: u32 length, u32 count, count x (u32 offset, u32 size), then the
ranges' bytes in that order. Applied to the bytes before it: cut (or zero-extended) to the
length, then the ranges written; the bytes past the previous version's end are always in a
range.

Both stores keep chunks this way and call the same functions: `encode` decides a replacing
chunk's stored form (the embedded store, memfs.store.chunks; PostgreSQL, memfs.store.pg.tx),
`rebuild` and `read_range` read it back. `over` is kept as the ids separated by spaces (NULL:
stored whole) in both stores' `chunks` rows.

No state: pure functions, called from the commit thread (encode, make) and any reader (apply).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

BLOCK = 4096  # compared as a unit: an unchanged block costs one slice comparison
MERGE_GAP = 64  # ranges closer than this are one range (a range's header is 8 bytes)
MIN_CHUNK = 8 << 10  # smaller chunks are stored whole: a delta could save only a few KiB
FRACTION = 4  # a patch over 1/FRACTION of the chunk's length: stored whole instead
MAX_LAYERS = 64  # patches a read applies over the base, at most

_HEAD = struct.Struct("<II")
_RANGE = struct.Struct("<II")


def worth_trying(size: int) -> bool:
    return size >= MIN_CHUNK


def split_over(over: str | None) -> tuple[str, ...]:
    """The `over` column (ids separated by spaces; NULL: stored whole) as a tuple."""
    return tuple(over.split()) if over else ()


def join_over(over: tuple[str, ...]) -> str | None:
    return " ".join(over) if over else None


def encode(data: bytes, old: str, old_over: tuple[str, ...], patched: Callable[[], int],
           full: Callable[[str], bytes | None]) -> tuple[bytes, tuple[str, ...]]:
    """How to store `data`, which replaces the committed chunk `old` (read through
    `old_over`): (the bytes to store, what they are read through). A patch over `old` and
    what `old` is read through; once that list is MAX_LAYERS long or its patches add up to
    more than the chunk saves, a patch over `old`'s base alone; else whole, `(data, ())`.

    `patched()` is the bytes of the patches a read of `old` applies (its own and those
    between; asked only when needed), `full(id)` a chunk's full bytes, or None when the
    caller cannot have them cheaply (that form is then not tried)."""
    if not worth_trying(len(data)):
        return data, ()
    if not old_over:  # old is whole: it is the base
        return _over(data, full(old), (old,))
    chain = (*old_over, old)
    if len(chain) - 1 < MAX_LAYERS:
        limit = min(len(data) // FRACTION, len(data) - patched())
        prev = full(old) if limit > 0 else None
        blob = make(prev, data, limit) if prev is not None else None
        if blob is not None:
            return blob, chain
    base = old_over[0]
    return _over(data, full(base), (base,))


def _over(data: bytes, prev: bytes | None,
          over: tuple[str, ...]) -> tuple[bytes, tuple[str, ...]]:
    blob = make(prev, data) if prev is not None else None
    return (data, ()) if blob is None else (blob, over)


def make(prev: bytes, new: bytes, limit: int | None = None) -> bytes | None:
    """The patch taking `prev` to `new`, or None when it would exceed `limit` bytes (by
    default 1/FRACTION of `new`: storing `new` whole is then the better deal)."""
    limit = len(new) // FRACTION if limit is None else limit
    runs = _changed(prev, new, limit)
    if runs is None:
        return None
    head = _HEAD.pack(len(new), len(runs)) + b"".join(_RANGE.pack(a, b - a) for a, b in runs)
    return head + b"".join(new[a:b] for a, b in runs)


def _changed(base: bytes, new: bytes, limit: int) -> list[tuple[int, int]] | None:
    """The ranges of `new` that differ from `base` (None once they pass `limit` bytes)."""
    n, m = len(new), len(base)
    runs: list[tuple[int, int]] = []
    total = _HEAD.size
    for off in range(0, n, BLOCK):
        end = min(off + BLOCK, n)
        if end <= m and new[off:end] == base[off:end]:
            continue
        inside = min(end, m)  # the part of the block the base has
        a = off + _common_prefix(new[off:inside], base[off:inside]) if off < inside else off
        b = end - _common_suffix(new[a:end], base[a:end]) if end <= m else end
        if runs and a - runs[-1][1] <= MERGE_GAP:
            prev = runs.pop()
            total -= prev[1] - prev[0] + _RANGE.size
            a = prev[0]
        runs.append((a, b))
        total += b - a + _RANGE.size
        if total > limit:
            return None
    return runs


def _common_prefix(x: bytes, y: bytes) -> int:
    """How many leading bytes two equal-length byte strings share (a binary search of slice
    comparisons: a dozen memcmps, no Python loop over bytes)."""
    lo, hi = 0, len(x)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[:mid] == y[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(x: bytes, y: bytes) -> int:
    lo, hi = 0, len(x)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[len(x) - mid:] == y[len(y) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _ranges(blob: bytes) -> tuple[int, list[tuple[int, int, int]]]:
    """The chunk's length and its ranges as (offset, size, where its bytes start in blob)."""
    if len(blob) < _HEAD.size:
        raise ValueError("a delta shorter than its header")
    length, count = _HEAD.unpack_from(blob, 0)
    pos = _HEAD.size + count * _RANGE.size
    out = []
    for i in range(count):
        off, size = _RANGE.unpack_from(blob, _HEAD.size + i * _RANGE.size)
        out.append((off, size, pos))
        pos += size
    if pos != len(blob) or any(off + size > length for off, size, _ in out):
        raise ValueError("a delta whose ranges do not add up to its length")
    return length, out


def length(blob: bytes) -> int:
    return _HEAD.unpack_from(blob, 0)[0]


def apply(prev: bytes, blob: bytes) -> bytes:
    """The bytes `blob` makes of `prev` (the version before it)."""
    size, ranges = _ranges(blob)
    out = bytearray(prev[:size])
    if len(out) < size:
        out.extend(bytes(size - len(out)))
    for off, n, pos in ranges:
        out[off:off + n] = blob[pos:pos + n]
    return bytes(out)


def rebuild(base: bytes, patches: list[bytes]) -> bytes:
    """The chunk: the base with each patch applied in order."""
    data = base
    for blob in patches:
        data = apply(data, blob)
    return data


def assemble(chunk_id: str, own: bytes, over: tuple[str, ...],
             stored: Mapping[str, bytes]) -> bytes:
    """A chunk from its stored bytes `own` and the stored bytes of what it is read through
    (`stored`, by id); KeyError naming what is missing."""
    if not over:
        return own
    lacking = [dep for dep in over if dep not in stored]
    if lacking:
        raise KeyError(f"chunk {chunk_id} is stored as a patch over chunks the store lacks "
                       f"({', '.join(lacking)})")
    return rebuild(stored[over[0]], [*(stored[dep] for dep in over[1:]), own])


def read_range(patches: list[bytes], start: int, count: int,
               base_range: Callable[[int, int], bytes]) -> bytes:
    """Bytes [start, start+count) of the chunk (`patches` over a base), clipped to it,
    reading from the base only the part asked for (`base_range(start, count)`, clipped to the
    base by the caller)."""
    end = start + max(0, count)
    out = bytearray(base_range(start, max(0, count)))
    out.extend(bytes(end - start - len(out)))
    size = 0
    for blob in patches:
        size, ranges = _ranges(blob)
        if size < end:  # cut: what lies past this version's end is gone (zeros if regrown)
            cut = max(0, size - start)
            out[cut:] = bytes(len(out) - cut)
        for off, n, pos in ranges:
            a, b = max(off, start), min(off + n, end)
            if a < b:
                out[a - start:b - start] = blob[pos + a - off:pos + b - off]
    return bytes(out[:max(0, min(end, size) - start)])
