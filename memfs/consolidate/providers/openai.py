"""OpenAI-compatible chat completions with one required tool and no parallel calls."""

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

DEFAULT_BASE_URL = "https://api.openai.com/v1"
KEY_VAR = "OPENAI_API_KEY"
TOOL_ERROR_PREFIX = "ERROR: "  # chat completions has no is_error flag on tool messages


@dataclass
class OpenAIProvider:
    model: str
    base_url: str = DEFAULT_BASE_URL
    name: str = "openai"
    key_var: str = KEY_VAR
    max_retries: int = 4

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def request_body(self, transcript: Transcript, tool: ToolSpec, max_tokens: int) -> dict:
        messages: list[dict[str, Any]] = [{"role": "system", "content": transcript.system}]
        for entry in transcript.entries:
            role = entry["role"]
            if role == "user":
                messages.append({"role": "user", "content": entry["text"]})
            elif role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": entry["text"] or None}
                if entry["tool_calls"]:
                    msg["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments_raw"]},
                        }
                        for c in entry["tool_calls"]
                    ]
                messages.append(msg)
            elif role == "tool_results":
                for r in entry["results"]:
                    content = (TOOL_ERROR_PREFIX if r["is_error"] else "") + r["content"]
                    messages.append(
                        {"role": "tool", "tool_call_id": r["call_id"], "content": content}
                    )
        return {
            "model": self.model,
            "messages": messages,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": max_tokens,
        }

    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        key = api_key_from_env(self.key_var)
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    async def complete(
        self, client: httpx.AsyncClient, body: dict, on_retry: OnRetry | None = None
    ) -> tuple[ModelReply, dict]:
        return await complete_with(self, client, body, parse_response, on_retry)


def parse_response(data: dict) -> ModelReply:
    """Map a chat completion to a neutral reply, refusing what the worker cannot use."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ProviderError(
            f"openai: response has no choices[0].message ({exc!r})",
            "check --base-url points at a chat-completions API",
        ) from exc
    finish = str(choice.get("finish_reason") or "")
    if message.get("refusal") or finish == "content_filter":
        raise ProviderRefusal(
            f"openai: the model refused ({message.get('refusal') or finish})",
            "review the session content, or try another --model",
        )
    if finish == "length":
        raise ProviderTruncated(
            "openai: the answer hit max_tokens (finish_reason: length); its tool arguments "
            "are incomplete",
            "raise --max-output-tokens, or consolidate a shorter session",
        )
    calls = []
    for raw in message.get("tool_calls") or []:
        fn = raw.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(ToolCall(str(raw.get("id") or ""), str(fn.get("name") or ""), args))
    usage = data.get("usage") or {}
    return ModelReply(
        text=str(message.get("content") or ""),
        tool_calls=tuple(calls),
        stop_reason=finish,
        usage=Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
    )
