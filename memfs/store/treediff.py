"""What differs between two trees: paths added, changed, removed and renamed, with sizes,
and a file's bytes as a tree holds them (for `memfs show` and `memfs diff`).

Structural sharing makes this cheap: a subtree whose object id is the same on both sides is
equal and never opened, so a commit's diff costs its changed paths times their depth.
Renames are exact: a removed and an added entry of the same kind with the same content
(a directory's object id, a file's content reference; empty files never pair) are one move.

Pure reads of a Store (any thread).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from memfs.store.backend import StoreBackend as Store
from memfs.store.trees import DIR, FILE, LINK, Entry, decode_dir

ADDED, CHANGED, REMOVED, RENAMED = "A", "M", "D", "R"


@dataclass(frozen=True)
class Change:
    status: str  # A, M, D or R
    path: str  # for R: the new path
    kind: str  # d, f, l (or whatever kind the tree names)
    size: int | None  # after (None for a removal or a directory)
    old_size: int | None = None  # before (None for an addition or a directory)
    old_path: str | None = None  # R only
    ref: str = ""  # content reference after ("" for a removal)
    old_ref: str = ""  # content reference before
    detail: str = ""  # M: "content", "mode 644 -> 755", "metadata" ...

    def to_json(self) -> dict:
        doc = {"status": self.status, "path": self.path, "kind": self.kind, "size": self.size,
               "old_size": self.old_size}
        if self.old_path is not None:
            doc["old_path"] = self.old_path
        if self.detail:
            doc["detail"] = self.detail
        return doc


def diff_trees(store: Store, old: str | None, new: str | None,
               paths: list[str] | None = None) -> list[Change]:
    """Changes from tree `old` to tree `new` (None: the empty tree), limited to `paths`
    (each a path from the store root, e.g. "work/src"), sorted by path."""
    wanted = [p.strip("/") for p in paths or [] if p.strip("/")] or None
    raw = list(_diff_dir(store, old, new, "", wanted))
    return sorted(_pair_renames(store, raw), key=lambda c: (c.path, c.status))


def only_times(store: Store, old: str | None, new: str | None) -> bool:
    """Do trees `old` and `new` differ in times at most (the same paths, bytes, modes,
    owners and xattrs)? Stops at the first other difference: a big change costs no more
    than a small one."""
    return all(c.status == CHANGED and c.detail == "times"
               for c in _diff_dir(store, old, new, "", None))


def _entries(store: Store, tree: str | None) -> dict[str, Entry]:
    if not tree:
        return {}
    return {e.name: e for e in decode_dir(store.read_object(tree))}


def _wanted(path: str, wanted: list[str] | None) -> tuple[bool, bool]:
    """(inside a wanted path, on the way to one)."""
    if wanted is None:
        return True, True
    inside = any(path == w or path.startswith(w + "/") for w in wanted)
    above = any(w.startswith(path + "/") for w in wanted)
    return inside, inside or above


def _diff_dir(store: Store, old: str | None, new: str | None, prefix: str,
              wanted: list[str] | None) -> Iterator[Change]:
    if old == new:
        return
    a, b = _entries(store, old), _entries(store, new)
    for name in sorted(set(a) | set(b)):
        path = prefix + name
        inside, descend = _wanted(path, wanted)
        if not descend:
            continue
        ea, eb = a.get(name), b.get(name)
        if ea is not None and eb is not None and ea.kind == eb.kind == DIR:
            if ea.ref != eb.ref:
                yield from _diff_dir(store, ea.ref, eb.ref, path + "/", wanted)
            if inside and _meta(ea) != _meta(eb):
                yield Change(CHANGED, path + "/", DIR, None, None, detail=_detail(ea, eb))
            continue
        if ea is not None and eb is not None and ea.kind == eb.kind:
            if inside and ea.to_list() != eb.to_list():
                yield Change(CHANGED, path, eb.kind, _size(eb), _size(ea), ref=eb.ref,
                             old_ref=ea.ref, detail=_detail(ea, eb))
            continue
        if ea is not None:
            yield from _whole(store, ea, path, REMOVED, wanted)
        if eb is not None:
            yield from _whole(store, eb, path, ADDED, wanted)


def _whole(store: Store, e: Entry, path: str, status: str,
           wanted: list[str] | None) -> Iterator[Change]:
    """An entry that exists on one side only: a directory as itself (a rename pairs it
    whole) followed by everything below it."""
    inside, _ = _wanted(path, wanted)
    if e.kind == DIR:
        if inside:
            yield _one(status, path + "/", e)
        for child in decode_dir(store.read_object(e.ref)) if e.ref else []:
            yield from _whole(store, child, path + "/" + child.name, status, wanted)
    elif inside:
        yield _one(status, path, e)


def _one(status: str, path: str, e: Entry) -> Change:
    if status == ADDED:
        return Change(ADDED, path, e.kind, _size(e), None, ref=e.ref)
    return Change(REMOVED, path, e.kind, None, _size(e), old_ref=e.ref)


def _size(e: Entry) -> int | None:
    if e.kind == DIR:
        return None
    if e.kind == LINK:
        return len(e.ref.encode("utf-8", "surrogateescape"))
    return e.size


def _meta(e: Entry) -> tuple:
    return e.mode, e.uid, e.gid, tuple(sorted(e.xattrs.items()))


def _detail(a: Entry, b: Entry) -> str:
    parts = []
    if a.ref != b.ref or a.size != b.size:
        parts.append("content" if a.kind != LINK else f"target {a.ref} -> {b.ref}")
    if a.mode != b.mode:
        parts.append(f"mode {a.mode:o} -> {b.mode:o}")
    if (a.uid, a.gid) != (b.uid, b.gid):
        parts.append(f"owner {a.uid}:{a.gid} -> {b.uid}:{b.gid}")
    if a.xattrs != b.xattrs:
        parts.append("xattrs")
    return ", ".join(parts) or "times"


def _pair_renames(store: Store, changes: list[Change]) -> list[Change]:
    """Exact renames: a whole directory first (its subtree id), then files by content."""
    removed = sorted((c for c in changes if c.status == REMOVED), key=lambda c: c.path)
    added = sorted((c for c in changes if c.status == ADDED), key=lambda c: c.path)
    moves: list[Change] = []
    gone_old: set[str] = set()  # removed paths a move accounts for
    gone_new: set[str] = set()  # added paths a move accounts for

    def below(root: str, path: str) -> bool:
        return path.startswith(root)  # a directory's path ends with "/"

    for kind in (DIR, FILE, LINK):
        by_ref: dict[str, list[Change]] = {}
        for c in removed:
            if c.kind == kind and c.old_ref and c.path not in gone_old:
                by_ref.setdefault(c.old_ref, []).append(c)
        for c in added:
            if c.kind != kind or not c.ref or c.path in gone_new or not by_ref.get(c.ref):
                continue
            if kind == FILE and not c.size:
                continue
            src = by_ref[c.ref].pop(0)
            moves.append(Change(RENAMED, c.path, kind, c.size, src.old_size, src.path,
                                c.ref, src.old_ref))
            if kind == DIR:  # everything below moved with it
                gone_old.update(r.path for r in removed if below(src.path, r.path))
                gone_new.update(a.path for a in added if below(c.path, a.path))
            else:
                gone_old.add(src.path)
                gone_new.add(c.path)
    kept = [c for c in changes if not (c.status == REMOVED and c.path in gone_old)
            and not (c.status == ADDED and c.path in gone_new)]
    return kept + moves


# -- a file's bytes --------------------------------------------------------------------------
def find_entry(store: Store, tree: str, path: str) -> Entry | None:
    """The entry at `path` (from the store root) in `tree`; None if absent. The root itself
    is a directory entry named ""."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts:
        return Entry("", DIR, 0o755, 0, 0, 0, 0, 0, tree)
    ref: str | None = tree
    entry: Entry | None = None
    for part in parts:
        if ref is None:
            return None
        entry = _entries(store, ref).get(part)
        if entry is None:
            return None
        ref = entry.ref if entry.kind == DIR else None
    return entry


def file_pieces(store: Store, ref: str, size: int) -> Iterator[bytes]:
    """A file's bytes, chunk by chunk (holes as zeros): streamed, never loaded whole."""
    from memfs.store.chunks import CHUNK_SIZE

    chunks = store.file_chunks(ref)
    pos = 0
    index = 0
    while pos < size:
        n = min(CHUNK_SIZE, size - pos)
        cid = chunks.get(index)
        data = store.read_chunk(cid)[:n] if cid else b""
        yield data + bytes(n - len(data))
        pos += n
        index += 1


def read_file(store: Store, ref: str, size: int) -> bytes:
    return b"".join(file_pieces(store, ref, size))
