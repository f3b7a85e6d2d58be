"""The commit barrier end to end on real files: recheck, receipt first, one CAS, final state.

`Scenario` builds a real root (sessions, memory generations, a worker session holding the
accepted final draft) and is shared with test_committer_crash.py. Every body a scenario uses
carries a BODY-… marker, and after each test every receipt it wrote is scanned for them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.committer import (
    ALT,
    GLOBAL,
    LANG,
    NEW_EDITOR,
    OLD_EDITOR,
    ONLINE,
    TURNS,
    WS,
    Scenario,
    assert_no_bodies,
    review_to_json,
    states,
)

from memfs.consolidate.committer import (
    Plan,
    Review,
    commit_review,
)
from memfs.consolidate.lock import held_here, review_lock
from memfs.consolidate.receipts import new_review_id, read_receipt
from memfs.errors import MemfsError
from memfs.memory.generation import content_hash
from memfs.memory.preview import Put
from memfs.rootdir import receipts_dir

# --- the happy paths ---------------------------------------------------------------------


def test_commit_goes_through_committing_to_committed(sc: Scenario) -> None:
    review = sc.prepare(sc.raw())
    before = sc.ws_rev()
    receipt = commit_review(sc.root, review)
    assert receipt.state == "committed"
    assert states(receipt) == ["committing", "committed"]
    assert receipt.scopes["workspace"].before == before
    assert receipt.scopes["workspace"].planned_after == sc.ws_rev() != before
    assert receipt.touched_scopes == ("workspace",)
    assert sc.records() == {"editor": NEW_EDITOR, "lang": LANG}
    assert [(c.op, c.name) for c in receipt.changes] == [
        ("delete", "scratch"), ("put", "editor"), ("put", "lang")]
    assert receipt.changes[1].content_hash == content_hash(NEW_EDITOR)
    assert receipt.changes[0].content_hash is None
    assert receipt.proposal_hash == review.plan.proposal_hash
    assert receipt.worker_attempt == review.worker_attempt
    assert receipt.source.turn_count == len(TURNS)
    assert read_receipt(sc.root, review.review_id) == receipt
    assert assert_no_bodies(sc.root) == 1


def test_global_and_workspace_commit_behind_one_receipt(sc: Scenario) -> None:
    g0 = sc.global_rev()
    receipt = commit_review(sc.root, sc.prepare(sc.raw(glob=True)))
    assert receipt.state == "committed"
    assert receipt.touched_scopes == ("workspace", "global")
    assert receipt.scopes["global"].before == g0
    assert receipt.scopes["global"].planned_after == sc.global_rev() != g0
    assert sc.memory.global_generation().content == GLOBAL
    assert receipt.changes[-1].op == "replace-global"
    assert len(sc.receipts()) == 1


def test_no_semantic_change_gets_a_no_change_receipt_and_no_swap(sc: Scenario) -> None:
    gens = len(sc.memory.history(WS))
    rev = sc.ws_rev()
    raw = {"changes": [{"op": "put", "name": "editor", "content": OLD_EDITOR + "\n\n",
                        "evidence": [{"from": 1, "to": 1}]}], "final": True}
    review = sc.prepare(raw)
    receipt = commit_review(sc.root, review)
    assert receipt.state == "no-change"
    assert states(receipt) == ["no-change"]
    assert receipt.scopes["workspace"].before == receipt.scopes["workspace"].planned_after == rev
    assert sc.ws_rev() == rev and len(sc.memory.history(WS)) == gens
    # a plan the parser did not fold (same content put directly) is no-change at the barrier too
    plan = Plan("hand-made", (Put("editor", OLD_EDITOR),))
    review2 = Review(new_review_id(), review.source, WS, rev, plan, "att")
    assert commit_review(sc.root, review2).state == "no-change"
    assert len(sc.memory.history(WS)) == gens


def test_a_finished_review_returns_idempotently(sc: Scenario) -> None:
    review = sc.prepare(sc.raw())
    first = commit_review(sc.root, review)
    gens = len(sc.memory.history(WS))
    assert commit_review(sc.root, review) == first
    assert len(sc.memory.history(WS)) == gens
    other = Review(**{**review.__dict__, "plan": Plan("another-hash")})
    with pytest.raises(MemfsError, match="another proposal"):
        commit_review(sc.root, other)
    assert sc.receipts() == [first]


# --- the final recheck -------------------------------------------------------------------


def test_online_write_between_freeze_and_commit_is_a_target_conflict(sc: Scenario) -> None:
    review = sc.prepare(sc.raw())
    online = sc.memory.put_record(WS, "editor", ONLINE)
    receipt = commit_review(sc.root, review)
    assert receipt.state == "target-conflict"
    assert states(receipt) == ["target-conflict"]  # never reached `committing`
    assert receipt.observed == {"workspace": online}
    assert receipt.scopes["workspace"].planned_after is None
    assert sc.ws_rev() == online and sc.records()["editor"] == ONLINE


def test_online_global_write_is_a_conflict_only_when_global_is_touched(sc: Scenario) -> None:
    with_global = sc.prepare(sc.raw(glob=True))
    ws_only = sc.prepare(sc.raw())
    online = sc.memory.replace_global(ONLINE)
    receipt = commit_review(sc.root, with_global)
    assert receipt.state == "target-conflict" and receipt.observed == {"global": online}
    assert sc.global_rev() == online
    assert commit_review(sc.root, ws_only).state == "committed"


def test_turn_appended_between_freeze_and_commit_is_refused(sc: Scenario) -> None:
    review = sc.prepare(sc.raw())
    rev = sc.ws_rev()
    sc.sessions.append(sc.sid, "user", "Actually, spaces.")
    receipt = commit_review(sc.root, review)
    assert receipt.state == "source-changed"
    assert receipt.observed["source.turn_count"] == str(len(TURNS) + 1)
    assert sc.ws_rev() == rev


def test_missing_frozen_global_revision_is_refused_before_anything(sc: Scenario) -> None:
    review = sc.prepare(sc.raw(glob=True))
    with pytest.raises(MemfsError, match="Global revision"):
        commit_review(sc.root, Review(**{**review.__dict__, "global_revision": None}))
    assert sc.receipts() == []


# --- two reviews in two processes --------------------------------------------------------

CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from helpers.committer import review_from_json
from memfs.consolidate.committer import commit_review
root = Path(sys.argv[1])
review = review_from_json(root, json.loads(Path(sys.argv[2]).read_text()))
print("ready", flush=True)
print(commit_review(root, review).state, flush=True)
"""


def test_two_reviews_in_two_processes_are_serialized(sc: Scenario, tmp_path: Path) -> None:
    jobs = []
    for name, raw in (("a", sc.raw()), ("b", sc.raw(editor=ALT))):
        job = tmp_path / f"{name}.json"
        job.write_text(json.dumps(review_to_json(sc.prepare(raw), raw)))
        jobs.append(job)
    here = str(Path(__file__).parent)
    with review_lock(sc.root):  # both start while a review holds the lock
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(sc.root), str(j), here],
                                  stdout=subprocess.PIPE, text=True) for j in jobs]
        assert [p.stdout.readline().strip() for p in procs if p.stdout] == ["ready", "ready"]
        time.sleep(0.5)  # both are inside commit_review now, waiting for the lock
        assert all(p.poll() is None for p in procs), "a review ran while the lock was held"
        assert sc.receipts() == []
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["committed", "target-conflict"]
    by_state = {r.state: r for r in sc.receipts()}
    first, second = by_state["committed"], by_state["target-conflict"]
    assert states(second) == ["target-conflict"]  # it never got past the recheck
    assert second.observed == {"workspace": first.scopes["workspace"].planned_after}
    assert second.created_at >= first.updated_at
    assert sc.ws_rev() == first.scopes["workspace"].planned_after


# --- visible -----------------------------------------------------------------------------


def test_receipts_command_lists_them(sc: Scenario) -> None:
    committed = commit_review(sc.root, sc.prepare(sc.raw()))
    (receipts_dir(sc.root) / "junk.md").write_text("not a receipt")
    out = sc.cli("receipts", "--json")
    assert out.returncode == 1  # a damaged receipt is reported, and the exit says so
    data = json.loads(out.stdout)
    assert [r["review_id"] for r in data["receipts"]] == [committed.review_id]
    assert data["receipts"][0]["state"] == "committed"
    assert [d["path"].rsplit("/", 1)[1] for d in data["damaged"]] == ["junk.md"]
    (receipts_dir(sc.root) / "junk.md").unlink()
    text = sc.cli("receipts")
    assert text.returncode == 0 and committed.review_id in text.stdout and "committed" in text.stdout
    assert sc.cli("receipts", "--state", "committing").stdout.strip() == "no receipts"


def test_the_review_lock_is_free_while_the_model_is_asked(sc: Scenario) -> None:
    """The real orchestration: each time it is about to ask the model, the lock is free
    (taking it with no wait succeeds, from this thread and by flock); it commits after."""
    from helpers.stub_server import StubServer

    from memfs.consolidate.review import ConsolidateOptions, consolidate

    asked: list[bool] = []

    def progress(message: str) -> None:
        if "asking" in message:
            with review_lock(sc.root, timeout=0):
                asked.append(held_here(sc.root))
            assert not held_here(sc.root)

    draft = {**sc.raw(), "final": False}
    with StubServer([{"propose": draft}, {"propose": sc.raw()}]) as stub:
        options = ConsolidateOptions(provider="openai", model="gpt-4o",
                                     base_url=stub.base_url("openai"))
        out = consolidate(sc.root, sc.sid, WS, options, progress)
    assert asked == [True, True]  # two model requests, the lock free before each
    assert out.state == "committed" and out.receipt is not None
    assert states(out.receipt) == ["committing", "committed"]
