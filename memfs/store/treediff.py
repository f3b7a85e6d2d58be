"""What differs between two trees: paths added, changed, removed and renamed, with sizes,
and a file's bytes as a tree holds them (for `memfs show` and `memfs diff`).

Structural sharing makes this cheap: a subtree whose object id is the same on both sides is
equal and never opened, so a commit's diff costs its changed paths times their depth.
Renames are exact: a removed and an added entry of the same kind with the same content
(a directory's object id, a file's content reference; empty files never pair) are one move.

A hard-linked name is a row naming an entry of its commit's inode table, so a side of a diff
is a `TreeState`: the tree with that table. Names resolve to the table's entry, so a write
through one name is a change of every name, seen even when no directory changed.

Pure reads of a Store (any thread).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from memfs.store.backend import StoreBackend as Store
from memfs.store.trees import DIR, FILE, HARD, LINK, Entry, decode_dir

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


@dataclass(frozen=True)
class TreeState:
    """A commit's tree and the inode table its hard-linked names resolve through."""
    tree: str | None
    inodes: dict[str, Entry] = field(default_factory=dict)


def commit_state(store: Store, commit_id: str | None) -> TreeState | None:
    """The tree a commit holds (None: the empty tree before the first commit)."""
    if commit_id is None:
        return None
    return TreeState(store.commit(commit_id).tree, _table(store, store.inode_table(commit_id)))


_TABLES: OrderedDict[tuple[str, str], dict[str, Entry]] = OrderedDict()
_TABLES_LOCK = threading.Lock()


def _table(store: Store, table: str | None) -> dict[str, Entry]:
    """An inode table's rows, the last few kept decoded: a log walks commits that mostly
    share their table with the commit before (objects are immutable: shared, never
    changed by a caller)."""
    if table is None:
        return {}
    key = (str(store.root), table)
    with _TABLES_LOCK:
        if key in _TABLES:
            _TABLES.move_to_end(key)
            return _TABLES[key]
    rows = store.inodes(table)
    with _TABLES_LOCK:
        _TABLES[key] = rows
        while len(_TABLES) > 4:
            _TABLES.popitem(last=False)
    return rows


@dataclass
class _Sides:
    """Both sides of a diff, and the inode keys whose entry differs between them: a
    subtree with the same id on both sides still differs where it names one of those.
    Such subtrees are put aside, and read only if the directories the diff did read do not
    hold every name (the entry's link count) of each changed inode: a write through a name
    is mostly found in a changed directory, and a big unchanged tree is then never walked."""
    a: TreeState
    b: TreeState
    changed_keys: frozenset[str]
    names_changed: dict[str, bool] = field(default_factory=dict)  # by tree id, one diff's
    seen_a: Counter[str] = field(default_factory=Counter)  # names of changed keys read
    seen_b: Counter[str] = field(default_factory=Counter)
    deferred: list[tuple[str, str]] = field(default_factory=list)  # (same-id tree, prefix)

    def all_named(self) -> bool:
        return all(self.seen_a[k] >= (self.a.inodes[k].nlink or 1)
                   and self.seen_b[k] >= (self.b.inodes[k].nlink or 1)
                   for k in self.changed_keys)


def _sides(old: TreeState | None, new: TreeState | None, times: bool = True) -> _Sides:
    """Without `times`, an inode whose entry changed in its times only is no changed key
    (git freshens an object it would have written again with utime: a walk of the whole
    tree to report it is wasted on a question about anything but times)."""
    a, b = old or TreeState(None), new or TreeState(None)
    keys = frozenset(k for k in a.inodes.keys() & b.inodes.keys()
                     if _row(a.inodes[k], times) != _row(b.inodes[k], times))
    return _Sides(a, b, keys)


def _row(e: Entry, times: bool) -> list:
    return e.to_list() if times else replace(e, mtime_ns=0, ctime_ns=0, atime_ns=None).to_list()


def _changes(store: Store, sides: _Sides, wanted: list[str] | None) -> Iterator[Change]:
    yield from _diff_dir(store, sides, sides.a.tree, sides.b.tree, "", wanted)
    if sides.deferred and not sides.all_named():
        for tree, prefix in sides.deferred:
            yield from _diff_dir(store, sides, tree, tree, prefix, wanted, walk=True)


def diff_trees(store: Store, old: TreeState | None, new: TreeState | None,
               paths: list[str] | None = None) -> list[Change]:
    """Changes from `old` to `new` (None: the empty tree), limited to `paths` (each a path
    from the store root, e.g. "work/src"), sorted by path."""
    wanted = [p.strip("/") for p in paths or [] if p.strip("/")] or None
    sides = _sides(old, new)
    raw = list(_changes(store, sides, wanted))
    return sorted(_pair_renames(store, raw), key=lambda c: (c.path, c.status))


def only_times(store: Store, old: TreeState | None, new: TreeState | None) -> bool:
    """Do `old` and `new` differ in times at most (the same paths, bytes, modes, owners,
    xattrs and link counts)? Stops at the first other difference: a big change costs no
    more than a small one."""
    sides = _sides(old, new, times=False)
    return all(c.status == CHANGED and c.detail == "times"
               for c in _changes(store, sides, None))


def listing(store: Store, state: TreeState, tree: str | None) -> list[Entry]:
    """A directory's entries, hard-linked names resolved."""
    return list(_entries(store, tree, state.inodes).values())


def _entries(store: Store, tree: str | None, inodes: dict[str, Entry] | None = None,
             seen: Counter[str] | None = None) -> dict[str, Entry]:
    if not tree:
        return {}
    rows = decode_dir(store.read_object(tree))
    if seen is not None:
        seen.update(e.ref for e in rows if e.kind == HARD)
    return {e.name: _resolve(e, inodes) for e in rows}


def _resolve(e: Entry, inodes: dict[str, Entry] | None) -> Entry:
    """A hard-linked name as its inode: the table's entry under this name."""
    if e.kind != HARD or not inodes or e.ref not in inodes:
        return e
    return replace(inodes[e.ref], name=e.name)


def _names_changed_key(store: Store, sides: _Sides, tree: str | None) -> bool:
    """Does the tree name (at any depth) an inode whose entry changed? Each subtree is read
    once per diff."""
    if not sides.changed_keys or not tree:
        return False
    if tree not in sides.names_changed:
        sides.names_changed[tree] = any(
            (e.kind == HARD and e.ref in sides.changed_keys)
            or (e.kind == DIR and _names_changed_key(store, sides, e.ref))
            for e in decode_dir(store.read_object(tree)))
    return sides.names_changed[tree]


def _wanted(path: str, wanted: list[str] | None) -> tuple[bool, bool]:
    """(inside a wanted path, on the way to one)."""
    if wanted is None:
        return True, True
    inside = any(path == w or path.startswith(w + "/") for w in wanted)
    above = any(w.startswith(path + "/") for w in wanted)
    return inside, inside or above


def _diff_dir(store: Store, sides: _Sides, old: str | None, new: str | None, prefix: str,
              wanted: list[str] | None, walk: bool = False) -> Iterator[Change]:
    if old == new:
        if not walk:  # read later only if a changed inode has a name not found yet
            if old and sides.changed_keys:
                sides.deferred.append((old, prefix))
            return
        if not _names_changed_key(store, sides, old):
            return
    a = _entries(store, old, sides.a.inodes, sides.seen_a)
    b = _entries(store, new, sides.b.inodes, sides.seen_b)
    for name in sorted(set(a) | set(b)):
        path = prefix + name
        inside, descend = _wanted(path, wanted)
        if not descend:
            continue
        ea, eb = a.get(name), b.get(name)
        if ea is not None and eb is not None and ea.kind == eb.kind == DIR:
            yield from _diff_dir(store, sides, ea.ref, eb.ref, path + "/", wanted, walk)
            if inside and _meta(ea) != _meta(eb):
                yield Change(CHANGED, path + "/", DIR, None, None, detail=_detail(ea, eb))
            continue
        if ea is not None and eb is not None and ea.kind == eb.kind:
            if inside and ea.to_list() != eb.to_list():
                yield Change(CHANGED, path, eb.kind, _size(eb), _size(ea), ref=eb.ref,
                             old_ref=ea.ref, detail=_detail(ea, eb))
            continue
        if ea is not None:
            yield from _whole(store, sides.a, ea, path, REMOVED, wanted, sides.seen_a)
        if eb is not None:
            yield from _whole(store, sides.b, eb, path, ADDED, wanted, sides.seen_b)


def _whole(store: Store, state: TreeState, e: Entry, path: str, status: str,
           wanted: list[str] | None, seen: Counter[str]) -> Iterator[Change]:
    """An entry that exists on one side only: a directory as itself (a rename pairs it
    whole) followed by everything below it."""
    inside, _ = _wanted(path, wanted)
    if e.kind == DIR:
        if inside:
            yield _one(status, path + "/", e)
        for child in _entries(store, e.ref, state.inodes, seen).values():
            yield from _whole(store, state, child, path + "/" + child.name, status, wanted,
                              seen)
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
    if a.kind != DIR and (a.nlink or 1) != (b.nlink or 1):
        parts.append(f"links {a.nlink or 1} -> {b.nlink or 1}")
    if (a.uid, a.gid) != (b.uid, b.gid):
        parts.append(f"owner {a.uid}:{a.gid} -> {b.uid}:{b.gid}")
    if a.xattrs != b.xattrs:
        parts.append(_xattr_words(a.xattrs, b.xattrs))
    return ", ".join(parts) or "times"


def _xattr_words(a: dict[str, str], b: dict[str, str]) -> str:
    """Which extended attributes changed, by name (it said only "xattrs", and a user had
    to compare getfattr dumps of two views to learn which)."""
    words = [f"+{n}" for n in sorted(b.keys() - a.keys())]
    words += [f"-{n}" for n in sorted(a.keys() - b.keys())]
    words += [f"~{n}" for n in sorted(k for k in a.keys() & b.keys() if a[k] != b[k])]
    shown = words[:5] + ([f"{len(words) - 5} more"] if len(words) > 5 else [])
    return f"xattrs {' '.join(shown)}"


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
def find_entry(store: Store, state: TreeState, path: str) -> Entry | None:
    """The entry at `path` (from the store root) in `state`, a hard-linked name resolved;
    None if absent. The root itself is a directory entry named ""."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts:
        return Entry("", DIR, 0o755, 0, 0, 0, 0, 0, state.tree or "")
    ref: str | None = state.tree
    entry: Entry | None = None
    for part in parts:
        if ref is None:
            return None
        entry = _entries(store, ref, state.inodes).get(part)
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
