"""Files as a user's program writes and probes them through a mount."""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes) -> None:
    """Write `path` whole and fsync it (memfs commits before the fsync returns)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def gone(path: Path) -> bool:
    """Whether `path` is missing (stat answers ENOENT)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    return False
