"""`memfs consolidate` says why: each refused draft or final with its whole reason (stderr and
--json), each retry with its cause and delay, a rate limit that outlasts --timeout, and a
missing API key before any request. A real CLI process against the loopback stub."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.stub_server import StubServer
from helpers.worker import PUT_TABS, consolidate, make_session, memory_state

NO_KEYS = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}


@pytest.fixture
def stub():
    with StubServer() as s:
        yield s


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_each_refused_proposal_is_printed_with_its_reason(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    wrong = {**PUT_TABS, "evidence": [{"from": 2, "to": 2}]}  # turn 2 is a tool turn
    stub.push({"propose": {"changes": [{k: v for k, v in PUT_TABS.items() if k != "evidence"}],
                           "final": True}},
              *[{"propose": {"changes": [wrong], "final": True}}] * 2)
    code, out, err = consolidate(root, stub, provider, sid, "--max-steps", "3", env=NO_KEYS)
    assert code == 1 and out["state"] == "step-cap"
    reasons = [r["reason"] for r in out["rejections"]]
    assert [r["kind"] for r in out["rejections"]] == ["final"] * 3
    assert "changes[0].evidence: missing field" in reasons[0]
    assert all("evidence" in r for r in reasons[1:]), reasons
    for r in out["rejections"]:
        assert f"step {r['step']}: final rejected: {r['reason']}" in err
    assert "final rejected\n" not in err  # never a bare verdict
    assert memory_state(root) == before


def test_the_text_summary_names_the_last_refusal(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [{**PUT_TABS, "name": "a/b"}], "final": True}})
    res = subprocess.run(
        [sys.executable, "-m", "memfs", "--root", str(root), "consolidate", sid, "--base-url",
         stub.base_url("openai"), "--model", "gpt-4o", "--max-steps", "1"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **NO_KEYS})
    assert res.returncode == 1
    assert "refused   1 proposal(s) or call(s); the last (step 1, final): " in res.stdout
    assert "path separator" in res.stdout


def test_retries_are_reported_with_cause_and_delay(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"http": {"status": 429, "headers": {"retry-after-ms": "100"},
                        "body": {"error": {"message": "rate limit reached for requests"}}}},
              {"propose": {"changes": [PUT_TABS], "final": True}})
    code, out, err = consolidate(root, stub, "openai", sid, env=NO_KEYS)
    assert code == 0, err
    assert ("step 1: openai: HTTP 429 (rate limited): rate limit reached for requests; "
            "retrying in 0.1 s (retry-after-ms; try 2 of 5)") in err
    assert [(r["cause"], r["delay_s"]) for r in out["retries"]] == [
        ("HTTP 429 (rate limited): rate limit reached for requests", 0.1)]


def test_a_rate_limit_that_outlasts_the_timeout_says_so(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"http": {"status": 429, "headers": {"retry-after": "120"}, "body": {}}})
    code, out, err = consolidate(root, stub, "anthropic", sid, "--timeout", "5", env=NO_KEYS)
    assert code == 1
    assert "asked to wait 120.0 s (retry-after), longer than the" in out["error"]
    assert "s left of this attempt" in out["error"]
    assert "--timeout longer than the wait" in out["remedy"]


@pytest.mark.parametrize("provider,var", [("openai", "OPENAI_API_KEY"),
                                          ("anthropic", "ANTHROPIC_API_KEY")])
def test_a_missing_key_is_refused_before_any_request(tmp_path, provider, var):
    root = tmp_path / "root"
    sid = make_session(root)
    before = memory_state(root)
    res = subprocess.run(
        [sys.executable, "-m", "memfs", "--root", str(root), "consolidate", sid, "--provider",
         provider, "--base-url", "http://192.0.2.1:9/v1", "--json"],  # TEST-NET: never reached
        capture_output=True, text=True, timeout=60, env={**os.environ, **NO_KEYS})
    assert res.returncode == 1
    assert f'"{var} is not set: {provider} at http://192.0.2.1:9/v1' in res.stdout
    assert f"export {var}=<your key>" in res.stdout
    assert not (root / "sessions" / "workers").exists()  # no attempt was started
    assert memory_state(root) == before


def test_a_loopback_stub_without_a_key_is_allowed_with_a_note(tmp_path, stub):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [PUT_TABS], "final": True}})
    code, out, err = consolidate(root, stub, "openai", sid, env=NO_KEYS)
    assert code == 0, err
    assert "OPENAI_API_KEY is not set: sending without an API key to the loopback endpoint" in err
    assert "authorization" not in stub.requests[0].headers
