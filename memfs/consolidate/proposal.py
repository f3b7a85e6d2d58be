"""The closed proposal parser: model output in, a canonical, validated Proposal out.

The worker's proposal is hostile input. Every field is checked against an exact schema (an
unknown or missing field is named), every evidence range against the frozen session's
model-visible turns, and every record through the same validation and preview MemoryStore
commits with. Scope, revision and paths are never read from a proposal: the caller supplies
the session and the current generation.

Canonical form: name-sorted deletes, name-sorted puts, then replace-global; evidence ranges
sorted and de-duplicated; contents normalized. The proposal hash is BLAKE2b over that form's
canonical JSON, so two proposals that say the same thing hash the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfs.errors import MemfsError
from memfs.memory.errors import InvalidRecord
from memfs.memory.generation import (
    GlobalGeneration,
    WorkspaceGeneration,
    blake2b_hex,
    canonical_json,
)
from memfs.memory.preview import (
    Change,
    Delete,
    Put,
    WorkspacePreview,
    preview_global_change,
    preview_workspace_changes,
)
from memfs.memory.records import normalize_record_content, validate_name
from memfs.memory.sessions import FrozenSession

PROPOSAL_KIND = "memfs.proposal/1"
MAX_PROPOSAL_BYTES = 2 * 1024 * 1024
MAX_CHANGES = 256
MAX_EVIDENCE = 64
MAX_REASON_CHARS = 2000
NO_CHANGE_REASON = "the proposed changes leave memory as it is"

_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # op -> (required, optional)
    "put": (frozenset({"op", "name", "content", "evidence"}), frozenset()),
    "delete": (frozenset({"op", "name", "evidence"}), frozenset()),
    "replace-global": (frozenset({"op", "content", "evidence"}), frozenset()),
    "no-change": (frozenset({"op"}), frozenset({"reason", "evidence"})),
}
_ORDER = {"delete": 0, "put": 1, "replace-global": 2, "no-change": 3}


class ProposalError(MemfsError):
    """A proposal refused at the boundary; `field` names where (e.g. changes[1].evidence[0])."""

    def __init__(self, field: str, message: str, remedy: str = "") -> None:
        super().__init__(f"{field or 'proposal'}: {message}",
                         remedy or "fix the proposal and send it again")
        self.field = field


@dataclass(frozen=True, order=True)
class Evidence:
    """An inclusive range of session turn numbers (from 1), as the projection shows them."""

    start: int
    end: int

    def wire(self) -> dict[str, int]:
        return {"from": self.start, "to": self.end}


@dataclass(frozen=True)
class ProposedChange:
    op: str  # "put" | "delete" | "replace-global" | "no-change"
    name: str | None = None
    content: str | None = None
    evidence: tuple[Evidence, ...] = ()
    reason: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        if self.name is not None:
            out["name"] = self.name
        if self.content is not None:
            out["content"] = self.content
        if self.reason is not None:
            out["reason"] = self.reason
        if self.evidence or self.op != "no-change":
            out["evidence"] = [e.wire() for e in self.evidence]
        return out


@dataclass(frozen=True)
class Proposal:
    changes: tuple[ProposedChange, ...]  # canonical order
    final: bool
    hash: str
    session: FrozenSession
    workspace_preview: WorkspacePreview

    @property
    def no_change(self) -> bool:
        return len(self.changes) == 1 and self.changes[0].op == "no-change"

    @property
    def reason(self) -> str | None:
        return self.changes[0].reason if self.no_change else None

    @property
    def workspace_changes(self) -> tuple[Change, ...]:
        """The puts and deletes, in canonical order, for preview_workspace_changes()."""
        out: list[Change] = []
        for c in self.changes:
            if c.op == "put":
                out.append(Put(c.name or "", c.content or ""))
            elif c.op == "delete":
                out.append(Delete(c.name or ""))
        return tuple(out)

    @property
    def global_content(self) -> str | None:
        """Global's replacement content, or None when Global is left alone."""
        return next((c.content for c in self.changes if c.op == "replace-global"), None)

    def to_wire(self) -> dict[str, Any]:
        return {"changes": [c.wire() for c in self.changes], "final": self.final}


def proposal_hash(changes: Sequence[ProposedChange]) -> str:
    return blake2b_hex(canonical_json({"kind": PROPOSAL_KIND,
                                       "changes": [c.wire() for c in changes]}))


def parse_proposal(raw: object | str, session: FrozenSession, current: WorkspaceGeneration,
                   current_global: GlobalGeneration | None = None) -> Proposal:
    """Validate and canonicalize one proposal; raise ProposalError naming the field.

    With `current_global`, a replace-global equal to Global counts as no change, so a proposal
    that changes nothing at all becomes `no-change`; without it, replace-global always counts.
    """
    if session.workspace is not None and session.workspace != current.workspace:
        raise ProposalError("", f"session {session.id} belongs to workspace "
                            f"{session.workspace!r}, not {current.workspace!r}",
                            "review a session against its own workspace")
    doc = _decode(raw)
    _exact(doc, "", frozenset({"changes", "final"}), frozenset())
    final = doc["final"]
    if type(final) is not bool:
        raise ProposalError("final", "must be true or false")
    items = doc["changes"]
    if type(items) is not list or not items:
        raise ProposalError("changes", "must be a non-empty list")
    if len(items) > MAX_CHANGES:
        raise ProposalError("changes", f"has {len(items)} entries, over {MAX_CHANGES}")
    parsed = [_change(item, f"changes[{i}]", session) for i, item in enumerate(items)]
    _check_combination(parsed, current)
    changes = tuple(sorted(parsed, key=lambda c: (_ORDER[c.op], c.name or "")))

    workspace = tuple(c for c in changes if c.op in ("put", "delete"))
    try:
        preview = preview_workspace_changes(current, [
            Put(c.name or "", c.content or "") if c.op == "put" else Delete(c.name or "")
            for c in workspace])
    except InvalidRecord as exc:
        raise ProposalError("changes", exc.message, exc.remedy) from None
    glob = next((c for c in changes if c.op == "replace-global"), None)
    global_same = (glob is not None and current_global is not None
                   and preview_global_change(current_global, glob.content).no_change)
    if changes[0].op != "no-change" and preview.no_change and (glob is None or global_same):
        evidence = tuple(sorted({e for c in changes for e in c.evidence}))
        changes = (ProposedChange("no-change", evidence=evidence, reason=NO_CHANGE_REASON),)
    return Proposal(changes=changes, final=final, hash=proposal_hash(changes), session=session,
                    workspace_preview=preview)


def _decode(raw: object) -> dict[str, Any]:
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ProposalError("", "is not UTF-8") from None
    if isinstance(raw, str):
        if len(raw) > MAX_PROPOSAL_BYTES:
            raise ProposalError("", f"is over {MAX_PROPOSAL_BYTES} bytes")
        try:
            raw = json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except ProposalError:
            raise
        except (ValueError, RecursionError) as exc:
            raise ProposalError("", f"is not valid JSON ({str(exc)[:80]})") from None
    if type(raw) is not dict:
        raise ProposalError("", "must be a JSON object with 'changes' and 'final'")
    return raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ProposalError(key, "appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ProposalError("", f"contains {name}, which is not JSON")


def _exact(obj: dict[str, Any], where: str, required: frozenset[str],
           optional: frozenset[str]) -> None:
    for key in obj:
        if type(key) is not str or key not in required | optional:
            raise ProposalError(_join(where, str(key)), "unknown field",
                                f"allowed fields here: {', '.join(sorted(required | optional))}")
    for key in sorted(required):
        if key not in obj:
            raise ProposalError(_join(where, key), "missing field")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _change(item: object, where: str, session: FrozenSession) -> ProposedChange:
    if type(item) is not dict:
        raise ProposalError(where, "must be an object with an 'op'")
    op = item.get("op")
    if type(op) is not str or op not in _FIELDS:
        raise ProposalError(_join(where, "op"), f"{op!r} is not one of {', '.join(_FIELDS)}")
    _exact(item, where, *_FIELDS[op])
    name = content = reason = None
    if "name" in item:
        try:
            name = validate_name(item["name"])
        except InvalidRecord as exc:
            raise ProposalError(_join(where, "name"), exc.message, exc.remedy) from None
    if op == "put":
        try:
            content = normalize_record_content(item["content"])
        except InvalidRecord as exc:
            raise ProposalError(_join(where, "content"), exc.message, exc.remedy) from None
    elif op == "replace-global":
        try:
            content = preview_global_change(_EMPTY_GLOBAL, item["content"]).content
        except InvalidRecord as exc:
            raise ProposalError(_join(where, "content"), exc.message, exc.remedy) from None
    if "reason" in item:
        reason = item["reason"]
        if type(reason) is not str or not reason.strip() or len(reason) > MAX_REASON_CHARS:
            raise ProposalError(_join(where, "reason"),
                                f"must be non-blank text of at most {MAX_REASON_CHARS} characters")
        if any(ord(c) < 32 and c not in "\n\t" for c in reason):
            raise ProposalError(_join(where, "reason"), "contains a control character")
    evidence: tuple[Evidence, ...] = ()
    if "evidence" in item:
        evidence = _evidence(item["evidence"], _join(where, "evidence"), session)
    if op == "no-change" and reason is None and not evidence:
        raise ProposalError(where, "a no-change needs evidence or a reason")
    return ProposedChange(op, name, content, evidence, reason)


def _evidence(value: object, where: str, session: FrozenSession) -> tuple[Evidence, ...]:
    if type(value) is not list or not value:
        raise ProposalError(where, "must be a non-empty list of {\"from\": N, \"to\": M}")
    if len(value) > MAX_EVIDENCE:
        raise ProposalError(where, f"has {len(value)} ranges, over {MAX_EVIDENCE}")
    out: set[Evidence] = set()
    for i, rng in enumerate(value):
        at = f"{where}[{i}]"
        if type(rng) is not dict:
            raise ProposalError(at, "must be {\"from\": N, \"to\": M}")
        _exact(rng, at, frozenset({"from", "to"}), frozenset())
        start, end = rng["from"], rng["to"]
        if type(start) is not int or type(end) is not int:
            raise ProposalError(at, "'from' and 'to' must be integers (turn numbers from 1)")
        out.add(_check_range(start, end, at, session))
    return tuple(sorted(out))


def _check_range(start: int, end: int, at: str, session: FrozenSession) -> Evidence:
    label = f"range {start}-{end}"
    if start > end:
        raise ProposalError(at, f"{label} is reversed ('from' is after 'to')")
    if start < 1 or end > session.turn_count:
        turns = f"turns 1-{session.turn_count}" if session.turn_count else "no turns"
        raise ProposalError(at, f"{label} is outside session {session.id}, which has {turns}",
                            "cite only turns the evidence projection shows")
    hidden = next((t for t in range(start, end + 1) if t not in session.visible_turns), None)
    if hidden is not None:
        raise ProposalError(at, f"{label} covers turn {hidden}, which the evidence projection "
                            f"of session {session.id} hides",
                            "cite only user and assistant turns the projection shows")
    return Evidence(start, end)


def _check_combination(parsed: list[ProposedChange], current: WorkspaceGeneration) -> None:
    if any(c.op == "no-change" for c in parsed) and len(parsed) > 1:
        raise ProposalError("changes", "no-change must be the only change")
    seen: dict[str, int] = {}
    globals_ = 0
    for i, c in enumerate(parsed):
        if c.op == "replace-global":
            globals_ += 1
            if globals_ > 1:
                raise ProposalError(f"changes[{i}]", "a second replace-global",
                                    "send one replace-global per proposal")
        if c.name is None:
            continue
        if c.name in seen:
            raise ProposalError(f"changes[{i}].name", f"{c.name!r} is already changed by "
                                f"changes[{seen[c.name]}]", "send one change per record")
        seen[c.name] = i
        if c.op == "delete" and c.name not in current.records:
            raise ProposalError(f"changes[{i}].name", f"cannot delete {c.name!r}: no such record "
                                f"in workspace {current.workspace!r}")


_EMPTY_GLOBAL = GlobalGeneration(content="", revision="")
