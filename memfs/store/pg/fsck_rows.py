"""The store as `memfs fsck` sees it on PostgreSQL: chunks from the database itself, never
this host's cache, so a row the database lost is found. Used by PgStore.fsck, in the
caller's thread (the CLI's, or the daemon's worker thread for a control request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfs.store.chunks import chunk_digest
from memfs.store.delta import assemble, split_over
from memfs.store.pg import chunkrows

if TYPE_CHECKING:
    from memfs.store.pg.store import PgStore


class DatabaseChunks:
    """The store as fsck sees it: chunks from the database itself, never the cache.

    A patch is rebuilt from its row and the rows it is read through, each fetched once per
    fsck and kept (up to ROWS_KEPT bytes, oldest out first): the patches over one base share
    it, which one statement per chunk fetched again each time (64 patches over a 512 KiB log
    pulled 32.6 MiB)."""

    ROWS_KEPT = 64 << 20

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self._rows: dict[str, tuple[str | None, bytes]] = {}  # id -> (over, stored bytes)
        self._kept = 0

    def read_chunk(self, chunk_id: str) -> bytes:
        got = self._fetch([chunk_id]).get(chunk_id)
        if got is None:
            raise KeyError(f"chunk {chunk_id} is missing from the store")
        over, own = got
        deps = split_over(over)
        stored = {dep: row[1] for dep, row in self._fetch(list(deps)).items()}
        data = assemble(chunk_id, own, deps, stored)
        if chunk_digest(data) != chunk_id.split(".")[0]:
            raise OSError(f"chunk {chunk_id} in the database does not match its digest")
        return data

    def _fetch(self, ids: list[str]) -> dict[str, tuple[str | None, bytes]]:
        """The stored rows of `ids` that exist: kept ones, the rest in one statement."""
        missing = [i for i in ids if i not in self._rows]
        if missing:
            whole = self._store._chunk_sql is chunkrows.WHOLE_SQL  # a store before patches
            sql = ("SELECT id, NULL, data FROM chunks WHERE id = ANY(%s)" if whole else
                   "SELECT id, over, data FROM chunks WHERE id = ANY(%s)")
            for cid, over, data in self._store._query(sql, (missing,)):
                self._keep(cid, over, bytes(data))
        return {i: self._rows[i] for i in ids if i in self._rows}

    def _keep(self, cid: str, over: str | None, data: bytes) -> None:
        while self._rows and self._kept + len(data) > self.ROWS_KEPT:
            old = next(iter(self._rows))
            self._kept -= len(self._rows.pop(old)[1])
        self._rows[cid] = (over, data)
        self._kept += len(data)

    def __getattr__(self, name: str):
        return getattr(self._store, name)
