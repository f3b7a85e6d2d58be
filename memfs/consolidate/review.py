"""`memfs consolidate`: freeze, run the worker, validate, preview, commit behind a receipt.

The orchestration in order:

1. freeze the source session and read the current Global and Workspace generations;
2. run an isolated worker attempt (memfs.consolidate.worker) whose only tool is answered by
   the closed proposal parser bound to exactly those frozen values;
3. rebuild the final proposal from the worker session (the same replay recovery uses) and
   parse it again, so what is committed is what recovery would rebuild;
4. preview both scopes and hand the plan to the receipt-first committer.

The model is told turn numbers, roles and text, and memory content by record name. It is
never told a path, a revision, or which workspace it is in; the host fills those in.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfs.consolidate.committer import Review, commit_review, plan_from_proposal, snapshot_of
from memfs.consolidate.proposal import parse_proposal
from memfs.consolidate.providers import make_provider
from memfs.consolidate.providers.base import Usage, api_key_from_env, missing_key
from memfs.consolidate.receipts import Receipt, new_review_id, receipt_location
from memfs.consolidate.worker import (
    CONSOLIDATOR_VERSION,
    Budget,
    Rejection,
    Verdict,
    load_worker_session,
    replay_final_proposal,
    run_worker,
    tool_spec,
)
from memfs.errors import MemfsError
from memfs.memory.durable import crash_point
from memfs.memory.generation import GlobalGeneration, WorkspaceGeneration
from memfs.memory.preview import preview_global_change
from memfs.memory.sessions import FrozenSession, ProjectedTurn
from memfs.memory.shared import open_memory_store
from memfs.memory.shared_sessions import open_session_store

EVIDENCE_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "properties": {"from": {"type": "integer"}, "to": {"type": "integer"}},
        "required": ["from", "to"],
        "additionalProperties": False,
    },
}
CHANGES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "description": "The complete proposal (not a delta on your last draft).",
    "items": {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["put", "delete", "replace-global", "no-change"]},
            "name": {"type": "string", "description": "record name (put/delete), e.g. 'editor'"},
            "content": {"type": "string", "description": "Markdown (put/replace-global)"},
            "evidence": EVIDENCE_SCHEMA,
            "reason": {"type": "string", "description": "only for no-change"},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
}
TOOL_DESCRIPTION = (
    "Propose memory changes. Every change cites the turns that justify it as inclusive ranges "
    "of turn numbers. final=false checks a draft and lets you revise it; final=true submits "
    "it. The reply lists any errors; fix them and call again."
)
SYSTEM_PROMPT = """\
You consolidate an agent's long-term memory from one conversation.

Memory has two scopes:
- Workspace records: named Markdown notes about this project. `put` creates or replaces a
  record by name (give its full new content); `delete` removes one.
- Global memory: one Markdown document of durable preferences that hold across projects.
  `replace-global` gives its full new content; keep what is still true.

Rules:
- Record only what the conversation shows; cite it. Each change needs `evidence`: ranges
  {"from": N, "to": M} of the numbered turns below. Cite only turns shown.
- At most one change per record name, and at most one replace-global.
- If nothing is worth keeping, propose a single {"op": "no-change", "reason": "..."}.
- Answer only by calling memory_review_propose. Send final=false to check a draft, and
  final=true when you are done. Your proposal changes nothing until the host commits it.
"""


@dataclass(frozen=True)
class ConsolidateOptions:
    provider: str = "openai"
    model: str | None = None
    base_url: str | None = None
    budget: Budget = field(default_factory=Budget)


@dataclass
class ReviewOutcome:
    """What one `consolidate` did. `state` is the receipt's state, or the worker's end
    (step-cap, timeout) when nothing reached the committer."""

    review_id: str
    attempt_id: str
    state: str
    workspace: str
    steps: int
    usage: Usage
    worker_session: str
    receipt: Receipt | None = None
    receipt_path: str | None = None
    revisions: dict[str, dict[str, str | None]] = field(default_factory=dict)
    diff: list[dict[str, Any]] = field(default_factory=list)
    consolidator_version: str = CONSOLIDATOR_VERSION
    rejections: list[Rejection] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.state in ("committed", "no-change")

    def to_json(self) -> dict[str, Any]:
        return {
            "review_id": self.review_id, "worker_attempt": self.attempt_id, "state": self.state,
            "workspace": self.workspace, "steps": self.steps,
            "usage": {"input_tokens": self.usage.input_tokens,
                      "output_tokens": self.usage.output_tokens},
            "worker_session": self.worker_session, "receipt": self.receipt_path,
            "revisions": self.revisions, "diff": self.diff,
            "consolidator_version": self.consolidator_version,
            "rejections": [r.to_json() for r in self.rejections], "retries": self.retries,
        }


def render_prompt(turns: list[ProjectedTurn], glob: GlobalGeneration,
                  ws: WorkspaceGeneration) -> str:
    """The one user message: visible turns by number, then memory by record name."""
    parts = ["## Conversation (numbered turns you may cite)", ""]
    if not turns:
        parts.append("(no visible turns)")
    for t in turns:
        parts.append(f"### Turn {t.index} ({t.role})\n{t.text.rstrip()}\n")
    parts += ["", "## Global memory", "", glob.content.rstrip() or "(empty)", "",
              "## Workspace records", ""]
    if not ws.records:
        parts.append("(none)")
    for name, content in ws.records.items():
        parts.append(f"### record: {name}\n{content.rstrip()}\n")
    return "\n".join(parts) + "\n"


def make_validate(frozen: FrozenSession, ws: WorkspaceGeneration,
                  glob: GlobalGeneration) -> Callable[[dict[str, Any]], Verdict]:
    """The parser bound to the frozen values; its refusals go back to the model as tool errors."""

    def validate(raw: dict[str, Any]) -> Verdict:
        try:
            proposal = parse_proposal(raw, frozen, ws, glob)
        except MemfsError as exc:  # ProposalError, or a record the memory layer refuses
            return Verdict(False, f"{exc.message} ({exc.remedy})" if exc.remedy else exc.message)
        if proposal.no_change:
            return Verdict(True, "no change to memory", {"hash": proposal.hash, "diff": []})
        diff = [f"{d.kind} {d.name}" for d in proposal.workspace_preview.diff]
        if proposal.global_content is not None:
            diff.append("replace Global")
        return Verdict(True, "; ".join(diff) or "no change",
                       {"hash": proposal.hash, "diff": diff})

    return validate


def consolidate(root: Path, session_id: str, workspace: str | None,
                options: ConsolidateOptions,
                progress: Callable[[str], None] | None = None) -> ReviewOutcome:
    """One review end to end. Raises MemfsError for refusals before anything is written,
    and the provider's error (auth, refusal, truncation) with the worker session kept."""
    say = progress or (lambda _m: None)
    sessions = open_session_store(root)
    frozen = sessions.freeze(session_id)
    ws_name = workspace or frozen.workspace
    if not ws_name:
        raise MemfsError(f"session {frozen.id} names no workspace",
                         "pass --workspace NAME (or create sessions with --workspace)")
    if frozen.workspace and workspace and frozen.workspace != workspace:
        raise MemfsError(f"session {frozen.id} belongs to workspace {frozen.workspace!r}",
                         f"drop --workspace or pass --workspace {frozen.workspace}")
    turns = sessions.projection(frozen)
    memory = open_memory_store(root)
    ws_gen = memory.workspace_generation(ws_name)
    glob_gen = memory.global_generation()
    review_id = new_review_id()
    attempt_id = f"{review_id}-a1"
    provider = make_provider(options.provider, options.model, options.base_url)
    refusal = missing_key(provider)
    if refusal is not None:
        raise refusal
    say(f"review {review_id}: session {frozen.id} ({len(turns)} visible turns), "
        f"workspace {ws_name}, {provider.name}/{provider.model}")
    if not api_key_from_env(provider.key_var):
        say(f"{provider.key_var} is not set: sending without an API key to the loopback "
            f"endpoint {provider.url}")

    outcome = run_worker(
        root, provider, system=SYSTEM_PROMPT, user=render_prompt(turns, glob_gen, ws_gen),
        tool=tool_spec(CHANGES_SCHEMA, TOOL_DESCRIPTION),
        validate=make_validate(frozen, ws_gen, glob_gen), budget=options.budget,
        attempt_id=attempt_id, progress=say,
        context={"review_id": review_id, "workspace": ws_name,
                 "source": {"session_id": frozen.id, "turn_count": frozen.turn_count,
                            "content_hash": frozen.content_hash},
                 "revisions": {"workspace": ws_gen.revision, "global": glob_gen.revision}},
    )
    result = ReviewOutcome(review_id, attempt_id, outcome.status, ws_name, outcome.steps,
                           outcome.usage, str(outcome.session_path),
                           rejections=outcome.rejections, retries=outcome.retries)
    if outcome.status != "accepted":
        return result
    crash_point("consolidate-after-worker")  # the final is durable; nothing committed yet

    # What recovery would rebuild is what we commit: replay, then parse once more.
    raw = replay_final_proposal(load_worker_session(root, attempt_id))
    proposal = parse_proposal(raw, frozen, ws_gen, glob_gen)
    preview = proposal.workspace_preview
    glob_preview = preview_global_change(glob_gen, proposal.global_content)
    result.diff = _diff(ws_gen, preview.records, glob_gen, glob_preview.content)
    say(f"preview: {len(result.diff)} change(s); committing behind a receipt")
    plan = plan_from_proposal(proposal)
    receipt = commit_review(root, Review(
        review_id=review_id, source=snapshot_of(frozen), workspace=ws_name,
        workspace_revision=ws_gen.revision, plan=plan, worker_attempt=attempt_id,
        global_revision=glob_gen.revision, consolidator_version=CONSOLIDATOR_VERSION))
    result.receipt, result.state = receipt, receipt.state
    result.receipt_path = receipt_location(root, review_id)
    result.revisions = {s: {"before": r.before, "after": r.planned_after}
                        for s, r in receipt.scopes.items()}
    return result


def _diff(ws: WorkspaceGeneration, after: dict[str, str], glob: GlobalGeneration,
          glob_after: str) -> list[dict[str, Any]]:
    """Per-record unified diffs for people (the receipt keeps only hashes)."""
    out = []
    for name in sorted(set(ws.records) | set(after)):
        a, b = ws.records.get(name), after.get(name)
        if a == b:
            continue
        kind = "added" if a is None else "deleted" if b is None else "changed"
        out.append({"scope": "workspace", "name": name, "kind": kind,
                    "unified": _unified(a or "", b or "", f"{name}.md")})
    if glob_after != glob.content:
        out.append({"scope": "global", "name": "global", "kind": "replaced",
                    "unified": _unified(glob.content, glob_after, "global.md")})
    return out


def _unified(a: str, b: str, label: str) -> str:
    return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                        f"a/{label}", f"b/{label}"))
