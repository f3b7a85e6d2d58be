"""The journal's remembered snapshot of P and P's modes, kept as overlays of the fingerprint
rows: each path once (in the rows' map), not in three maps.

Why: a bound mount keeps its snapshot (fingerprints, evidence, modes) between passes, and a
map keyed by path costs ~21 bytes a file at 20k files and ~38 at 100k, whatever it holds. In
the steady state P is the fingerprint row's own digest (disk and store agreed on what disk
holds, and the walk hashed it) and P's mode is one value for nearly every file. So evidence
is the rows' digests except where it is not (`own`: a P that differs from its row's digest,
an agreed absence, a path with no row) and minus the rows P has no word on (`unset`); the
modes are one `constant` except `own` and minus `unset` (evidence with no mode). Those two
hold the exceptions only: after a take-in they are empty.

Read-only, shared by every thread that reads a PassInputs: an overlay is built under the
journal's lock (memfs.store.journal) and never changed after; a write that changes P, a
mode or a row makes new overlays (`with_rows`, `with_evidence`, `with_modes`), the old ones
stay valid for whoever holds them. Invariants: `own` and `unset` are disjoint, `unset` is
a subset of the base's keys, and a value derived from the base is never None (a P of None,
an agreed absence, is always `own`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, ValuesView
from typing import Any, Protocol, TypeVar

from memfs.pathtable import FingerprintTable

V = TypeVar("V")
_MISSING: Any = object()


class _Row(Protocol):
    @property
    def digest(self) -> str | None: ...


class _Overlay(Mapping[str, V]):
    """A base's keys minus `unset`, plus `own`'s; a value is `own`'s, else derived."""

    __slots__ = ("base", "own", "unset", "lineage", "_len")

    def __init__(self, base: Mapping[str, Any], own: dict[str, V], unset: frozenset[str],
                 lineage: object = None) -> None:
        self.base = base
        self.own = own
        self.unset = unset
        # Shared by the overlays known to hold the same values (one rebased over new rows:
        # `with_rows`), so they compare equal at once, as one map compared to itself did.
        self.lineage = object() if lineage is None else lineage
        self._len = len(base) - len(unset) + sum(1 for p in own if p not in base)

    def __getitem__(self, path: str) -> V:
        got = self.get(path, _MISSING)
        if got is _MISSING:
            raise KeyError(path)
        return got

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path, _MISSING) is not _MISSING

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        own, unset, base = self.own, self.unset, self.base
        for p in base:
            if p not in unset:
                yield p
        for p in own:
            if p not in base:
                yield p

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __eq__(self, other: object) -> bool:
        if same_values(self, other):
            return True
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


def same_values(a: object, b: object) -> bool:
    """Are a and b one overlay, or overlays made to hold the same values (no comparison)?"""
    return a is b or (isinstance(a, _Overlay) and type(a) is type(b)
                      and a.lineage is b.lineage)  # type: ignore[attr-defined]


class _Values(ValuesView[V]):
    """`None in values()` from the exceptions alone: a derived value is never None (P's
    "is any row an agreed absence", asked once per snapshot: memfs.backing.gather)."""

    _mapping: _Overlay[V]

    def __contains__(self, value: object) -> bool:
        if value is None:
            return None in self._mapping.own.values()
        return super().__contains__(value)


class EvidenceOverlay(_Overlay[str | None]):
    """P: path -> the agreed digest (None: agreed absence), over the fingerprint rows."""

    __slots__ = ()

    def get(self, path: str, default: Any = None) -> Any:
        own = self.own
        if path in own:
            return own[path]
        if path in self.unset:
            return default
        return _digest(self.base, path, default)


class ModeOverlay(_Overlay[int]):
    """P's modes: path -> permission bits, over the evidence; `constant` for every evidence
    path not in `own` or `unset` (None: no constant, the modes are `own` alone)."""

    __slots__ = ("constant",)

    def __init__(self, base: Mapping[str, Any], own: dict[str, int], unset: frozenset[str],
                 constant: int | None, lineage: object = None) -> None:
        self.constant = constant
        super().__init__(base, own, unset, lineage)
        if constant is None:
            self._len = len(own)

    def __iter__(self) -> Iterator[str]:
        return iter(self.own) if self.constant is None else super().__iter__()

    def get(self, path: str, default: Any = None) -> Any:
        own = self.own
        if path in own:
            return own[path]
        if self.constant is None or path in self.unset or path not in self.base:
            return default
        return self.constant


def build(rows: Mapping[str, _Row], evidence: Iterable[tuple[str, str | None, int | None]],
          ) -> tuple[EvidenceOverlay, ModeOverlay]:
    """The overlays of a snapshot read from SQLite: `rows` (path -> fingerprint row) and the
    evidence rows (path, digest or None, mode or None), paths and digests already interned
    and modes already shared ints."""
    own: dict[str, str | None] = {}
    given: dict[str, int | None] = {}
    for p, d, m in evidence:
        given[p] = m
        if d is None or _digest(rows, p, _MISSING) != d:
            own[p] = d
    ev = EvidenceOverlay(rows, own, frozenset(p for p in rows if p not in given))
    counts = Counter(m for m in given.values() if m is not None)
    if not counts:
        return ev, ModeOverlay(ev, {}, frozenset(), None)
    common = counts.most_common(1)[0][0]
    modes = {p: m for p, m in given.items() if m is not None and m != common}
    return ev, ModeOverlay(ev, modes, frozenset(p for p, m in given.items() if m is None),
                           common)


def _compact(d: dict[str, V]) -> dict[str, V]:
    """A copy sized for what `d` holds now: a dict keeps its table when entries are popped
    (a take-in's P is `own` until its rows are written, ~20k entries at 20k files, then none)."""
    return dict(d) if d else {}


def _digest(rows: Mapping[str, Any], path: str, default: Any) -> Any:
    """The row's digest for `path` (`default`: no row); a table gives it without a record."""
    if type(rows) is FingerprintTable:
        return rows.digest_of(path, default)
    row = rows.get(path)
    return default if row is None else row.digest


def _place(own: dict[str, str | None], unset: set[str], path: str, value: Any,
           rows: Mapping[str, Any]) -> None:
    """Put `path`'s P (`value`, or _MISSING for none) where it belongs over its row."""
    own.pop(path, None)
    unset.discard(path)
    digest = _digest(rows, path, _MISSING)
    if value is _MISSING:
        if digest is not _MISSING:
            unset.add(path)
    elif value is None or digest is _MISSING or digest != value:
        own[path] = value


def with_rows(ev: EvidenceOverlay, rows: Mapping[str, _Row],
              changed: Iterable[str]) -> EvidenceOverlay:
    """The same P over new fingerprint rows, which differ from the old base at `changed`
    (the same values: the same lineage)."""
    own, unset = dict(ev.own), set(ev.unset)
    for p in changed:
        _place(own, unset, p, ev.get(p, _MISSING), rows)
    return EvidenceOverlay(rows, ev.own if own == ev.own else _compact(own),
                           ev.unset if unset == ev.unset else frozenset(unset), ev.lineage)


def with_evidence(ev: EvidenceOverlay, updates: Mapping[str, str | None]) -> EvidenceOverlay:
    """P with `updates` (path -> digest, None: agreed absence) recorded."""
    own, unset, rows = dict(ev.own), set(ev.unset), ev.base
    for p, d in updates.items():
        _place(own, unset, p, d, rows)
    return EvidenceOverlay(rows, _compact(own), frozenset(unset))


def with_modes(md: ModeOverlay, ev: EvidenceOverlay, updates: Mapping[str, int | None],
               recorded: Iterable[str] = ()) -> ModeOverlay:
    """The modes over the evidence `ev` (md's, or md's with P `recorded` for more paths),
    with `updates` (path -> bits, None: no mode) recorded; a path P was recorded for with no
    mode update has none. Modes with no constant yet take the commonest of the updates when
    the old evidence was empty (a mount's first take-in). Over evidence of md's values with
    nothing recorded: md's values, its lineage."""
    if not updates and not recorded and same_values(md.base, ev):
        return ModeOverlay(ev, md.own, md.unset, md.constant, md.lineage)
    constant, own, unset = md.constant, dict(md.own), set(md.unset)
    if constant is None and len(md.base) == 0:
        counts = Counter(m for m in updates.values() if m is not None)
        if counts:
            constant = counts.most_common(1)[0][0]
    if constant is not None:
        old = md.base
        unset.update(p for p in recorded if p not in old and p not in updates and p in ev)
    for p, m in updates.items():
        own.pop(p, None)
        unset.discard(p)
        if constant is None:
            if m is not None:
                own[p] = m
        elif m is None:
            if p in ev:
                unset.add(p)
        elif m != constant or p not in ev:
            own[p] = m
    return ModeOverlay(ev, _compact(own), frozenset(unset), constant)


__all__ = ["EvidenceOverlay", "ModeOverlay", "build", "with_evidence", "with_modes",
           "with_rows"]
