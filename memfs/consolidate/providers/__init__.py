"""Provider clients for the consolidation worker: real protocols over httpx."""

from __future__ import annotations

from memfs.consolidate.providers.anthropic import AnthropicProvider
from memfs.consolidate.providers.base import (
    ModelReply,
    Provider,
    ProviderAuthError,
    ProviderError,
    ProviderRefusal,
    ProviderTruncated,
    ProviderUnavailable,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    Usage,
)
from memfs.consolidate.providers.limits import declared_output_limit, request_max_tokens
from memfs.consolidate.providers.openai import OpenAIProvider
from memfs.errors import MemfsError

PROVIDERS = ("openai", "anthropic")
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-20241022"}


def make_provider(name: str, model: str | None = None, base_url: str | None = None) -> Provider:
    """Build a provider client by name; the key is read from the environment per request."""
    model = model or DEFAULT_MODELS.get(name, "")
    if name == "openai":
        return OpenAIProvider(model, base_url) if base_url else OpenAIProvider(model)
    if name == "anthropic":
        return AnthropicProvider(model, base_url) if base_url else AnthropicProvider(model)
    raise MemfsError(f"unknown provider {name!r}", f"use one of: {', '.join(PROVIDERS)}")


__all__ = [
    "AnthropicProvider", "ModelReply", "OpenAIProvider", "Provider", "ProviderAuthError",
    "ProviderError", "ProviderRefusal", "ProviderTruncated", "ProviderUnavailable", "ToolCall",
    "ToolResult", "ToolSpec", "Transcript", "Usage", "declared_output_limit", "make_provider",
    "request_max_tokens", "PROVIDERS", "DEFAULT_MODELS",
]
