"""Anthropic Messages with tool_use / tool_result blocks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from memfs.consolidate.providers.base import (
    ModelReply,
    OnRetry,
    ProviderError,
    ProviderRefusal,
    ProviderTruncated,
    ToolCall,
    ToolSpec,
    Transcript,
    Usage,
    api_key_from_env,
    complete_with,
)

DEFAULT_BASE_URL = "https://api.anthropic.com"
KEY_VAR = "ANTHROPIC_API_KEY"
ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class AnthropicProvider:
    model: str
    base_url: str = DEFAULT_BASE_URL
    name: str = "anthropic"
    key_var: str = KEY_VAR
    max_retries: int = 4

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/messages"

    def request_body(self, transcript: Transcript, tool: ToolSpec, max_tokens: int) -> dict:
        messages: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            # Messages must alternate; fold a nudge after tool results into the same turn.
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})

        for entry in transcript.entries:
            role = entry["role"]
            if role == "user":
                add("user", [{"type": "text", "text": entry["text"]}])
            elif role == "assistant":
                blocks: list[dict[str, Any]] = []
                if entry["text"]:
                    blocks.append({"type": "text", "text": entry["text"]})
                for c in entry["tool_calls"]:
                    try:
                        tool_input = json.loads(c["arguments_raw"])
                    except ValueError:
                        tool_input = {}
                    blocks.append(
                        {"type": "tool_use", "id": c["id"], "name": c["name"], "input": tool_input}
                    )
                add("assistant", blocks)
            elif role == "tool_results":
                add(
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": r["call_id"],
                            "content": r["content"],
                            "is_error": r["is_error"],
                        }
                        for r in entry["results"]
                    ],
                )
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "system": transcript.system,
            "messages": messages,
            "tools": [
                {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        }

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        key = api_key_from_env(self.key_var)
        if key:
            headers["x-api-key"] = key
        return headers

    async def complete(
        self, client: httpx.AsyncClient, body: dict, on_retry: OnRetry | None = None
    ) -> tuple[ModelReply, dict]:
        return await complete_with(self, client, body, parse_response, on_retry)


def parse_response(data: dict) -> ModelReply:
    """Map a Messages response to a neutral reply, refusing what the worker cannot use."""
    content = data.get("content")
    if not isinstance(content, list):
        raise ProviderError(
            "anthropic: response has no content list",
            "check --base-url points at a Messages API",
        )
    stop = str(data.get("stop_reason") or "")
    if stop == "refusal":
        raise ProviderRefusal(
            "anthropic: the model refused (stop_reason: refusal)",
            "review the session content, or try another --model",
        )
    if stop == "max_tokens":
        raise ProviderTruncated(
            "anthropic: the answer hit max_tokens (stop_reason: max_tokens); its tool input "
            "is incomplete",
            "raise --max-output-tokens, or consolidate a shorter session",
        )
    texts, calls = [], []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            calls.append(
                ToolCall(
                    str(block.get("id") or ""),
                    str(block.get("name") or ""),
                    json.dumps(block.get("input")),
                )
            )
    usage = data.get("usage") or {}
    return ModelReply(
        text="\n".join(texts),
        tool_calls=tuple(calls),
        stop_reason=stop,
        usage=Usage(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)),
    )
