"""`memfs memory show|log|preview` and `memfs session new|append|import|list|show`.

These open the memory and sessions directly: plain files under the root, safe to read while a
daemon runs (commits swap whole generations) and safe to write (flock); or, on a root whose
store is in PostgreSQL, rows of that database (memfs.memory.shared, shared_sessions).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from memfs.cli.main import add_json_flag, emit
from memfs.consolidate.proposal import parse_proposal
from memfs.errors import MemfsError
from memfs.memory.generation import GlobalGeneration
from memfs.memory.sessions import SessionStore, is_visible
from memfs.memory.shared import open_memory_store
from memfs.memory.shared_sessions import open_session_store
from memfs.memory.store import MemoryStore
from memfs.rootdir import resolve_root


def register(sub: argparse._SubParsersAction) -> None:
    mem = sub.add_parser("memory", help="Global and workspace memory").add_subparsers(
        dest="memory_command", metavar="SUBCOMMAND", required=True)
    p = mem.add_parser("show", help="print the current generations")
    p.add_argument("--workspace", help="show this workspace's records")
    p.add_argument("--global", dest="show_global", action="store_true", help="print Global")
    p.add_argument("--revision", metavar="REV",
                   help="a kept generation instead of the current one (8+ hex digits of its "
                        "revision, e.g. from a receipt or `memfs memory log`)")
    add_json_flag(p)
    p.set_defaults(func=cmd_memory_show)
    p = mem.add_parser("log", help="kept generations and their revisions, newest first")
    p.add_argument("--workspace", help="only this workspace")
    p.add_argument("--global", dest="show_global", action="store_true", help="only Global")
    add_json_flag(p)
    p.set_defaults(func=cmd_memory_log)
    p = mem.add_parser("preview", help="validate a proposal and print its planned diff")
    p.add_argument("proposal", help="proposal JSON file ('-' for stdin)")
    p.add_argument("--session", required=True, help="the session the evidence cites")
    p.add_argument("--workspace", help="target workspace (default: the session's)")
    add_json_flag(p)
    p.set_defaults(func=cmd_memory_preview)

    ses = sub.add_parser("session", help="append-only agent sessions").add_subparsers(
        dest="session_command", metavar="SUBCOMMAND", required=True)
    p = ses.add_parser("new", help="create a session and print its id")
    p.add_argument("--workspace", help="the workspace this session works in")
    add_json_flag(p)
    p.set_defaults(func=cmd_session_new)
    p = ses.add_parser("append", help="append one turn")
    p.add_argument("id")
    p.add_argument("--role", required=True, choices=("user", "assistant", "tool"))
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the turn's text")
    src.add_argument("--file", help="read the text from a file ('-' for stdin)")
    add_json_flag(p)
    p.set_defaults(func=cmd_session_append)
    p = ses.add_parser("import", help="import a JSONL turn file or OpenAI messages as a session")
    p.add_argument("file")
    p.add_argument("--workspace", help="the workspace this session works in")
    add_json_flag(p)
    p.set_defaults(func=cmd_session_import)
    p = ses.add_parser("list", help="the sessions, oldest first: id, workspace, turns")
    add_json_flag(p)
    p.set_defaults(func=cmd_session_list)
    p = ses.add_parser("show", help="print a session's turns and its frozen snapshot")
    p.add_argument("id")
    add_json_flag(p)
    p.set_defaults(func=cmd_session_show)


def _stores(args: argparse.Namespace) -> tuple[MemoryStore, SessionStore]:
    root = resolve_root(args.root)
    return open_memory_store(root), open_session_store(root)


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MemfsError(f"cannot read {path}: {exc}", "give a readable UTF-8 file") from None


def cmd_memory_show(args: argparse.Namespace) -> int:
    store, _ = _stores(args)
    if args.revision is not None:
        return _show_revision(args, store)
    if args.workspace:
        gen = store.workspace_generation(args.workspace)
        payload = {"workspace": gen.workspace, "revision": gen.revision, "seq": gen.seq,
                   "records": gen.records, "index": gen.index}
        text = f"workspace {gen.workspace}  revision {gen.revision}  generation {gen.seq}\n"
        text += gen.index.rstrip("\n")
        known = store.workspaces()
        if args.workspace not in known:  # a typo reads as an empty workspace: say which have any
            text += (f"\n(no memory was ever committed for workspace {args.workspace!r}; "
                     f"workspaces with memory: {', '.join(known) or 'none'})")
        emit(args, payload, text)
        return 0
    glob = store.global_generation()
    if args.show_global:
        emit(args, {"revision": glob.revision, "seq": glob.seq, "content": glob.content},
             f"Global  revision {glob.revision}  generation {glob.seq}\n{glob.content}".rstrip())
        return 0
    rows = []
    for ws in store.workspaces():
        gen = store.workspace_generation(ws)
        rows.append({"workspace": ws, "revision": gen.revision, "seq": gen.seq,
                     "records": sorted(gen.records)})
    payload = {"global": {"revision": glob.revision, "seq": glob.seq,
                          "bytes": len(glob.content.encode())}, "workspaces": rows}
    lines = [f"Global      {glob.revision[:16]}  gen {glob.seq}  {len(glob.content.encode())} bytes"]
    lines += [f"{r['workspace']:<11} {r['revision'][:16]}  gen {r['seq']}  "
              f"{len(r['records'])} records" for r in rows]
    emit(args, payload, "\n".join(lines))
    return 0


def _show_revision(args: argparse.Namespace, store: MemoryStore) -> int:
    """`memory show --revision REV` of a workspace or Global: a kept generation, or a
    refusal saying the policy dropped it (memfs.memory.retention)."""
    if bool(args.workspace) == bool(args.show_global):
        raise MemfsError("--revision reads one scope", "add --workspace WS or --global")
    gen = store.generation_at(None if args.show_global else args.workspace, args.revision)
    if isinstance(gen, GlobalGeneration):
        emit(args, {"revision": gen.revision, "seq": gen.seq, "content": gen.content},
             f"Global  revision {gen.revision}  generation {gen.seq}\n{gen.content}".rstrip())
        return 0
    body = "".join(f"\n--- {name}.md\n{gen.records[name]}" for name in sorted(gen.records))
    emit(args, {"workspace": gen.workspace, "revision": gen.revision, "seq": gen.seq,
                "records": gen.records, "index": gen.index},
         f"workspace {gen.workspace}  revision {gen.revision}  generation {gen.seq}\n"
         + gen.index.rstrip("\n") + body.rstrip("\n"))
    return 0


def cmd_memory_log(args: argparse.Namespace) -> int:
    store, _ = _stores(args)
    if args.workspace:
        scopes: list[str | None] = [args.workspace]
    elif args.show_global:
        scopes = [None]
    else:
        scopes = [None, *store.workspaces()]
    entries = [asdict(info) for scope in scopes for info in store.history(scope)]
    lines = [f"{'*' if e['current'] else ' '} {e['workspace'] or 'Global':<11} gen {e['seq']:<4} "
             f"{e['revision'][:16]}  from {e['parent_revision'][:16]}  {e['created']}"
             + (f"  {len(e['names'])} records" if e["scope"] == "workspace" else "")
             for e in entries]
    emit(args, {"generations": entries}, "\n".join(lines) or "no memory committed yet")
    return 0


def cmd_memory_preview(args: argparse.Namespace) -> int:
    store, sessions = _stores(args)
    frozen = sessions.freeze(args.session)
    workspace = args.workspace or frozen.workspace
    if not workspace:
        raise MemfsError(f"session {frozen.id} names no workspace",
                         "pass --workspace WS (or create sessions with --workspace)")
    current = store.workspace_generation(workspace)
    glob = store.global_generation()
    proposal = parse_proposal(_read_input(args.proposal), frozen, current, glob)
    planned = proposal.workspace_preview
    gplan = None
    if proposal.global_content is not None:
        from memfs.memory.preview import preview_global_change

        gplan = preview_global_change(glob, proposal.global_content)
    payload = {
        "session": {"id": frozen.id, "turn_count": frozen.turn_count,
                    "content_hash": frozen.content_hash},
        "proposal_hash": proposal.hash, "no_change": proposal.no_change,
        "reason": proposal.reason, "final": proposal.final,
        "workspace": {"name": workspace, "before_revision": planned.before_revision,
                      "after_revision": planned.revision, "no_change": planned.no_change,
                      "diff": [asdict(d) for d in planned.diff]},
        "global": None if gplan is None else {
            "before_revision": gplan.before_revision, "after_revision": gplan.revision,
            "no_change": gplan.no_change},
        "changes": [c.wire() for c in proposal.changes],
    }
    lines = [f"proposal {proposal.hash[:16]}  session {frozen.id} ({frozen.turn_count} turns)"]
    if proposal.no_change:
        lines.append(f"no-change: {proposal.reason or ''}".rstrip())
    lines.append(f"workspace {workspace}: {planned.before_revision[:16]} -> "
                 f"{planned.revision[:16]}" + ("  (unchanged)" if planned.no_change else ""))
    lines += [f"  {d.kind:<8} {d.name}" for d in planned.diff]
    if gplan is not None:
        lines.append(f"Global: {gplan.before_revision[:16]} -> {gplan.revision[:16]}"
                     + ("  (unchanged)" if gplan.no_change else ""))
    emit(args, payload, "\n".join(lines))
    return 0


def cmd_session_new(args: argparse.Namespace) -> int:
    _, sessions = _stores(args)
    sid = sessions.new(args.workspace)
    emit(args, {"id": sid}, sid)
    return 0


def cmd_session_append(args: argparse.Namespace) -> int:
    _, sessions = _stores(args)
    text = args.text if args.text is not None else _read_input(args.file)
    index = sessions.append(args.id, args.role, text)
    emit(args, {"id": args.id, "turn": index}, str(index))
    return 0


def cmd_session_import(args: argparse.Namespace) -> int:
    _, sessions = _stores(args)
    sid = sessions.import_jsonl(Path(args.file), args.workspace)
    frozen = sessions.freeze(sid)
    emit(args, {"id": sid, "turn_count": frozen.turn_count}, sid)
    return 0


def cmd_session_list(args: argparse.Namespace) -> int:
    _, sessions = _stores(args)
    infos = sessions.list()
    lines = [f"{i.id}  {i.turn_count:>4} turns  workspace {i.workspace or '-'}  "
             f"created {i.created or '?'}" if i.damaged is None else f"{i.id}  DAMAGED: {i.damaged}"
             for i in infos]
    emit(args, {"sessions": [asdict(i) for i in infos]},
         "\n".join(lines) or f"no sessions in {sessions.where} (`memfs session new` creates one)")
    return 0


def cmd_session_show(args: argparse.Namespace) -> int:
    _, sessions = _stores(args)
    frozen = sessions.freeze(args.id)
    turns = sessions.turns(args.id)
    payload = {"id": frozen.id, "workspace": frozen.workspace, "turn_count": frozen.turn_count,
               "content_hash": frozen.content_hash,
               "turns": [dict(asdict(t), visible=is_visible(t)) for t in turns]}
    lines = [f"session {frozen.id}  {frozen.turn_count} turns  hash {frozen.content_hash[:16]}"
             + (f"  workspace {frozen.workspace}" if frozen.workspace else "")]
    for t in turns:
        mark = " " if is_visible(t) else "-"
        first, *rest = t.text.rstrip("\n").split("\n")
        lines.append(f"{mark}{t.index:>4} {t.role:<9} {first}" + (" …" if rest else ""))
    emit(args, payload, "\n".join(lines))
    return 0
