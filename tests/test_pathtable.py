"""The disk side's path table (memfs.pathtable): rows kept as an index per path and `array`
columns must read back exactly as a plain dict of the same rows would, through any sequence of
writes and drops (each a new table by `patched`), and an older table must stay as it was."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.pathtable import FingerprintTable, Row

PATHS = [f"d/f{i}" for i in range(8)] + ["e/g", "x", "d"]
DIGESTS = ["0" * 32, "ab" * 16, "f" * 32, "AB" * 16, "short", None]  # hex and odd ones
KINDS = ["text", "binary", "oversize", "hardlink"]
MIMES = [None, "text/plain", "image/png", "application/octet-stream"]
I64 = st.integers(-(1 << 63), (1 << 63) - 1)

_rows = st.builds(Row, I64, I64, I64, I64, I64, st.sampled_from(DIGESTS),
                  st.sampled_from(KINDS), I64, st.sampled_from(MIMES))
_ops = st.lists(st.dictionaries(st.sampled_from(PATHS), st.one_of(st.none(), _rows),
                                min_size=1, max_size=5), max_size=12)


def _check(t: FingerprintTable, model: dict[str, Row]) -> None:
    assert len(t) == len(model) and dict(t) == model and t == model
    assert sorted(t) == sorted(model) and len(set(t)) == len(model)
    for p in [*PATHS, "nowhere"]:
        want = model.get(p)
        assert (p in t) == (want is not None)
        assert t.get(p, "-") == (want if want is not None else "-")
        assert t.digest_of(p, "-") == (want.digest if want is not None else "-")
        i = t.at(p)
        assert (i is None) == (want is None)
        if i is not None:
            assert t.paths[i] == p and t.row(i) == want and type(t.row(i)) is Row
            assert t.same_row(i, t, i)


@settings(max_examples=200, deadline=None)
@given(_rows.map(lambda r: {"d/f0": r}), _ops)
def test_a_patched_table_reads_as_a_plain_dict(first, ops) -> None:
    """Each write makes a new table; every one of them, and a table built afresh from the
    same rows, reads as the model; the older tables read as they did; a path keeps its index
    across patches while it lives, and same_row tells equal rows from changed ones."""
    t = FingerprintTable.build(first.items())
    model = dict(first)
    history = [(t, dict(model))]
    for changes in ops:
        new = t.patched(changes.items())
        for p, r in changes.items():
            if r is None:
                model.pop(p, None)
            else:
                model[p] = r
        _check(new, model)
        _check(FingerprintTable.build(model.items()), model)
        assert new.lineage is t.lineage  # small tables are never rebuilt
        for p in model:
            i = t.at(p)
            if i is not None:
                assert new.at(p) == i  # a living path keeps its index
                assert new.same_row(i, t, i) == (t.row(i) == model[p])
        t = new
        history.append((t, dict(model)))
    for old, want in history:
        _check(old, want)
    # A patch of an older table (the tables of a lineage share their index): each branch
    # reads as its own model, and leaves every other table as it was.
    extra = {"new/p": first["d/f0"], PATHS[-1]: first["d/f0"]}
    branches = [(old.patched(extra.items()), {**want, **extra}) for old, want in history]
    for t, want in [*history, *branches]:
        _check(t, want)


def test_a_table_mostly_dropped_is_built_afresh() -> None:
    """Dead rows are not kept forever: once most of a large table is dropped, the patch is a
    new table (a new lineage, its own indices) holding only the living rows."""
    row = Row(1, 2, 3, 4, 5, "ab" * 16, "text", 6, "text/plain")
    t = FingerprintTable.build((f"p{i}", row._replace(size=i)) for i in range(3000))
    kept = t.patched((f"p{i}", None) for i in range(1000))
    assert kept.lineage is t.lineage and len(kept.paths) == 3000
    small = kept.patched((f"p{i}", None) for i in range(1000, 2000))
    assert small.lineage is not t.lineage and len(small.paths) == len(small) == 1000
    assert dict(small) == {f"p{i}": row._replace(size=i) for i in range(2000, 3000)}
    assert len(t) == 3000 and t["p5"].size == 5  # the old table as it was
