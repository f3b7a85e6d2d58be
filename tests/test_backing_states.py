"""What a pass writes into a mount's listing (memfs.backing.states.record_states), as a
function: no mount needed."""

from __future__ import annotations

import sys
from functools import partial

from memfs.backing.states import MountState, record_states
from memfs.reconcile.facts import Observation
from memfs.reconcile.plan import PassPlan, SyncPlan
from memfs.reconcile.rule import SYNCED_UNCHANGED


def _calls(fn) -> int:
    """Python-level calls `fn` makes (the interpreter's own count; not a timing)."""
    n = [0]

    def prof(_frame, event, _arg) -> None:
        if event == "call":
            n[0] += 1
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n[0]


def _mount(files: int) -> MountState:
    st = MountState()
    st.states.update({f"d{i // 100}/f{i}": ("synced", None) for i in range(files)})
    st.states.update({"d0/f1/x": ("synced", None), "d0/f1.txt": ("synced", None),
                      "d0/f10": ("synced", None)})
    st.disk_only.update({f"d{i // 100}/f{i}": (1, "text/plain") for i in range(0, files, 7)})
    return st


def test_a_pass_over_one_path_touches_its_scope_not_the_whole_listing() -> None:
    """An on-access pass over one path (a lookup of a new name) replaced what the listing said
    under that path by reading every path the mount lists: ~20 ms a lookup at 57,000 files in
    a bound mount, so each file a tool made there cost more the larger the mount. It now goes
    by range: the same work at 200 paths as at 20,000, and exactly the scope's paths replaced
    (the path and those below it; not `d0/f1.txt` or `d0/f10`, which share its letters)."""
    cost = []
    for files in (200, 20_000):
        st = _mount(files)
        plan = PassPlan("main", decisions={"d0/f1": SYNCED_UNCHANGED})
        obs = Observation(root=(1, 1), scope="d0/f1")
        cost.append(_calls(partial(record_states, st, "d0/f1", obs, plan, SyncPlan(), set())))
        assert "d0/f1/x" not in st.states and st.states["d0/f1"] == ("synced", None)
        assert st.states["d0/f1.txt"] and st.states["d0/f10"] and "d0/f7" in st.states
        assert "d0/f7" in st.disk_only and "d0/f14" in st.disk_only
        assert len(st.states) == files + 1  # d0/f1/x gone; d0/f1.txt kept
    assert cost[1] <= cost[0] + 10, cost


def test_a_pass_over_the_whole_mount_replaces_the_whole_listing() -> None:
    st = _mount(300)
    plan = PassPlan("main", decisions={"new": SYNCED_UNCHANGED})
    record_states(st, "", Observation(root=(1, 1), scope=""), plan, SyncPlan(), set())
    assert dict(st.states) == {"new": ("synced", None)} and not st.disk_only


def _drafts(tmp_path, files: int):
    """A real workspace's BranchIntent for mount `proj` with `files` drafts made through the
    mount (store origin), as a tool writing files there leaves them."""
    from helpers.workspace import new_ws

    from memfs.backing.intent import BranchIntent
    from memfs.reconcile.rule import PathIntent

    ws = new_ws(tmp_path / f"root{files}")
    bi = BranchIntent(ws, lambda: ["proj"])
    for i in range(files):
        bi.set_entry("proj", f"d{i // 100}/f{i}", PathIntent(False, True))
    for p in ("d0/f1/x", "d0/f1.txt"):
        bi.set_entry("proj", p, PathIntent(False, True))
    return bi


def test_a_one_path_pass_finds_the_drafts_under_it_by_range(tmp_path) -> None:
    """Each file a tool makes in a bound mount is a draft (an intent entry) and a one-path
    pass (the lookup of its new name). The pass read every entry of the intent table to find
    those under its path, so making files cost more with each draft not yet materialized.
    The entries under a path now come from the table's index, kept with each change: the
    same work at 200 drafts as at 20,000, and the same paths as reading the table."""
    from memfs.reconcile.plan import _under, plan_pass

    cost = []
    for files in (200, 20_000):
        bi = _drafts(tmp_path, files)
        table = bi.table("proj")
        for scope in ("d0/f1", "d0", "d1/f100", "nowhere", "d0/f1/x"):
            want = {p for p in table if _under(p, scope)}
            assert set(bi.paths_under("proj", scope, table)) == want, scope
        bi.set_entry("proj", "d0/f1", None)  # one taken out, then the pass over it
        obs = Observation(root=(1, 1), scope="d0/f1")
        table = bi.table("proj")

        def one_pass(table=table, obs=obs, bi=bi) -> None:
            plan_pass(obs, {}, {}, table, intent_paths=bi.paths_under("proj", "d0/f1", table))
        cost.append(_calls(one_pass))
        assert set(bi.paths_under("proj", "d0/f1", table)) == {"d0/f1/x"}
    assert cost[1] <= cost[0] + 10, cost


def test_rewind_marks_and_whole_tables_are_found_too(tmp_path) -> None:
    """A pass after an undo decides with the table plus its rewind marks (for_pass): the marks
    under the scope are among the paths; a table replaced whole is indexed afresh."""
    from memfs.reconcile.intent import IntentTable
    from memfs.reconcile.rule import PathIntent

    bi = _drafts(tmp_path, 300)
    bi.restored["proj"] = {"d0/f5", "d0/f5/y", "d2/f200"}
    table = bi.for_pass("proj", "d0/f5")
    assert set(bi.paths_under("proj", "d0/f5", table)) == {"d0/f5", "d0/f5/y"}
    bi.replace_table("proj", IntentTable({"d0/f5/z": PathIntent(True, False)}))
    bi.restored.clear()
    assert bi.paths_under("proj", "d0/f5", bi.table("proj")) == ["d0/f5/z"]
    assert bi.paths_under("proj", "", bi.table("proj")) is None  # the whole mount: read all


def test_a_commits_intent_bytes_cost_the_changed_entries_not_every_draft(tmp_path) -> None:
    """Each group commit keeps the mount's intent; the loop encoded the whole table again for
    every commit (json over every draft: milliseconds at thousands, every FUSE request
    waiting meanwhile, and as long a hold of the interpreter lock when tried in the commit
    thread). The entries are now kept encoded, in path order, changed one at a time, and a
    commit joins them: the same bytes as encoding the table, for fewer Python calls than
    there are drafts."""
    from memfs.reconcile import intent
    from memfs.reconcile.rule import Conflict, PathIntent

    cost = []
    for files in (200, 20_000):
        bi = _drafts(tmp_path, files)
        bi.encoded()
        bi.set_entry("proj", "d0/f2", PathIntent(True, False, Conflict("both-changed", "ab")))
        bi.set_entry("proj", "d0/f3", None)
        cost.append(_calls(bi.encoded))
        data = bi.encoded()
        assert data is not None and data["proj"] == intent.encode(bi.table("proj"))
        assert intent.decode(data["proj"]) == bi.table("proj")
    assert cost[1] <= cost[0] + 10, cost


def test_joined_members_are_the_encoding(tmp_path) -> None:
    """encode_members gives encode's bytes for names json escapes (quotes, a backslash, a
    name that is not UTF-8, as the walk keeps it) and every kind of entry."""
    from memfs.reconcile import intent
    from memfs.reconcile.rule import Conflict, PathIntent

    entries = {"a\"q": PathIntent(True, False), "b\\c": PathIntent(False, True),
               "caf\u00e9/\udcff": PathIntent(False, False, Conflict("type-changed", None)),
               "d": PathIntent(False, False), "e": PathIntent(True, True, Conflict("x", "y"))}
    table = intent.IntentTable(entries)
    joined = intent.encode_members(intent.member(p, entries[p]) for p in sorted(entries))
    assert joined == intent.encode(table)
