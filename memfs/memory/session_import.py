"""Turn files for `memfs session import`: memfs JSONL, or OpenAI chat `messages`.

Accepted shapes (see docs/memory.md):
- JSONL, one turn per line: {"role": "user"|"assistant"|"tool"|"system", "text": "..."}
- JSONL of OpenAI messages: {"role": ..., "content": "..." | [{"type": "text", "text": ...}]
  | null, ...}; "developer" counts as system, "function" as tool; tool_calls are kept out of
  the text (an assistant turn with only tool calls has empty text and is hidden from evidence).
- One JSON document: a list of such messages, or {"messages": [...]}.
"""

from __future__ import annotations

import json
from pathlib import Path

from memfs.memory.errors import SessionError
from memfs.memory.sessions import ROLES

_ROLE_ALIASES = {"developer": "system", "function": "tool"}


def parse_turn_file(path: Path) -> list[tuple[str, str]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SessionError(f"cannot read {path}: {exc}", "give a UTF-8 JSONL file") from exc
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "messages" in doc:
        doc = doc["messages"]
    if isinstance(doc, list):
        return [_turn(m, f"{path}: messages[{i}]") for i, m in enumerate(doc)]
    turns = []
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SessionError(f"{path}:{n}: not JSON ({exc.msg})",
                               "one JSON object per line") from None
        turns.append(_turn(item, f"{path}:{n}"))
    return turns


def _turn(item: object, where: str) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise SessionError(f"{where}: a turn must be a JSON object", "see docs/memory.md")
    role = _ROLE_ALIASES.get(item.get("role"), item.get("role"))  # type: ignore[arg-type]
    if role not in ROLES:
        raise SessionError(f"{where}: role {item.get('role')!r} is not one of {', '.join(ROLES)}",
                           "fix the role")
    if "text" in item:
        text = item["text"]
    else:
        text = _content_text(item.get("content"), where)
    if not isinstance(text, str):
        raise SessionError(f"{where}: text must be a string", "fix the turn")
    return role, text


def _content_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise SessionError(f"{where}: a text part has no text", "fix the message")
                parts.append(part["text"])
        return "\n".join(parts)
    raise SessionError(f"{where}: content must be a string, a list of parts or null",
                       "fix the message")
