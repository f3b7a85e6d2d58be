"""What the workspace, history, fsck and the CLI need from a store, and which store a root uses.

Two backends implement `StoreBackend`:
- the embedded store (memfs.store.store.Store: SQLite + packs in the root; the default), and
- PostgreSQL (memfs.store.pg.PgStore: metadata and chunks in a database many hosts share; the
  root keeps only this host's record, branch, bindings, journal and a chunk cache).

A root says which one it uses in `store.json` (written by `memfs init --store URL`, or at the
first open with $MEMFS_STORE set); a root without one is embedded, as every root made before
there were two backends is. `open_store` is the one way to open a root's store.

Both backends keep the same data model (memfs.store.trees): objects named by BLAKE2b, chunks
by xxh3-128 with a byte comparison before two writes share a name, commits whose id hashes
their body. Only where rows live and how a head moves differ.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from memfs.durable import fsync_dir, mkdir_durable
from memfs.errors import MemfsError

if TYPE_CHECKING:
    from memfs.store import retention
    from memfs.store.refs import CommitRefs
    from memfs.store.store import Commit
    from memfs.store.trees import Entry

STORE_ENV = "MEMFS_STORE"
LOCATION_FILE = "store.json"
SCHEMES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class DroppedCommit:
    """The tombstone of a commit the retention policy dropped (memfs.store.retention): how
    history is walked over the gap and why a revision naming it is refused."""

    id: str
    parent: str | None
    time_ns: int  # when the commit was made
    dropped_ns: int  # when GC dropped it
    reason: str


class StoreTx(Protocol):
    """One durable step of the writer: chunks, objects, a commit and its side records."""

    # replacing[i]: the committed chunk piece i replaces (the same piece of the same file), a
    # hint the store may keep piece i as a delta of (memfs.store.delta); None: a new piece
    def put_chunks(self, pieces: list[bytes],
                   replacing: list[str | None] | None = None) -> list[str]: ...
    def put_object(self, data: bytes) -> str: ...
    def add_commit(self, parent: str | None, tree: str, branch: str, message: str,
                   processes: list[dict], inodes: str | None = None) -> Commit: ...
    def put_intents(self, commit_id: str, intents: dict[str, bytes]) -> None: ...
    # records beside the commits (memfs.store.history owns their rules)
    def put_ops(self, commit_id: str, data: str) -> None: ...
    def ref_exists(self, table: str, name: str) -> bool: ...
    def add_mark(self, name: str, commit_id: str, branch: str, time_ns: int,
                 label: str) -> None: ...
    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None: ...
    def set_checkpoint(self, name: str, commit_id: str, branch: str, time_ns: int) -> None: ...
    def delete_checkpoint(self, name: str) -> None: ...
    def add_reflog(self, ref: str, old: str | None, new: str, reason: str,
                   time_ns: int) -> None: ...


class Records(Protocol):
    """Reads of the records beside the commits (history, marks, checkpoints, by-time views)."""

    def has_commit(self, cid: str) -> bool: ...
    def commit_chain(self, start: str, limit: int) -> list[Commit]: ...
    def dropped_commit(self, cid: str) -> DroppedCommit | None: ...
    def dropped_with_prefix(self, base: str) -> list[str]: ...
    def branch_head(self, name: str) -> str | None: ...
    def commits_with_prefix(self, prefix: str) -> list[str]: ...
    def commit_ops(self, ids: list[str]) -> dict[str, str]: ...
    def marks_of(self, ids: list[str]) -> list[tuple[str, str]]: ...
    def mark_commit(self, name: str, branch: str | None = None) -> str | None: ...
    def checkpoint_rows(self) -> list[tuple[str, str, str, int]]: ...
    def checkpoint_row(self, name: str) -> tuple[str, str, str, int] | None: ...
    def commit_ids(self) -> list[str]: ...
    def commits_by_time(self, start_ns: int, end_ns: int) -> list[tuple[str, int]]: ...
    def commit_times(self) -> tuple[int, int | None, int | None]: ...
    def newest_time_before(self, end_ns: int) -> int | None: ...
    def oldest_time_from(self, start_ns: int) -> int | None: ...
    def data_version(self) -> int: ...


class StoreBackend(Records, Protocol):
    """A store as its users see it. Reads may come from any thread; writes go through
    `transaction()` (the commit thread) or the short head-moving calls below."""

    root: Path  # the local root (this host's files: locks, sockets, journal, caches)
    db_path: Path  # the local SQLite file the backing journal lives in (memfs.store.journal)
    readonly: bool
    kind: str  # "sqlite" or "postgresql"
    # Reads may wait for a server: the FUSE handlers fetch what the caches miss in a worker
    # thread first (memfs.workspace.warm). The embedded store's reads are local.
    remote: bool

    def close(self) -> None: ...
    def cached(self, objects: list[str], chunks: list[str]) -> bool: ...
    def fill_cache(self, objects: list[str], chunks: list[str]) -> None: ...
    def transaction(self) -> AbstractContextManager[StoreTx]: ...
    # -- reading
    def current_branch(self) -> str: ...
    def head(self, branch: str | None = None) -> str: ...
    def commit(self, cid: str) -> Commit: ...
    def log(self, branch: str | None = None, limit: int = 20,
            start: str | None = None) -> list[Commit]: ...
    def branches(self) -> dict[str, str]: ...
    def reflog(self, limit: int = 50) -> list[dict]: ...
    def checkpoints(self) -> list[tuple[str, str, str, int]]: ...
    def resolve(self, rev: str) -> str: ...
    def read_object(self, oid: str) -> bytes: ...
    def read_chunk(self, chunk_id: str) -> bytes: ...
    def read_chunk_range(self, chunk_id: str, start: int, length: int) -> bytes: ...
    def file_chunks(self, ref: str) -> dict[int, str]: ...
    def inode_table(self, commit_id: str) -> str | None: ...
    def inodes(self, table: str | None) -> dict[str, Entry]: ...
    def commit_refs(self, commit: Commit) -> CommitRefs: ...
    def intents_at(self, commit_id: str, max_walk: int = 10_000) -> dict[str, bytes | None]: ...
    def bindings(self) -> dict[str, dict]: ...
    def fsck(self) -> list[str]: ...
    def stat_space(self) -> os.statvfs_result: ...
    # -- moving heads and names
    def set_current_branch(self, branch: str) -> None: ...
    def create_branch(self, name: str, at: str | None = None) -> str: ...
    def reset_head(self, branch: str, target: str, reason: str) -> None: ...
    def checkpoint(self, name: str, cid: str | None = None, *, force: bool = False) -> str: ...
    def set_binding(self, mount: str, doc: dict | None) -> None: ...
    # -- the retention policy (memfs.store.retention), kept with the store
    def policy(self) -> retention.Policy: ...
    def set_policy(self, policy: retention.Policy) -> None: ...
    # -- many hosts (memfs.store.pg.lease; the embedded store: SingleHost)
    def claim(self, branch: str) -> Claim: ...
    def release(self, branch: str) -> None: ...
    def takeover(self, branch: str) -> Claim: ...
    def lease_state(self, branch: str) -> Claim: ...
    def watch(self, on_head: Callable[[str, str], None],
              on_lost: Callable[[str], None]) -> None: ...


@dataclass(frozen=True)
class Claim:
    """Whether this host may write `branch`, and if not, who does and for how long."""

    branch: str
    writable: bool
    holder: str | None = None  # "hostname (host id)" of the writing host
    expires_in: float | None = None  # seconds until the holder's lease expires (<0: expired)
    token: int | None = None

    def to_json(self) -> dict:
        return {"branch": self.branch, "writable": self.writable, "holder": self.holder,
                "expires_in": None if self.expires_in is None else round(self.expires_in, 1)}

    def reason(self) -> str:
        if self.writable:
            return ""
        when = ("its lease expired; `memfs takeover " + self.branch + "` moves it here"
                if self.expires_in is not None and self.expires_in < 0 else
                f"its lease runs {self.expires_in:.0f} s more unless renewed"
                if self.expires_in is not None else "")
        return f"branch {self.branch} is written by host {self.holder}" + \
            (f" ({when})" if when else "")


class SingleHost:
    """The embedded store's answers about hosts: one host, the one holding daemon.lock,
    always writes, and no other host moves a head (mixed into Store)."""

    def claim(self, branch: str) -> Claim:
        return Claim(branch, True)

    def release(self, branch: str) -> None:
        pass

    def takeover(self, branch: str) -> Claim:
        raise MemfsError("this store is embedded in its root: one host writes it, so there is "
                         "no lease to take over",
                         "takeover is for a store shared in PostgreSQL (memfs init --store URL)")

    def lease_state(self, branch: str) -> Claim:
        return Claim(branch, True)

    def watch(self, on_head: Callable[[str, str], None],
              on_lost: Callable[[str], None]) -> None:
        pass


# -- which store a root uses ---------------------------------------------------------------
@dataclass(frozen=True)
class Location:
    """A root's record of its store: the backend and, for PostgreSQL, the URL and the
    identity this root has among the store's hosts."""

    backend: str  # "postgresql"
    url: str
    host: str  # random, made once per root: two roots on one machine are two hosts

    def to_json(self) -> dict:
        return {"backend": self.backend, "url": self.url, "host": self.host}


class StoreLocationError(MemfsError):
    pass


def read_location(root: Path) -> Location | None:
    """The root's record, or None for an embedded root (or one not made yet)."""
    path = root / LOCATION_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreLocationError(f"{path} cannot be read: {exc}",
                                 "restore it (it names the store this root uses), or move "
                                 "the root aside and `memfs init --store URL` again") from None
    try:
        return Location(doc["backend"], doc["url"], doc["host"])
    except (KeyError, TypeError):
        raise StoreLocationError(f"{path} lacks backend, url or host",
                                 "restore it, or move the root aside and `memfs init --store "
                                 "URL` again") from None


def check_url(url: str) -> str:
    if not url.startswith(SCHEMES):
        raise StoreLocationError(
            f"--store {redact(url)!r} is not a store memfs knows",
            "give a PostgreSQL URL (postgresql://USER@HOST[:PORT]/DATABASE), or leave --store "
            "out for the embedded store in the root")
    return url


def redact(url: str) -> str:
    """A URL as it may be printed: any password replaced by ***."""
    head, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{head}{sep}{creds.split(':', 1)[0]}:***@{host}"


def choose_location(root: Path, url: str | None) -> Location | None:
    """What a root will use: its record if it has one (a different `url` is refused), else
    `url` (or $MEMFS_STORE) for a root not made yet. An embedded root stays embedded."""
    url = url or os.environ.get(STORE_ENV) or None
    have = read_location(root)
    embedded = (root / "store.db").exists() and have is None
    if have is not None:
        if url and url != have.url:
            raise StoreLocationError(
                f"the root {root} uses the store at {redact(have.url)}, not {redact(url)}",
                f"leave --store (and ${STORE_ENV}) out to use the root's store, or give "
                "another --root for the other store")
        return have
    if url:
        check_url(url)
        if embedded:
            raise StoreLocationError(
                f"the root {root} holds an embedded store (store.db); it cannot be moved to "
                f"{redact(url)}",
                f"give a new --root for the PostgreSQL store, or unset ${STORE_ENV}")
        return Location("postgresql", url, os.urandom(8).hex())
    return None


def record_location(root: Path, loc: Location) -> None:
    """Write store.json (0600: the URL may hold a password), durably, once."""
    path = root / LOCATION_FILE
    if path.exists():
        return
    mkdir_durable(root)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (json.dumps(loc.to_json(), indent=1) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(root)


def open_store(root: Path, *, create: bool = True, url: str | None = None) -> StoreBackend:
    """The store this root uses, opened for writing (created if missing and `create`)."""
    from memfs.store.store import Store

    loc = choose_location(root, url) if create else read_location(root)
    if loc is None:
        return Store.open(root, create=create)
    from memfs.store.pg.store import PgStore

    store = PgStore.open(root, loc)
    if create:
        record_location(root, loc)
    return store


def open_store_readonly(root: Path) -> StoreBackend:
    """Reads only (log, diff, show): safe beside a running daemon."""
    from memfs.store.store import Store

    loc = read_location(root)
    if loc is None:
        return Store.open_readonly(root)
    from memfs.store.pg.store import PgStore

    return PgStore.open(root, loc, readonly=True)
