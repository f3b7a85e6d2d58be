"""`.memfs/history/` and `.memfs/checkpoints/`: every kept commit and every checkpoint as a
read-only tree whose times are its commit's.

    history/INDEX                           how history is laid out, what is kept, the tools
    history/by-time/YYYY-MM-DD/             one directory per local day that has commits
    history/by-time/YYYY-MM-DD/HH:MM:SS-ID/ each commit of that day (ID: 12 hex digits)
    history/<id or unique prefix>/          any commit by id (looked up, never listed)
    checkpoints/<name>/                     each checkpoint

Listings are small per directory and read through indexed queries (a day's commits by
time), remembered until the database changes (SQLite's data_version), so `ls` and `find`
stay fast with 100k commits. Loop thread (short SQLite reads, as the rest of .memfs/).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta

from memfs.store import StoreError, history

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


class HistoryViews:
    def __init__(self, tree) -> None:  # tree: memfs.fs.virtual.VirtualTree
        self.tree = tree
        self.ws = tree.ws
        self.store = tree.ws.store
        self._memo: dict[tuple, tuple[int, object]] = {}

    # -- memo -------------------------------------------------------------------------------
    def _fresh(self, key: tuple, compute: Callable[[], object]):
        version = self.store.data_version()
        got = self._memo.get(key)
        if got is not None and got[0] == version:
            return got[1]
        value = compute()
        if len(self._memo) > 64:
            self._memo.clear()
        self._memo[key] = (version, value)
        return value

    def _newest(self) -> int | None:
        return self._fresh(("summary",), lambda: history.summary(self.store))["newest"]

    # -- .memfs/history/ -------------------------------------------------------------------
    def history_dir(self):
        return self.tree._dir(self._history_lookup, lambda: Names([b"INDEX", b"by-time"]),
                              mtime=self._newest, timeouts=STABLE)

    def _history_lookup(self, name: bytes):
        if name == b"INDEX":
            return self.tree._dir_cached(("history", "INDEX"),
                                         lambda: self.tree._file(self._index, mtime=self._newest))
        if name == b"by-time":
            return self.tree._dir_cached(("history", "by-time"), lambda: self.tree._dir(
                self._day_lookup, self._day_names, mtime=self._newest, timeouts=STABLE))
        text = name.decode("ascii", "replace")
        if not _HEX.match(text):
            return None
        try:
            cid = self.store.resolve(text)
        except StoreError:  # unknown or ambiguous: absent
            return None
        return self.ws.view(cid, "history/" + cid, immutable=True) if cid.startswith(text) \
            else None

    def _index(self) -> bytes:
        s = history.summary(self.store)
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
        return self._fresh(("day-names",), lambda: Names([d.encode() for d in
                                                           sorted(self._days())]))

    def _day_lookup(self, name: bytes):
        day = name.decode("ascii", "replace")
        days = self._days()
        if day not in days:
            return None
        return self.tree._dir_cached(("day", day), lambda: self.tree._dir(
            lambda n: self._commit_lookup(day, n), lambda: self._commit_names(day),
            mtime=lambda: self._days().get(day, 0), timeouts=STABLE))

    def _day_commits(self, day: str) -> dict[bytes, str]:
        def compute() -> dict[bytes, str]:
            d = date.fromisoformat(day)
            start = history.day_start(d)
            end = history.day_start(d + timedelta(days=1))
            return {_entry_name(cid, t): cid for cid, t in
                    history.commits_by_time(self.store, start, end)}

        return self._fresh(("day", day), compute)

    def _commit_names(self, day: str) -> Names:
        return self._fresh(("names", day), lambda: Names(list(self._day_commits(day))))

    def _commit_lookup(self, day: str, name: bytes):
        cid = self._day_commits(day).get(name)
        if cid is None:
            return None
        return self.ws.view(cid, f"history/by-time/{cid}", immutable=True)

    # -- .memfs/checkpoints/ -----------------------------------------------------------------
    def checkpoints_dir(self):
        return self.tree._dir(self._checkpoint_lookup, lambda: Names(
            sorted(cp.name.encode("utf-8", "surrogateescape")
                   for cp in history.checkpoints(self.store))), mtime=self._newest,
            timeouts=STABLE)

    def _checkpoint_lookup(self, name: bytes):
        cp = history.checkpoint(self.store, name.decode("utf-8", "surrogateescape"))
        if cp is None:
            return None
        try:
            return self.ws.view(cp.commit, "checkpoints/" + cp.name)
        except StoreError:  # its commit is no longer kept
            return None


def _entry_name(cid: str, time_ns: int) -> bytes:
    return f"{datetime.fromtimestamp(time_ns / 1e9).strftime('%H:%M:%S')}-{cid[:ID_CHARS]}".encode()


def _when(ns: int | None) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S") if ns else "-"
