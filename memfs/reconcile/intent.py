"""Branch intent as bytes: tombstones, store origin and conflicts (with their disk side).

Why a value: this intent must rewind with the branch — an undo that brings a file back must
also bring back its lack of a tombstone — so the store keeps these bytes per mount in each
commit, next to the tree they qualify. Why a checksum: a damaged intent must never read as
"no intent", because no tombstone means a disk copy may be taken in again (a resurrected
deletion) and no conflict means a draft may be written over a disk edit. Damaged bytes decode
to a table where every path is unverified until a path sync replaces its entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from memfs.reconcile.rule import Conflict, PathIntent

MAGIC = b"memfs-intent/1\n"
_DIGEST = 16  # BLAKE2b-128 over the body


@dataclass(frozen=True)
class IntentTable:
    """Per-path branch intent of one mount.

    A damaged table knows only the paths replaced since the damage was found (`entries` then
    holds just those); every other lookup reads as unverified.
    """

    entries: Mapping[str, PathIntent] = field(default_factory=dict)
    damaged: bool = False
    why: str = ""
    replaced: frozenset[str] = frozenset()

    def get(self, path: str) -> PathIntent:
        if self.damaged and path not in self.replaced:
            return PathIntent(damaged=True)
        return self.entries.get(path, PathIntent())

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def with_entry(self, path: str, intent: PathIntent | None) -> IntentTable:
        """A copy with `path` set (or cleared, for None / an empty intent): what a path sync
        does. On a damaged table this makes that one path known again."""
        entries = dict(self.entries)
        if intent is None or _empty(intent):
            entries.pop(path, None)
        else:
            entries[path] = intent
        replaced = self.replaced | {path} if self.damaged else frozenset()
        return IntentTable(entries, self.damaged, self.why, replaced)


def _empty(i: PathIntent) -> bool:
    return not (i.tombstone or i.origin_store or i.conflict or i.damaged or i.restored)


def member(path: str, i: PathIntent) -> bytes:
    """One entry as `encode` writes it in the body (`"path":[tomb,origin,conflict]`), or b""
    for an empty intent, which it leaves out. A holder that keeps these in path order builds
    the same bytes with `encode_members`, paying for the entries that changed only."""
    if _empty(i):
        return b""
    c = [i.conflict.kind, i.conflict.disk] if i.conflict else None
    return (json.dumps(path) + ":" + json.dumps([int(i.tombstone), int(i.origin_store), c],
                                                  separators=(",", ":"))).encode()


def encode_members(members: Iterable[bytes]) -> bytes:
    """`encode` of an undamaged table from its entries' `member` bytes in path order (the
    order json's sort_keys gives): the same bytes, joined instead of built again."""
    raw = b'{"e":{' + b",".join(filter(None, members)) + b"}}"
    return MAGIC + hashlib.blake2b(raw, digest_size=_DIGEST).hexdigest().encode() + b"\n" + raw


def encode(table: IntentTable | Mapping[str, PathIntent]) -> bytes:
    """Canonical bytes (sorted, compact JSON) behind a magic line and a BLAKE2b checksum.
    Damage is carried forward: a damaged table encodes as damaged with its replaced paths.
    Pending intents are not part of it: they live in the global journal."""
    if isinstance(table, IntentTable):
        entries, damaged, replaced = table.entries, table.damaged, table.replaced
    else:
        entries, damaged, replaced = table, False, frozenset()
    body: dict[str, list[object]] = {}
    for path in sorted(entries):
        i = entries[path]
        if _empty(i):
            continue
        c = [i.conflict.kind, i.conflict.disk] if i.conflict else None
        body[path] = [int(i.tombstone), int(i.origin_store), c]
    doc: dict[str, object] = {"e": body}
    if damaged:
        doc["damaged"] = sorted(replaced)
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return MAGIC + hashlib.blake2b(raw, digest_size=_DIGEST).hexdigest().encode() + b"\n" + raw


def decode(data: bytes | None) -> IntentTable:
    """Bytes back to a table. Missing, truncated, altered or foreign bytes → a damaged table."""
    if data is None:
        return IntentTable(damaged=True, why="intent missing")
    if not data.startswith(MAGIC):
        return IntentTable(damaged=True, why="not an intent")
    rest = data[len(MAGIC):]
    head, sep, raw = rest.partition(b"\n")
    if not sep or hashlib.blake2b(raw, digest_size=_DIGEST).hexdigest().encode() != head:
        return IntentTable(damaged=True, why="checksum mismatch")
    try:
        doc = json.loads(raw)
        entries = {}
        for path, (tomb, origin, c) in doc["e"].items():
            conflict = Conflict(str(c[0]), None if c[1] is None else str(c[1])) if c else None
            entries[str(path)] = PathIntent(bool(tomb), bool(origin), conflict)
        if "damaged" in doc:
            return IntentTable(entries, True, "damaged earlier",
                               frozenset(str(p) for p in doc["damaged"]))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return IntentTable(damaged=True, why="malformed intent")
    return IntentTable(entries)


EMPTY = encode({})
"""The intent of a mount with nothing to say (a new mount's first commit)."""
