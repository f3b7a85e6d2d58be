"""Provider clients against the stub over real loopback HTTP: wire format, retries, errors."""

from __future__ import annotations

import os
import time

import httpx
import pytest
import trio
from helpers.stub_server import StubServer

from memfs.consolidate.providers import (
    AnthropicProvider,
    OpenAIProvider,
    ProviderAuthError,
    ProviderError,
    ProviderRefusal,
    ProviderTruncated,
    ProviderUnavailable,
    ToolSpec,
    Transcript,
    declared_output_limit,
    make_provider,
    request_max_tokens,
)
from memfs.errors import MemfsError

TOOL = ToolSpec("memory_review_propose", "propose", {"type": "object", "properties": {}})
PROVIDERS = ["openai", "anthropic"]


def ask(provider, transcript=None, max_tokens=512):
    transcript = transcript or Transcript("sys")
    if not transcript.entries:
        transcript.add_user("hello")
    body = provider.request_body(transcript, TOOL, max_tokens)

    async def go():
        async with httpx.AsyncClient(timeout=10) as client:
            return await provider.complete(client, body)

    return trio.run(go)


@pytest.fixture
def monkeypatch_env():
    """Set environment variables for one test and restore them after (keys only in env)."""
    saved: dict[str, str | None] = {}

    def set_env(**values: str) -> None:
        for k, v in values.items():
            saved.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    yield set_env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def stub():
    with StubServer() as s:
        yield s


def provider_for(name, stub, **kw):
    p = make_provider(name, "gpt-4o" if name == "openai" else "claude-3-5-haiku", stub.base_url(name))
    for k, v in kw.items():
        setattr(p, k, v)
    return p


@pytest.mark.parametrize("name", PROVIDERS)
def test_tool_call_round_trip_and_wire_format(stub, name, monkeypatch_env):
    monkeypatch_env(OPENAI_API_KEY="sk-test-openai", ANTHROPIC_API_KEY="sk-test-anthropic")
    stub.push({"propose": {"changes": [], "final": True}, "usage": {"input": 11, "output": 7}})
    reply, raw = ask(provider_for(name, stub))
    assert [c.name for c in reply.tool_calls] == ["memory_review_propose"]
    assert reply.tool_calls[0].arguments_raw.replace(" ", "") == '{"changes":[],"final":true}'
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)
    req = stub.requests[0]
    assert req.body["max_tokens"] == 512
    if name == "openai":
        assert req.body["tool_choice"] == "required"
        assert req.body["parallel_tool_calls"] is False
        assert req.headers["authorization"] == "Bearer sk-test-openai"
        assert req.body["messages"][0] == {"role": "system", "content": "sys"}
    else:
        assert req.headers["anthropic-version"] == "2023-06-01"
        assert req.headers["x-api-key"] == "sk-test-anthropic"
        assert req.body["tool_choice"]["type"] == "any"
        assert req.body["tools"][0]["input_schema"] == TOOL.parameters


@pytest.mark.parametrize("name", PROVIDERS)
def test_tool_results_are_sent_back_in_protocol_shape(stub, name):
    stub.push({"propose": {"changes": [], "final": False}}, {"text": "ok"})
    p = provider_for(name, stub)
    t = Transcript("sys")
    t.add_user("hi")
    reply, _ = ask(p, t)
    t.add_reply(reply)
    from memfs.consolidate.providers import ToolResult

    t.add_tool_results([ToolResult(reply.tool_calls[0].id, "bad evidence", True)])
    ask(p, t)
    msgs = stub.requests[1].body["messages"]
    if name == "openai":
        assert msgs[-1]["role"] == "tool" and msgs[-1]["content"].startswith("ERROR: ")
        assert msgs[-2]["tool_calls"][0]["function"]["name"] == "memory_review_propose"
    else:
        block = msgs[-1]["content"][0]
        assert block["type"] == "tool_result" and block["is_error"] is True
        assert msgs[-2]["content"][0]["type"] == "tool_use"


@pytest.mark.parametrize("name", PROVIDERS)
def test_retries_honour_retry_after_ms_then_succeed(stub, name):
    stub.push(
        {"http": {"status": 429, "headers": {"retry-after-ms": "300"}, "body": {}}},
        {"http": {"status": 503, "headers": {"retry-after": "0"}, "body": {}}},
        {"propose": {"changes": [], "final": True}},
    )
    t0 = time.monotonic()
    reply, _ = ask(provider_for(name, stub))
    assert time.monotonic() - t0 >= 0.3
    assert len(stub.requests) == 3 and reply.tool_calls


def test_retries_are_bounded(stub):
    stub.push(*[{"http": {"status": 500, "headers": {"retry-after-ms": "1"}}}] * 10)
    with pytest.raises(ProviderUnavailable, match="3 tries"):
        ask(provider_for("openai", stub, max_retries=2))
    assert len(stub.requests) == 3


def test_non_retryable_status_fails_at_once(stub):
    stub.push({"http": {"status": 400, "body": {"error": {"message": "bad model"}}}})
    with pytest.raises(ProviderError, match="bad model"):
        ask(provider_for("openai", stub))
    assert len(stub.requests) == 1


@pytest.mark.parametrize("name", PROVIDERS)
def test_auth_failure_names_the_key_variable(name, monkeypatch_env):
    monkeypatch_env(OPENAI_API_KEY="wrong", ANTHROPIC_API_KEY="wrong")
    with StubServer(require_key="right") as stub:
        with pytest.raises(ProviderAuthError) as err:
            ask(provider_for(name, stub))
    assert ("OPENAI_API_KEY" if name == "openai" else "ANTHROPIC_API_KEY") in err.value.remedy
    assert len(stub.requests) == 1  # never retried


@pytest.mark.parametrize("name", PROVIDERS)
def test_refusal_and_truncation_are_clear_errors(stub, name):
    stub.push({"refuse": "I can't help with that"}, {"truncate": '{"changes": [{"op'})
    with pytest.raises(ProviderRefusal, match="refused"):
        ask(provider_for(name, stub))
    with pytest.raises(ProviderTruncated, match="max_tokens") as err:
        ask(provider_for(name, stub))
    assert "--max-output-tokens" in err.value.remedy


def test_malformed_openai_arguments_are_kept_verbatim(stub):
    stub.push({"call": {"name": "memory_review_propose", "arguments": '{"changes": [,,'}})
    reply, _ = ask(provider_for("openai", stub))
    assert reply.tool_calls[0].arguments_raw == '{"changes": [,,'


def test_declared_limits_and_ceiling():
    assert declared_output_limit("gpt-4o-2024-08-06") == 16384
    assert declared_output_limit("gpt-4o-mini-2024-07-18") == 16384
    assert declared_output_limit("claude-3-haiku-20240307") == 4096
    assert declared_output_limit("some-local-model") is None
    assert request_max_tokens("gpt-4o") == 8192
    assert request_max_tokens("claude-3-haiku-20240307") == 4096
    assert request_max_tokens("some-local-model") == 8192
    assert request_max_tokens("gpt-4o", override=12000) == 12000
    assert request_max_tokens("claude-3-haiku-20240307", override=12000) == 4096
    assert request_max_tokens("gpt-4o", override=100) == 100


def test_make_provider_rejects_unknown():
    with pytest.raises(MemfsError, match="unknown provider"):
        make_provider("bard")
    assert isinstance(make_provider("openai"), OpenAIProvider)
    assert isinstance(make_provider("anthropic"), AnthropicProvider)


def test_retry_delay_reads_the_server_headers():
    from email.utils import formatdate

    from memfs.consolidate.providers.base import retry_delay

    def resp(**headers: str) -> httpx.Response:
        return httpx.Response(429, headers={k.replace("_", "-"): v for k, v in headers.items()})

    assert retry_delay(resp(retry_after_ms="250", retry_after="9"), 0) == 0.25
    assert retry_delay(resp(retry_after="2"), 0) == 2.0
    assert 8 < retry_delay(resp(retry_after=formatdate(time.time() + 10, usegmt=True)), 0) <= 10
    assert retry_delay(resp(retry_after="soon"), 2) == 2.0  # unreadable: our own backoff
    assert retry_delay(None, 10) == 30.0  # capped
