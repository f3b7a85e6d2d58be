"""What every provider client shares: the neutral transcript, errors, and bounded retries.

The worker speaks one protocol-neutral transcript; each provider module translates it to its
wire format and back. Keeping the translation at the edge lets the worker loop, the session
log and replay stay the same whichever provider answered.
"""

from __future__ import annotations

import email.utils
import ipaddress
import math
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import trio

from memfs.errors import MemfsError

RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
DEFAULT_MAX_RETRIES = 4
MAX_BACKOFF_S = 30.0


class ProviderError(MemfsError):
    """A provider request failed in a way the worker cannot repair by talking to the model."""


class ProviderAuthError(ProviderError):
    """401/403: the key is missing, wrong or lacks access."""


class ProviderRefusal(ProviderError):
    """The model declined (OpenAI `refusal`, Anthropic `stop_reason: refusal`)."""


class ProviderTruncated(ProviderError):
    """The answer hit the output ceiling mid-call, so its tool arguments are incomplete."""


class ProviderUnavailable(ProviderError):
    """Retryable failures persisted past the retry budget (or the attempt deadline)."""


@dataclass(frozen=True)
class Retry:
    """One retried request: why, how long the client waits before the next try, and who chose
    that wait (the server's retry-after-ms / retry-after, or memfs's own backoff)."""

    attempt: int  # the try that failed, from 1
    tries: int  # how many tries the budget allows
    cause: str
    delay_s: float
    source: str

    def describe(self, provider: str) -> str:
        return (f"{provider}: {self.cause}; retrying in {self.delay_s:.1f} s ({self.source}; "
                f"try {self.attempt + 1} of {self.tries})")


OnRetry = Callable[[Retry], None]


@dataclass(frozen=True)
class ToolSpec:
    """The one tool the model may call: a name, a description, a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A call as the model made it; `arguments_raw` is kept verbatim (it may be malformed JSON)."""

    id: str
    name: str
    arguments_raw: str


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


@dataclass(frozen=True)
class ModelReply:
    """One provider answer in neutral form."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: Usage


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    content: str
    is_error: bool


@dataclass
class Transcript:
    """The conversation so far: a system prompt, then alternating user/assistant entries.

    Entries are plain dicts so they can be written to the worker session as they are:
    {"role": "user", "text": ...}
    {"role": "assistant", "text": ..., "tool_calls": [{"id", "name", "arguments_raw"}]}
    {"role": "tool_results", "results": [{"call_id", "content", "is_error"}]}
    """

    system: str
    entries: list[dict[str, Any]] = field(default_factory=list)

    def add_user(self, text: str) -> None:
        self.entries.append({"role": "user", "text": text})

    def add_reply(self, reply: ModelReply) -> None:
        self.entries.append(
            {
                "role": "assistant",
                "text": reply.text,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments_raw": c.arguments_raw}
                    for c in reply.tool_calls
                ],
            }
        )

    def add_tool_results(self, results: list[ToolResult]) -> None:
        self.entries.append(
            {
                "role": "tool_results",
                "results": [
                    {"call_id": r.call_id, "content": r.content, "is_error": r.is_error}
                    for r in results
                ],
            }
        )


class Provider(Protocol):
    """A chat model that must answer with a call to `tool`."""

    name: str
    model: str
    key_var: str  # the environment variable the key is read from, per request

    @property
    def url(self) -> str:
        """The endpoint a request is posted to."""
        ...

    def request_body(self, transcript: Transcript, tool: ToolSpec, max_tokens: int) -> dict:
        """The exact JSON body sent (what the worker session records; it holds no key)."""
        ...

    async def complete(self, client: httpx.AsyncClient, body: dict,
                       on_retry: OnRetry | None = None) -> tuple[ModelReply, dict]:
        """Send `body` (with retries, each told to `on_retry`); return the neutral reply and
        the raw response body."""
        ...


def api_key_from_env(var: str) -> str | None:
    """Keys live only in the environment and in request headers; nothing else sees them."""
    key = os.environ.get(var, "").strip()
    return key or None


def retry_delay(response: httpx.Response | None, attempt: int) -> float:
    """Server-directed delay (retry-after-ms, then retry-after), else capped exponential."""
    if response is not None:
        ms = response.headers.get("retry-after-ms")
        if ms is not None:
            try:
                return max(0.0, float(ms) / 1000.0)
            except ValueError:
                pass
        ra = response.headers.get("retry-after")
        if ra is not None:
            try:
                return max(0.0, float(ra))
            except ValueError:
                pass
            try:
                return max(0.0, email.utils.parsedate_to_datetime(ra).timestamp() - time.time())
            except (TypeError, ValueError):
                pass  # unreadable: fall back to our own backoff
    return min(MAX_BACKOFF_S, 0.5 * (2**attempt))


def delay_source(response: httpx.Response | None) -> str:
    """Who chose retry_delay's wait: the header it read, or memfs's backoff."""
    if response is not None:
        for name in ("retry-after-ms", "retry-after"):
            if name in response.headers:
                return name
    return "backoff"


MAX_BODY_TEXT = 2000  # a non-JSON error body (an HTML page) is shown up to this, marked if cut


def _error_detail(response: httpx.Response) -> str:
    """The server's own message, whole; only a non-JSON page is shortened, and says so."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        if len(text) > MAX_BODY_TEXT:
            return f"{text[:MAX_BODY_TEXT]}… ({len(text) - MAX_BODY_TEXT} more characters)"
        return text or "(empty body)"
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or body) if (err or body) else "(no detail in the body)"


def _failure(response: httpx.Response) -> str:
    rate = " (rate limited)" if response.status_code == 429 else ""
    return f"HTTP {response.status_code}{rate}: {_error_detail(response)}"


def _seconds_left() -> float:
    """Time left in the caller's trio deadline (the attempt's --timeout); inf without one."""
    return trio.current_effective_deadline() - trio.current_time()


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict,
    *,
    provider: str,
    key_var: str,
    max_retries: int = DEFAULT_MAX_RETRIES,
    sleep: Callable[[float], Awaitable[None]] = trio.sleep,
    on_retry: OnRetry | None = None,
) -> dict:
    """POST with bounded retries on 408/409/429/5xx and transport errors; each retry is
    reported to `on_retry` (cause, delay, who chose it) before the wait.

    The caller's trio cancel scope bounds the total time. A wait that would outlast it (a
    rate limit's retry-after longer than the time left) is not started: it ends at once in
    ProviderUnavailable saying so, rather than in a plain timeout later.
    """
    last = ""
    for attempt in range(max_retries + 1):
        response: httpx.Response | None = None
        try:
            response = await client.post(url, headers=headers, json=body)
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code in (401, 403):
                raise ProviderAuthError(
                    f"{provider} refused the credentials (HTTP {response.status_code}: "
                    f"{_error_detail(response)})",
                    f"set {key_var} to a valid key for this endpoint",
                )
            if response.status_code < 300:
                try:
                    data = response.json()
                except ValueError as exc:
                    raise ProviderError(
                        f"{provider} answered with a body that is not JSON ({exc})",
                        "check --base-url points at a compatible API",
                    ) from exc
                if not isinstance(data, dict):
                    raise ProviderError(f"{provider} answered with a non-object body")
                return data
            if response.status_code not in RETRYABLE_STATUS:
                raise ProviderError(
                    f"{provider} rejected the request (HTTP {response.status_code}: "
                    f"{_error_detail(response)})",
                    "check --model and --base-url",
                )
            last = _failure(response)
        if attempt == max_retries:
            break
        delay = retry_delay(response, attempt)
        source = delay_source(response)
        left = _seconds_left()
        if delay >= left:
            who = (f"{provider} asked to wait {delay:.1f} s ({source})" if source != "backoff"
                   else f"the next try would come after {delay:.1f} s of backoff")
            raise ProviderUnavailable(
                f"{provider} failed ({last}) and {who}, longer than the "
                f"{max(0.0, left):.1f} s left of this attempt",
                "try again later, or give a --timeout longer than the wait")
        if on_retry is not None:
            on_retry(Retry(attempt + 1, max_retries + 1, last, delay, source))
        if math.isfinite(delay):
            await sleep(delay)
    raise ProviderUnavailable(
        f"{provider} kept failing after {max_retries + 1} tries (last: {last})",
        "try again later, or point --base-url at another endpoint",
    )


async def complete_with(provider, client: httpx.AsyncClient, body: dict,
                        parse: Callable[[dict], ModelReply],
                        on_retry: OnRetry | None = None) -> tuple[ModelReply, dict]:
    """One request of a provider (its url, headers, key variable, retries), parsed by the
    protocol's own `parse`: the part both protocols share."""
    data = await post_json(
        client, provider.url, provider.headers(), body,
        provider=provider.name, key_var=provider.key_var, max_retries=provider.max_retries,
        on_retry=on_retry,
    )
    return parse(data), data


def is_loopback(url: str) -> bool:
    """Is `url` served on this host (a local stub or proxy), where no key may be needed?"""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def missing_key(provider) -> MemfsError | None:
    """The refusal for a request that would go out with no API key to a remote endpoint (it
    would only come back 401 after the session was frozen and a worker started), or None."""
    if api_key_from_env(provider.key_var) or is_loopback(provider.url):
        return None
    return MemfsError(
        f"{provider.key_var} is not set: {provider.name} at {provider.url} would refuse a "
        "request without an API key",
        f"export {provider.key_var}=<your key>, or point --base-url at a local "
        "OpenAI/Anthropic-compatible server")
