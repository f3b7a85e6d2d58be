"""The worker loop over real loopback HTTP, with a small host-side validate() of our own.

The real proposal parser is exercised end to end in test_worker_e2e.py; here the loop's own
rules are under test: drafts answered, one accepted final concludes, step cap, timeout, the
envelope, unknown tools, the ceiling, usage, the session log and replay.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.stub_server import StubServer

from memfs.consolidate.providers import (
    ProviderTruncated,
    ProviderUnavailable,
    make_provider,
    request_max_tokens,
)
from memfs.consolidate.worker import (
    CONSOLIDATOR_VERSION,
    Budget,
    Verdict,
    load_worker_session,
    replay_final_proposal,
    run_worker,
    tool_spec,
)
from memfs.errors import MemfsError

PROVIDERS = ["openai", "anthropic"]
GOOD = [{"op": "put", "name": "editor", "content": "Uses vim."}]
BAD = [{"op": "put", "name": "../etc/passwd", "content": "x"}]
TOOL = tool_spec({"type": "array", "items": {"type": "object"}}, "propose memory changes")


def validate(proposal: dict) -> Verdict:
    """Accept a list of puts with plain names; the loop must not care how this decides."""
    changes = proposal["changes"]
    if not isinstance(changes, list):
        return Verdict(False, "changes must be a list")
    errors = [
        f"changes[{i}].name: not a plain name"
        for i, c in enumerate(changes)
        if not isinstance(c, dict) or "/" in str(c.get("name", "/"))
    ]
    if errors:
        return Verdict(False, "; ".join(errors))
    return Verdict(True, f"{len(changes)} change(s)", detail={"n": len(changes)})


def run(root: Path, stub: StubServer, name: str, *, model: str = "gpt-4o",
        budget: Budget | None = None, progress=None):
    provider = make_provider(name, model, stub.base_url(name))
    return run_worker(
        root, provider, system="You consolidate memory.", user="Turn 1 (user): I use vim.",
        tool=TOOL, validate=validate, budget=budget or Budget(max_steps=4, timeout_s=10),
        context={"session": "s1"}, progress=progress,
    )


@pytest.fixture
def stub():
    with StubServer() as s:
        yield s


@pytest.mark.parametrize("name", PROVIDERS)
def test_invalid_draft_answered_then_corrected_final_accepted(tmp_path, stub, name):
    stub.push(
        {"propose": {"changes": BAD, "final": False}, "usage": {"input": 50, "output": 5}},
        {"propose": {"changes": GOOD, "final": True}, "usage": {"input": 70, "output": 9}},
    )
    seen: list[str] = []
    out = run(tmp_path, stub, name, progress=seen.append)
    assert out.status == "accepted" and out.steps == 2 and out.final_changes == GOOD
    assert (out.usage.input_tokens, out.usage.output_tokens) == (120, 14)
    assert any("draft rejected" in m for m in seen) and any("final accepted" in m for m in seen)
    # the model was told what was wrong, as a tool error it can fix
    last = stub.requests[1].body["messages"][-1]
    text = json.dumps(last)
    assert "not a plain name" in text
    assert ("ERROR: " in text) if name == "openai" else ('"is_error": true' in text)


@pytest.mark.parametrize("name", PROVIDERS)
def test_failed_final_is_answered_and_the_loop_goes_on(tmp_path, stub, name):
    stub.push(
        {"propose": {"changes": BAD, "final": True}},
        {"propose": {"changes": GOOD, "final": False}},
        {"propose": {"changes": GOOD, "final": True}},
    )
    out = run(tmp_path, stub, name)
    assert out.status == "accepted" and out.steps == 3
    events = load_worker_session(tmp_path, out.attempt_id)
    results = [(e["final"], e["accepted"]) for e in events if e["event"] == "result"]
    assert results == [(True, False), (False, True), (True, True)]
    assert replay_final_proposal(events) == {"changes": GOOD, "final": True}


def test_never_final_ends_at_step_cap(tmp_path, stub):
    stub.push(*[{"propose": {"changes": GOOD, "final": False}}] * 5)
    out = run(tmp_path, stub, "openai", budget=Budget(max_steps=3, timeout_s=10))
    assert out.status == "step-cap" and out.final_changes is None
    assert len(stub.requests) == 3
    events = load_worker_session(tmp_path, out.attempt_id)
    assert events[-1]["event"] == "end" and events[-1]["status"] == "step-cap"
    with pytest.raises(MemfsError, match="0 accepted final"):
        replay_final_proposal(events)


@pytest.mark.parametrize("name", PROVIDERS)
def test_hanging_model_ends_at_the_timeout(tmp_path, stub, name):
    stub.push({"propose": {"changes": GOOD, "final": False}}, {"hang": 30})
    t0 = time.monotonic()
    out = run(tmp_path, stub, name, budget=Budget(max_steps=5, timeout_s=1.5))
    elapsed = time.monotonic() - t0  # the 1.5 s attempt timeout, not the 30 s hang
    assert elapsed > 1.4
    assert elapsed < 5
    assert out.status == "timeout" and out.final_changes is None
    assert load_worker_session(tmp_path, out.attempt_id)[-1]["status"] == "timeout"


def test_a_rate_limit_longer_than_the_timeout_says_so_at_once(tmp_path, stub):
    """The wait is never started: the attempt ends saying the server's wait outlasts it, not
    in a plain `timeout` a minute later."""
    stub.push({"http": {"status": 429, "headers": {"retry-after": "60"}}})
    t0 = time.monotonic()
    with pytest.raises(ProviderUnavailable) as err:
        run(tmp_path, stub, "anthropic", budget=Budget(max_steps=5, timeout_s=1))
    assert time.monotonic() - t0 < 1
    assert ("anthropic failed (HTTP 429 (rate limited): (no detail in the body)) and anthropic "
            "asked to wait 60.0 s (retry-after), longer than the") in err.value.message
    assert "--timeout longer than the wait" in err.value.remedy
    assert len(stub.requests) == 1


def test_a_backoff_past_the_timeout_says_so_too(tmp_path, stub):
    stub.push(*[{"http": {"status": 503, "body": {"error": {"message": "overloaded"}}}}] * 5)
    with pytest.raises(ProviderUnavailable, match=r"the next try would come after [0-9.]+ s of "
                       "backoff, longer than"):
        run(tmp_path, stub, "openai", budget=Budget(max_steps=5, timeout_s=1.2))


@pytest.mark.parametrize("name", PROVIDERS)
def test_retries_are_reported_with_cause_and_delay(tmp_path, stub, name):
    stub.push({"http": {"status": 429, "headers": {"retry-after-ms": "200"},
                        "body": {"error": {"message": "slow down"}}}},
              {"propose": {"changes": GOOD, "final": True}})
    seen: list[str] = []
    out = run(tmp_path, stub, name, progress=seen.append)
    assert out.status == "accepted"
    assert (f"step 1: {name}: HTTP 429 (rate limited): slow down; retrying in 0.2 s "
            "(retry-after-ms; try 2 of 5)") in seen
    assert out.retries == [{"step": 1, "attempt": 1, "cause": "HTTP 429 (rate limited): slow down",
                            "delay_s": 0.2, "source": "retry-after-ms"}]
    events = load_worker_session(tmp_path, out.attempt_id)
    assert [e["cause"] for e in events if e["event"] == "retry"] == [out.retries[0]["cause"]]


def test_rejections_carry_the_whole_reason(tmp_path, stub):
    """The reason the model is told is printed and kept whole (it was cut at 60 characters,
    mid-sentence)."""
    raw = '{"changes": [{"op": "put" "name": "x"}], "final": true}'
    stub.push({"call": {"name": "memory_review_propose", "arguments": raw}},
              {"propose": {"changes": BAD, "final": True}},
              {"propose": {"changes": GOOD, "final": True}})
    seen: list[str] = []
    out = run(tmp_path, stub, "openai", progress=seen.append)
    assert out.status == "accepted"
    (bad_json, bad_name) = out.rejections
    assert bad_json.kind == "call" and bad_json.reason == (
        "arguments are not valid JSON (Expecting ',' delimiter: line 1 column 27 (char 26)); "
        "send a JSON object {changes, final}")
    assert (bad_name.step, bad_name.kind, bad_name.reason) == (
        2, "final", "changes[0].name: not a plain name")
    assert f"step 1: call refused: {bad_json.reason}" in seen
    assert "step 2: final rejected: changes[0].name: not a plain name" in seen


@pytest.mark.parametrize("name", PROVIDERS)
def test_hostile_calls_are_refused_and_nothing_concludes(tmp_path, stub, name):
    stub.push(
        {"call": {"name": "write_file", "arguments": {"path": "/etc/passwd", "content": "x"}}},
        {"call": {"name": "memory_review_propose",
                  "arguments": {"changes": GOOD, "final": True, "path": "/tmp/x"}}},
        {"call": {"name": "memory_review_propose",
                  "arguments": {"changes": GOOD, "final": True, "revision": "abc"}}},
        {"call": {"name": "memory_review_propose", "arguments": {"changes": GOOD}}},
        {"call": {"name": "memory_review_propose", "arguments": {"changes": GOOD, "final": "yes"}}},
        {"text": "I'd rather just chat."},
    )
    out = run(tmp_path, stub, name, budget=Budget(max_steps=6, timeout_s=10))
    assert out.status == "step-cap" and out.final_changes is None
    events = load_worker_session(tmp_path, out.attempt_id)
    refusals = [e["content"] for e in events if e["event"] == "result"]
    assert "no tool named 'write_file'" in refusals[0]
    assert "unknown field(s) 'path'" in refusals[1]
    assert "unknown field(s) 'revision'" in refusals[2]
    assert "missing field(s) 'final'" in refusals[3]
    assert "'final' must be true or false" in refusals[4]
    assert [e["event"] for e in events].count("draft") == 0  # nothing reached validate
    assert any(e["event"] == "nudge" for e in events)


@pytest.mark.parametrize(("raw", "error"), [
    ('{"changes": [,', "not valid JSON"),
    ('{"changes": [], "final": false, "final": true}', "'final' appears twice"),
    ('{"changes": [{"n": NaN}], "final": true}', "NaN is not JSON"),
    ('{"changes": "' + "x" * (2 * 1024 * 1024) + '", "final": true}', "over 2097152 characters"),
])
def test_malformed_arguments_are_a_tool_error_the_model_can_fix(tmp_path, stub, raw, error):
    stub.push(
        {"call": {"name": "memory_review_propose", "arguments": raw}},
        {"propose": {"changes": GOOD, "final": True}},
    )
    out = run(tmp_path, stub, "openai")
    assert out.status == "accepted" and out.final_changes == GOOD
    tool_msg = stub.requests[1].body["messages"][-1]
    assert tool_msg["role"] == "tool" and error in tool_msg["content"]


def test_truncated_arguments_end_the_attempt_with_a_clear_error(tmp_path, stub):
    stub.push({"truncate": '{"changes": [{"op": "pu'})
    with pytest.raises(ProviderTruncated):
        run(tmp_path, stub, "openai")
    (path,) = (tmp_path / "sessions" / "workers").iterdir()
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["status"] == "provider-error" and "max_tokens" in last["error"]


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("model", ["gpt-4o", "claude-3-haiku-20240307", "local-unknown"])
def test_every_request_carries_the_ceiling(tmp_path, stub, name, model):
    stub.push(
        {"propose": {"changes": BAD, "final": False}},
        {"propose": {"changes": GOOD, "final": True}},
    )
    out = run(tmp_path, stub, name, model=model)
    want = {"gpt-4o": 8192, "claude-3-haiku-20240307": 4096, "local-unknown": 8192}[model]
    assert request_max_tokens(model) == want
    assert [r.body["max_tokens"] for r in stub.requests] == [want, want]
    assert load_worker_session(tmp_path, out.attempt_id)[0]["max_tokens"] == want


def test_session_records_everything_but_the_key(tmp_path, stub):
    import os

    os.environ["OPENAI_API_KEY"] = "sk-secret-never-on-disk"
    try:
        stub.push({"propose": {"changes": GOOD, "final": True}})
        out = run(tmp_path, stub, "openai")
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert stub.requests[0].headers["authorization"].endswith("sk-secret-never-on-disk")
    events = load_worker_session(tmp_path, out.attempt_id)
    kinds = [e["event"] for e in events]
    assert kinds == ["attempt", "request", "response", "draft", "result", "end"]
    assert events[0]["consolidator_version"] == CONSOLIDATOR_VERSION
    assert events[0]["context"] == {"session": "s1"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"sk-secret-never-on-disk" not in path.read_bytes()


def test_replay_refuses_two_accepted_finals():
    events = [
        {"event": "draft", "step": 1, "call_id": "a", "final": True, "changes": GOOD},
        {"event": "result", "step": 1, "call_id": "a", "final": True, "accepted": True},
        {"event": "draft", "step": 2, "call_id": "b", "final": True, "changes": []},
        {"event": "result", "step": 2, "call_id": "b", "final": True, "accepted": True},
    ]
    with pytest.raises(MemfsError, match="2 accepted final"):
        replay_final_proposal(events)
    assert replay_final_proposal(events[:2]) == {"changes": GOOD, "final": True}


@pytest.mark.parametrize(("model", "override", "want"), [
    ("gpt-4o", 1000, 1000), ("gpt-4o", 12000, 12000), ("claude-3-haiku-20240307", 12000, 4096),
])
def test_max_output_tokens_override(tmp_path, stub, model, override, want):
    stub.push({"propose": {"changes": GOOD, "final": True}})
    run(tmp_path, stub, "anthropic", model=model,
        budget=Budget(max_steps=2, timeout_s=10, max_output_tokens=override))
    assert stub.requests[0].body["max_tokens"] == want
