"""The quiet pass: a pass whose inputs equal the last pass's reuses its plans (Backing._plan),
and a change to any one input is decided afresh.

Driven on a real store and a real backing directory inside trio, with no FUSE (as
tests/helpers/backing.py): what they check is the bridge's bookkeeping, not the kernel.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from pathlib import Path

import pytest
from helpers.backing import attached as _attached
from helpers.backing import close as _close
from helpers.require import require_tool

from memfs.backing.planning import PlanInputs as _PlanInputs
from memfs.reconcile.intent import IntentTable
from memfs.reconcile.rule import Content, PathIntent
from memfs.store.journal import Journal
from memfs.workspace.workspace import Workspace

FILES = {"a.txt": "a1\n", "b.txt": "b1\n", "c.txt": "c1\n"}


def _plans(b, scope: str = ""):
    return b.planner.last["work"][scope][1:]


def _node(ws: Workspace, rel: str):
    mnode = ws.children(ws.root)[b"work"]
    return ws.children(mnode)[rel.encode()]


async def _quiet(tmp_path: Path):
    ws, b, disk = await _attached(tmp_path, FILES)
    await ws.commit()
    old = 10**9  # files last changed long ago: fingerprints vouch at once
    for name in FILES:
        os.utime(disk / name, ns=(old, old))
    await b.run_pass("work")  # hashes (the ctime is new: inside the racy window, so again)
    return ws, b, disk


@pytest.mark.trio
async def test_a_quiet_pass_reuses_the_plans(tmp_path: Path):
    ws, b, disk = await _quiet(tmp_path)
    res = await b.run_pass("work")
    first = _plans(b)
    again = await b.run_pass("work")
    assert _plans(b)[0] is first[0] and _plans(b)[1] is first[1]
    assert again == res and again.taken == [] and again.conflicts == []
    assert b.states.mounts["work"].states["a.txt"] == ("synced", None)
    _close(ws, b)


@pytest.mark.trio
async def test_each_input_changed_alone_is_decided_afresh(tmp_path: Path):
    ws, b, disk = await _quiet(tmp_path)
    await b.run_pass("work")
    await b.run_pass("work")
    # Disk: an edit is taken.
    (disk / "a.txt").write_text("a2 on disk\n")
    res = await b.run_pass("work")
    assert res.taken == ["a.txt"]
    await b.run_pass("work")
    # The store: a draft shows as one (disk unchanged).
    ws.write(_node(ws, "b.txt"), 0, b"B")
    await b.run_pass("work")
    assert b.states.mounts["work"].states["b.txt"][0] == "workspace-draft"
    await ws.commit()
    # The evidence, changed by another connection (disk and store unchanged): P for c.txt
    # is wrong now, and the pass records the agreed digest again.
    await b.run_pass("work")
    await b.run_pass("work")
    agreed = b.journal.pass_inputs("work").evidence["c.txt"]
    other = Journal(b.journal.db_path)
    other.record_evidence("work", [("c.txt", "0" * 32)])
    other.close()
    await b.run_pass("work")
    assert b.journal.pass_inputs("work").evidence["c.txt"] == agreed
    await b.run_pass("work")  # quiet again: the last inputs are those of now
    # A pending intent (a write-ahead that never reached disk): abandoned by the pass.
    b.journal.begin_intent("work", "c.txt", "write", old=agreed, new="9" * 32)
    await b.run_pass("work")
    assert b.journal.pending_intents("work") == []
    _close(ws, b)


def test_plan_inputs_compare_every_input():
    """`same` is what makes reusing a plan safe: each input, changed alone, makes it False."""
    from memfs.reconcile.contained import RootId
    from memfs.reconcile.observe import Observation, Region

    obs = Observation(RootId(1, 2), "")
    base = _PlanInputs("", False, "main", "main", obs, {"a": Content("1" * 32)}, {"a": "1" * 32},
                       IntentTable(), {}, {"a": 0o644}, {})
    assert base.same(dataclasses.replace(base))
    other_obs = Observation(RootId(1, 2), "")
    other_obs.regions.append(Region("x", "vcs"))
    changes = {
        "scope": "src", "path_sync": True, "branch": "try", "branch_now": "try",
        "obs": other_obs, "view": {"a": Content("2" * 32)}, "evidence": {"a": "2" * 32},
        "table": IntentTable({"a": PathIntent(tombstone=True)}),
        "pending": {"a": object()}, "modes": {"a": 0o755}, "specials": {"a": "l"},
        "intent_paths": ["a"],
    }
    assert set(changes) == {f.name for f in dataclasses.fields(_PlanInputs)}
    for name, value in changes.items():
        assert not base.same(dataclasses.replace(base, **{name: value})), name


@pytest.mark.trio
async def test_a_file_dated_past_2262_is_hashed_every_pass(tmp_path: Path):
    """Its fingerprint does not fit the journal's integers: it is never cached (so never
    vouched for) instead of failing every pass of the mount."""
    ws, b, disk = await _attached(tmp_path, {"a.txt": "a\n"})
    (disk / "future.txt").write_text("from the future\n")
    ns = 10_000_000_000 * 10**9
    os.utime(disk / "future.txt", ns=(ns, ns))
    if os.stat(disk / "future.txt").st_mtime_ns != ns:
        require_tool("the test directory's filesystem clamps times past 2262 (ext4 and tmpfs do not)")
    for _ in range(2):
        res = await b.run_pass("work")
        assert res.incomplete is None and res.regions == []
    assert b.states.mounts["work"].states["future.txt"] == ("synced", None)
    assert "future.txt" not in b.journal.pass_inputs("work").fingerprints
    _close(ws, b)


@pytest.mark.trio
async def test_evidence_memo_is_safe_from_two_worker_threads(tmp_path: Path):
    """The evidence conversion runs in the gather, in a worker thread, and the pass lock is
    per mount: two mounts' gathers run at once. The memo used to be a dict both threads
    inserted into and evicted from (review found a KeyError; a lock fixed it). Now the thread
    is handed the last conversion and returns its own, and only the loop keeps the memo, so
    there is nothing to race: converting from many threads at once gives each the same,
    right answer, and the rows it was made from are recognised by identity."""
    from memfs.backing.gather import convert_evidence

    ws, b, disk = await _attached(tmp_path, {"a.txt": "a\n"})
    rows = b.journal.pass_inputs("work").evidence
    first = convert_evidence(rows, None)
    errors: list[BaseException] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def hammer() -> None:
        try:
            for i in range(20000):
                got = convert_evidence(rows, first if i % 2 else None)
                assert got.evidence == first.evidence and got.rows is rows
        except BaseException as exc:  # noqa: BLE001 - any failure is the finding
            errors.append(exc)

    try:
        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert convert_evidence(rows, first) is first
        await b.run_pass("work")
        assert b.passes.evidence_memos[("work", "")].rows is rows  # kept on the loop
    finally:
        sys.setswitchinterval(old)
        _close(ws, b)
    assert errors == []
