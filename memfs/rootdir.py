"""Where a memfs root lives and what it holds.

One root directory per store. Everything memfs keeps is under it, so a root can be
copied, backed up or deleted as one folder:

    store.db      SQLite: trees, commits, branches, the journal (the embedded store)
    packs/        content-addressed file chunks (the embedded store)
    store.json    which store the root uses, when it is not embedded (memfs.store.backend)
    host.db       a shared store's host side: branch, bindings, the journal (memfs.store.pg)
    cache/        a shared store's chunks and objects read or written here (safe to delete)
    staging/      scratch files of a running daemon (safe to delete when none runs)
    memory/       agent memory generations (memfs.memory)            } the embedded store;
    sessions/     append-only agent sessions (memfs.memory.sessions)  } a shared store keeps
    receipts/     consolidation receipts (memfs.consolidate)          } them as its rows
    daemon.lock   held (flock) by the one daemon serving this root; its record (memfs.liveness)
    review.lock   held (flock) by the one consolidation review committing at a time
    control.sock  that daemon's control socket
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUN_PATH_MAX = 107  # bytes of a Unix socket's path the kernel's sockaddr_un holds (108, NUL)


def resolve_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--root, else $MEMFS_ROOT, else the store of the memfs mount the current directory is
    in, else $XDG_DATA_HOME/memfs (~/.local/share/memfs)."""
    if explicit:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get("MEMFS_ROOT")
    if env:
        return Path(env).expanduser().absolute()
    from memfs.liveness import store_of_cwd  # the mount table: only when nothing names a root

    here = store_of_cwd()
    if here is not None:
        return here
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(xdg, "memfs").absolute()


def memory_dir(root: Path) -> Path:
    return root / "memory"


def sessions_dir(root: Path) -> Path:
    return root / "sessions"


def receipts_dir(root: Path) -> Path:
    return root / "receipts"


def control_socket(root: Path) -> Path:
    return root / "control.sock"


@contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """The address to bind or connect the Unix socket at `path` by: the path itself, or,
    longer than sun_path holds (a root deep in a long HOME or TMPDIR: "AF_UNIX path too
    long"), the same file through an O_PATH descriptor of its directory,
    /proc/self/fd/N/NAME, open only while the caller binds or connects."""
    text = str(path)
    if len(os.fsencode(text)) <= SUN_PATH_MAX:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
