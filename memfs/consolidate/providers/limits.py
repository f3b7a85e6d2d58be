"""Declared output-token limits of known models, and the per-request ceiling derived from them.

Every worker request carries max_tokens = min(8192, declared): without a ceiling an adapter's
large default would apply on every step of a multi-step review and multiply cost. A model's
lower declared limit wins; an unknown model gets the 8192 ceiling.
"""

from __future__ import annotations

REQUEST_CEILING = 8192

# Max output tokens as the vendors document them. Matched exactly, else by the longest prefix
# (so dated snapshots like "gpt-4o-2024-08-06" find "gpt-4o").
DECLARED_OUTPUT_LIMITS: dict[str, int] = {
    "gpt-3.5-turbo": 4096,
    "gpt-4": 8192,
    "gpt-4-turbo": 4096,
    "gpt-4o": 16384,
    "gpt-4o-mini": 16384,
    "gpt-4.1": 32768,
    "gpt-4.1-mini": 32768,
    "gpt-4.1-nano": 32768,
    "o3-mini": 100000,
    "claude-3-haiku": 4096,
    "claude-3-opus": 4096,
    "claude-3-5-haiku": 8192,
    "claude-3-5-sonnet": 8192,
    "claude-3-7-sonnet": 64000,
    "claude-sonnet-4": 64000,
    "claude-opus-4": 32000,
}


def declared_output_limit(model: str) -> int | None:
    """The model's documented output limit, or None when the table does not know it."""
    if model in DECLARED_OUTPUT_LIMITS:
        return DECLARED_OUTPUT_LIMITS[model]
    best = max(
        (k for k in DECLARED_OUTPUT_LIMITS if model.startswith(k + "-")), key=len, default=None
    )
    return DECLARED_OUTPUT_LIMITS[best] if best else None


def request_max_tokens(model: str, override: int | None = None) -> int:
    """min(8192, declared); `override` replaces 8192 but still never exceeds the declared limit."""
    declared = declared_output_limit(model)
    ceiling = override if override is not None else REQUEST_CEILING
    if ceiling < 1:
        raise ValueError("max output tokens must be at least 1")
    return min(ceiling, declared) if declared is not None else ceiling
