"""`.memfs/history/` and `.memfs/checkpoints/`: every kept commit and every checkpoint as a
read-only tree whose times are its commit's.

    history/INDEX                           how history is laid out, what is kept, the tools
    history/by-time/YYYY-MM-DD/             one directory per local day that has commits
    history/by-time/YYYY-MM-DD/HH:MM:SS-ID/ each commit of that day (ID: 12 hex digits)
    history/<id or unique prefix>/          any commit by id (looked up, never listed)
    checkpoints/<name>/                     each checkpoint

Listings are small per directory and read through indexed queries (a day's commits by
time), remembered until the database changes (the store's data_version), so `ls` and `find`
stay fast with 100k commits. Loop thread. On the embedded store the reads are short SQLite
reads on the loop, as the rest of .memfs/; on a store in PostgreSQL each is a round trip, so
every directory's `prepare` (before a listing) and `prepare_name` (before a lookup) makes
what it will read fresh in a worker thread first, and the loop reads memory: a slow or
locked server holds the request that asked, never the mount.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import TypeVar, cast

import trio

from memfs.store import StoreError, history

S = TypeVar("S")
T = TypeVar("T")
STABLE = (60.0, 1.0)  # a directory whose name never changes meaning: entry 60 s, attrs 1 s

ID_CHARS = 12
_HEX = re.compile(r"^[0-9a-f]{6,}$")


class Names(list):
    """A listing whose `in` is a set lookup (the FUSE layer checks names one by one)."""

    def __init__(self, items: list[bytes]) -> None:
        super().__init__(items)
        self._set = frozenset(items)

    def __contains__(self, item: object) -> bool:
        return item in self._set


class Facts:
    """What .memfs/ reads of the store, remembered until the store's data_version moves.

    `get` (loop) returns the remembered value when it is fresh, else computes it on the loop
    (a short SQLite read on the embedded store). On a remote store a remembered value is
    returned as is: the directory's prepare renewed it with `ensure` (loop; the read in a
    worker thread) just before, so the loop reads no server unless a lookup comes without a
    prepare (a getattr's mtime: it may lag a commit by one request). `always`: for what no
    notice tells this host of (a checkpoint another process made): read each time, as before
    it was remembered. `warm` runs a read whose result the store itself keeps (a commit, its
    inode table) in a worker thread on a remote store."""

    LIMIT = 256

    def __init__(self, store) -> None:
        self.store = store
        self.remote = bool(getattr(store, "remote", False))
        self._memo: dict[tuple, tuple[int, object]] = {}
        self._derived: dict[tuple, tuple[object, object]] = {}  # key -> (source, value)

    def get(self, key: tuple, compute: Callable[[], object], *, always: bool = False):
        version = self.store.data_version()
        got = self._memo.get(key)
        if got is not None and (self.remote or (got[0] == version and not always)):
            return got[1]
        return self._keep(key, version, compute())

    def peek(self, key: tuple, compute: Callable[[], object]):
        """As `get`, but on a remote store never a read on the loop: None when nothing is
        remembered yet (for an attribute, which no prepare precedes)."""
        if self.remote:
            got = self._memo.get(key)
            return None if got is None else got[1]
        return self.get(key, compute)

    async def ensure(self, key: tuple, compute: Callable[[], object], *,
                     always: bool = False) -> None:
        if not self.remote:
            return
        version = self.store.data_version()
        got = self._memo.get(key)
        if always or got is None or got[0] != version:
            self._keep(key, version, await trio.to_thread.run_sync(compute))

    async def warm(self, read: Callable[[], object]) -> None:
        if self.remote:
            await trio.to_thread.run_sync(read)

    def derived(self, key: tuple, source: S, build: Callable[[S], T]) -> T:
        """A value built from a remembered one (a listing's names from its rows), rebuilt
        whenever that one was renewed: it is never staler than its source."""
        got = self._derived.get(key)
        if got is not None and got[0] is source:
            return cast(T, got[1])
        if len(self._derived) >= self.LIMIT:
            self._derived.clear()
        value = build(source)
        self._derived[key] = (source, value)
        return value

    def _keep(self, key: tuple, version: int, value: object):
        self._memo.pop(key, None)  # to the end: the oldest go first when it is full
        if len(self._memo) >= self.LIMIT:
            for old in list(self._memo)[:self.LIMIT // 2]:
                del self._memo[old]
        self._memo[key] = (version, value)
        return value


class HistoryViews:
    def __init__(self, tree) -> None:  # tree: memfs.fs.virtual.VirtualTree
        self.tree = tree
        self.ws = tree.ws
        self.store = tree.ws.store
        self.facts = Facts(self.store)
        self._fresh = self.facts.get

    def _summary(self) -> dict:
        return self._fresh(("summary",), lambda: history.summary(self.store))

    def _newest(self) -> int | None:
        """A history directory's mtime: its newest commit's time (None: the store root's,
        until a listing on a remote store has read it)."""
        got = self.facts.peek(("summary",), lambda: history.summary(self.store))
        return None if got is None else got["newest"]

    async def _ensure_summary(self) -> None:
        await self.facts.ensure(("summary",), lambda: history.summary(self.store))

    def seen(self, cid: str) -> str:
        """Worker thread: what a view of `cid` reads first (its commit, its inode table),
        into the store's memory, so ws.view on the loop reads no server."""
        self.store.commit(cid)
        table = self.store.inode_table(cid)
        if table:
            self.store.inodes(table)
        return cid

    # -- .memfs/history/ -------------------------------------------------------------------
    def history_dir(self):
        d = self.tree._dir(self._history_lookup, lambda: Names([b"INDEX", b"by-time"]),
                           mtime=self._newest, timeouts=STABLE)
        d.prepare = self._ensure_summary
        d.prepare_name = self._prepare_history_name
        return d

    async def _prepare_history_name(self, name: bytes) -> None:
        await self._ensure_summary()
        text = name.decode("ascii", "replace")
        if _HEX.match(text):
            await self.facts.ensure(("resolve", text), lambda: self._resolve(text, warm=True))

    def _resolve(self, text: str, *, warm: bool = False) -> str | None:
        try:
            cid = self.store.resolve(text)
        except StoreError:  # unknown or ambiguous: absent
            return None
        if not cid.startswith(text):
            return None
        return self._seen_if_kept(cid) if warm else cid

    def _history_lookup(self, name: bytes):
        if name == b"INDEX":
            return self.tree._dir_cached(("history", "INDEX"), lambda: self.tree._file(
                self._index, mtime=self._newest, prepare=self._ensure_summary))
        if name == b"by-time":
            return self.tree._dir_cached(("history", "by-time"), self._by_time_dir)
        text = name.decode("ascii", "replace")
        if not _HEX.match(text):
            return None
        cid = self._fresh(("resolve", text), lambda: self._resolve(text))
        return None if cid is None else self._view(cid, "history/" + cid, immutable=True)

    def _view(self, cid: str, place: str, *, immutable: bool = False):
        try:
            return self.ws.view(cid, place, immutable=immutable)
        except StoreError:  # dropped since it was listed: absent
            return None

    def _by_time_dir(self):
        d = self.tree._dir(self._day_lookup, self._day_names, mtime=self._newest,
                           timeouts=STABLE)

        async def prepare(name: bytes | None = None) -> None:
            await self._ensure_summary()
            await self.facts.ensure(("days",), lambda: dict(history.days(self.store)))

        d.prepare = prepare
        d.prepare_name = prepare
        return d

    def _index(self) -> bytes:
        s = self._summary()
        span = (f"from {_when(s['oldest'])} to {_when(s['newest'])} (local time)"
                if s["commits"] else "none yet")
        return (
            f"memfs history: {s['commits']} commit{'s' if s['commits'] != 1 else ''} kept, "
            f"{span}.\n\n"
            "  by-time/YYYY-MM-DD/HH:MM:SS-ID/  every kept commit (all branches), under the day\n"
            "                                   it was made; each one's mtime is its commit's time\n"
            "  <commit id>/                     any commit by its id or a unique prefix of 6 or\n"
            "                                   more hex digits (looked up, not listed)\n"
            "  ../checkpoints/NAME/             each checkpoint\n"
            "  ../branches/NAME/                each branch as its head has it\n\n"
            "Every view is read-only. From a shell: `memfs log --ops` lists operations (what\n"
            "`memfs undo` takes back), `memfs log --stat` what each commit changed,\n"
            "`memfs show REV:PATH` a file as it was, `memfs diff A B` what differs.\n"
            "A commit stays here until the retention policy drops it (docs/guarantees.md).\n"
        ).encode()

    def _days(self) -> dict[str, int]:
        return self._fresh(("days",), lambda: dict(history.days(self.store)))

    def _day_names(self) -> Names:
        return self.facts.derived(("day-names",), self._days(),
                                  lambda days: Names([d.encode() for d in sorted(days)]))

    def _day_lookup(self, name: bytes):
        day = name.decode("ascii", "replace")
        days = self._days()
        if day not in days:
            return None
        return self.tree._dir_cached(("day", day), lambda: self._day_dir(day))

    def _day_dir(self, day: str):
        d = self.tree._dir(lambda n: self._commit_lookup(day, n), lambda: self._commit_names(day),
                           mtime=lambda: self._day_mtime(day), timeouts=STABLE)

        async def prepare() -> None:
            await self.facts.ensure(("days",), lambda: dict(history.days(self.store)))
            await self.facts.ensure(("day", day), lambda: self._commits_of(day))

        async def prepare_name(name: bytes) -> None:
            await prepare()
            cid = self._day_commits(day).get(name)
            if cid is not None:
                await self.facts.warm(lambda: self._seen_if_kept(cid))

        d.prepare, d.prepare_name = prepare, prepare_name
        return d

    def _day_mtime(self, day: str) -> int | None:
        days = self.facts.peek(("days",), lambda: dict(history.days(self.store)))
        return None if days is None else days.get(day, 0)

    def _commits_of(self, day: str) -> dict[bytes, str]:
        d = date.fromisoformat(day)
        start = history.day_start(d)
        end = history.day_start(d + timedelta(days=1))
        return {_entry_name(cid, t): cid for cid, t in
                history.commits_by_time(self.store, start, end)}

    def _day_commits(self, day: str) -> dict[bytes, str]:
        return self._fresh(("day", day), lambda: self._commits_of(day))

    def _commit_names(self, day: str) -> Names:
        return self.facts.derived(("names", day), self._day_commits(day),
                                  lambda commits: Names(list(commits)))

    def _commit_lookup(self, day: str, name: bytes):
        cid = self._day_commits(day).get(name)
        if cid is None:
            return None
        return self._view(cid, f"history/by-time/{cid}", immutable=True)

    # -- .memfs/checkpoints/ -----------------------------------------------------------------
    def checkpoints_dir(self):
        d = self.tree._dir(self._checkpoint_lookup, lambda: Names(
            sorted(name.encode("utf-8", "surrogateescape") for name in self._checkpoints())),
            mtime=self._newest, timeouts=STABLE)

        async def prepare() -> None:
            await self._ensure_summary()
            await self.facts.ensure(("checkpoints",), self._read_checkpoints, always=True)

        async def prepare_name(name: bytes) -> None:
            await prepare()
            cid = self._checkpoints().get(name.decode("utf-8", "surrogateescape"))
            if cid is not None:
                await self.facts.warm(lambda: self._seen_if_kept(cid))

        d.prepare, d.prepare_name = prepare, prepare_name
        return d

    def _read_checkpoints(self) -> dict[str, str]:
        return {cp.name: cp.commit for cp in history.checkpoints(self.store)}

    def _checkpoints(self) -> dict[str, str]:
        return self._fresh(("checkpoints",), self._read_checkpoints, always=True)

    def _seen_if_kept(self, cid: str) -> str | None:
        try:
            return self.seen(cid)
        except StoreError:  # dropped: the lookup says absent
            return None

    def _checkpoint_lookup(self, name: bytes):
        text = name.decode("utf-8", "surrogateescape")
        cid = self._checkpoints().get(text)
        if cid is None:
            return None
        return self._view(cid, "checkpoints/" + text)  # absent once its commit is dropped


def _entry_name(cid: str, time_ns: int) -> bytes:
    return f"{datetime.fromtimestamp(time_ns / 1e9).strftime('%H:%M:%S')}-{cid[:ID_CHARS]}".encode()


def _when(ns: int | None) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S") if ns else "-"
