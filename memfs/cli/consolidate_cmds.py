"""`memfs consolidate SESSION`: one review of a session into memory, end to end.

Progress goes to stderr while the model works, so `--json` output on stdout stays clean.
Exit 0 when the review ended committed or no-change; 1 for any other end (conflict, source
changed, step cap, timeout), with nothing written to memory in those cases.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from memfs.cli.main import add_json_flag, emit
from memfs.rootdir import resolve_root

if TYPE_CHECKING:
    from memfs.consolidate.review import ReviewOutcome

# Kept here rather than imported: the provider modules pull in httpx and trio, which every
# other CLI command would otherwise pay for at start-up.
PROVIDERS = ("openai", "anthropic")

WHY_NOT = {
    "step-cap": "the model sent no accepted final proposal within --max-steps",
    "timeout": "the attempt ran out of time (--timeout)",
    "target-conflict": "memory changed while the model worked",
    "source-changed": "the session changed while the model worked",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consolidate", help="review a session into memory with a model")
    p.add_argument("session", help="the session id to review")
    p.add_argument("--workspace", help="target workspace (default: the session's)")
    p.add_argument("--provider", choices=PROVIDERS, default="openai")
    p.add_argument("--model", help="model name (default per provider)")
    p.add_argument("--base-url", help="API base URL (an OpenAI-compatible server, a proxy)")
    p.add_argument("--max-steps", type=_positive_int, default=8, help="model requests (8)")
    p.add_argument("--timeout", type=_positive_float, default=300.0, help="total seconds (300)")
    p.add_argument("--max-output-tokens", type=_positive_int,
                   help="per-request output ceiling instead of 8192 (a model's lower limit wins)")
    add_json_flag(p)
    p.set_defaults(func=cmd_consolidate)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def cmd_consolidate(args: argparse.Namespace) -> int:
    from memfs.consolidate.review import ConsolidateOptions, consolidate
    from memfs.consolidate.worker import Budget

    root = resolve_root(args.root)
    options = ConsolidateOptions(
        provider=args.provider, model=args.model, base_url=args.base_url,
        budget=Budget(max_steps=args.max_steps, timeout_s=args.timeout,
                      max_output_tokens=args.max_output_tokens))

    def progress(msg: str) -> None:
        print(f"memfs: {msg}", file=sys.stderr, flush=True)

    outcome = consolidate(root, args.session, args.workspace, options, progress)
    emit(args, outcome.to_json(), _text(outcome))
    return 0 if outcome.committed else 1


def _text(o: ReviewOutcome) -> str:
    lines = []
    for d in o.diff:
        lines.append(d["unified"].rstrip("\n") or f"{d['kind']} {d['name']}")
    if o.receipt is None:
        lines.append(f"review {o.review_id}: {o.state} — {WHY_NOT.get(o.state, '')}; "
                     "nothing committed")
    else:
        lines.append(f"review {o.review_id}: {o.state}"
                     + (f" — {WHY_NOT[o.state]}" if o.state in WHY_NOT else ""))
        lines.append(f"receipt   {o.receipt_path}")
        for scope, rev in sorted(o.revisions.items()):
            lines.append(f"{scope:<9} {str(rev['before'])[:16]} -> {str(rev['after'])[:16]}")
    if o.rejections and not o.committed:
        last = o.rejections[-1]
        lines.append(f"refused   {len(o.rejections)} proposal(s) or call(s); the last (step "
                     f"{last.step}, {last.kind}): {last.reason}")
    if o.retries:
        lines.append(f"retried   {len(o.retries)} request(s): "
                     + "; ".join(f"{r['cause']} (waited {r['delay_s']:g} s)" for r in o.retries))
    lines.append(f"worker    {o.worker_session} ({o.steps} steps, "
                 f"{o.usage.input_tokens} input + {o.usage.output_tokens} output tokens)")
    return "\n".join(lines)
