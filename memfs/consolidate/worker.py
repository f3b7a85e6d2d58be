"""The consolidation worker: an isolated multi-step loop with exactly one tool.

The model sees the frozen session's visible turns and the current memory text, and may only
call `memory_review_propose {changes, final}`. It never receives a path, a revision, a
workspace selector or another tool, and nothing it says writes anything: every call is answered
by the host's `validate(proposal)`, and only an accepted `final=true` ends the attempt with a
proposal. That proposal is still just a proposal until the committer's receipt barrier.

Every request, response, draft and result is appended (and fsynced) to the worker session,
a JSONL file under <root>/sessions/workers/<attempt-id>.jsonl, so `replay_final_proposal`
can rebuild the final plan from that file alone, without calling a model (recovery uses it).
Request bodies are recorded, headers are not: API keys live only in the environment and in
the outgoing request.

Concurrency: one attempt is one `trio.run`; `trio.move_on_after(timeout)` bounds the whole
attempt (retries and waits included), so a hung provider ends it with nothing proposed.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from memfs.consolidate.providers.base import (
    Provider,
    ProviderError,
    Retry,
    ToolCall,
    ToolResult,
    ToolSpec,
    Transcript,
    Usage,
)
from memfs.consolidate.providers.limits import request_max_tokens
from memfs.errors import MemfsError
from memfs.rootdir import sessions_dir

# Bump when the prompt or the tool schema changes; recorded with every review.
CONSOLIDATOR_VERSION = "memfs-consolidator/2"
TOOL_NAME = "memory_review_propose"
ENVELOPE_FIELDS = frozenset({"changes", "final"})
MAX_ARGUMENT_CHARS = 2 * 1024 * 1024
NUDGE = f"Answer only by calling {TOOL_NAME}; it is the only way to reply."


@dataclass(frozen=True)
class Verdict:
    """The host's answer to one proposal: told to the model, recorded in the session."""

    accepted: bool
    message: str
    detail: Any = None  # JSON-able summary (e.g. the preview), recorded but not sent


# validate({"changes": ..., "final": ...}) -> Verdict: the host's parser, injected.
Validate = Callable[[dict[str, Any]], Verdict]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Budget:
    """Cost bounds of one attempt. Each request's max_tokens is min(8192, the model's declared
    limit); `max_output_tokens` replaces the 8192 (the declared limit still wins)."""

    max_steps: int = 8
    timeout_s: float = 300.0
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class Rejection:
    """A draft or final the host refused, or a call it would not take, with the whole reason
    the model was told (also printed, and in `memfs consolidate --json`)."""

    step: int
    kind: str  # draft | final | call
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "reason": self.reason}


@dataclass
class WorkerOutcome:
    attempt_id: str
    status: str  # accepted | step-cap | timeout
    steps: int
    usage: Usage
    final_changes: Any = None
    final_verdict: Verdict | None = None
    session_path: Path | None = None
    rejections: list[Rejection] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)


def tool_spec(changes_schema: dict[str, Any], description: str) -> ToolSpec:
    return ToolSpec(
        name=TOOL_NAME,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                "changes": changes_schema,
                "final": {
                    "type": "boolean",
                    "description": "false: validate this draft and let me revise it; "
                    "true: this is my final proposal",
                },
            },
            "required": ["changes", "final"],
            "additionalProperties": False,
        },
    )


def new_attempt_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(6)


def worker_session_path(root: Path, attempt_id: str) -> Path:
    if not attempt_id or "/" in attempt_id or attempt_id.startswith("."):
        raise MemfsError(f"not a worker attempt id: {attempt_id!r}")
    return sessions_dir(root) / "workers" / f"{attempt_id}.jsonl"


class WorkerSession:
    """Append-only JSONL log of one attempt; each event is fsynced before the loop goes on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the file's name is durable, not only its bytes
        finally:
            os.close(dfd)
        self._seq = 0

    def append(self, event: str, **fields: Any) -> None:
        self._seq += 1
        line = json.dumps({"seq": self._seq, "event": event, **fields}, sort_keys=True) + "\n"
        os.write(self._fd, line.encode())
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_worker_session(root: Path, attempt_id: str) -> WorkerSession:
    """A new attempt's log: a file under the root, or rows of its shared store (a root in
    PostgreSQL: memfs.consolidate.shared_workers), which every host can replay."""
    from memfs.store.backend import read_location

    path = worker_session_path(root, attempt_id)  # checks the id in both cases
    loc = read_location(root)
    if loc is None:
        return WorkerSession(path)
    from memfs.consolidate.shared_workers import SharedWorkerSession

    return SharedWorkerSession(loc.url, loc.host, attempt_id)  # type: ignore[return-value]


def load_worker_session(root: Path, attempt_id: str) -> list[dict[str, Any]]:
    """The events of one attempt; a torn last line (a crash mid-append) is dropped."""
    from memfs.store.backend import read_location

    path = worker_session_path(root, attempt_id)
    loc = read_location(root)
    if loc is not None:
        from memfs.consolidate.shared_workers import load_shared_worker_session

        return load_shared_worker_session(loc.url, attempt_id)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise MemfsError(
            f"no worker session for attempt {attempt_id}", f"expected it at {path}"
        ) from exc
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            break
    return events


def replay_final_proposal(worker_session: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw final proposal {"changes": ..., "final": true} from a worker session alone.

    Pure: exactly one accepted final=true result must exist, and its draft is returned as the
    model sent it, so the caller re-parses and re-hashes it like the original.
    """
    finals = [
        e for e in worker_session
        if e.get("event") == "result" and e.get("final") is True and e.get("accepted") is True
    ]
    if len(finals) != 1:
        raise MemfsError(
            f"worker session has {len(finals)} accepted final proposals, not exactly one",
            "this attempt cannot be replayed; finish its receipt as a conflict",
        )
    call_id, step = finals[0]["call_id"], finals[0]["step"]
    for e in worker_session:
        if e.get("event") == "draft" and e.get("call_id") == call_id and e.get("step") == step:
            return {"changes": e["changes"], "final": True}
    raise MemfsError(
        f"worker session has no draft for its accepted final call {call_id}",
        "the session is damaged; finish the receipt as a conflict",
    )


class _Malformed(ValueError):
    pass


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise _Malformed(f"key {dup!r} appears twice in one object")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _Malformed(f"{name} is not JSON")


def _envelope(call: ToolCall) -> tuple[Any, bool] | str:
    """(changes, final) from the call's raw arguments, or an error the model can fix.

    As strict as the proposal parser on text: no duplicate keys (which one would win is
    ambiguous), no NaN/Infinity, a size cap before parsing.
    """
    if len(call.arguments_raw) > MAX_ARGUMENT_CHARS:
        return f"arguments are over {MAX_ARGUMENT_CHARS} characters; propose less at once"
    try:
        args = json.loads(call.arguments_raw, object_pairs_hook=_strict_object,
                          parse_constant=_no_constant)
    except _Malformed as exc:
        return f"arguments are malformed: {exc}"
    except (ValueError, RecursionError) as exc:
        return f"arguments are not valid JSON ({exc}); send a JSON object {{changes, final}}"
    if not isinstance(args, dict):
        return "arguments must be a JSON object {changes, final}"
    unknown = sorted(set(args) - ENVELOPE_FIELDS)
    if unknown:
        return (
            f"unknown field(s) {', '.join(map(repr, unknown))}: {TOOL_NAME} takes only "
            "'changes' and 'final' (paths, revisions and scopes are chosen by the host)"
        )
    missing = sorted(ENVELOPE_FIELDS - set(args))
    if missing:
        return f"missing field(s) {', '.join(map(repr, missing))}"
    if not isinstance(args["final"], bool):
        return "'final' must be true or false"
    return args["changes"], args["final"]


@dataclass
class _Loop:
    provider: Provider
    tool: ToolSpec
    validate: Validate
    budget: Budget
    session: WorkerSession
    progress: Progress
    max_tokens: int
    usage: Usage = field(default_factory=Usage)
    steps: int = 0  # requests sent so far
    rejections: list[Rejection] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)

    def retried(self, retry: Retry) -> None:
        """A provider request is retried: say why and how long, and record it."""
        entry = {"step": self.steps, "attempt": retry.attempt, "cause": retry.cause,
                 "delay_s": round(retry.delay_s, 3), "source": retry.source}
        self.retries.append(entry)
        self.session.append("retry", **entry)
        self.progress(f"step {self.steps}: {retry.describe(self.provider.name)}")

    def answer(self, step: int, index: int, call: ToolCall) -> tuple[ToolResult, Any, Verdict | None]:
        """Answer one call; returns the result, and (changes, verdict) when it was validated."""

        def refuse(msg: str) -> tuple[ToolResult, Any, None]:
            self.session.append(
                "result", step=step, call_id=call.id, accepted=False, final=None,
                is_error=True, content=msg,
            )
            return ToolResult(call.id, msg, True), None, None

        if index > 0:
            return refuse("one call per step: this call was ignored; send one proposal at a time")
        if call.name != TOOL_NAME:
            return refuse(f"no tool named {call.name!r}; the only tool is {TOOL_NAME}")
        parsed = _envelope(call)
        if isinstance(parsed, str):
            return refuse(parsed)
        changes, final = parsed
        self.session.append("draft", step=step, call_id=call.id, final=final, changes=changes)
        verdict = self.validate({"changes": changes, "final": final})
        if final and verdict.accepted:
            content = "accepted as final: " + verdict.message
        elif verdict.accepted:
            content = "draft is valid: " + verdict.message + " (send final=true to conclude)"
        else:
            content = verdict.message
        self.session.append(
            "result", step=step, call_id=call.id, accepted=verdict.accepted, final=final,
            is_error=not verdict.accepted, content=content, detail=verdict.detail,
        )
        return ToolResult(call.id, content, not verdict.accepted), (changes, final), verdict

    def rejected(self, step: int, kind: str, reason: str) -> None:
        self.rejections.append(Rejection(step, kind, reason))
        what = "call refused" if kind == "call" else f"{kind} rejected"
        self.progress(f"step {step}: {what}: {reason}")

    async def run(self, transcript: Transcript) -> tuple[str, int, Any, Verdict | None]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.budget.timeout_s)) as client:
            for step in range(1, self.budget.max_steps + 1):
                self.steps = step
                body = self.provider.request_body(transcript, self.tool, self.max_tokens)
                self.session.append("request", step=step, body=body)
                self.progress(f"step {step}/{self.budget.max_steps}: asking {self.provider.model}")
                reply, raw = await self.provider.complete(client, body, self.retried)
                self.usage = self.usage + reply.usage
                self.session.append(
                    "response", step=step, body=raw,
                    usage={"input": reply.usage.input_tokens, "output": reply.usage.output_tokens},
                )
                transcript.add_reply(reply)
                if not reply.tool_calls:
                    transcript.add_user(NUDGE)
                    self.session.append("nudge", step=step, text=NUDGE)
                    self.progress(f"step {step}: no tool call; reminded the model")
                    continue
                results, concluded = [], None
                for i, call in enumerate(reply.tool_calls):
                    result, draft, verdict = self.answer(step, i, call)
                    results.append(result)
                    if draft is not None and verdict is not None:
                        kind = "final" if draft[1] else "draft"
                        if verdict.accepted:
                            self.progress(f"step {step}: {kind} accepted")
                        else:
                            self.rejected(step, kind, verdict.message)
                        if draft[1] and verdict.accepted:
                            concluded = (draft[0], verdict)
                    else:
                        self.rejected(step, "call", result.content)
                transcript.add_tool_results(results)
                if concluded is not None:
                    return "accepted", step, concluded[0], concluded[1]
        return "step-cap", self.budget.max_steps, None, None


def run_worker(
    root: Path,
    provider: Provider,
    *,
    system: str,
    user: str,
    tool: ToolSpec,
    validate: Validate,
    budget: Budget,
    context: dict[str, Any] | None = None,
    attempt_id: str | None = None,
    progress: Progress | None = None,
) -> WorkerOutcome:
    """Run one attempt to an accepted final, the step cap, or the timeout (sync; one trio.run).

    A ProviderError (auth, refusal, truncation, retries exhausted) is recorded in the session
    and raised. `context` (the frozen sources, workspace, revisions) is recorded, never sent.
    """
    attempt_id = attempt_id or new_attempt_id()
    session = open_worker_session(root, attempt_id)
    max_tokens = request_max_tokens(provider.model, budget.max_output_tokens)
    loop = _Loop(provider, tool, validate, budget, session, progress or (lambda _m: None),
                 max_tokens)
    session.append(
        "attempt", attempt_id=attempt_id, consolidator_version=CONSOLIDATOR_VERSION,
        provider=provider.name, model=provider.model, max_tokens=max_tokens,
        max_steps=budget.max_steps, timeout_s=budget.timeout_s, context=context or {},
        tool={"name": tool.name, "parameters": tool.parameters},
    )
    transcript = Transcript(system)
    transcript.add_user(user)

    async def attempt() -> tuple[str, int, Any, Verdict | None]:
        with trio.move_on_after(budget.timeout_s):
            return await loop.run(transcript)
        return "timeout", loop.steps, None, None

    def end(status: str, steps: int, **extra: Any) -> None:
        session.append(
            "end", status=status, steps=steps,
            usage={"input": loop.usage.input_tokens, "output": loop.usage.output_tokens},
            **extra,
        )

    try:
        try:
            status, steps, changes, verdict = trio.run(attempt)
        except ProviderError as exc:
            end("provider-error", loop.steps, error=str(exc))
            raise
        end(status, steps)
    finally:
        session.close()
    return WorkerOutcome(attempt_id, status, steps, loop.usage, changes, verdict, session.path,
                         loop.rejections, loop.retries)

