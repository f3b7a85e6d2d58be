"""Tree snapshots: what a user can observe of a directory tree, as a comparable dict.

Two trees are "the same" for the round-trip tests when every entry agrees on type, permission
bits, size, content and symlink target. Directory sizes and inode numbers are filesystem
details, so they are left out; mtimes are compared only where a test set them on purpose.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable

Entry = tuple[object, ...]


def file_digest(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 of a file, streamed so a 1 GiB file costs no memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def snapshot(
    root: str | os.PathLike[str],
    *,
    mtimes: bool | Iterable[str] = False,
    skip: Iterable[str] = (),
) -> dict[str, Entry]:
    """Map each relative path under `root` to (type, mode, size, content-hash|target[, mtime_ns]).

    `mtimes=True` records every non-symlink mtime; an iterable records only those paths.
    `skip` names relative paths whose whole subtree is left out (e.g. ".git").
    """
    out: dict[str, Entry] = {}
    skipped = set(skip)
    root = os.fspath(root)

    def want_mtime(rel: str) -> bool:
        return mtimes is True or (not isinstance(mtimes, bool) and rel in wanted)

    wanted = set() if isinstance(mtimes, bool) else set(mtimes)

    def walk(rel_dir: str) -> None:
        with os.scandir(os.path.join(root, rel_dir)) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = os.path.join(rel_dir, e.name) if rel_dir else e.name
            if rel in skipped:
                continue
            st = e.stat(follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                entry: Entry = ("link", os.readlink(e.path), st.st_size)
            elif stat.S_ISDIR(st.st_mode):
                entry = ("dir", oct(mode))
            elif stat.S_ISREG(st.st_mode):
                entry = ("file", oct(mode), st.st_size, file_digest(e.path))
            else:
                entry = ("other", oct(mode), stat.S_IFMT(st.st_mode))
            if want_mtime(rel) and not stat.S_ISLNK(st.st_mode):
                entry = (*entry, st.st_mtime_ns)
            out[rel] = entry
            if stat.S_ISDIR(st.st_mode):
                walk(rel)

    walk("")
    return out


def diff_snapshots(a: dict[str, Entry], b: dict[str, Entry]) -> list[str]:
    """Human-readable differences, empty when equal (for assertion messages)."""
    lines = []
    for path in sorted(set(a) | set(b)):
        if a.get(path) != b.get(path):
            lines.append(f"{path}: {a.get(path)!r} != {b.get(path)!r}")
    return lines


def read_all(root: str | os.PathLike[str]) -> int:
    """Read every regular file under `root` to the end; return the byte count.

    Proves each listed file is readable in full (a reference to a missing blob shows up as EIO).
    """
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            with open(p, "rb") as f:
                while block := f.read(1 << 20):
                    total += len(block)
    return total
