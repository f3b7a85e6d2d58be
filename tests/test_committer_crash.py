"""The kill matrix: SIGKILL a real committing process at each point, then `memfs recover`.

Each case kills a child process (MEMFS_CRASH_AT) at one named point of the barrier — ours,
or the memory store's inside its CAS — checks what the crash left, runs `memfs recover`,
checks the one right end state, and runs recover again to see it change nothing. A kill
proves ordering only: the fsyncs that make each step durable across power loss are not
exercised by SIGKILL (the page cache survives a killed process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.committer import (
    ALT,
    GLOBAL,
    LANG,
    NEW_EDITOR,
    ONLINE,
    WS,
    Scenario,
    review_to_json,
)

from memfs.consolidate.committer import (
    Action,
    Plan,
    plan_from_proposal,
    recover_receipts,
    recover_review,
)
from memfs.consolidate.proposal import parse_proposal
from memfs.consolidate.receipts import (
    ScopeRevisions,
    read_receipt,
    receipt_path,
    write_receipt,
)
from memfs.consolidate.worker import worker_session_path
from memfs.rootdir import memory_dir, receipts_dir

CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from helpers.committer import review_from_json
from memfs.consolidate.committer import commit_review
root = Path(sys.argv[1])
print(commit_review(root, review_from_json(root, json.loads(Path(sys.argv[2]).read_text()))).state)
"""


def run_commit(sc: Scenario, raw: dict, crash_at: str, tmp_path: Path) -> str:
    """Commit `raw` in a child process that SIGKILLs itself at `crash_at`; its review id."""
    review = sc.prepare(raw)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(review_to_json(review, raw)))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(sc.root), str(job), str(Path(__file__).parent)],
        env={**os.environ, "MEMFS_CRASH_AT": crash_at}, capture_output=True, text=True,
        timeout=60)
    assert proc.returncode == -9, f"did not die at {crash_at}: {proc.stdout} {proc.stderr}"
    return review.review_id


def snapshot(sc: Scenario) -> tuple:
    d = receipts_dir(sc.root)
    files = {n: (d / n).read_bytes() for n in sorted(os.listdir(d))} if d.is_dir() else {}
    return (files, sc.ws_rev(), sc.global_rev(), len(sc.memory.history(WS)),
            len(sc.memory.history(None)))


def recover_cli(sc: Scenario) -> dict:
    out = sc.cli("recover", "--json")
    assert out.returncode in (0, 1), out.stderr
    data = json.loads(out.stdout)
    data["exit"] = out.returncode
    return data


#   point                      Global? left committing? swapped?  recover's action
MATRIX = [
    ("commit-before-receipt", False, None, False, None),
    ("receipt-before-rename", False, None, False, None),
    ("commit-after-receipt", False, True, False, "replay"),
    ("files-written", False, True, False, "replay"),  # MemoryStore: inside the CAS, pre-swap
    ("swapped", False, True, True, "mark-committed"),  # MemoryStore: swapped, dir not fsynced
    ("commit-after-swap", False, True, True, "mark-committed"),
    ("commit-after-committed", False, False, True, "nothing"),
    ("commit-after-receipt", True, True, False, "replay"),
    ("commit-between-scopes", True, True, "workspace", "replay"),
    ("commit-after-swap", True, True, True, "mark-committed"),
]


@pytest.mark.parametrize("point, glob, committing, swapped, action", MATRIX,
                         ids=[f"{m[0]}{'-with-global' if m[1] else ''}" for m in MATRIX])
def test_kill_matrix(point: str, glob: bool, committing: bool | None, swapped: object,
                     action: str | None, tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    ws0, g0 = sc.ws_rev(), sc.global_rev()
    gens0 = len(sc.memory.history(WS)), len(sc.memory.history(None))
    review_id = run_commit(sc, sc.raw(glob=glob), point, tmp_path)

    # What the crash left.
    receipt = read_receipt(sc.root, review_id)
    if committing is None:
        assert receipt is None
    else:
        assert receipt is not None
        assert receipt.state == ("committing" if committing else "committed")
        planned_ws = receipt.scopes["workspace"].planned_after
        assert sc.ws_rev() == (planned_ws if swapped in (True, "workspace") else ws0)
        if glob:
            assert sc.global_rev() == (receipt.scopes["global"].planned_after
                                       if swapped is True else g0)

    # Recovery reaches the one right end state.
    report = recover_cli(sc)
    assert report["exit"] == 0 and report["unresolved"] == 0
    after = read_receipt(sc.root, review_id)
    if committing is None:
        assert report["outcomes"] == [] and after is None
        assert sc.ws_rev() == ws0 and sc.global_rev() == g0
        d = receipts_dir(sc.root)
        assert not d.exists() or os.listdir(d) == []  # a cut-short write is cleaned up
    else:
        assert [o["action"] for o in report["outcomes"]] == [action]
        assert after is not None and after.state == "committed"
        assert sc.ws_rev() == after.scopes["workspace"].planned_after
        assert sc.records() == {"editor": NEW_EDITOR, "lang": LANG}
        if glob:
            assert sc.global_rev() == after.scopes["global"].planned_after
            assert sc.memory.global_generation().content == GLOBAL
        # Exactly one swap per scope in total: replay never writes twice.
        assert len(sc.memory.history(WS)) == gens0[0] + 1
        assert len(sc.memory.history(None)) == gens0[1] + (1 if glob else 0)
        if action == "replay":
            assert after.history[-1].by == "recover"

    # A second recover changes nothing.
    before = snapshot(sc)
    again = recover_cli(sc)
    assert again["changed"] is False and again["exit"] == 0
    assert all(o["action"] == "nothing" for o in again["outcomes"])
    assert snapshot(sc) == before


def test_recovery_refuses_a_plan_that_is_not_the_receipts(tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    review_id = run_commit(sc, sc.raw(), "commit-after-receipt", tmp_path)
    receipt = read_receipt(sc.root, review_id)
    assert receipt is not None and receipt.state == "committing"
    frozen = sc.sessions.freeze(sc.sid)
    current = sc.memory.workspace_generation(WS)
    other = plan_from_proposal(parse_proposal(sc.raw(editor=ALT), frozen, current))
    right = plan_from_proposal(parse_proposal(sc.raw(), frozen, current))
    assert right.proposal_hash == receipt.proposal_hash
    start = snapshot(sc)

    # A different proposal.
    out = recover_review(sc.root, review_id, other)
    assert out.action == Action.REFUSE_PLAN and "hash" in out.detail
    # The receipt's hash, but other changes.
    forged = Plan(receipt.proposal_hash, other.workspace_changes)
    assert recover_review(sc.root, review_id, forged).action == Action.REFUSE_PLAN
    assert snapshot(sc) == start

    # The right plan against a receipt whose planned revision differs.
    tampered = receipt.finished("committing", "test")
    tampered = type(tampered)(**{**tampered.__dict__, "scopes": {
        "workspace": ScopeRevisions(receipt.scopes["workspace"].before, "f" * 64)}})
    write_receipt(sc.root, tampered)
    tampered_bytes = receipt_path(sc.root, review_id).read_bytes()
    out = recover_review(sc.root, review_id, right)
    assert out.action == Action.REFUSE_PLAN and "revisions" in out.detail
    assert receipt_path(sc.root, review_id).read_bytes() == tampered_bytes
    assert sc.ws_rev() == receipt.scopes["workspace"].before

    # Restored, the same plan replays.
    write_receipt(sc.root, receipt)
    out = recover_review(sc.root, review_id, right)
    assert out.action == Action.REPLAY and out.state == "committed"
    assert sc.ws_rev() == receipt.scopes["workspace"].planned_after


def test_online_write_after_the_crash_finishes_as_target_conflict(tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    review_id = run_commit(sc, sc.raw(), "commit-after-receipt", tmp_path)
    online = sc.memory.put_record(WS, "editor", ONLINE)
    report = recover_receipts(sc.root)
    assert [o.action for o in report.outcomes] == ["target-conflict"]
    receipt = read_receipt(sc.root, review_id)
    assert receipt is not None and receipt.state == "target-conflict"
    assert receipt.observed == {"workspace": online}
    assert sc.ws_rev() == online and sc.records()["editor"] == ONLINE  # never overwritten


def test_partial_two_scope_commit_then_global_conflict_is_reported(tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    review_id = run_commit(sc, sc.raw(glob=True), "commit-between-scopes", tmp_path)
    online = sc.memory.replace_global(ONLINE)
    report = recover_receipts(sc.root)
    assert [o.action for o in report.outcomes] == ["target-conflict"]
    receipt = read_receipt(sc.root, review_id)
    assert receipt is not None and receipt.state == "target-conflict"
    # The Workspace half stays (never rolled back); Global keeps the online write.
    assert receipt.observed == {"workspace": receipt.scopes["workspace"].planned_after,
                                "global": online}
    assert sc.global_rev() == online


def test_without_its_worker_session_a_replay_waits_and_writes_nothing(tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    review_id = run_commit(sc, sc.raw(), "commit-after-receipt", tmp_path)
    receipt = read_receipt(sc.root, review_id)
    assert receipt is not None
    worker_session_path(sc.root, receipt.worker_attempt).unlink()
    start = snapshot(sc)
    report = recover_cli(sc)
    assert report["exit"] == 1 and report["unresolved"] == 1
    assert [o["action"] for o in report["outcomes"]] == ["needs-plan"]
    assert "no worker session" in report["outcomes"][0]["detail"]
    assert snapshot(sc) == start
    text = sc.cli("recover")
    assert text.returncode == 1 and "still committing" in text.stdout


def test_a_retried_review_after_a_crash_is_recovered_not_written_twice(tmp_path: Path) -> None:
    """The orchestrator retrying the same review id finishes the crashed commit."""
    sc = Scenario(tmp_path / "root")
    raw = sc.raw()
    review = sc.prepare(raw)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(review_to_json(review, raw)))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(sc.root), str(job), str(Path(__file__).parent)],
        env={**os.environ, "MEMFS_CRASH_AT": "commit-after-swap"}, capture_output=True)
    assert proc.returncode == -9
    gens = len(sc.memory.history(WS))
    from memfs.consolidate.committer import commit_review

    done = commit_review(sc.root, review)
    assert done.state == "committed" and done.history[-1].by == "recover"
    assert len(sc.memory.history(WS)) == gens


def test_a_damaged_generation_is_reported_and_recovery_goes_on(tmp_path: Path) -> None:
    sc = Scenario(tmp_path / "root")
    review_id = run_commit(sc, sc.raw(), "commit-after-receipt", tmp_path)
    record = (memory_dir(sc.root) / "workspaces" / WS).resolve() / "editor.md"
    os.chmod(record, 0o644)
    record.write_text("tampered on disk\n")
    report = recover_cli(sc)
    assert report["exit"] == 1 and report["unresolved"] == 1
    assert [o["action"] for o in report["outcomes"]] == ["error"]
    assert "does not match its revision" in report["outcomes"][0]["detail"]
    receipt = read_receipt(sc.root, review_id)
    assert receipt is not None and receipt.state == "committing"


def test_what_receipts_says_after_a_kill_between_scopes_is_true(tmp_path: Path) -> None:
    """Found in a user trial: killed between its two scopes, a review left `memfs receipts`
    saying "(intent recorded; memory not yet swapped)" while the workspace's record was
    already in memory, and naming no remedy."""
    sc = Scenario(tmp_path / "root")
    ws0 = sc.ws_rev()
    review_id = run_commit(sc, sc.raw(glob=True), "commit-between-scopes", tmp_path)
    assert sc.ws_rev() != ws0, "the workspace scope was swapped before the kill"
    out = sc.cli("receipts")
    line = next(x for x in out.stdout.splitlines() if x.startswith(review_id))
    assert "committing" in line and "not yet swapped" not in line, line
    assert "(intent recorded; swapping memory (if no review is running, `memfs recover` " \
           "finishes it))" in line, line
    assert recover_cli(sc)["exit"] == 0
