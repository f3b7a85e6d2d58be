"""The closed proposal parser: exact schema, evidence against the projection, canonical form."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers.memory import snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfs.consolidate.proposal import ProposalError, parse_proposal
from memfs.memory.generation import global_revision
from memfs.memory.preview import preview_workspace_changes
from memfs.memory.sessions import FrozenSession, SessionStore
from memfs.memory.store import MemoryStore

# Session A: 1 user, 2 assistant, 3 user, 4 tool (hidden), 5 assistant, 6 user.
TURNS_A = [("user", "hi"), ("assistant", "hello"), ("user", "use tabs, width 4"),
           ("tool", "ls: a b"), ("assistant", "noted"), ("user", "forget the old note")]
TURNS_B = [("user", "other"), ("tool", "x")]
RECORDS = {"alpha": "# Alpha\n", "beta": "# Beta\n- b\n", "gamma": "# Gamma\n"}
VISIBLE_RANGES = [(1, 1), (1, 2), (1, 3), (2, 3), (3, 3), (5, 5), (5, 6), (6, 6)]
NAMES = ["alpha", "beta", "gamma", "delta", "epsilon", "Zeta", "café"]


def _world(tmp: Path) -> tuple[MemoryStore, FrozenSession, FrozenSession]:
    sessions = SessionStore(tmp / "sessions")
    a = sessions.import_turns(TURNS_A, workspace="work")
    b = sessions.import_turns(TURNS_B, workspace="work")
    store = MemoryStore(tmp / "memory")
    for name, content in RECORDS.items():
        store.put_record("work", name, content)
    store.replace_global("# Global\n- English\n")
    return store, sessions.freeze(a), sessions.freeze(b)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemoryStore, FrozenSession,
                                                             FrozenSession]:
    return _world(tmp_path_factory.mktemp("proposal"))


def _valid() -> dict[str, Any]:
    return {"changes": [
        {"op": "put", "name": "editor-preferences", "content": "# Editor\n- Tabs, width 4.\n",
         "evidence": [{"from": 3, "to": 3}]},
        {"op": "delete", "name": "beta", "evidence": [{"from": 5, "to": 6}]},
        {"op": "replace-global", "content": "# Global\n- Answer in English.\n",
         "evidence": [{"from": 1, "to": 1}]}], "final": True}


def _parse(world, raw, session=None):  # noqa: ANN001, ANN202
    store, a, _ = world
    return parse_proposal(raw, session or a, store.workspace_generation("work"),
                          store.global_generation())


def test_the_issue_example_parses_to_canonical_order(world) -> None:  # noqa: ANN001
    p = _parse(world, json.dumps(_valid()))
    assert [(c.op, c.name) for c in p.changes] == [
        ("delete", "beta"), ("put", "editor-preferences"), ("replace-global", None)]
    assert p.final and not p.no_change and len(p.hash) == 64
    assert p.global_content == "# Global\n- Answer in English.\n"
    assert [d.kind for d in p.workspace_preview.diff] == ["deleted", "added"]


@pytest.mark.parametrize(("evidence", "session", "message"), [
    ({"from": 7, "to": 7}, "a", r"range 7-7 is outside session .*turns 1-6"),
    ({"from": 6, "to": 7}, "a", r"range 6-7 is outside"),
    ({"from": 0, "to": 1}, "a", r"range 0-1 is outside"),
    ({"from": -1, "to": 1}, "a", r"range -1-1 is outside"),
    ({"from": 4, "to": 4}, "a", r"range 4-4 covers turn 4, which the evidence projection"),
    ({"from": 3, "to": 5}, "a", r"range 3-5 covers turn 4"),
    ({"from": 3, "to": 2}, "a", r"range 3-2 is reversed"),
    ({"from": 5, "to": 6}, "b", r"range 5-6 is outside session .*turns 1-2"),
    ({"from": 2, "to": 2}, "b", r"range 2-2 covers turn 2"),
    ({"from": "1", "to": 1}, "a", r"must be integers"),
    ({"from": True, "to": 1}, "a", r"must be integers"),
    ({"from": 1.0, "to": 1}, "a", r"must be integers"),
    ({"from": 1}, "a", r"evidence\[1\]\.to: missing field"),
    ({"from": 1, "to": 1, "session": "x"}, "a", r"evidence\[1\]\.session: unknown field"),
])
def test_bad_evidence_is_refused_naming_the_range(world, evidence, session, message) -> None:  # noqa: ANN001
    raw = _valid()
    good = {"from": 5, "to": 5} if session == "a" else {"from": 1, "to": 1}
    raw["changes"][1]["evidence"] = [good, evidence]
    if session == "b":  # the rest of the proposal cites turns that are valid in session B
        for change in raw["changes"][::2]:
            change["evidence"] = [{"from": 1, "to": 1}]
    before = snapshot(world[0].root)
    with pytest.raises(ProposalError, match=message) as info:
        _parse(world, raw, world[1] if session == "a" else world[2])
    assert info.value.field.startswith("changes[1].evidence[1]")
    assert snapshot(world[0].root) == before


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.update(scope="global"), r"^scope: unknown field"),
    (lambda r: r.update(revision="abc"), r"^revision: unknown field"),
    (lambda r: r.pop("final"), r"^final: missing field"),
    (lambda r: r.update(final="yes"), r"^final: must be true or false"),
    (lambda r: r.update(changes=[]), r"^changes: must be a non-empty list"),
    (lambda r: r["changes"][0].update(path="/etc/passwd"), r"changes\[0\]\.path: unknown field"),
    (lambda r: r["changes"][0].update(workspace="x"), r"changes\[0\]\.workspace: unknown"),
    (lambda r: r["changes"][0].pop("evidence"), r"changes\[0\]\.evidence: missing field"),
    (lambda r: r["changes"][0].pop("content"), r"changes\[0\]\.content: missing field"),
    (lambda r: r["changes"][1].update(content="x"), r"changes\[1\]\.content: unknown field"),
    (lambda r: r["changes"][2].update(name="g"), r"changes\[2\]\.name: unknown field"),
    (lambda r: r["changes"][0].update(op="update"), r"changes\[0\]\.op: 'update' is not"),
    (lambda r: r["changes"][0].update(name="../x"), r"changes\[0\]\.name: .*separator"),
    (lambda r: r["changes"][0].update(name="index"), r"changes\[0\]\.name: .*reserved"),
    (lambda r: r["changes"][0].update(content=" \n"), r"changes\[0\]\.content: .*empty"),
    (lambda r: r["changes"][0].update(content="x" * 70000), r"changes\[0\]\.content: .*cap"),
    (lambda r: r["changes"][0].update(evidence=[]), r"changes\[0\]\.evidence: must be a non"),
    (lambda r: r["changes"][1].update(name="nope"), r"changes\[1\]\.name: cannot delete 'nope'"),
    (lambda r: r["changes"][0].update(name="beta"), r"changes\[1\]\.name: 'beta' is already"),
    (lambda r: r["changes"].append(copy.deepcopy(r["changes"][2])),
     r"changes\[3\]: a second replace-global"),
    (lambda r: r["changes"].append({"op": "no-change", "reason": "x"}),
     r"changes: no-change must be the only change"),
    (lambda r: r.update(changes=[{"op": "no-change"}]), r"changes\[0\]: a no-change needs"),
    (lambda r: r.update(changes=[{"op": "no-change", "reason": " "}]),
     r"changes\[0\]\.reason: must be non-blank"),
])
def test_schema_violations_are_named(world, mutate, message) -> None:  # noqa: ANN001
    raw = _valid()
    mutate(raw)
    with pytest.raises(ProposalError, match=message):
        _parse(world, raw)


@pytest.mark.parametrize(("text", "message"), [
    ('{"changes": [], "final": true, "final": false}', r"final: appears twice"),
    ('{"changes": [{"op": "no-change", "reason": "x", "evidence": [{"from": NaN, "to": 1}]}],'
     ' "final": true}', r"NaN"),
    ("[" * 100000, r"not valid JSON"),
    ("", r"not valid JSON"),
    ("[]", r"must be a JSON object"),
])
def test_malformed_text_is_refused(world, text, message) -> None:  # noqa: ANN001
    with pytest.raises(ProposalError, match=message):
        _parse(world, text)


def test_explicit_no_change_and_semantic_no_change(world) -> None:  # noqa: ANN001
    explicit = _parse(world, {"changes": [{"op": "no-change", "reason": "nothing durable",
                                           "evidence": [{"from": 1, "to": 3}]}], "final": True})
    assert explicit.no_change and explicit.reason == "nothing durable"
    same = _parse(world, {"changes": [
        {"op": "put", "name": "alpha", "content": "# Alpha  \r\n\n", "evidence": [
            {"from": 3, "to": 3}]},
        {"op": "replace-global", "content": "# Global\n- English", "evidence": [
            {"from": 1, "to": 1}, {"from": 1, "to": 1}]}], "final": False})
    assert same.no_change and same.workspace_changes == () and same.global_content is None
    assert [e.wire() for e in same.changes[0].evidence] == [{"from": 1, "to": 1},
                                                            {"from": 3, "to": 3}]
    assert not same.final


# ---- properties ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["put", "delete", "no-change", "replace-global",
                                             "op", "name", "content", "evidence", "from", "to"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["changes", "final", "op", "name", "content", "evidence",
                                       "from", "to", "reason", "x"]), children, max_size=5),
    max_leaves=25)

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(raw=json_values)
def test_arbitrary_json_never_crashes_and_changes_nothing(world, raw) -> None:  # noqa: ANN001
    before = snapshot(world[0].root)
    for candidate in (raw, {"changes": raw, "final": True}, {"changes": [raw], "final": True},
                      json.dumps(raw)):
        try:
            p = _parse(world, candidate)
        except ProposalError:
            continue
        assert p.changes and len(p.hash) == 64
    assert snapshot(world[0].root) == before


MUTATIONS = ["drop", "add", "retype", "shift", "dup", "op", "name"]


@SETTINGS
@given(data=st.data())
def test_near_miss_proposals_are_refused_or_valid(world, data) -> None:  # noqa: ANN001
    raw = _valid()
    before = snapshot(world[0].root)
    for _ in range(data.draw(st.integers(1, 3))):
        change = data.draw(st.sampled_from(raw["changes"])) if raw["changes"] else {}
        kind = data.draw(st.sampled_from(MUTATIONS))
        if kind == "drop" and change:
            change.pop(data.draw(st.sampled_from(sorted(change))))
        elif kind == "add":
            change[data.draw(st.sampled_from(["scope", "revision", "path", "name", "reason",
                                              "content"]))] = "x"
        elif kind == "retype" and change:
            change[data.draw(st.sampled_from(sorted(change)))] = data.draw(json_values)
        elif kind == "shift" and isinstance(change.get("evidence"), list) and change["evidence"]:
            rng = change["evidence"][0]
            if isinstance(rng, dict):
                rng[data.draw(st.sampled_from(["from", "to"]))] = data.draw(st.integers(-1, 8))
        elif kind == "dup" and change:
            raw["changes"].append(copy.deepcopy(change))
        elif kind == "op" and change:
            change["op"] = data.draw(st.sampled_from(["put", "delete", "no-change",
                                                      "replace-global", "PUT"]))
        elif kind == "name" and change:
            change["name"] = data.draw(st.sampled_from(NAMES + ["../x", "a/b", "", ".x",
                                                                "index", "x\x00"]))
    try:
        p = _parse(world, raw)
    except ProposalError as exc:
        assert exc.field is not None and str(exc)
    else:
        visible = world[1].visible_turns
        for c in p.changes:
            for e in c.evidence:
                assert all(t in visible for t in range(e.start, e.end + 1))
    assert snapshot(world[0].root) == before


@st.composite
def valid_changes(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=5))
    changes: list[dict[str, Any]] = []
    for name in names:
        evidence = [{"from": a, "to": b} for a, b in
                    draw(st.lists(st.sampled_from(VISIBLE_RANGES), min_size=1, max_size=3))]
        if name in RECORDS and draw(st.booleans()):
            changes.append({"op": "delete", "name": name, "evidence": evidence})
        else:
            content = draw(st.sampled_from([RECORDS.get(name, "# New\n"), f"# {name}\n- v2\n",
                                            f"# {name}\r\n- v3   \n\n"]))
            changes.append({"op": "put", "name": name, "content": content, "evidence": evidence})
    if draw(st.booleans()):
        changes.append({"op": "replace-global", "content": draw(st.sampled_from(
            ["# Global\n- English\n", "# Global\n- Deutsch\n"])), "evidence": [{"from": 1,
                                                                               "to": 2}]})
    return changes or [{"op": "no-change", "reason": "nothing", "evidence": [{"from": 6,
                                                                             "to": 6}]}]


@SETTINGS
@given(changes=valid_changes(), order=st.randoms(use_true_random=False))
def test_canonical_form_is_idempotent_and_order_independent(world, changes, order) -> None:  # noqa: ANN001
    p = _parse(world, {"changes": changes, "final": True})
    shuffled = copy.deepcopy(changes)
    order.shuffle(shuffled)
    for c in shuffled:
        if "evidence" in c:
            order.shuffle(c["evidence"])
    q = _parse(world, {"changes": shuffled, "final": True})
    assert q.hash == p.hash and q.to_wire() == p.to_wire()
    again = _parse(world, p.to_wire())
    assert again.hash == p.hash and again.to_wire() == p.to_wire()
    ops = [c.op for c in p.changes]
    assert ops == sorted(ops, key=["delete", "put", "replace-global", "no-change"].index)
    for op in ("delete", "put"):
        names = [c.name for c in p.changes if c.op == op]
        assert names == sorted(names)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=valid_changes())
def test_planned_revision_is_the_committed_revision(world, changes) -> None:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(world[0].root, Path(tmp) / "memory", symlinks=True)
        store, a = MemoryStore(Path(tmp) / "memory"), world[1]
        current = store.workspace_generation("work")
        glob = store.global_generation()
        p = parse_proposal({"changes": changes, "final": True}, a, current, glob)
        plan = preview_workspace_changes(current, p.workspace_changes)
        assert plan == p.workspace_preview
        before = snapshot(store.root)
        committed = store.commit_workspace("work", plan, current.revision)
        assert committed == plan.revision == store.workspace_generation("work").revision
        if plan.no_change:
            assert snapshot(store.root) == before
        if p.global_content is not None:
            assert store.commit_global(p.global_content, glob.revision) == global_revision(
                p.global_content)
        if p.no_change:
            assert committed == current.revision
            assert store.global_generation().revision == glob.revision


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(RECORDS)), unique=True, min_size=1),
       noise=st.sampled_from(["", "  ", "\r\n", "\n\n", " \t\r\n\r\n"]))
def test_a_proposal_that_changes_nothing_is_no_change(world, names, noise) -> None:  # noqa: ANN001
    raw = {"changes": [{"op": "put", "name": n, "content": RECORDS[n].rstrip("\n") + noise,
                        "evidence": [{"from": 3, "to": 3}]} for n in names], "final": True}
    p = _parse(world, raw)
    assert p.no_change and p.workspace_preview.no_change
    assert p.hash == _parse(world, {"changes": [{"op": "no-change", "reason": p.reason,
                                                 "evidence": [{"from": 3, "to": 3}]}],
                                    "final": True}).hash
