"""The reserved `.memfs/` control tree: read-only views generated on demand.

`.memfs` is reachable by name from the mount root but never listed there, so `find`, `du`,
`grep -r` and `git add -A` never walk into history. Everything below it is read-only.
Entries are generated when looked up; files render their content at open, so a `cat`
always shows the present. Loop thread only (the FUSE handlers); a file that must count
something slowly does it in its `prepare`, in a worker thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from memfs.fs.history_view import STABLE, HistoryViews

VIRTUAL_BASE = 1 << 40


@dataclass
class VFile:
    id: int
    render: Callable[[], bytes]
    mtime: Callable[[], int | None] | None = None  # ns; None: the store root's mtime
    # Awaited at open, before render: facts that must be fresh and cannot be made fresh on
    # the loop without waiting (status: what disk owes, counted in a worker thread).
    prepare: Callable[[], Awaitable[None]] | None = None


@dataclass
class VDir:
    id: int
    # name -> (VFile | VDir | workspace Node); None when absent
    lookup: Callable[[bytes], object | None]
    listing: Callable[[], list[bytes]]
    cache: dict[bytes, object] = field(default_factory=dict)
    mtime: Callable[[], int | None] | None = None  # ns; None: the store root's mtime
    # (entry, attribute) timeouts the kernel may cache it for: 0 unless its name can only
    # ever mean this directory (history's layout), where a path walk need not ask again.
    timeouts: tuple[float, float] = (0.0, 0.0)
    # Awaited before a listing starts (and before a lookup in it, unless prepare_name is
    # set, which is awaited with the name instead): for entries that live in a database and
    # are fetched in a worker thread, so `lookup` and `listing` read memory.
    prepare: Callable[[], Awaitable[None]] | None = None
    prepare_name: Callable[[bytes], Awaitable[None]] | None = None


class VirtualTree:
    """Builds and remembers the virtual nodes so their inode numbers stay stable."""

    def __init__(self, ws, root: Path, extra: dict[bytes, Callable[[], object]] | None = None):
        self.ws = ws
        self.root_dir = root
        self.nodes: dict[int, VFile | VDir] = {}
        self._next = VIRTUAL_BASE
        self.top = self._dir(self._top_lookup, lambda: sorted(self._top_children()),
                             timeouts=STABLE)
        self._extra = extra or {}
        self.history = HistoryViews(self)
        # The control requests running and the last long ones (memfs.fs.longops), set by the
        # daemon's control server: `cat .memfs/status` says what `memfs status` says.
        self.requests_status: Callable[[], dict] | None = None

    def _id(self) -> int:
        self._next += 1
        return self._next

    def _dir(self, lookup, listing, mtime=None, timeouts=(0.0, 0.0)) -> VDir:
        d = VDir(self._id(), lookup, listing, mtime=mtime, timeouts=timeouts)
        self.nodes[d.id] = d
        return d

    def _file(self, render, mtime=None, prepare=None) -> VFile:
        f = VFile(self._id(), render, mtime, prepare)
        self.nodes[f.id] = f
        return f

    def _top_children(self) -> dict[bytes, Callable[[], object]]:
        items = {
            b"status": lambda: self._file(self._status, prepare=self._prepare_status),
            b"branches": self._branches_dir,
            b"history": lambda: self.history.history_dir(),
            b"checkpoints": lambda: self.history.checkpoints_dir(),
            b"receipts": self._receipts,
        }
        items.update(self._extra)
        return items

    def _top_lookup(self, name: bytes):
        make = self._top_children().get(name)
        if make is None:
            return None
        if name not in self.top.cache:
            self.top.cache[name] = make()
        return self.top.cache[name]

    async def _prepare_status(self) -> None:
        await self.ws.backing.refresh_status()
        await self.ws.refresh_policy()

    def _status(self) -> bytes:
        doc = self.ws.status()
        if self.requests_status is not None:
            doc["requests"] = self.requests_status()
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def _branches_dir(self) -> VDir:
        """Each branch as its head has it; the heads are read in a worker thread first on a
        store in PostgreSQL (history_view.Facts), every time: a branch made elsewhere shows."""
        facts = self.history.facts

        def heads() -> dict[str, str]:
            return facts.get(("branches",), self.ws.store.branches, always=True)

        async def prepare() -> None:
            await facts.ensure(("branches",), self.ws.store.branches, always=True)

        async def prepare_name(name: bytes) -> None:
            await prepare()
            head = heads().get(name.decode("utf-8", "surrogateescape"))
            if head is not None:
                await facts.warm(lambda: self.history._seen_if_kept(head))

        def lookup(name: bytes):
            text = name.decode("utf-8", "surrogateescape")
            head = heads().get(text)
            return None if head is None else self.ws.view(head, "branches/" + text)

        d = self._dir(lookup, lambda: sorted(n.encode() for n in heads()))
        d.prepare, d.prepare_name = prepare, prepare_name
        return d

    def _receipts(self) -> VDir:
        """The receipts, read-only: the root's files, or a shared store's rows as the same
        `<review id>.md` files, fetched in a worker thread before each lookup, listing and
        open (a slow or locked server holds that request only, never the loop)."""
        from memfs.workspace.agent_memory import shared_receipt_bodies

        bodies = shared_receipt_bodies(self.root_dir)
        if bodies is None:
            return self._folder(self.root_dir / "receipts")
        fetched: dict[str, str] = {}

        async def refresh() -> None:
            rows = await trio.to_thread.run_sync(bodies)
            fetched.clear()
            fetched.update(rows)

        def listing() -> list[bytes]:
            return sorted(f"{rid}.md".encode() for rid in fetched)

        def lookup(name: bytes):
            rid = name.decode("utf-8", "surrogateescape").removesuffix(".md")
            if not name.endswith(b".md") or rid not in fetched:
                return None
            return self._file(lambda: fetched.get(rid, "").encode(), prepare=refresh)

        folder = self._dir(lookup, listing)
        folder.prepare = refresh
        return folder

    def _folder(self, path: Path) -> VDir:
        """A read-only mirror of a real folder under the root (receipts, memory)."""

        def listing() -> list[bytes]:
            try:
                return sorted(os.fsencode(n) for n in os.listdir(path) if not n.startswith("."))
            except FileNotFoundError:
                return []

        def lookup(name: bytes):
            target = path / os.fsdecode(name)
            if name.startswith(b".") or b"/" in name:
                return None
            if target.is_dir():
                return self._folder(target)
            if target.is_file():
                return self._file(lambda: target.read_bytes())
            return None

        return self._dir(lookup, listing)

    def path_dir(self, provider: Callable[[], dict[str, Path | None]], prefix: str = "") -> VDir:
        """A read-only tree over 'a/b/c' -> file (e.g. .memfs/conflicts/<mount>/<path>: each
        conflict's recorded disk side); entries whose file is None are not shown."""

        def names() -> dict[bytes, bool]:  # name -> is a directory
            out: dict[bytes, bool] = {}
            for key, blob in provider().items():
                if blob is None or not key.startswith(prefix):
                    continue
                head, sep, _ = key[len(prefix):].partition("/")
                out[os.fsencode(head)] = out.get(os.fsencode(head), False) or bool(sep)
            return out

        def lookup(name: bytes):
            is_dir = names().get(name)
            if is_dir is None:
                return None
            key = prefix + os.fsdecode(name)
            if is_dir:
                return self._dir_cached(("path", key), lambda: self.path_dir(provider, key + "/"))
            blob = provider().get(key)
            return None if blob is None else self._file(lambda: blob.read_bytes())

        return self._dir(lookup, lambda: sorted(names()))

    def _dir_cached(self, key: tuple[str, str], make: Callable[[], VDir]) -> VDir:
        """One VDir per key, so a path's inode number stays stable across lookups."""
        cache = self.__dict__.setdefault("_path_dirs", {})
        if key not in cache:
            cache[key] = make()
        return cache[key]
