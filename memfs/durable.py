"""The few durable-I/O steps every layer needs, written once.

A file's bytes survive a power cut only after fsync of the file; its name only after fsync
of its directory; a new directory's name only after fsync of its parent. Every module that
persists something (store packs, memory generations, sessions, receipts) uses these.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(path: Path, mode: int = 0o700) -> None:
    """Create a directory (and missing parents) so that a power cut cannot take its name
    away: each new directory's parent is fsynced after the mkdir. Private by default: a
    store holds everything its user wrote."""
    if path.is_dir():
        return
    if not path.parent.is_dir():
        mkdir_durable(path.parent, mode)
    try:
        path.mkdir(mode)
    except FileExistsError:
        return
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a short write is not an error)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
