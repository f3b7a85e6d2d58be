"""Generations as values: what a revision is a hash of, and how the index is rendered.

A revision is BLAKE2b-256 over a canonical JSON encoding of the generation's records (or of
Global's content), so it names content, not history: two generations with the same records have
the same revision wherever and whenever they were made. The index is derived from the records,
so it is not hashed separately.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from memfs.memory.errors import InvalidRecord
from memfs.memory.records import MAX_INDEX_BYTES, RECORD_SUFFIX

WORKSPACE_KIND = "memfs.memory.workspace/1"
GLOBAL_KIND = "memfs.memory.global/1"
INDEX_TITLE_CHARS = 80


def blake2b_hex(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def workspace_revision(records: Mapping[str, str]) -> str:
    return blake2b_hex(canonical_json({"kind": WORKSPACE_KIND,
                                       "records": [[n, records[n]] for n in sorted(records)]}))


def global_revision(content: str) -> str:
    return blake2b_hex(canonical_json({"kind": GLOBAL_KIND, "content": content}))


def content_hash(content: str) -> str:
    """Hash of one record's content, for diffs and receipts (never the body itself)."""
    return blake2b_hex(content.encode())


def _title(content: str) -> str:
    for line in content.split("\n"):
        stripped = line.strip()
        if stripped:
            title = stripped.lstrip("#").strip() or stripped
            return title if len(title) <= INDEX_TITLE_CHARS else title[: INDEX_TITLE_CHARS - 1] + "…"
    return ""


def render_index(records: Mapping[str, str]) -> str:
    """The generated, read-only index.md: one line per record, name-sorted."""
    lines = ["# Memory index", ""]
    if not records:
        lines.append("(no records)")
    for name in sorted(records):
        title = _title(records[name])
        lines.append(f"- {name}{RECORD_SUFFIX}" + (f": {title}" if title else ""))
    index = "\n".join(lines) + "\n"
    if len(index.encode()) > MAX_INDEX_BYTES:
        raise InvalidRecord(f"the generated index would be over {MAX_INDEX_BYTES} bytes",
                            "merge or delete records; this workspace holds too many")
    return index


@dataclass(frozen=True)
class GlobalGeneration:
    content: str
    revision: str
    seq: int = 0  # 0 = nothing committed yet


@dataclass(frozen=True)
class WorkspaceGeneration:
    workspace: str
    records: dict[str, str] = field(hash=False)
    index: str
    revision: str
    seq: int = 0


def empty_global() -> GlobalGeneration:
    return GlobalGeneration(content="", revision=global_revision(""), seq=0)


def empty_workspace(workspace: str) -> WorkspaceGeneration:
    return WorkspaceGeneration(workspace=workspace, records={}, index=render_index({}),
                               revision=workspace_revision({}), seq=0)
