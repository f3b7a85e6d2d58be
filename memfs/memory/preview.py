"""The one pure generation algorithm. Preview and commit both call it, so they cannot drift.

`preview_workspace_changes` takes the current generation and a list of puts/deletes and returns
the complete next generation (normalized records, index, revision) plus a per-name diff. It
reads no disk and no clock; `MemoryStore.commit_workspace` re-runs it before swapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from memfs.memory.errors import InvalidRecord
from memfs.memory.generation import (
    GlobalGeneration,
    WorkspaceGeneration,
    content_hash,
    global_revision,
    render_index,
    workspace_revision,
)
from memfs.memory.records import normalize_global_content, normalize_record_content, validate_name


@dataclass(frozen=True)
class Put:
    name: str
    content: str
    op: Literal["put"] = "put"


@dataclass(frozen=True)
class Delete:
    name: str
    op: Literal["delete"] = "delete"


Change = Put | Delete


@dataclass(frozen=True)
class RecordDiff:
    name: str
    kind: Literal["added", "changed", "deleted"]
    before_hash: str | None
    after_hash: str | None


@dataclass(frozen=True)
class WorkspacePreview:
    workspace: str
    records: dict[str, str] = field(hash=False)  # name-sorted, normalized
    index: str
    revision: str
    before_revision: str
    diff: tuple[RecordDiff, ...]

    @property
    def no_change(self) -> bool:
        return self.revision == self.before_revision


@dataclass(frozen=True)
class GlobalPreview:
    content: str
    revision: str
    before_revision: str

    @property
    def no_change(self) -> bool:
        return self.revision == self.before_revision


def preview_workspace_changes(current: WorkspaceGeneration,
                              changes: Sequence[Change]) -> WorkspacePreview:
    """Apply puts/deletes to `current`; raise InvalidRecord on any invalid or conflicting change.

    Two changes to one name, or a delete of a missing record, are refused: there is exactly one
    way to express each outcome.
    """
    records = dict(current.records)
    seen: set[str] = set()
    for change in changes:
        name = validate_name(getattr(change, "name", None))
        if name in seen:
            raise InvalidRecord(f"two changes to record {name!r}", "send one change per record")
        seen.add(name)
        if isinstance(change, Put):
            records[name] = normalize_record_content(change.content)
        elif isinstance(change, Delete):
            if name not in records:
                raise InvalidRecord(f"cannot delete {name!r}: no such record",
                                    "delete only records that exist")
            del records[name]
        else:
            raise InvalidRecord(f"unknown change {change!r}", "use Put or Delete")
    return finish_workspace_preview(current, records)


def finish_workspace_preview(current: WorkspaceGeneration,
                             records: dict[str, str]) -> WorkspacePreview:
    """Order, index, revision and diff for a record set that is already validated."""
    ordered = {name: records[name] for name in sorted(records)}
    diff: list[RecordDiff] = []
    for name in sorted(set(ordered) | set(current.records)):
        before, after = current.records.get(name), ordered.get(name)
        if before == after:
            continue
        kind: Literal["added", "changed", "deleted"] = (
            "added" if before is None else "deleted" if after is None else "changed")
        diff.append(RecordDiff(name, kind, before and content_hash(before),
                               after and content_hash(after)))
    return WorkspacePreview(
        workspace=current.workspace, records=ordered, index=render_index(ordered),
        revision=workspace_revision(ordered), before_revision=current.revision, diff=tuple(diff))


def preview_global_change(current: GlobalGeneration, content: str | None) -> GlobalPreview:
    """Normalize a replacement of Global; None means "leave Global as it is"."""
    if content is None:
        return GlobalPreview(current.content, current.revision, current.revision)
    norm = normalize_global_content(content)
    return GlobalPreview(norm, global_revision(norm), current.revision)
