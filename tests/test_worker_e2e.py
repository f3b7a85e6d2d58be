"""`memfs consolidate` end to end: a real CLI process, real HTTP on loopback, real files.

A session where the user states a preference → the scripted model puts a record citing that
turn → a committed receipt → the record readable from the memory store's files.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.stub_server import StubServer
from helpers.worker import PUT_TABS, consolidate, make_session, memory_state

from memfs.consolidate.receipts import read_receipt
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir

PROVIDERS = ["openai", "anthropic"]
@pytest.fixture
def stub():
    with StubServer() as s:
        yield s


@pytest.mark.parametrize("provider", PROVIDERS)
def test_preference_becomes_a_committed_record(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [PUT_TABS], "final": True},
               "usage": {"input": 321, "output": 45}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    assert out["state"] == "committed"
    assert out["usage"] == {"input_tokens": 321, "output_tokens": 45}
    assert "step 1/8" in err and "final accepted" in err  # progress while the model works
    assert out["diff"][0]["name"] == "indentation" and "+Use tabs." in out["diff"][0]["unified"]
    receipt = read_receipt(root, out["review_id"])
    assert receipt is not None and receipt.state == "committed"
    assert receipt.worker_attempt == out["worker_attempt"]
    assert receipt.consolidator_version == "memfs-consolidator/2"
    assert out["revisions"]["workspace"]["after"] == receipt.scopes["workspace"].planned_after
    memory = MemoryStore(memory_dir(root))
    assert memory.read_record("ws-alpha", "indentation") == "# Indentation\nUse tabs.\n"
    assert memory.workspace_generation("ws-alpha").revision == receipt.scopes["workspace"].planned_after
    # the model saw turns by number, never a path, revision or workspace name
    sent = json.dumps(stub.requests[0].body)
    assert "Turn 1 (user)" in sent and "ls: a.py" not in sent
    for secret in (str(root), receipt.scopes["workspace"].before, "ws-alpha"):
        assert secret not in sent


@pytest.mark.parametrize("provider", PROVIDERS)
def test_global_and_workspace_in_one_receipt(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [
        PUT_TABS,
        {"op": "replace-global", "content": "- Indent with tabs.\n",
         "evidence": [{"from": 1, "to": 1}]},
    ], "final": True}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    receipt = read_receipt(root, out["review_id"])
    assert receipt.state == "committed" and set(receipt.touched_scopes) == {"workspace", "global"}
    memory = MemoryStore(memory_dir(root))
    assert memory.global_generation().content == "- Indent with tabs.\n"
    assert memory.global_generation().revision == receipt.scopes["global"].planned_after
    assert "indentation" in memory.workspace_generation("ws-alpha").records


def tool_replies(stub: StubServer) -> list[str]:
    """What the host answered to each call, as the model received it in the next request."""
    out = []
    for req in stub.requests[1:]:
        last = req.body["messages"][-1]
        out.append(last["content"] if req.protocol == "openai" else json.dumps(last["content"]))
    return out


@pytest.mark.parametrize("provider", PROVIDERS)
def test_invalid_draft_then_corrected_final(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    hidden = {**PUT_TABS, "evidence": [{"from": 1, "to": 2}]}  # turn 2 is tool output
    stub.push({"propose": {"changes": [hidden], "final": False}},
              {"propose": {"changes": [PUT_TABS], "final": False}},
              {"propose": {"changes": [PUT_TABS], "final": True}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    assert out["state"] == "committed" and out["steps"] == 3
    replies = tool_replies(stub)
    assert "covers turn 2, which the evidence projection" in replies[0]
    assert "draft is valid: added indentation" in replies[1]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_failed_final_then_good_final(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    no_evidence = {k: v for k, v in PUT_TABS.items() if k != "evidence"}
    stub.push({"propose": {"changes": [no_evidence], "final": True}},
              {"propose": {"changes": [PUT_TABS], "final": True}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    assert out["steps"] == 2 and out["state"] == "committed"
    assert "changes[0].evidence: missing field" in tool_replies(stub)[0]


def test_never_final_ends_at_step_cap_with_nothing_committed(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    stub.push(*[{"propose": {"changes": [PUT_TABS], "final": False}}] * 3)
    code, out, err = consolidate(root, stub, "anthropic", sid, "--max-steps", "3")
    assert code == 1 and out["state"] == "step-cap" and out["receipt"] is None
    assert len(stub.requests) == 3
    assert memory_state(root) == before


def test_hanging_model_ends_at_timeout_with_nothing_committed(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    stub.push({"propose": {"changes": [PUT_TABS], "final": False}}, {"hang": 30})
    code, out, err = consolidate(root, stub, "openai", sid, "--timeout", "1.5")
    assert code == 1 and out["state"] == "timeout"
    assert memory_state(root) == before


HOSTILE = [
    ({"propose": {"changes": [{**PUT_TABS, "name": "../../etc/passwd"}], "final": True}},
     "path separator"),
    ({"propose": {"changes": [{**PUT_TABS, "name": "/home/u/.bashrc"}], "final": True}},
     "path separator"),
    ({"propose": {"changes": [{**PUT_TABS, "revision": "0" * 64}], "final": True}},
     "changes[0].revision: unknown field"),
    ({"call": {"name": "memory_review_propose",
               "arguments": {"changes": [PUT_TABS], "final": True, "workspace": "other"}}},
     "unknown field(s) 'workspace'"),
    ({"propose": {"changes": [{**PUT_TABS, "content": "x" * 70000}], "final": True}},
     "over the 65536-byte cap"),
    ({"propose": {"changes": [{**PUT_TABS, "evidence": [{"from": 3, "to": 9}]}], "final": True}},
     "outside session"),
    ({"call": {"name": "shell", "arguments": {"cmd": "rm -rf /"}}}, "no tool named 'shell'"),
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_hostile_output_is_refused_and_nothing_changes(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    stub.push(*[move for move, _ in HOSTILE], {"text": "done"})
    steps = len(HOSTILE) + 1
    code, out, err = consolidate(root, stub, provider, sid, "--max-steps", str(steps))
    assert code == 1 and out["state"] == "step-cap"
    assert len(stub.requests) == steps
    replies = tool_replies(stub)
    for (_, expected), reply in zip(HOSTILE, replies, strict=True):
        assert expected in reply
    assert memory_state(root) == before
    assert not (root / "memory" / "workspaces").exists() or not any(
        (root / "memory" / "workspaces").iterdir())


GLOBAL_AND_PUT = {"propose": {"changes": [
    PUT_TABS,
    {"op": "replace-global", "content": "- Indent with tabs.\n", "evidence": [{"from": 1, "to": 1}]},
], "final": True}}


@pytest.mark.parametrize("crash_at", ["commit-after-receipt", "commit-between-scopes"])
def test_killed_commit_is_recovered_from_the_worker_session(tmp_path, stub, crash_at):
    """SIGKILL mid-commit, then `memfs recover` rebuilds the plan from the worker session alone
    (the stub has no script left: a model call would fail) and finishes both scopes."""
    root = tmp_path / "root"
    sid = make_session(root)
    ws_before, glob_before, _ = memory_state(root)
    stub.push(GLOBAL_AND_PUT)
    code, out, err = consolidate(root, stub, "openai", sid, env={"MEMFS_CRASH_AT": crash_at})
    assert code == -9, err
    (receipt_file,) = (root / "receipts").glob("*.md")
    receipt = read_receipt(root, receipt_file.stem)
    assert receipt.state == "committing"
    ws_now, glob_now, _ = memory_state(root)
    assert glob_now == glob_before  # Global is swapped second: not yet
    assert ws_now == (ws_before if crash_at == "commit-after-receipt"
                      else receipt.scopes["workspace"].planned_after)
    n_requests = len(stub.requests)

    rec = subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), "recover", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    (outcome,) = json.loads(rec.stdout)["outcomes"]
    assert outcome["action"] == "replay" and outcome["state"] == "committed"
    assert len(stub.requests) == n_requests  # recovery never called the model
    done = read_receipt(root, receipt.review_id)
    ws_after, glob_after, _ = memory_state(root)
    assert ws_after == done.scopes["workspace"].planned_after
    assert glob_after == done.scopes["global"].planned_after
    assert MemoryStore(memory_dir(root)).global_generation().content == "- Indent with tabs.\n"


def test_no_change_proposal_gets_a_no_change_receipt(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)[:2]
    stub.push({"propose": {"changes": [{"op": "no-change", "reason": "nothing durable"}],
                           "final": True}})
    code, out, err = consolidate(root, stub, "anthropic", sid)
    assert code == 0, err
    assert out["state"] == "no-change" and out["diff"] == []
    assert read_receipt(root, out["review_id"]).state == "no-change"
    assert memory_state(root)[:2] == before


@pytest.mark.parametrize("provider", PROVIDERS)
def test_auth_failure_is_clear_and_the_key_is_never_written(tmp_path, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    key = "sk-sentinel-" + provider
    with StubServer([{"propose": {"changes": [PUT_TABS], "final": True}}],
                    require_key="the-right-key") as stub:
        code, out, err = consolidate(root, stub, provider, sid,
                                     env={"OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key})
    assert code == 1
    var = "OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY"
    assert "refused the credentials (HTTP 401" in out["error"] and var in out["remedy"]
    assert len(stub.requests) == 1  # an auth failure is not retried
    assert not (root / "receipts").exists() or not any((root / "receipts").iterdir())
    (session,) = (root / "sessions" / "workers").glob("*.jsonl")
    assert '"status": "provider-error"' in session.read_text()
    for path in root.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_workspace_other_than_the_sessions_is_refused(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    code, out, err = consolidate(root, stub, "openai", sid, "--workspace", "elsewhere")
    assert code == 1 and "belongs to workspace 'ws-alpha'" in out["error"]
    assert stub.requests == []


def test_killed_after_the_worker_leaves_no_receipt_and_no_change(tmp_path, stub):
    """SIGKILL between the accepted final and the commit: memory and receipts untouched, the
    worker session intact (kill tests prove ordering only; durability rests on fsync)."""
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    stub.push(GLOBAL_AND_PUT)
    code, _, err = consolidate(root, stub, "anthropic", sid,
                               env={"MEMFS_CRASH_AT": "consolidate-after-worker"})
    assert code == -9, err
    assert memory_state(root) == before
    (path,) = (root / "sessions" / "workers").glob("*.jsonl")
    from memfs.consolidate.worker import load_worker_session, replay_final_proposal

    events = load_worker_session(root, path.stem)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "accepted"
    assert replay_final_proposal(events) == GLOBAL_AND_PUT["propose"]
    with path.open("a") as f:  # a torn append is dropped on load
        f.write('{"seq": 99, "event": "res')
    assert load_worker_session(root, path.stem) == events


def test_memory_written_while_the_model_works_is_never_overwritten(tmp_path):
    root = tmp_path / "root"
    sid = make_session(root)
    memory = MemoryStore(memory_dir(root))

    def someone_writes(_request) -> None:  # an online write through the mount, say
        memory.put_record("ws-alpha", "editor", "Uses vim.\n")

    with StubServer([{"propose": {"changes": [PUT_TABS], "final": True}}],
                    on_request=someone_writes) as stub:
        code, out, err = consolidate(root, stub, "openai", sid)
    assert code == 1 and out["state"] == "target-conflict"
    assert read_receipt(root, out["review_id"]).state == "target-conflict"
    assert set(memory.workspace_generation("ws-alpha").records) == {"editor"}
