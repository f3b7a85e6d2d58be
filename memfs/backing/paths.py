"""How a command names a path of a backed mount: MOUNT[/PATH], one canonical spelling.

Why strict: a path sync discards the workspace's changes under the path it names, and
materialize --force overwrites disk there, so two spellings of one path must never mean two
things, and a spelling one command refuses must not be taken by another (issue 15: `sync
work//a.txt` took disk over a draft while materialize's own check refused '//', and
`materialize --force work/./a.txt` named nothing and answered "nothing owed"). Every request
that names a path goes through `parse_store_path` on the daemon's side (the CLI, the control
socket and a daemon-less run all reach it), so each spelling is refused or taken the same way
by every command. Also `under`, the one prefix test every owner of the package uses.

Pure; no state, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfs.errors import MemfsError


@dataclass(frozen=True)
class StorePath:
    """A mount and a path relative to it ('' for the whole mount)."""

    mount: str
    rel: str


def parse_store_path(text: str) -> StorePath:
    """'work/src/a.txt' -> StorePath('work', 'src/a.txt').

    One trailing '/' is allowed (`work/src/`, as a shell completes a directory). Refused: an
    empty path, a leading '/', empty components ('//'), '.', '..' and NUL, anywhere. Names
    are taken as they are otherwise, bytes that are not UTF-8 included (they arrive as
    surrogate escapes, the form the store keeps them in)."""
    if not text or text == "/":
        raise MemfsError("no mount named in the path", "name it as MOUNT[/PATH], e.g. work/src")
    body = text[:-1] if text.endswith("/") else text
    parts = body.split("/")
    bad = [p for p in parts if p in ("", ".", "..") or "\0" in p]
    if bad:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        why = ("it starts with '/'" if text.startswith("/") else
               "it has an empty component ('//')" if "" in bad else
               f"it has a {bad[0]!r} component" if "\0" not in bad[0] else "it holds a NUL")
        raise MemfsError(
            f"{shown!r} is not a plain MOUNT/PATH: {why}",
            "name it relative to the store, one '/' between names, without '.' or '..' (e.g. "
            "work/src/a.txt), or give the absolute path through the mountpoint")
    return StorePath(parts[0], "/".join(parts[1:]))


def split_path(path: str) -> tuple[str, str]:
    """'mount/a/b' -> ('mount', 'a/b'), by the one spelling every command takes."""
    p = parse_store_path(path)
    return p.mount, p.rel


def under(path: str, scope: str) -> bool:
    """Is `path` at or below `scope` ('' is the whole mount)?"""
    return scope == "" or path == scope or path.startswith(scope + "/")


def keys_under(keys, scope: str) -> list[str]:
    """The keys of a sorted container (sortedcontainers' SortedDict or SortedList) at or
    below a non-empty `scope`: the path itself, then the range from `scope/` up to `scope0`
    ('0' follows '/'), which is exactly what lies below it. O(log n + found), where a filter
    with `under` reads every key."""
    out = [scope] if scope in keys else []
    out.extend(keys.irange(scope + "/", scope + "0", inclusive=(True, False)))
    return out


__all__ = ["StorePath", "keys_under", "parse_store_path", "split_path", "under"]
