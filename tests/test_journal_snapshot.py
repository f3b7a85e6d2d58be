"""The journal's snapshot keeps P and its modes as overlays of the fingerprint rows
(memfs.store.journal_snapshot): each read must give what the plain maps of before gave, through
any sequence of writes the journal patches the snapshot with, and the steady state (P the rows'
digests, one mode) must hold no map a file of its own."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.store.journal import FingerprintRow, Journal

PATHS = [f"d/f{i}" for i in range(6)] + ["e/g", "x"]
DIGESTS = ["a" * 32, "b" * 32, "c" * 32]


def _row(digest: str, i: int) -> FingerprintRow:
    return FingerprintRow(5, 10**18 + i, 10**18 + i, 100 + i, 66305, digest, "text",
                          10**18 + 99, "text/plain")


_ops = st.lists(st.one_of(
    st.tuples(st.just("fp"), st.dictionaries(st.sampled_from(PATHS), st.one_of(
        st.none(), st.sampled_from(DIGESTS)), min_size=1, max_size=4)),
    st.tuples(st.just("ev"), st.dictionaries(st.sampled_from(PATHS), st.tuples(
        st.one_of(st.none(), st.sampled_from(DIGESTS)),
        st.one_of(st.none(), st.sampled_from([0o644, 0o755, 0o600]))), min_size=1, max_size=4)),
    st.tuples(st.just("done"), st.sampled_from(PATHS), st.one_of(st.none(),
                                                                 st.sampled_from(DIGESTS))),
), max_size=12)


def _check(got: object, fps: dict, ev: dict, modes: dict) -> None:
    assert dict(got.fingerprints) == fps  # type: ignore[attr-defined]
    for name, want in (("evidence", ev), ("modes", modes)):
        m = getattr(got, name)
        assert dict(m) == want and len(m) == len(want), name
        assert sorted(m) == sorted(want) and sorted(m.keys()) == sorted(want.keys())
        assert (None in m.values()) == (None in want.values())
        for p in [*PATHS, "nowhere"]:
            assert (p in m) == (p in want) and m.get(p, "-") == want.get(p, "-"), (name, p)


@settings(max_examples=150, deadline=None)
@given(_ops, st.sampled_from(["", "d"]))
def test_a_patched_snapshot_reads_as_the_plain_maps(tmp_path_factory, ops, prefix) -> None:
    """Each write patches the snapshot (rows, P, modes; an intent's completion); every read
    of the patched snapshot, and of one read afresh from SQLite, equals the model's maps."""
    j = Journal(Path(tmp_path_factory.mktemp("j")) / "store.db")
    fps: dict = {}
    ev: dict = {}
    modes: dict = {}
    under = (lambda p: p == prefix or p.startswith(prefix + "/")) if prefix else (lambda p: True)
    j.pass_inputs("work", prefix)  # a snapshot current when the writes begin: patched by them
    for n, op in enumerate(ops):
        if op[0] == "fp":
            rows = {p: None if d is None else _row(d, n) for p, d in op[1].items()}
            j.put_fingerprints("work", rows)
            for p, r in rows.items():
                if r is None:
                    fps.pop(p, None)
                else:
                    fps[p] = r
        elif op[0] == "ev":
            j.record_evidence("work", [(p, d, m) for p, (d, m) in op[1].items()])
            for p, (d, m) in op[1].items():
                ev[p] = d
                if m is None:
                    modes.pop(p, None)
                else:
                    modes[p] = m
        else:
            _, p, new = op
            i = j.begin_intent("work", p, "write", old=None, new=new, mode=0o644)
            j.complete_intent(i)
            ev[p] = new
            if new is None:
                modes.pop(p, None)
            else:
                modes[p] = 0o644
        want = ({p: r for p, r in fps.items() if under(p)},
                {p: d for p, d in ev.items() if under(p)},
                {p: m for p, m in modes.items() if under(p)})
        _check(j.pass_inputs("work", prefix), *want)
    fresh = Journal(j.db_path)
    _check(fresh.pass_inputs("work", prefix),
           {p: r for p, r in fps.items() if under(p)}, {p: d for p, d in ev.items() if under(p)},
           {p: m for p, m in modes.items() if under(p)})
    j.close()
    fresh.close()


def test_agreed_files_cost_no_map_of_their_own(tmp_path: Path) -> None:
    """After a take-in (a row, P its digest, one mode for every file) P and its modes are the
    rows' own keys: no exception kept, read from SQLite or patched by the take-in's writes
    (three maps a file were ~21 bytes each at 20k files, ~38 at 100k)."""
    paths = [f"d{i // 100}/f{i}" for i in range(1000)]
    rows = {p: _row(f"{i:032x}", i) for i, p in enumerate(paths)}
    j = Journal(tmp_path / "store.db")
    j.pass_inputs("work")
    j.put_fingerprints("work", dict(rows))
    j.record_evidence("work", [(p, r.digest, 0o644) for p, r in rows.items()])
    j.record_evidence("work", [("gone.txt", None, None), (paths[0], rows[paths[0]].digest, 0o755)])
    for got in (j.pass_inputs("work"), Journal(tmp_path / "store.db").pass_inputs("work")):
        ev, modes = got.evidence, got.modes
        assert len(ev) == 1001 and ev[paths[5]] == rows[paths[5]].digest
        assert ev["gone.txt"] is None and modes[paths[0]] == 0o755 and modes[paths[9]] == 0o644
        assert ev.own == {"gone.txt": None} and not ev.unset  # type: ignore[attr-defined]
        assert modes.own == {paths[0]: 0o755}  # type: ignore[attr-defined]
        assert modes.unset == {"gone.txt"}  # type: ignore[attr-defined]


def _tables(obj: object, skip: set[int]) -> int:
    """Bytes of the maps and sets `obj` reaches (not the ones in `skip`, nor their items)."""
    import gc
    import sys

    total, todo, seen = 0, [obj], set(skip)
    while todo:
        o = todo.pop()
        if id(o) in seen or not isinstance(o, dict | set | frozenset | Mapping):
            continue
        seen.add(id(o))
        if isinstance(o, dict | set | frozenset):
            total += sys.getsizeof(o)
        todo.extend(x for x in gc.get_referents(o) if isinstance(x, dict | set | frozenset | Mapping))
    return total


def test_a_snapshot_keeps_one_map_a_file(tmp_path: Path) -> None:
    """A taken-in mount's snapshot (every file agreed, one mode), read from SQLite or patched
    by the take-in's writes: P and its modes reach no map or set a file beyond the rows' own
    map (each was ~30 bytes a file at 10k files)."""
    import gc

    n = 10_000
    j = Journal(tmp_path / "store.db")
    j.pass_inputs("work")
    rows = {f"d{i // 100}/f{i}.txt": _row(f"{i:032x}", i) for i in range(n)}
    j.put_fingerprints("work", rows)
    j.record_evidence("work", [(p, r.digest, 0o644) for p, r in rows.items()])
    for got in (j.pass_inputs("work"), Journal(tmp_path / "store.db").pass_inputs("work")):
        assert len(got.evidence) == len(got.modes) == len(got.fingerprints) == n
        fps = got.fingerprints
        skip = {id(fps), *(id(x) for x in gc.get_referents(fps))}  # the proxy and its dict
        per = (_tables(got.evidence, skip) + _tables(got.modes, skip)) / n
        assert per < 4, f"P and its modes: {per:.0f} B a file of maps"  # 42 before


def test_a_scoped_read_reads_the_rows_in_its_scope_not_the_mounts(tmp_path: Path) -> None:
    """A lookup of a new name in a bound mount reads P and the fingerprints at that one path;
    the statement's `path = ? OR (path >= ? AND path < ?)` made SQLite search by mount alone
    and read every row of it (8 ms at 55,000 files, so each file a tool made there cost more
    the larger the directory bound). Counted in SQLite's own steps, not timed: a scoped read
    costs the same at 200 rows as at 20,000, and reads what the prefix names (the row, the
    rows below it; a sibling that shares the prefix's letters is not one)."""
    import sqlite3

    def steps(j: Journal, prefix: str) -> tuple[int, int, set[str]]:
        def q(c: sqlite3.Connection) -> tuple[int, int, set[str]]:
            n = [0]

            def count() -> int:
                n[0] += 1
                return 0
            c.set_progress_handler(count, 100)
            try:
                ev = {p for p, _d, _m in Journal._evidence_rows(c, "work", prefix)}
                ev_steps, n[0] = n[0], 0
                fps = set(dict(Journal._fingerprint_rows(c, "work", prefix)))
                assert fps == ev
                return ev_steps, n[0], ev
            finally:
                c.set_progress_handler(None, 0)
        return j._read(q)

    got = []
    for files in (200, 20_000):
        j = Journal(tmp_path / f"{files}.db")
        paths = [f"d{i // 100}/f{i}" for i in range(files)] + ["d0/f1/under", "d0/f1.txt"]
        rows = {p: _row(f"{i:032x}", i) for i, p in enumerate(paths)}
        j.put_fingerprints("work", rows)
        j.record_evidence("work", [(p, r.digest, 0o644) for p, r in rows.items()])
        ev_steps, fp_steps, seen = steps(j, "d0/f1")
        assert seen == {"d0/f1", "d0/f1/under"}  # not d0/f10 or d0/f1.txt
        assert steps(j, "d1/f100")[2] == {"d1/f100"}
        got.append((ev_steps, fp_steps))
    (small_ev, small_fp), (big_ev, big_fp) = got
    assert big_ev <= small_ev + 2 and big_fp <= small_fp + 2, got
