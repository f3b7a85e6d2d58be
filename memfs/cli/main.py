"""The `memfs` console script: one argparse tree, commands registered by topic modules.

Each topic module (`mount_cmds`, `status_cmd`, `store_cmds`, `history_cmds`, `memory_cmds`, `consolidate_cmds`,
`reconcile_cmds`) has `register(subparsers)`, adding its commands with
`set_defaults(func=...)`. A command's func takes the parsed args and returns an exit code; it
raises MemfsError for a refusal, which is printed as "memfs: what happened — what to do" (or as
JSON with --json).

The global options (`--root`, `--json`) are accepted before or after the command
(`memfs --root R mount M` and `memfs mount M --root R`): every command's parser has them too,
with no default of its own, so a value given in either place is kept.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from memfs.errors import MemfsError
from memfs.rootdir import resolve_root

TOPICS = ("mount_cmds", "status_cmd", "store_cmds", "history_cmds", "memory_cmds", "consolidate_cmds",
          "receipts_cmds", "reconcile_cmds", "gc_cmds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memfs", description="memfs: a durable, versioned workspace store mounted as a folder."
    )
    _add_globals(parser, None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for topic in TOPICS:
        try:
            module = importlib.import_module(f"memfs.cli.{topic}")
        except ModuleNotFoundError as exc:
            if exc.name == f"memfs.cli.{topic}":
                continue
            raise
        module.register(sub)
    for p in _parsers(parser):
        _add_globals(p, argparse.SUPPRESS)
    return parser


ROOT_HELP = "store root (default $MEMFS_ROOT or $XDG_DATA_HOME/memfs)"


def _add_globals(p: argparse.ArgumentParser, default: object) -> None:
    """--root and --json on `p`, unless it has them. The top-level parser's defaults (None,
    False) stand; a command's are SUPPRESS, so they never overwrite a value given before it."""
    have = {s for a in p._actions for s in a.option_strings}
    if "--root" not in have:
        p.add_argument("--root", default=default, help=ROOT_HELP)
    if "--json" not in have:
        p.add_argument("--json", action="store_true",
                       default=False if default is None else default,
                       help="machine-readable output")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's parser below `parser` (subcommands of subcommands too)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in dict.fromkeys(action.choices.values()):
                found += [p, *_parsers(p)]
    return found


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="machine-readable output")


def emit(args: argparse.Namespace, payload: object, text: str | None = None) -> None:
    """Print `payload` as JSON under --json, else `text` (or a plain rendering)."""
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    elif text is not None:
        print(text)
    else:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))


def _names_as_bytes() -> None:
    """File names are bytes; one that is not UTF-8 arrives as surrogate escapes (argv, the
    store, the control socket). Plain output writes it back as those bytes, as ls does to a
    pipe, instead of failing in a UTF-8 locale whose stdio refuses surrogates; --json keeps the
    escape (backslash-udcXX, ASCII JSON), which os.fsencode turns back into the byte."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", "") == "strict":
            reconfigure(errors="surrogateescape")


def _refuse_a_file_as_root(args: argparse.Namespace) -> None:
    """A root that is a file (`--root notes.txt`) is no store and cannot become one: say so once,
    here, instead of each command failing its own way (a traceback from the control socket)."""
    root = resolve_root(getattr(args, "root", None))
    if root.exists() and not root.is_dir():
        given = ("--root" if getattr(args, "root", None) else
                 "$MEMFS_ROOT" if os.environ.get("MEMFS_ROOT") else "the default root")
        raise MemfsError(f"the store root {root} ({given}) is a file, not a directory",
                         "give --root the directory `memfs init` made (or set MEMFS_ROOT to it), "
                         "or move the file aside")


def main(argv: list[str] | None = None) -> int:
    _names_as_bytes()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        _refuse_a_file_as_root(args)
        return int(args.func(args) or 0)
    except MemfsError as exc:
        if getattr(args, "json", False):
            json.dump({"error": exc.message, "remedy": exc.remedy}, sys.stdout)
            sys.stdout.write("\n")
        else:
            print(f"memfs: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `memfs log | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
