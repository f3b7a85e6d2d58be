"""`memfs receipts` and `memfs recover`: the consolidation receipts and their recovery.

Both work on the files under the root directly. That is safe beside a running daemon:
recovery takes the same review lock a commit holds, and memory writes are CAS under
the memory store's own lock.
"""

from __future__ import annotations

import argparse

from memfs.cli.main import add_json_flag, emit
from memfs.consolidate.committer import recover_receipts
from memfs.consolidate.receipts import COMMITTING, STATES, scan_receipts
from memfs.rootdir import resolve_root


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("receipts", help="list consolidation receipts, oldest first")
    p.add_argument("--state", choices=STATES,  # a typo filtered all out: "no receipts"
                   help="only receipts in this state (e.g. committing)")
    add_json_flag(p)
    p.set_defaults(func=cmd_receipts)
    p = sub.add_parser("recover",
                       help="finish interrupted consolidation commits (never asks a model)")
    add_json_flag(p)
    p.set_defaults(func=cmd_recover)


def cmd_receipts(args: argparse.Namespace) -> int:
    scan = scan_receipts(resolve_root(args.root))
    receipts = [r for r in scan.receipts if args.state in (None, r.state)]
    payload = {
        "receipts": [r.to_json() for r in receipts],
        "damaged": [{"path": str(p), "error": why} for p, why in scan.damaged],
    }
    lines = []
    for r in receipts:
        scopes = ", ".join(r.touched_scopes) or "-"
        lines.append(f"{r.review_id}  {r.state:<15} workspace={r.workspace}  scopes={scopes}  "
                     f"changes={len(r.changes)}  updated={r.updated_at}"
                     + (f"  ({r.detail})" if r.detail else ""))
    lines += [f"damaged: {p}: {why}" for p, why in scan.damaged]
    emit(args, payload, "\n".join(lines) if lines else "no receipts")
    return 1 if scan.damaged else 0


def cmd_recover(args: argparse.Namespace) -> int:
    """Exit 0 when every receipt ended final; 1 when one stays committing or is damaged."""
    report = recover_receipts(resolve_root(args.root))
    lines = [f"{o.review_id}: {o.action} -> {o.state}" + (f" ({o.detail})" if o.detail else "")
             for o in report.outcomes]
    if report.temp_files_removed:
        lines.append(f"removed {report.temp_files_removed} unfinished receipt write(s)")
    lines += [f"damaged: {p}: {why}" for p, why in report.damaged]
    if report.unresolved:
        lines.append(f"{len(report.unresolved)} receipt(s) still {COMMITTING}: their worker "
                     "session must yield the exact plan the receipt names; nothing was written")
    emit(args, report.to_json(), "\n".join(lines) if lines else "no receipts to recover")
    return 1 if report.unresolved or report.damaged else 0
