"""The commit barrier end to end on real files: recheck, receipt first, one CAS, final state.

`Scenario` builds a real root (sessions, memory generations, a worker session holding the
accepted final draft) and is shared with test_committer_crash.py. Every body a scenario uses
carries a BODY-… marker, and after each test every receipt it wrote is scanned for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memfs.consolidate.committer import (
    Plan,
    Review,
    commit_review,
    plan_from_proposal,
    snapshot_of,
)
from memfs.consolidate.lock import held_here, review_lock
from memfs.consolidate.proposal import parse_proposal
from memfs.consolidate.receipts import Receipt, new_review_id, read_receipt, scan_receipts
from memfs.consolidate.worker import WorkerSession, new_attempt_id, worker_session_path
from memfs.errors import MemfsError
from memfs.memory.generation import content_hash
from memfs.memory.preview import Put
from memfs.memory.sessions import SessionStore
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir, receipts_dir, sessions_dir

OLD_EDITOR = "# Editor\nBODY-OLD-EDITOR-4b1d: indent with spaces\n"
SCRATCH = "BODY-SCRATCH-77aa temporary note\n"
NEW_EDITOR = "# Editor\nBODY-NEW-EDITOR-91ce: indent with tabs\n"
LANG = "# Language\nBODY-LANG-3c2e: Python 3.11\n"
GLOBAL = "# Preferences\nBODY-GLOBAL-a5f0: concise answers\n"
ALT = "BODY-ALT-0d9e another proposal\n"
ONLINE = "BODY-ONLINE-e1f4 written through the mount\n"
MARKERS = [line.split(":")[0].split(" ")[0] for line in
           (OLD_EDITOR.split("\n")[1], SCRATCH, NEW_EDITOR.split("\n")[1], LANG.split("\n")[1],
            GLOBAL.split("\n")[1], ALT, ONLINE)]
TURNS = [("user", "I prefer tabs over spaces."), ("assistant", "Noted: tabs."),
         ("tool", "ls output"), ("user", "And we use Python 3.11.")]
WS = "work"
SCENARIOS: list[Scenario] = []


class Scenario:
    """A root with one session, a workspace with two records, and Global memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memory = MemoryStore(memory_dir(root))
        self.sessions = SessionStore(sessions_dir(root))
        self.sid = self.sessions.new(WS)
        self.sessions.append_many(self.sid, TURNS)
        self.memory.put_record(WS, "editor", OLD_EDITOR)
        self.memory.put_record(WS, "scratch", SCRATCH)
        SCENARIOS.append(self)

    @staticmethod
    def raw(glob: bool = False, editor: str = NEW_EDITOR) -> dict[str, Any]:
        changes: list[dict[str, Any]] = [
            {"op": "put", "name": "lang", "content": LANG, "evidence": [{"from": 4, "to": 4}]},
            {"op": "delete", "name": "scratch", "evidence": [{"from": 1, "to": 2}]},
            {"op": "put", "name": "editor", "content": editor,
             "evidence": [{"from": 1, "to": 2}]},
        ]
        if glob:
            changes.append({"op": "replace-global", "content": GLOBAL,
                            "evidence": [{"from": 1, "to": 1}]})
        return {"changes": changes, "final": True}

    def prepare(self, raw: dict[str, Any], review_id: str | None = None) -> Review:
        """Freeze, parse, and keep the accepted final draft in a worker session, as the
        worker would; the returned Review is what the orchestrator hands the committer."""
        frozen = self.sessions.freeze(self.sid)
        current = self.memory.workspace_generation(WS)
        glob = self.memory.global_generation()
        proposal = parse_proposal(raw, frozen, current, glob)
        attempt = new_attempt_id()
        session = WorkerSession(worker_session_path(self.root, attempt))
        session.append("draft", step=1, call_id="c1", final=True, changes=raw["changes"])
        session.append("result", step=1, call_id="c1", accepted=True, final=True,
                       is_error=False, content="accepted as final")
        session.close()
        return Review(review_id or new_review_id(), snapshot_of(frozen), WS, current.revision,
                      plan_from_proposal(proposal), attempt, glob.revision)

    def ws_rev(self) -> str:
        return self.memory.workspace_generation(WS).revision

    def global_rev(self) -> str:
        return self.memory.global_generation().revision

    def records(self) -> dict[str, str]:
        return self.memory.workspace_generation(WS).records

    def receipts(self) -> list[Receipt]:
        scan = scan_receipts(self.root)
        assert not scan.damaged
        return scan.receipts

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memfs", "--root", str(self.root), *args],
                              capture_output=True, text=True, timeout=60)


def assert_no_bodies(root: Path) -> int:
    """No receipt under `root` holds any memory or proposal body; returns files scanned."""
    d = receipts_dir(root)
    names = os.listdir(d) if d.is_dir() else []
    for name in names:
        text = (d / name).read_text()
        for marker in MARKERS:
            assert marker not in text, f"{name} contains the body marked {marker}"
    return len(names)


@pytest.fixture(autouse=True)
def scan_receipts_for_bodies() -> Iterator[None]:
    start = len(SCENARIOS)
    yield
    for sc in SCENARIOS[start:]:
        assert_no_bodies(sc.root)


@pytest.fixture
def sc(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path / "root")


def states(receipt: Receipt) -> list[str]:
    return [h.state for h in receipt.history]


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
from test_committer_flow import review_from_json
from memfs.consolidate.committer import commit_review
root = Path(sys.argv[1])
review = review_from_json(root, json.loads(Path(sys.argv[2]).read_text()))
print("ready", flush=True)
print(commit_review(root, review).state, flush=True)
"""


def review_to_json(review: Review, raw: dict[str, Any]) -> dict[str, Any]:
    return {"review_id": review.review_id, "source": review.source.__dict__,
            "workspace": review.workspace, "workspace_revision": review.workspace_revision,
            "global_revision": review.global_revision, "worker_attempt": review.worker_attempt,
            "raw": raw}


def review_from_json(root: Path, job: dict[str, Any]) -> Review:
    """Rebuild a Review in another process: re-parse the raw proposal against the frozen
    prefix and the current generations, as the orchestrator does."""
    from memfs.consolidate.committer import frozen_prefix
    from memfs.consolidate.receipts import SourceSnapshot

    source = SourceSnapshot(**job["source"])
    memory = MemoryStore(memory_dir(root))
    frozen = frozen_prefix(SessionStore(sessions_dir(root)), source)
    proposal = parse_proposal(job["raw"], frozen, memory.workspace_generation(job["workspace"]),
                              memory.global_generation())
    return Review(job["review_id"], source, job["workspace"], job["workspace_revision"],
                  plan_from_proposal(proposal), job["worker_attempt"], job["global_revision"])


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
    from memfs.consolidate.review import ConsolidateOptions, consolidate
    from memfs.consolidate.stub_server import StubServer

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
