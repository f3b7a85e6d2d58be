"""Branch intent bytes: round trip, and damage never reads as absent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.reconcile import intent
from memfs.reconcile.rule import (
    ABSENT,
    Action,
    Conflict,
    Content,
    PathIntent,
    State,
    decide,
)

TABLE = {
    "gone.txt": PathIntent(tombstone=True),
    "new.txt": PathIntent(origin_store=True),
    "c/x.md": PathIntent(conflict=Conflict("both-changed", "b" * 32)),
    "d.txt": PathIntent(conflict=Conflict("deleted-on-disk", None)),
}


def test_round_trip_and_canonical():
    data = intent.encode(TABLE)
    table = intent.decode(data)
    assert not table.damaged
    assert dict(table.entries) == TABLE
    assert intent.encode(dict(reversed(list(TABLE.items())))) == data  # canonical
    assert intent.decode(intent.EMPTY).get("anything") == PathIntent()


def test_damage_is_unverified_for_every_path():
    data = intent.encode(TABLE)
    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    for bad in (None, b"", b"{}", data[:-1], bytes(flipped), b"x" + data):
        table = intent.decode(bad)
        assert table.damaged
        for path in ("gone.txt", "never-seen.txt"):
            assert table.get(path).damaged
    # The tombstone's protection survives damage: the rule will not take the disk copy back.
    dec = decide(Content("a" * 32), ABSENT, "a" * 32, intent.decode(bytes(flipped)).get("gone.txt"))
    assert dec.action == Action.UNVERIFIED and dec.state == State.UNVERIFIED


def test_path_sync_replaces_one_entry_of_a_damaged_table():
    t = intent.decode(b"garbage").with_entry("a.txt", PathIntent(tombstone=True))
    t = t.with_entry("b.txt", None)
    assert t.get("a.txt") == PathIntent(tombstone=True)
    assert t.get("b.txt") == PathIntent()  # synced, and nothing to say
    assert t.get("c.txt").damaged  # every other path stays unverified...
    again = intent.decode(intent.encode(t))  # ...across a commit too
    assert again.get("a.txt") == PathIntent(tombstone=True) and again.get("b.txt") == PathIntent()
    assert again.get("c.txt").damaged


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=0, max_value=10_000))
def test_any_corruption_is_damaged_or_identical(noise: bytes, at: int):
    data = intent.encode(TABLE)
    at %= len(data)
    mutated = data[:at] + noise + data[at + len(noise):]
    table = intent.decode(mutated)
    assert table.damaged or dict(table.entries) == TABLE
