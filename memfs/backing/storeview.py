"""The store side of a pass: a mount's files in the live tree and their digests, the rule's S.

Owns four caches, all written on the trio loop only:
- `digests`: (committed ref, size) -> xxh3-128 of a loaded node's content (a `RefDigests`:
  keyed by the ref string, no tuple a file). A ref is immutable, so an entry never goes
  stale. Refs not cached yet are hashed by a pass's worker thread (`ref_digest`, reading the
  store) and handed back; the loop merges them (`learn`). An unloaded file's digest is kept
  by the walk's table instead (memfs.backing.storefiles: 16 bytes beside its ref), and an
  entry here moves into a whole walk's table once its node is unloaded, and back from the
  last walk's tables once a lookup loads it again (no re-read of the store).
- `draft_digests`: node id -> (ver, digest) of a dirty file, hashed from its live bytes. `ver`
  moves on every write and truncate, so a remembered digest is served only for the bytes it
  was computed from (a stale one could read a draft as agreed and let a disk edit overwrite
  it). Cleared past 4096 entries (committed or deleted drafts would linger).
- the memo of the last walk: (mount, scope, epoch, ws.mutation_seq, ws.head, mount node) ->
  the files (`StoreFiles`: loaded nodes, and a packed table of the unloaded ones), the refs
  they need hashed, and the view S built from them. Every create, unlink, rename, write and
  truncate bumps `mutation_seq`; a commit that marks drafts committed moves `head` in the same
  loop turn; a replaced tree (undo, restore, switch) bumps `epoch` (`tree_replaced`). Any of
  them moving makes the next question walk again; the new walk's table takes the digests of
  the last one's files with the same path, ref and size (`FileTable.carry`).
- `_last`: mount -> the S of its last whole walk: its loaded files' Content objects a new
  view takes where a path's content is unchanged (one object per file across views, no
  digest memo), and its table, which the next walk's carries digests from.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import xxhash

from memfs.backing.storefiles import FileTable, StoreContents, StoreFiles, Unbuilt
from memfs.reconcile.contained import components
from memfs.reconcile.facts import shared_content
from memfs.reconcile.rule import MODE_BITS, MODES, SPECIAL_NAMES
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.trees import DIR, FILE, HARD, LINK, Entry, decode_dir, name_to_bytes
from memfs.workspace.nodes import Node

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

EMPTY_DIGEST = xxhash.xxh3_128_hexdigest(b"")
RefKey = tuple[str, int]  # (committed ref, size)


class ChunkReader(Protocol):
    def file_chunks(self, ref: str) -> dict[int, str]: ...
    def read_chunk(self, chunk_id: str) -> bytes: ...


def ref_chunks(store: ChunkReader, ref: str, size: int) -> Iterator[bytes]:
    """A committed file's content, chunk by chunk (holes and short chunks as zeros)."""
    chunks = store.file_chunks(ref)
    pos = 0
    for idx in range((size + CHUNK_SIZE - 1) // CHUNK_SIZE):
        n = min(CHUNK_SIZE, size - pos)
        piece = store.read_chunk(chunks[idx])[:n] if idx in chunks else b""
        yield piece + bytes(n - len(piece)) if len(piece) < n else piece
        pos += n


def ref_digest(store: ChunkReader, ref: str, size: int) -> str:
    """xxh3-128 of a committed file's whole content, streamed chunk by chunk."""
    h = xxhash.xxh3_128()
    for piece in ref_chunks(store, ref, size):
        h.update(piece)
    return h.hexdigest()


def hash_refs(store: ChunkReader, refs: Iterator[RefKey] | list[RefKey]) -> dict[RefKey, str]:
    """The digests of committed refs (a worker thread's part of a pass: it reads the store)."""
    return {key: sys.intern(ref_digest(store, *key)) for key in refs}


class RefDigests:
    """(committed ref, size) -> xxh3-128, kept compactly: nearly every ref is seen at one size,
    so the digest and that size are kept in two maps keyed by the ref string itself (no key
    tuple per file, and a table keyed by strings only is the compact kind: 85 bytes an entry
    became 53 at 10k). A ref seen again at another size (a file extended by a truncate keeps its
    chunks) goes in a third map keyed by the pair. A ref is immutable, so an entry never
    goes stale; it only grows. Loop only (StoreView's)."""

    __slots__ = ("_digest", "_size", "_other")

    def __init__(self) -> None:
        self._digest: dict[str, str] = {}
        self._size: dict[str, int] = {}  # the size the ref's _digest entry is for
        self._other: dict[RefKey, str] = {}

    def of(self, ref: str, size: int) -> str | None:
        """The digest of ref's content at size, if known."""
        if self._size.get(ref) == size:
            return self._digest[ref]
        return self._other.get((ref, size)) if self._other else None

    def get(self, key: RefKey) -> str | None:
        return self.of(*key)

    def __contains__(self, key: RefKey) -> bool:
        return self.of(*key) is not None

    def __setitem__(self, key: RefKey, digest: str) -> None:
        ref, size = key
        known = self._size.get(ref)
        if known is None or known == size:
            self._size[ref] = size
            self._digest[ref] = digest
        else:
            self._other[key] = digest

    def pop(self, ref: str, size: int) -> str | None:
        """The digest of ref at size, dropped from here (a table of files keeps it now)."""
        if self._size.get(ref) == size:
            del self._size[ref]
            return self._digest.pop(ref)
        return self._other.pop((ref, size), None) if self._other else None

    def update(self, digests: Mapping[RefKey, str]) -> None:
        for key, digest in digests.items():
            self[key] = digest

    def __len__(self) -> int:
        return len(self._digest) + len(self._other)


StoreFile = Node | Unbuilt  # what a pass decides a store file on


def _from_tables(digests: RefDigests, olds: list[FileTable], path: str, key: RefKey) -> None:
    """A loaded file's digest from a former walk's table, where it was an unloaded file with
    the same ref and size (the table took it out of `digests`): back into `digests`."""
    for old in olds:
        i = old.index(path)
        if i >= 0 and old.known[i] and old.key(i) == key:
            digest = old.digest(i)
            if digest is not None:
                digests[key] = digest
            return


class StoreView:
    """The live tree's side of one workspace's backed mounts (see the module docstring)."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.epoch = 0  # bumped when the tree is replaced (undo, restore, branch switch)
        self.digests = RefDigests()
        self.draft_digests: dict[int, tuple[int, str]] = {}
        # [key, nodes, refs still to hash, view or None]
        self._memo: list[Any] | None = None
        self._last: dict[str, StoreContents] = {}  # mount -> its last whole S
        self._linked: tuple[Mapping[str, StoreFile], frozenset[str]] | None = None  # hard_linked's

    def tree_replaced(self) -> None:
        self.epoch += 1

    def drop_memo(self) -> None:
        """Nodes were unloaded: the walk memo's go with it (its key no longer matches)."""
        self._memo = None

    def forget(self, mount: str) -> None:
        """The mount was detached."""
        self._last.pop(mount, None)
        self._memo = None

    def learn(self, digests: Mapping[RefKey, str]) -> None:
        """Digests a worker thread computed, merged on the loop: an unloaded file's into the
        walk memo's table, a loaded node's into `digests`; the memo's list of refs to hash
        drops them now (its keys, a tuple a file, are not kept until the next ask)."""
        memo = self._memo
        wanted: dict[RefKey, list[int]] = memo[2] if memo is not None else {}
        table = memo[1].table if memo is not None else None
        for key, digest in digests.items():
            at = wanted.pop(key, None)  # every position that wanted it has it now
            if at is None or table is None:
                self.digests[key] = digest  # not this walk's (asked before it): kept apart
                continue
            for i in at:
                if i < 0:
                    self.digests[key] = digest
                else:
                    table.set_digest(i, digest)
        if memo is not None:
            memo[2] = dict(wanted)  # a copy is sized to what is left (a dict never shrinks)

    # -- finding nodes ---------------------------------------------------------------
    def mount_node(self, mount: str) -> Node | None:
        node = self.ws.children(self.ws.root).get(name_to_bytes(mount))
        return node if node is not None and node.kind == DIR else None

    def holds(self, mount: str, rel: str) -> bool:
        """Does the workspace hold anything (file, directory, link, special) at rel?"""
        node = self.mount_node(mount)
        for part in components(rel):
            if node is None or node.kind != DIR:
                return False
            node = self.ws.children(node).get(name_to_bytes(part))
        return node is not None

    def same_as_decided(self, mount: str, rel: str, decided: StoreFile | None,
                        ver: int | None) -> tuple[bool, Node | None]:
        """(unchanged, the node at rel now): unchanged if the workspace holds there what a pass
        decided on: nothing, as then; the very node at the same version; or, decided from
        the committed tree, a clean file with the same committed ref and mode (unloaded and
        loaded again, its rows are what it was decided on)."""
        now = self.node_at(mount, rel)
        if decided is None or now is None:
            return decided is None and now is None, now
        if now is decided:
            return now.ver == ver, now
        same = not (decided.dirty or decided.ref is None or now.dirty or now.ref != decided.ref
                    or (now.mode & MODE_BITS) != (decided.mode & MODE_BITS))
        return same, now

    def node_at(self, mount: str, rel: str) -> Node | None:
        """The store file node at rel (None: none, or a disk-only node)."""
        node = self.mount_node(mount)
        for part in components(rel):
            if node is None or node.kind != DIR:
                return None
            node = self.ws.children(node).get(name_to_bytes(part))
        if node is None or node.kind != FILE or node.id in self.ws.disk_only:
            return None
        return node

    def dir_modes(self, mount: str, paths: Iterable[str]) -> dict[str, int]:
        """The permission bits of the store's directories above `paths` (by rel): what a
        materialize gives the ones disk lacks. Loop (it may load a directory's nodes)."""
        out: dict[str, int] = {}
        top = self.mount_node(mount)
        for path in paths:
            node, at = top, ""
            for part in components(path)[:-1]:
                at = f"{at}/{part}" if at else part
                node = None if node is None else self.ws.children(node).get(name_to_bytes(part))
                if node is None or node.kind != DIR:
                    break
                out[at] = node.mode & MODE_BITS
        return out

    def dirs_held(self, mount: str, paths: Iterable[str]) -> set[str]:
        """Which of `paths` (by rel) the store holds as directories: a materialize leaves
        those on disk when it empties them. Loop (it may load a directory's nodes)."""
        top = self.mount_node(mount)
        out: set[str] = set()
        for path in paths:
            node = top
            for part in components(path):
                node = None if node is None else self.ws.children(node).get(name_to_bytes(part))
                if node is None or node.kind != DIR:
                    break
            else:
                out.add(path)
        return out

    def nodes(self, mount: str, scope: str = "") -> tuple[StoreFiles, list[RefKey]]:
        """Every committed-or-draft file of the mount under scope (disk-only nodes excluded),
        read-only, and the committed refs whose digest is not cached yet. Remembered while
        nothing it depends on moved (module docstring): a pass asks twice, and a quiet tree's
        next pass asks the same question again; at 100k files the walk and the view cost
        more than the decisions."""
        top = self.mount_node(mount)
        key = self._key(mount, scope, top)
        memo = self._memo
        if memo is None or memo[0] != key:
            nodes = self._walk(top, scope)
            olds = self._carry(nodes.table, mount, scope)
            # What is still to hash: (ref, size) -> the table's positions that want it, -1
            # for a loaded node (whose digest `digests` keeps).
            refs: dict[RefKey, list[int]] = {}
            digests = self.digests
            for p, node in nodes.loaded.items():
                if not node.dirty and node.ref is not None:
                    k = (node.ref, node.data.size if node.data is not None else 0)
                    if olds and k not in digests:
                        _from_tables(digests, olds, p, k)  # its directory loaded since
                    refs.setdefault(k, []).append(-1)
            table = nodes.table
            for i in table.unknown():
                refs.setdefault(table.key(i), []).append(i)
            memo = self._memo = [key, nodes, refs, None]
        if memo[2]:
            memo[2] = self._still_wanted(memo[1].table, memo[2])
        return memo[1], list(memo[2])

    def _still_wanted(self, table: FileTable, refs: dict[RefKey, list[int]],
                      ) -> dict[RefKey, list[int]]:
        """The refs a walk wants hashed whose digests nobody learned since."""
        digests, known = self.digests, table.known
        return {key: at for key, at in refs.items()
                if any(not known[i] if i >= 0 else key not in digests for i in at)}

    def _carry(self, table: FileTable, mount: str, scope: str) -> list[FileTable]:
        """A new walk's table takes the digests known for its files: from the last walk's
        table and the mount's last whole view (same path, ref and size), else from `digests`
        (a loaded node's, unloaded since; a whole walk's table keeps it from here on).
        Returns those former tables (a file loaded since takes its digest from them)."""
        memo, last = self._memo, self._last.get(mount)
        olds = []
        if memo is not None and memo[0][0] == mount and len(memo[1].table):
            olds.append(memo[1].table)
        if last is not None and last.table is not (memo[1].table if memo else None) \
                and len(last.table):
            olds.append(last.table)
        for old in olds:
            table.carry(old)
        digests, whole = self.digests, scope == ""
        if not len(digests):
            return olds
        for i in table.unknown():
            ref, size = table.key(i)
            digest = digests.pop(ref, size) if whole else digests.of(ref, size)
            if digest is not None:
                table.set_digest(i, digest)
        return olds

    def _key(self, mount: str, scope: str, top: Node | None = None) -> tuple[object, ...]:
        ws = self.ws
        if top is None:
            top = self.mount_node(mount)
        return (mount, scope, self.epoch, ws.mutation_seq, ws.head, top, ws.unload_seq)

    def _walk(self, top: Node | None, scope: str) -> StoreFiles:
        nodes: dict[str, StoreFile] = {}
        at = ""
        for part in components(scope):
            if top is None or top.kind != DIR:
                # A symlink or FIFO above the scope stands where disk may have a directory.
                kind = None if top is None or top.kind == FILE else top.kind
                return StoreFiles(nodes, specials={at: kind} if kind and at else None)
            top = self.ws.children(top).get(name_to_bytes(part))
            at = f"{at}/{part}" if at else part
        if top is None or top.id in self.ws.disk_only:
            return StoreFiles(nodes)
        if top.kind != DIR:  # a file, or a link or FIFO the rule does not decide
            if top.kind == FILE:
                nodes[scope] = top
                return StoreFiles(nodes)
            return StoreFiles(nodes, specials={scope: top.kind})
        # Paths are interned, as the journal's and the walk's are: a pass looks each one up
        # in five maps, and equal keys that are one object compare without touching their
        # bytes (at 100k files that is memory traffic the pass waits on).
        intern = sys.intern
        table = FileTable()  # the files of unloaded directories, from their tree rows
        specials: dict[str, str] = {}  # links, FIFOs, sockets, devices: few, kept by path
        for prefix, name, kind, item in self._entries(top, scope + "/" if scope else ""):
            if kind == FILE:
                if isinstance(item, Entry):
                    table.add(intern(prefix + name), item)
                else:
                    nodes[intern(prefix + name)] = item  # type: ignore[assignment]
            elif kind != DIR:
                specials[prefix + name] = kind
        return StoreFiles(nodes, table.done(), specials)

    def _entries(self, top: Node, prefix: str) -> Iterator[tuple[str, str, str, object]]:
        """(prefix, name, kind, node or Entry) of everything below `top` but the
        disk-only nodes, by a work list; directories not loaded are read from their
        committed tree objects and no node is built (their rows, files' too, are yielded
        as Entries). A tree row naming a hard-linked inode needs the inode table: that
        directory is loaded as a lookup would."""
        ws = self.ws
        children, disk_only, read = ws.children, ws.disk_only, ws.store.read_object
        stack: list[tuple[Node | str, str]] = [(top, prefix)]
        while stack:
            d, at = stack.pop()
            if isinstance(d, Node) and d._children is None and d.ref and not d.dirty:
                d = d.ref  # a stub: its rows, not its nodes
            if isinstance(d, str):
                rows = decode_dir(read(d))
                if any(e.kind == HARD for e in rows):
                    d = self._dir_at(top, at[len(prefix):])
                else:
                    for e in rows:
                        if e.kind == DIR:
                            stack.append((e.ref, at + e.name + "/"))
                            yield at, e.name, DIR, e
                        else:
                            yield at, e.name, e.kind, e
                    continue
            for name, child in children(d).items():
                if child.id in disk_only:
                    continue
                text = name.decode("utf-8", "surrogateescape")
                if child.kind == DIR:
                    stack.append((child, at + text + "/"))
                yield at, text, child.kind, child

    def _dir_at(self, top: Node, rel: str) -> Node:
        """The directory node at rel below top (rel ends with "/"), loaded on the way."""
        node = top
        for part in rel.split("/")[:-1]:
            node = self.ws.children(node)[name_to_bytes(part)]
        return node

    # -- digests -----------------------------------------------------------------------
    def digest_now(self, node: Node) -> str:
        """The store side's digest: a committed file's by its immutable (ref, size), a draft's
        from its live bytes by (node id, ver) (module docstring)."""
        if not node.dirty and node.ref is not None:
            key = (node.ref, node.size())
            digest = self.digests.get(key)
            if digest is None:
                digest = self.digests[key] = sys.intern(ref_digest(self.ws.store, *key))
            return digest
        ver = node.ver  # read before the bytes: a write meanwhile leaves a ver never asked for
        hit = self.draft_digests.get(node.id)
        if hit is not None and hit[0] == ver:
            return hit[1]
        h = xxhash.xxh3_128()
        size = node.size()
        for off in range(0, size, CHUNK_SIZE):
            h.update(self.ws.read(node, off, CHUNK_SIZE))
        digest = h.hexdigest() if size else EMPTY_DIGEST
        if len(self.draft_digests) >= 4096:
            self.draft_digests.clear()
        self.draft_digests[node.id] = (ver, digest)
        return digest

    def view(self, nodes: Mapping[str, StoreFile]) -> StoreContents:
        """The rule's S for each store file (`digest_now`; a loaded file whose content is as
        in the mount's last whole view keeps that view's Content object; an unloaded file's
        is its table's digest, a Content built when asked)."""
        memo = self._memo
        if memo is not None and memo[1] is nodes and memo[3] is not None and \
                memo[0] == self._key(memo[0][0], memo[0][1]):
            return memo[3]  # the same nodes, nothing moved: the same digests (read-only)
        files = nodes if isinstance(nodes, StoreFiles) else StoreFiles(dict(nodes))
        digests, loaded = self.digests, {}
        last = self._last.get(memo[0][0]) if memo is not None else None
        before = last.loaded if last is not None else {}
        for p, n in files.loaded.items():
            # The committed, already-hashed case inline: nearly every file of a quiet tree.
            digest = None if n.dirty or n.ref is None or n.data is None else \
                digests.of(n.ref, n.data.size)  # (ref, node.size()) for a file
            if digest is None:
                digest = self.digest_now(n)  # type: ignore[arg-type]
            mode = MODES[n.mode & MODE_BITS]
            # The last whole view's object where the path's content is the same: one Content
            # per file shared by consecutive views, and no memo of every digest kept beside;
            # a new one from the disk side's cache (the same object as D where they agree).
            was = before.get(p)
            loaded[p] = was if was is not None and was.digest == digest and was.mode == mode \
                else shared_content(digest, "text", mode)
        table = files.table
        for i in table.unknown():  # not hashed by the pass's thread (status, a materialize)
            key = table.key(i)
            digest = digests.of(*key)
            table.set_digest(i, digest if digest is not None else
                             ref_digest(self.ws.store, *key))
        out = StoreContents(loaded, table)
        if memo is not None and memo[1] is nodes and memo[0] == self._key(memo[0][0],
                                                                             memo[0][1]):
            memo[3] = out  # shared from here on: nobody writes a view
            if memo[0][1] == "":
                self._last[memo[0][0]] = out
        return out

    def drafts_to_hash(self, nodes: Mapping[str, StoreFile]) -> list[Node]:
        """The dirty files whose digest is not remembered for their current bytes."""
        out: list[Node] = []
        for n in (nodes.loaded if isinstance(nodes, StoreFiles) else nodes).values():
            if n.dirty or n.ref is None:  # never an unloaded file: clean by definition
                hit = self.draft_digests.get(n.id)  # type: ignore[arg-type]
                if hit is None or hit[0] != n.ver:
                    out.append(n)  # type: ignore[arg-type]
        return out

    def file_refs(self, mount: str) -> dict[str, str | None]:
        """path -> committed ref of each file of the mount (None: a draft, changed for sure)."""
        nodes, _ = self.nodes(mount)
        out: dict[str, str | None] = {p: (None if n.dirty else n.ref)
                                      for p, n in nodes.loaded.items()}
        table = nodes.table
        for i, p in enumerate(table.paths):
            out[p] = table.ref(i)
        return out

    # -- what no write can put on disk --------------------------------------------------
    def unwritable(self, nodes: StoreFiles, mount: str) -> dict[str, str]:
        """Store entries no write can put on disk as they are, with why (materialize lists
        them, forced or not): a file with other hard links (disk would get separate copies,
        never the link), a symlink, FIFO, socket or device (no effect makes one on disk).
        `nodes`: a `nodes(mount)` answer, whose walk saw the specials."""
        out = {}
        for path in sorted(self.hard_linked(nodes)):
            links = nodes[path].nlink
            out[path] = (f"a hard link ({links} names share this file in the workspace): "
                         "written to disk it would be separate copies, so it is not written")
        for path, kind in sorted(nodes.specials.items()):
            if kind == LINK:
                # Links are carried neither way (a disk link is an incomplete region, never
                # followed unless the mount follows links): one made here stays here.
                out[path] = ("a symbolic link in the workspace: links are not written to disk "
                             "(nor taken from it); to put one there, make it on disk")
                continue
            out[path] = (f"a {SPECIAL_NAMES.get(kind, 'special file')} in the workspace: no "
                         "materialize makes special files on disk")
        return out

    def not_carried(self, nodes: StoreFiles) -> frozenset[str]:
        """The paths of `nodes` (a `nodes()` answer) whose change no materialize carries: a
        hard-linked file, and a symlink or special file made in the mount (a workspace
        deletion of disk's file there included: materialize leaves disk's file while the
        entry stands). Status counts with it at every request (memfs.backing.owed); the
        specials come from the same walk, so this costs no walk of its own."""
        linked = self.hard_linked(nodes)
        return linked | frozenset(nodes.specials) if nodes.specials else linked

    def hard_linked(self, nodes: Mapping[str, StoreFile]) -> frozenset[str]:
        """The paths of `nodes` (a `nodes()` answer) whose file has other names. Remembered
        for the same answer: status counts with it at every request (memfs.backing.owed), and
        any link or unlink makes `nodes()` answer anew."""
        got = self._linked
        if got is not None and got[0] is nodes:
            return got[1]
        files = nodes if isinstance(nodes, StoreFiles) else StoreFiles(dict(nodes))
        linked = frozenset(
            [p for p, n in files.loaded.items() if (getattr(n, "nlink", 1) or 1) > 1]
            + [files.table.paths[i] for i, k in files.table.nlinks.items() if k > 1])
        self._linked = (nodes, linked)
        return linked

__all__ = ["EMPTY_DIGEST", "RefDigests", "RefKey", "StoreContents", "StoreFile", "StoreFiles",
           "StoreView", "Unbuilt", "hash_refs", "ref_chunks", "ref_digest"]
