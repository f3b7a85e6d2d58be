"""Bindings: which store mount is bound to which directory, with what options, and its pin.

Owns `Bindings.bindings` (mount -> Binding, persisted in the store's `meta` table: global, not
per branch) and `Bindings.pins` (mount -> the branch disk was last materialized from, kept in
the journal's `journal_pins`: global too, disk does not rewind). Both are copies of durable
state made at open and kept in step by the code that writes it (attach, detach, a
materialize that pins, accepting a replaced root, a journal reopen), on the trio loop; the
durable writes themselves run in worker threads.

Also the checks attach makes before anything changes, and the parse of a control request's
arguments into a Binding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memfs.errors import MemfsError
from memfs.reconcile.observe import DEFAULT_MAX_FILE_SIZE
from memfs.store.trees import name_to_str

WATCH_MODES = ("on-access", "fs-events", "on-agent-action", "off")
# Modes observed on access. on-agent-action is observed by `memfs after-batch` (the scan
# coordinator); fs-events relies on its events; off only on sync.
ACCESS_WATCH = ("on-access",)
AGENT_WATCH = "on-agent-action"
DEFAULT_SCAN_DEADLINE = 20.0  # seconds an after-batch call waits for its scan


@dataclass(frozen=True)
class Binding:
    """A store mount bound to a backing directory (persisted in the store, not per branch)."""

    mount: str
    dir: str
    watch: str = "on-access"
    follow_symlinks: bool = False
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    ignore: tuple[str, ...] = ()
    scan_deadline: float = DEFAULT_SCAN_DEADLINE  # on-agent-action: how long a batch waits
    auto_materialize: bool = False  # a bare materialize after each group commit

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "ignore": list(self.ignore)}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Binding:
        return cls(str(doc["mount"]), str(doc["dir"]), str(doc.get("watch", "on-access")),
                   bool(doc.get("follow_symlinks", False)),
                   int(doc.get("max_file_size", DEFAULT_MAX_FILE_SIZE)),  # type: ignore[call-overload]
                   tuple(doc.get("ignore") or ()),  # type: ignore[arg-type]
                   float(doc.get("scan_deadline", DEFAULT_SCAN_DEADLINE)),  # type: ignore[arg-type]
                   bool(doc.get("auto_materialize", False)))

    @classmethod
    def from_request(cls, args: Mapping[str, object]) -> Binding:
        """A `backing_attach` request's arguments (absent options take attach's defaults)."""
        return cls(str(args["mount"]), str(args["dir"]), str(args.get("watch") or "on-access"),
                   bool(args.get("follow_symlinks")),
                   _given(args, "max_file_size", int, DEFAULT_MAX_FILE_SIZE),
                   tuple(args.get("ignore") or ()),  # type: ignore[arg-type]
                   _given(args, "scan_deadline", float, DEFAULT_SCAN_DEADLINE),
                   bool(args.get("auto_materialize")))


def _given(args: Mapping[str, object], key: str, kind: type, default: Any) -> Any:
    """args[key] as `kind`, the default only when it is absent: 0 is a value (`--scan-deadline
    0` used to become 20 s, `--max-file-size 0` 64 MiB, silently); attach checks the range."""
    value = args.get(key)
    return default if value is None else kind(value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_binding(binding: Binding) -> None:
    """What attach refuses before it looks at disk: a mount name, a watch mode, the sizes."""
    mount = binding.mount
    if not mount or "/" in mount or mount.startswith("."):
        raise MemfsError(f"invalid mount name {mount!r}", "name a top-level directory")
    if not _utf8(mount):
        # Names below a mount may be any bytes; the mount's own name keys the journal,
        # the bindings and every MOUNT/PATH a command takes, so it is kept to text.
        raise MemfsError(f"mount name {mount.encode('utf-8', 'surrogateescape')!r} is not "
                         "UTF-8", "name the mount in UTF-8 (the directory it binds, and "
                         "every name below, may be any bytes)")


def check_options(binding: Binding) -> None:
    """The options' ranges (after the directory was found)."""
    if binding.watch not in WATCH_MODES:
        raise MemfsError(f"unknown watch mode {binding.watch!r}",
                         f"use one of {', '.join(WATCH_MODES)}")
    if binding.max_file_size < 0:
        raise MemfsError(f"max file size {binding.max_file_size} is negative",
                         "give --max-file-size a number of bytes, 0 or more (0: every "
                         "non-empty file is disk-only)")
    if not binding.scan_deadline > 0:
        raise MemfsError(f"scan deadline {binding.scan_deadline:g} s is not positive",
                         "give --scan-deadline a number of seconds above 0")


def check_dir(path: str, store_root: Path) -> None:
    """An existing directory, by absolute path, outside the store root and the mount.
    Worker thread: a path into our own mount would otherwise block the loop answering it."""
    if not os.path.isabs(path) or not os.path.isdir(path):
        raise MemfsError(f"backing directory {path!r} is not an existing directory",
                         "create it, or name an existing directory by absolute path")
    real, own = os.path.realpath(path), os.path.realpath(store_root)
    if real == own or real.startswith(own + "/") or own.startswith(real.rstrip("/") + "/"):
        raise MemfsError(f"{path} overlaps the store root ({own})",
                         "bind a directory outside the store root")
    try:
        holder = json.loads((Path(own) / "daemon.lock").read_text() or "{}")
        mnt = holder.get("mountpoint")
        # A killed daemon's record stays (for `memfs status`); its mountpoint is a plain
        # directory again once the dead mount is cleaned, and proves nothing then.
        if mnt and os.path.ismount(mnt) and os.stat(path).st_dev == os.stat(mnt).st_dev:
            raise MemfsError(f"{path} is inside the memfs mount at {mnt}",
                             "bind a real directory outside the mount")
    except (OSError, ValueError):
        pass


@dataclass
class Bindings:
    """The bound mounts and their pins, as this process knows them (see the module doc)."""

    bindings: dict[str, Binding] = field(default_factory=dict)
    pins: dict[str, str] = field(default_factory=dict)

    def get(self, mount: str) -> Binding | None:
        return self.bindings.get(mount)

    def require(self, mount: str) -> Binding:
        b = self.bindings.get(mount)
        if b is None:
            raise MemfsError(f"mount {mount!r} is not bound to a backing directory",
                             f"`memfs attach {mount} DIR` binds it")
        return b

    def backed(self, path: bytes) -> tuple[str | None, str]:
        """A live-tree path b'/mount/rel' -> (mount, rel) when the mount is bound, else
        (None, '')."""
        mount, _, rel = name_to_str(path).strip("/").partition("/")
        return (mount, rel) if mount in self.bindings else (None, "")

    def agent_mounts(self) -> list[str]:
        return sorted(m for m, b in self.bindings.items() if b.watch == AGENT_WATCH)


__all__ = ["ACCESS_WATCH", "AGENT_WATCH", "Binding", "Bindings", "DEFAULT_SCAN_DEADLINE",
           "WATCH_MODES", "check_binding", "check_dir", "check_options"]
