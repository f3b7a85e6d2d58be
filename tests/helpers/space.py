"""A full disk for a test: someone else taking every byte left, writes until ENOSPC."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

MiB = 1 << 20


def fill(fs: Path, name: str = "filler") -> Path:
    """Someone else takes every byte left on the store's filesystem."""
    path = fs / name
    with open(path, "ab", buffering=0) as f:
        for size in (MiB, 64 << 10, 4096):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return path


def write_until_enospc(path: Path, rng: random.Random, *, fsync: bool = False
                       ) -> tuple[bytes, OSError]:
    """Write 1 MiB pieces (each fsynced, if asked) until a write() fails; what was accepted,
    and the error."""
    accepted = bytearray()
    with open(path, "wb", buffering=0) as f:
        while True:
            piece = rng.randbytes(MiB)
            try:
                n = f.write(piece)
                if fsync:
                    os.fsync(f.fileno())
            except OSError as exc:
                return bytes(accepted), exc
            accepted += piece[:n]
            assert len(accepted) < 64 * MiB, "64 MiB accepted on a 32 MiB filesystem"


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
