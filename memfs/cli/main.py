"""The `memfs` console script: one argparse tree, commands registered by topic modules.

Each topic module (`store_cmds`, `memory_cmds`, `consolidate_cmds`, `reconcile_cmds`) has
`register(subparsers)`, adding its commands with `set_defaults(func=...)`. A command's func
takes the parsed args and returns an exit code; it raises MemfsError for a refusal, which is
printed as "memfs: what happened — what to do" (or as JSON with --json).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from memfs.errors import MemfsError

TOPICS = ("store_cmds", "memory_cmds", "consolidate_cmds", "receipts_cmds", "reconcile_cmds",
          "gc_cmds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memfs", description="memfs: a durable, versioned workspace store mounted as a folder."
    )
    parser.add_argument("--root", help="store root (default $MEMFS_ROOT or $XDG_DATA_HOME/memfs)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for topic in TOPICS:
        try:
            module = importlib.import_module(f"memfs.cli.{topic}")
        except ModuleNotFoundError as exc:
            if exc.name == f"memfs.cli.{topic}":
                continue
            raise
        module.register(sub)
    return parser


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def emit(args: argparse.Namespace, payload: object, text: str | None = None) -> None:
    """Print `payload` as JSON under --json, else `text` (or a plain rendering)."""
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    elif text is not None:
        print(text)
    else:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
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


if __name__ == "__main__":
    sys.exit(main())
