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
