"""The bridge between the live tree and backing directories: bindings, passes, states.

A store mount (a top-level directory of the tree) may be bound to a real directory. A pass
observes it (memfs.reconcile.observe, in a worker thread), then decides every path with the
three-way rule on the trio loop from one consistent view — the live tree's content digests S,
the journal's evidence P, this branch's intent and the pending write-ahead intents — and applies
what the decisions take: text ingested (a changed file gets a new inode, so no kernel cache
can show the old bytes), removals, and disk-only nodes for binary or oversize files, which are
shown read-only with their real size and read straight from disk through a contained fd.

Why the shape: the rule and the plans are pure (memfs.reconcile.plan); this module gathers their
inputs on one branch, and if the branch or the tree is replaced while it gathers, gathers again.
Disk bytes taken into the tree are read in a thread and checked against the digest the decision
was made on; the tree nodes a decision was made on are checked unchanged just before applying,
with no await in between. Evidence is recorded only after the tree change it agrees with is
durable (ws.sync()), so a crash can never leave P vouching for a tree that was lost.

Branch intent (tombstones, store origin, conflicts) lives here per mount and is kept with each
commit (Store.put_intents), so undo and branch switch rewind it; P lives in the journal and never
rewinds. The recorded disk side of a conflict is kept, by its digest, under <root>/conflicts/.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import trio
import xxhash

from memfs.errors import MemfsError
from memfs.reconcile import intent as intent_mod
from memfs.reconcile.afterbatch import ScanCoordinator
from memfs.reconcile.contained import (
    CTIME_TRUSTED,
    Refused,
    RootId,
    RootUnavailable,
    components,
    crash_point,
    fs_magic,
    open_contained_file,
)
from memfs.reconcile.intent import IntentTable
from memfs.reconcile.observe import (
    DEFAULT_MAX_FILE_SIZE,
    RACY_NS,
    Fingerprint,
    Observation,
    WalkMemo,
    observe,
)
from memfs.reconcile.plan import (
    PassPlan,
    SyncPlan,
    count_owed,
    pending_from_journal,
    plan_pass,
    plan_sync,
)
from memfs.reconcile.rule import ABSENT, MODE_BITS, Conflict, Content, PathIntent, State
from memfs.store.chunks import CHUNK_SIZE
from memfs.store.journal import Intent, Journal
from memfs.store.trees import DIR, FILE, LINK, name_to_bytes, name_to_str
from memfs.workspace.attribution import labelled
from memfs.workspace.backing_paths import parse_store_path
from memfs.workspace.backing_tasks import (
    AGENT_WATCH,
    DEFAULT_SCAN_DEADLINE,
    ROOT_POLL,
    SCAN_DELAY_ENV,  # noqa: F401 - the tests' shim, named where the rest of backing is
    WATCH_REMEDY,
    DaemonTasks,
)
from memfs.workspace.backing_tree import TreeEdit
from memfs.workspace.health import store_full
from memfs.workspace.nodes import Node, WorkspaceError

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace

log = logging.getLogger("memfs.backing")

WATCH_MODES = ("on-access", "fs-events", "on-agent-action", "off")
ACCESS_INTERVAL = 1.0  # an on-access pass observes a scope at most once a second
# Modes observed on access. on-agent-action is observed by `memfs after-batch` (the scan
# coordinator); fs-events relies on its events; off only on sync.
ACCESS_WATCH = ("on-access",)
EVENTS_KEPT = 1000  # the in-memory event ring `memfs events` reads
EVENT_PATHS = 100  # paths an event lists (its counts say how many there were)
PUSH_DELAY_ENV = "MEMFS_TEST_PUSH_DELAY"  # test shim: seconds a push sleeps before each effect
PIN_REMEDY = ("switch back to {pinned!r} and materialize there, or `memfs materialize --force` "
              "to write {branch!r} over it (the mount is then pinned to {branch!r})")
_KIND_NAMES = {"p": "FIFO", "s": "socket", "c": "character device", "b": "block device"}
GATHER_TRIES = 3
BATCH_BYTES = 32 << 20  # a pass takes disk into the tree in batches of at most this much
BATCH_FILES = 4096
SEEN_PATHS_PER_PASS = 64  # a scoped pass this small records its files for on-access
SEEN_PATHS_KEPT = 8192
PLANS_KEPT = 32  # scopes per mount whose last plans are kept (Backing._plan)
EMPTY_DIGEST = xxhash.xxh3_128_hexdigest(b"")
ACCEPT_ROOT_REMEDY = ("bring the original directory back (an unplugged drive?), or take this "
                      "one on purpose with `memfs sync --accept-root`")


@dataclass(frozen=True)
class Binding:
    """A store mount bound to a backing directory (persisted in the store, not per branch)."""

    mount: str
    dir: str
    watch: str = "on-access"
    follow_symlinks: bool = False
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    ignore: tuple[str, ...] = ()
    scan_deadline: float = DEFAULT_SCAN_DEADLINE  # on-agent-action: how long a batch waits
    auto_materialize: bool = False  # a bare materialize after each group commit

    def to_json(self) -> dict:
        return {**asdict(self), "ignore": list(self.ignore)}

    @classmethod
    def from_json(cls, doc: dict) -> Binding:
        return cls(str(doc["mount"]), str(doc["dir"]), str(doc.get("watch", "on-access")),
                   bool(doc.get("follow_symlinks", False)),
                   int(doc.get("max_file_size", DEFAULT_MAX_FILE_SIZE)),
                   tuple(doc.get("ignore") or ()),
                   float(doc.get("scan_deadline", DEFAULT_SCAN_DEADLINE)),
                   bool(doc.get("auto_materialize", False)))


@dataclass
class MountState:
    """What the last passes found for one mount: the listing states, regions, availability."""

    states: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    disk_only: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (size, MIME)
    regions: dict[str, str] = field(default_factory=dict)
    unavailable: tuple[str, str] | None = None  # (what happened, remedy)
    last_pass: float | None = None
    last_error: str | None = None
    incomplete: str | None = None
    observed: dict[str, float] = field(default_factory=dict)  # scope -> monotonic time
    watch_error: str | None = None  # fs-events: why no watcher runs now
    applied: tuple | None = None  # (scope, plan, sync plan, nothing skipped) of the states


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + "/")


@dataclass
class _PlanInputs:
    """Everything plan_pass and plan_sync read, kept to tell whether a pass may reuse the
    last pass's plans (Backing._plan)."""

    scope: str
    path_sync: bool
    branch: str
    branch_now: str
    obs: Observation
    view: dict[str, Content]
    evidence: dict
    table: IntentTable
    pending: dict
    modes: Mapping[str, int]

    def same(self, other: _PlanInputs) -> bool:
        return (self.scope == other.scope and self.path_sync == other.path_sync
                and self.branch == other.branch and self.branch_now == other.branch_now
                and (self.table is other.table or self.table == other.table)
                and self.pending == other.pending and self.obs.same_disk(other.obs)
                and (self.view is other.view or self.view == other.view)
                and (self.evidence is other.evidence or self.evidence == other.evidence)
                and (self.modes is other.modes or self.modes == other.modes))


def _given(args: dict, key: str, kind: type, default: object):
    """args[key] as `kind`, the default only when it is absent: 0 is a value (`--scan-deadline
    0` used to become 20 s, `--max-file-size 0` 64 MiB, silently); attach checks the range."""
    value = args.get(key)
    return default if value is None else kind(value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def split_path(path: str) -> tuple[str, str]:
    """'mount/a/b' -> ('mount', 'a/b'), by the one spelling every command takes
    (backing_paths.parse_store_path: aliases such as '//', '.', '..' are refused)."""
    p = parse_store_path(path)
    return p.mount, p.rel


def ref_chunks(store, ref: str, size: int) -> Iterator[bytes]:
    """A committed file's content, chunk by chunk (holes and short chunks as zeros)."""
    chunks = store.file_chunks(ref)
    pos = 0
    for idx in range((size + CHUNK_SIZE - 1) // CHUNK_SIZE):
        n = min(CHUNK_SIZE, size - pos)
        piece = store.read_chunk(chunks[idx])[:n] if idx in chunks else b""
        yield piece + bytes(n - len(piece)) if len(piece) < n else piece
        pos += n


def ref_digest(store, ref: str, size: int) -> str:
    """xxh3-128 of a committed file's whole content, streamed chunk by chunk."""
    h = xxhash.xxh3_128()
    for piece in ref_chunks(store, ref, size):
        h.update(piece)
    return h.hexdigest()


def read_contained(root_dir: str, expected: RootId | None, rel: str,
                   digest: str | None) -> bytes | None:
    """A backing file's bytes through dir fds from the held root; None if it is not the file
    the decision saw (digest differs), is gone, or is not a regular file."""
    try:
        fd, _ = open_contained_file(root_dir, rel, root=expected)
    except (RootUnavailable, Refused, OSError):
        return None
    try:
        out = bytearray()
        while piece := os.pread(fd, 1 << 20, len(out)):
            out += piece
    finally:
        os.close(fd)
    data = bytes(out)
    if digest is not None and xxhash.xxh3_128_hexdigest(data) != digest:
        return None
    return data


def _batches(take: dict, obs: Observation) -> list[list[str]]:
    """The paths a pass takes, cut so that one batch reads at most BATCH_BYTES of disk;
    removals first, so a file disk made where a directory was (or the reverse) goes in once
    what stood in its way is gone (backing_tree)."""
    out: list[list[str]] = [[]]
    size = 0
    for path in sorted(take, key=lambda p: (isinstance(take[p], Content), p)):
        fact = obs.files.get(path)
        n = fact.size if fact is not None and isinstance(take[path], Content) else 0
        if out[-1] and (size + n > BATCH_BYTES or len(out[-1]) >= BATCH_FILES):
            out.append([])
            size = 0
        out[-1].append(path)
        size += n
    return out if out[-1] else []


class Backing(DaemonTasks):
    """Every backing binding of one workspace; installs itself as `ws.backing`."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.store = ws.store
        self.journal = Journal(ws.store.db_path)
        self.bindings = {m: Binding.from_json(d) for m, d in self.store.bindings().items()}
        self.mounts: dict[str, MountState] = {}
        self.intents: dict[str, IntentTable] = {}
        self.overlay: dict[tuple[str, str], Node] = {}  # live disk-only nodes
        self.epoch = 0  # bumped when the tree is replaced (undo, restore, branch switch)
        self._digests: dict[tuple[str, int], str] = {}
        self._draft_digests: dict[int, tuple[int, str]] = {}  # node id -> (ver, digest)
        self._store_memo: list | None = None  # [key, nodes, refs, view]: see _store_nodes
        self._facts: dict[str, dict] = {}  # mount -> the last full pass's files (see _gather)
        self._walk_memos: dict[str, WalkMemo] = {}  # mount -> its walk's directory memos
        # mount -> scope -> the last pass's plan inputs and plans (see _plan)
        self._plans: dict[str, dict[str, tuple[_PlanInputs, PassPlan, SyncPlan]]] = {}
        self._evidence_memo: dict[tuple[str, str], tuple[Mapping, dict]] = {}  # _evidence
        self._evidence_lock = threading.Lock()
        # When and how those were seen, and single files seen since: on-access's fast path.
        self._facts_seen: dict[str, tuple[int, bool, int]] = {}  # (at ns, trusted fs, dev)
        self._seen_paths: dict[tuple[str, str], tuple[Fingerprint, int, bool, int]] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._swept: set[str] = set()  # mounts whose scratch files this process removed
        # Undo/restore: the files the rewind changed, per mount, until a pass decides each
        # (in memory only: the pass right after the rewind decides them); see tree_replaced.
        self._restored: dict[str, set[str]] = {}
        self._refs_before: dict[str, dict[str, str | None]] | None = None
        self._tree_branch = ws.branch  # the branch the tree showed last (switch vs rewind)
        self.conflict_dir = Path(self.store.root) / "conflicts"
        # After-batch scans: one coordinator per daemon (made by run_watchers, which owns its
        # background scans); None on a daemon-less workspace, where a batch runs one scan.
        self.coordinator: ScanCoordinator | None = None
        self.scans_run = 0
        self._last_direct_scan: dict | None = None
        self._after_change: Callable[[], Awaitable[None]] | None = None
        self.events: collections.deque[dict] = collections.deque(maxlen=EVENTS_KEPT)
        self._event_seq = 0
        self.stopped = False  # set by stop(): no more backing work is taken
        self._active = 0
        self._idle = trio.Event()
        self._watch_scope = trio.CancelScope()
        self._watchers_done = trio.Event()
        self._auto_seen: dict[str, tuple[int, int]] = {}
        self.auto_last: dict[str, dict] = {}  # mount -> the last auto-materialize's outcome
        self.auto_running: set[str] = set()
        self._auto_held: set[int] = set()  # nodes an auto round left for their writer's close
        self._auto_wake = trio.Event()
        self._auto_retry: set[str] = set()  # mounts whose last round found no root to write to
        self.pins = {m: p for m in self.bindings if (p := self.journal.pin(m)) is not None}
        self._load_intents()
        # Adoptions a crash left pending on this branch: settled before any change to them.
        self.pending_adopts: dict[tuple[str, str], Intent] = {}
        self.settles = 0  # adoptions settled by a change: a pass gathering meanwhile re-reads
        # Nodes with a writable descriptor open through the mount (the FUSE layer counts them):
        # a pass never replaces or removes one, or the writes to come would land on a node
        # no longer in the tree. Taken by a pass after the last one closes.
        self.held_writers: collections.Counter[int] = collections.Counter()
        self._load_pending_adopts()
        ws.backing = self

    def close(self) -> None:
        self.journal.close()

    # -- events ------------------------------------------------------------------------
    def record_event(self, kind: str, /, **fields: object) -> None:
        """Keep an event in the bounded ring (`memfs events`); the oldest fall off first."""
        self._event_seq += 1
        self.events.append({"seq": self._event_seq, "time": time.time(), "event": kind,
                            **fields})

    def events_after(self, after: int = 0) -> dict:
        """Events with a sequence number above `after`; `last` is the newest number so far
        (a follower passes it back; a gap at the front means the ring dropped some)."""
        return {"events": [e for e in self.events if e["seq"] > after],
                "last": self._event_seq}

    # -- branch intent -----------------------------------------------------------------
    def _load_intents(self) -> None:
        kept = self.store.intents_at(self.ws.head) if self.bindings else {}
        self.intents = {}
        for mount in self.bindings:
            if mount not in kept:
                self.intents[mount] = IntentTable()  # no intent was kept: nothing to say
            else:
                self.intents[mount] = intent_mod.decode(kept[mount])

    def intent_bytes(self) -> dict[str, bytes] | None:
        """What the next commit keeps (Workspace._snapshot calls this on the loop)."""
        if not self.bindings:
            return None
        return {m: intent_mod.encode(self.intents.get(m, IntentTable())) for m in self.bindings}

    def _set_intent(self, mount: str, path: str, pi: PathIntent | None) -> None:
        table = self.intents.setdefault(mount, IntentTable())
        new = table.with_entry(path, pi)
        if new != table:
            self.intents[mount] = new
            self.ws._touch(self.ws.root)  # the next group commit keeps the new intent

    def tree_replaced(self) -> None:
        """Undo/restore/switch: intent rewinds with the tree; disk-only nodes went with it.
        After an undo or restore (the branch is the one `before_tree_replace` saw), every
        file the rewind changed is marked restored until a pass decides it (see `_restored`)."""
        before, self._refs_before = self._refs_before, None
        was, self._tree_branch = self._tree_branch, self.ws.branch
        self.epoch += 1
        self._load_intents()
        self._load_pending_adopts()
        self.overlay = {k: n for k, n in self.overlay.items() if n.parent is not None}
        for st in self.mounts.values():
            st.observed.clear()
        if before is None or was != self.ws.branch:
            self._restored.clear()  # another branch: its own rule, not a rewind of this one
            return
        for mount, old in before.items():
            now = self._file_refs(mount)
            marks = self._restored.setdefault(mount, set())
            marks.update(p for p, ref in now.items() if ref is None or old.get(p) != ref)

    def before_tree_replace(self) -> None:
        """Workspace._replace_tree calls this first (on the loop, the tree committed): the
        refs of every backed file, to tell afterwards which files an undo or restore changed."""
        self._refs_before = {m: self._file_refs(m) for m in self.bindings}

    def _file_refs(self, mount: str) -> dict[str, str | None]:
        """path -> committed ref of each file of the mount (None: a draft, changed for sure)."""
        nodes, _ = self._store_nodes(mount)
        return {p: (None if n.dirty else n.ref) for p, n in nodes.items()}

    async def before_rewind(self) -> None:
        """Workspace.restore calls this before it rewinds: disk's changes so far are taken in
        (or recorded as conflicts) against the tree they happened to, so what the restore
        brings back is decided against them and not by when a pass happened to run (`rm -rf`
        on disk, then a restore: the restored files come back as drafts owed to disk, instead
        of being taken as deleted by the next pass). Not for undo: its steps count from the
        head the user saw, and a commit of this pass would become the step undone. `off`
        mounts are left alone (observed only on sync)."""
        for mount, b in list(self.bindings.items()):
            if b.watch == "off" or self.stopped:
                continue
            try:
                await self.run_pass(mount)
            except MemfsError as exc:
                log.warning("pass before the rewind of %s failed: %s", mount, exc)

    def _pass_table(self, mount: str, scope: str) -> IntentTable:
        """The branch intent a pass decides with: the mount's, plus the files an undo or
        restore changed and no pass has decided since, marked restored (a damaged table is
        left as it is: every path there is unverified anyway)."""
        table = self.intents.get(mount, IntentTable())
        marks = self._restored.get(mount)
        if not marks or table.damaged:
            return table
        for p in sorted(p for p in marks if _under(p, scope)):
            table = table.with_entry(p, replace(table.get(p), restored=True))
        return table

    # -- settling before a change (seed 002) ----------------------------------------------
    def _load_pending_adopts(self) -> None:
        out: dict[tuple[str, str], Intent] = {}
        try:
            for mount in self.bindings:
                for i in self.journal.pending_intents(mount):
                    if i.op == "adopt" and i.branch == self.ws.branch:
                        out[(mount, i.path)] = i
        except MemfsError as exc:  # a poisoned journal: every pass refuses until reopened
            log.warning("pending adoptions not read: %s", exc)
        self.pending_adopts = out

    def settle_before_change(self, d: Node, name: bytes) -> None:
        """Workspace calls this before it changes d/name (or anything under it): a pending
        adoption there is settled first — done if the tree shows its new value, not done if
        the old — so a later write can never pass for an old adoption's outcome. A tree
        showing neither is left for the next pass to call interrupted."""
        mount, rel = self._backed(d.path() + b"/" + name)
        if mount is None:
            return
        for key in [k for k in self.pending_adopts if k[0] == mount and _under(k[1], rel)]:
            intent = self.pending_adopts.pop(key)
            if not any(p.id == intent.id for p in self.journal.pending_intents(*key)):
                continue  # a pass settled it already
            node = self._node_at(*key)
            now = None if node is None else self._digest_now(node)
            if now in (intent.new, intent.old):
                self._settle_adoption(intent, done=now == intent.new)

    def _settle_adoption(self, intent: Intent, *, done: bool) -> None:
        """Settle on the loop; a pass's thread may settle the same intent first (the same way,
        from the same tree), which is no failure of the change that asked."""
        try:
            if done:
                self.journal.complete_intent(intent.id)
            else:
                self.journal.abandon_intent(intent.id)
        except MemfsError:
            if any(p.id == intent.id for p in self.journal.pending_intents(intent.mount,
                                                                           intent.path)):
                raise
            return
        self.settles += 1

    def release_writer(self, node: Node) -> None:
        """The FUSE layer closed a writable descriptor on node (counted at open and create)."""
        left = self.held_writers[node.id] - 1
        if left > 0:
            self.held_writers[node.id] = left
            return
        del self.held_writers[node.id]
        if node.id in self._auto_held:  # an auto round left it for this close
            self._auto_held.discard(node.id)
            mount, _ = self._backed(node.path())
            if mount is not None:
                self._auto_seen.pop(mount, None)
            self._auto_wake.set()

    def note_removed(self, node: Node, path: bytes) -> None:
        """A file (or the files of a directory) removed through the mount: tombstones."""
        for rel_path in self._files_of(node, path):
            mount, rel = self._backed(rel_path)
            if mount is not None and rel:
                old = self.intents.get(mount, IntentTable()).get(rel)
                if not old.damaged:
                    self._set_intent(mount, rel, PathIntent(True, False, old.conflict))

    def note_created(self, node: Node, path: bytes) -> None:
        """A file (or the files of a directory) created through the mount: store origin."""
        for rel_path in self._files_of(node, path):
            mount, rel = self._backed(rel_path)
            if mount is not None and rel:
                old = self.intents.get(mount, IntentTable()).get(rel)
                if not old.damaged:
                    self._set_intent(mount, rel, PathIntent(False, True, old.conflict))

    def _files_of(self, node: Node, path: bytes) -> Iterator[bytes]:
        if node.kind == FILE:
            yield path
        elif node.kind == DIR:
            for name, child in self.ws.children(node).items():
                yield from self._files_of(child, path + b"/" + name)

    def _backed(self, path: bytes) -> tuple[str | None, str]:
        text = name_to_str(path).strip("/")
        mount, _, rel = text.partition("/")
        return (mount, rel) if mount in self.bindings else (None, "")

    # -- states ------------------------------------------------------------------------
    def state_of(self, node: Node) -> tuple[str, str | None] | None:
        """(state, conflict kind) of a node in a backed mount, or None (not backed/unknown)."""
        mount, rel = self._backed(node.path())
        if mount is None or not rel:
            return None
        return self._state_at(mount, rel)

    async def state_now(self, node: Node) -> tuple[tuple[str, str | None] | None, bool]:
        """(state, whether a pass ran) of a node as a listing of its one path would show it
        now: a file's path is observed first, in every watch mode, as `memfs ls --states PATH`
        does (the xattrs are a listing's question). Without this the xattrs gave the last
        listing's answer: `synced` for a draft made since, `workspace-draft` for a draft disk
        has since changed too. A directory gives the last listing's answer (observing it would
        walk its subtree)."""
        if node.kind != FILE or not self._live(node) or self.stopped:
            return self.state_of(node), False
        mount, rel = self._backed(node.path())
        if mount is None or not rel:
            return None, False
        try:
            await self.run_pass(mount, rel)
        except Exception as exc:  # noqa: BLE001 - the answer says unverified instead
            log.warning("state pass of %s/%s failed: %s", mount, rel, exc)
            self._state(mount).last_error = str(exc)
            return ("unverified", None), False
        return self._state_at(mount, rel), True

    def _state_at(self, mount: str, rel: str) -> tuple[str, str | None] | None:
        st = self.mounts.get(mount)
        if st is None:
            return None
        if st.unavailable is not None or self.journal.needs_reopen:
            return ("unverified", None)  # nothing is verified while the evidence is unreadable
        return st.states.get(rel)

    def owed(self, mount: str) -> dict[str, int]:
        """What disk owes this mount by the evidence (plan.count_owed): no disk is read, so
        status stays cheap and answers while a root is unavailable; a draft whose write failed
        or was refused is still a draft, so it still counts."""
        nodes, _ = self._store_nodes(mount)
        view = self._store_view(nodes)
        got = self.journal.pass_inputs(mount)  # remembered while the journal is unchanged
        evidence = self._evidence(mount, "", got.evidence)
        pending = pending_from_journal(got.pending, self.ws.branch)
        c = count_owed(view, evidence, self.intents.get(mount, IntentTable()), pending,
                       got.modes)
        return {"changes": c.pending_changes, "workspace_deletions": c.pending_workspace_deletions,
                "conflicts": c.conflicts}

    def status(self) -> dict:
        """Per mount; `journal` is None, or the refusal every evidence read answers after a
        failed journal write, with its remedy (`memfs sync --reopen`)."""
        refusal = self.journal.refusal()
        journal = None if refusal is None else {"error": refusal.message,
                                                "remedy": refusal.remedy}
        out = {}
        for mount, b in sorted(self.bindings.items()):
            st = self.mounts.get(mount, MountState())
            counts: dict[str, int] = {}
            for state, _ in st.states.values():
                counts[state] = counts.get(state, 0) + 1
            out[mount] = {
                "dir": b.dir, "watch": b.watch, "pinned": self.pins.get(mount),
                "journal": journal,
                "available": st.unavailable is None,
                "unavailable": None if st.unavailable is None else
                {"error": st.unavailable[0], "remedy": st.unavailable[1]},
                "last_pass": st.last_pass, "last_error": st.last_error,
                "watch_error": None if st.watch_error is None else
                {"error": st.watch_error, "remedy": WATCH_REMEDY},
                "incomplete": st.incomplete,
                "states": counts,
                "conflicts": sorted(p for p, (s, _) in st.states.items() if s == "conflict"),
                "workspace_deleted": sorted(p for p, (s, _) in st.states.items()
                                            if s == "workspace-deleted"),
                "regions": [{"path": p, "reason": r} for p, r in sorted(st.regions.items())],
                "owed": None if journal else self.owed(mount),  # owed reads the evidence
                "scans": self._scan_status(b),
                "auto_materialize": {"last": self.auto_last.get(mount),
                                     "running": mount in self.auto_running}
                if b.auto_materialize else None,
            }
        return out

    def _scan_status(self, b: Binding) -> dict | None:
        if b.watch != AGENT_WATCH:
            return None
        coord = self.coordinator
        return {"count": self.scans_run, "deadline": b.scan_deadline,
                "running_late": bool(coord and coord.running_late),
                "last_scan": coord.status["last_scan"] if coord else self._last_direct_scan,
                "last_miss": coord.status["last_miss"] if coord else None}

    def listing(self, mount: str, scope: str = "") -> dict:
        """`memfs ls --states`: every path under scope with its state, and the regions."""
        st = self.mounts.get(mount, MountState())
        return {
            "mount": mount, "path": scope,
            "available": st.unavailable is None,
            "unavailable": None if st.unavailable is None else
            {"error": st.unavailable[0], "remedy": st.unavailable[1]},
            "entries": [self._entry(st, p, s, c)
                        for p, (s, c) in sorted(st.states.items()) if _under(p, scope)],
            "regions": [{"path": p, "reason": r} for p, r in sorted(st.regions.items())
                        if _under(p, scope) or _under(scope, p)],
        }

    @staticmethod
    def _entry(st: MountState, path: str, state: str, conflict: str | None) -> dict:
        """One listing entry; a disk-only file carries its size and MIME type (seed 002)."""
        entry: dict = {"path": path, "state": state, "conflict": conflict}
        info = st.disk_only.get(path) if state == "disk-only" else None
        if info is not None:
            entry["size"], entry["mime"] = info
        return entry

    def conflict_files(self) -> dict[str, Path | None]:
        """'mount/path' -> the file holding the conflict's recorded disk side (None: absent)."""
        out: dict[str, Path | None] = {}
        for mount, table in self.intents.items():
            for path in table:
                c = table.get(path).conflict
                if c is None:
                    continue
                digest = c.disk
                blob = self.conflict_dir / digest if digest else None
                out[f"{mount}/{path}"] = blob if blob is not None and blob.exists() else None
        return out

    # -- binding -----------------------------------------------------------------------
    @labelled("attach", lambda b: f"attach: {b.mount} -> {b.dir}")
    async def attach(self, binding: Binding) -> dict:
        mount = binding.mount
        if not mount or "/" in mount or mount.startswith("."):
            raise MemfsError(f"invalid mount name {mount!r}", "name a top-level directory")
        if not _utf8(mount):
            # Names below a mount may be any bytes; the mount's own name keys the journal,
            # the bindings and every MOUNT/PATH a command takes, so it is kept to text.
            raise MemfsError(f"mount name {mount.encode('utf-8', 'surrogateescape')!r} is not "
                             "UTF-8", "name the mount in UTF-8 (the directory it binds, and "
                             "every name below, may be any bytes)")
        # Every look at the directory runs in a thread: a path into our own mount would
        # otherwise block the loop that has to answer it.
        await trio.to_thread.run_sync(self._check_dir, binding.dir)
        old = self.bindings.get(mount)
        if old is not None and os.path.realpath(old.dir) != os.path.realpath(binding.dir):
            raise MemfsError(f"mount {mount!r} is already bound to {old.dir}",
                             f"`memfs detach {mount}` first")
        if binding.watch not in WATCH_MODES:
            raise MemfsError(f"unknown watch mode {binding.watch!r}",
                             f"use one of {', '.join(WATCH_MODES)}")
        if binding.max_file_size < 0:
            raise MemfsError(f"max file size {binding.max_file_size} is negative",
                             "give --max-file-size a number of bytes, 0 or more (0: every "
                             "non-empty file is disk-only)")
        if not binding.scan_deadline > 0:
            raise MemfsError(f"scan deadline {binding.scan_deadline:g} s is not positive",
                             "give --scan-deadline a number of seconds above 0")
        st = await trio.to_thread.run_sync(os.stat, binding.dir)
        recorded = await trio.to_thread.run_sync(self.journal.root, mount)
        if old is None and recorded is not None and tuple(recorded) != (st.st_dev, st.st_ino):
            # Attaching names the directory on purpose: evidence of another one is set aside.
            await trio.to_thread.run_sync(self.journal.accept_root, mount, st.st_dev, st.st_ino)
            self._root_accepted(mount)
        await self.ws.boundary()  # what attach changes is an operation of its own
        kids = self.ws.children(self.ws.root)
        if name_to_bytes(mount) not in kids:
            self.ws.create(self.ws.root, name_to_bytes(mount), DIR, 0o755, os.getuid(),
                           os.getgid())
            self.ws.invalidate([(self.ws.root.id, name_to_bytes(mount))], [self.ws.root.id])
        elif kids[name_to_bytes(mount)].kind != DIR:
            raise MemfsError(f"{mount!r} is not a directory", "pick another mount name")
        self.store.set_binding(mount, binding.to_json())
        self.bindings[mount] = binding
        self.intents.setdefault(mount, IntentTable())
        self.ws._touch(self.ws.root)
        result = await self.run_pass(mount)
        return {"mount": mount, "dir": binding.dir, "watch": binding.watch, "pass": result}

    def _check_dir(self, path: str) -> None:
        """An existing directory, by absolute path, outside the store root and the mount."""
        if not os.path.isabs(path) or not os.path.isdir(path):
            raise MemfsError(f"backing directory {path!r} is not an existing directory",
                             "create it, or name an existing directory by absolute path")
        real, own = os.path.realpath(path), os.path.realpath(self.store.root)
        if real == own or real.startswith(own + "/") or own.startswith(real.rstrip("/") + "/"):
            raise MemfsError(f"{path} overlaps the store root ({own})",
                             "bind a directory outside the store root")
        try:
            holder = json.loads((Path(own) / "daemon.lock").read_text() or "{}")
            mnt = holder.get("mountpoint")
            # A killed daemon's record stays (for `memfs status`); its mountpoint is a plain
            # directory again once the dead mount is cleaned, and proves nothing then.
            if mnt and os.path.ismount(mnt) and os.stat(path).st_dev == os.stat(mnt).st_dev:
                raise MemfsError(f"{path} is inside the memfs mount at {mnt}",
                                 "bind a real directory outside the mount")
        except (OSError, ValueError):
            pass

    async def detach(self, mount: str) -> dict:
        if mount not in self.bindings:
            raise MemfsError(f"mount {mount!r} is not bound", "see `memfs status`")
        async with self._lock(mount):
            edit = TreeEdit(self.ws, self.overlay, mount, self._mount_node(mount))
            for m, rel in list(self.overlay):
                if m == mount:
                    edit.drop_overlay(rel)
            self.store.set_binding(mount, None)
            await trio.to_thread.run_sync(self.journal.clear_pin, mount)
            self.pins.pop(mount, None)
            del self.bindings[mount]
            self.mounts.pop(mount, None)
            self.intents.pop(mount, None)
            for memo in (self._facts, self._facts_seen, self._walk_memos, self._plans):
                memo.pop(mount, None)
            self._swept.discard(mount)
            self.ws.invalidate(edit.entries, edit.inodes)
        return {"mount": mount, "detached": True}

    # -- the control plane ---------------------------------------------------------------
    async def control(self, op: str, args: dict) -> object:
        """The daemon's `backing_*` requests (also run on a daemon-less workspace)."""
        with self._admitted():
            return await self._control(op, args)

    async def _control(self, op: str, args: dict) -> object:
        if op == "backing_attach":
            return await self.attach(Binding(
                args["mount"], args["dir"], args.get("watch") or "on-access",
                bool(args.get("follow_symlinks")),
                _given(args, "max_file_size", int, DEFAULT_MAX_FILE_SIZE),
                tuple(args.get("ignore") or ()),
                _given(args, "scan_deadline", float, DEFAULT_SCAN_DEADLINE),
                bool(args.get("auto_materialize"))))
        if op == "backing_after_batch":
            return await self.after_batch(args.get("agent"))
        if op == "backing_events":
            return self.events_after(int(args.get("after") or 0))
        if op == "backing_detach":
            return await self.detach(args["mount"])
        if op == "backing_sync":
            return await self.sync(args.get("path"), accept_root=bool(args.get("accept_root")),
                                   reopen=bool(args.get("reopen")))
        if op == "backing_materialize":
            return await self.materialize(args.get("paths") or None,
                                          force=bool(args.get("force")),
                                          apply_deletions=bool(args.get("apply_deletions")))
        if op == "backing_states":
            return await self.states(args.get("path"))
        raise MemfsError(f"unknown control request {op!r}", "upgrade the CLI and daemon together")

    async def sync(self, path: str | None, *, accept_root: bool = False,
                   reopen: bool = False) -> dict:
        """`memfs sync [PATH]`: without a path every bound mount, never discarding a draft; a
        path (MOUNT[/REL]) takes disk under it and lists what it `discarded`. `reopen` first
        reopens the journal (after a failed write), so the passes decide from the file."""
        if accept_root and path is not None:
            raise MemfsError(
                f"--accept-root takes a mount's whole root, not a path ({path!r})",
                "run `memfs sync --accept-root` without a path to take the replaced directory; "
                "`memfs sync PATH` takes disk at a path once the root is available")
        reopened = await self.reopen() if reopen else None
        out = {}
        if path is None:
            for mount in list(self.bindings):
                out[mount] = await self.run_pass(mount, accept_root=accept_root)
        else:
            mount, rel = split_path(path)
            out[mount] = await self.run_pass(mount, rel, path_sync=True,
                                             accept_root=accept_root, asked_on=self.ws.branch)
        return {"mounts": out, **({"reopened": reopened} if reopen else {})}

    async def reopen(self) -> dict:
        """Reopen the journal's view of the store in this process, without a restart: clears a
        failed write's poison (Journal.reopen). Every mount's lock is held meanwhile, so no
        pass or materialize straddles the old view and the new one; what this process keeps
        from the journal (the pins, the pending adoptions to settle) is read again, since a
        failed write may have reached the file. A reopen that fails leaves the journal
        refusing, and says why."""
        refusal = self.journal.refusal()
        async with contextlib.AsyncExitStack() as held:
            for mount in sorted(self.bindings):
                await held.enter_async_context(self._lock(mount))
            try:
                await trio.to_thread.run_sync(self.journal.reopen)
                pins = await trio.to_thread.run_sync(self._read_pins)
            except sqlite3.Error as exc:
                raise MemfsError(f"the journal could not be reopened ({exc})",
                                 "check the disk that holds the store (free space, dmesg), "
                                 "then run `memfs sync --reopen` again") from None
            self.pins = pins
            self._load_pending_adopts()
            for st in self.mounts.values():
                st.observed.clear()  # on-access windows: observe afresh from the new view
        was = None if refusal is None else refusal.message
        self.record_event("journal-reopened", was_refusing=was)
        return {"was_refusing": was}

    def _root_accepted(self, mount: str) -> None:
        """Journal.accept_root cleared the pin and abandoned the pending intents: forget ours."""
        self.pins.pop(mount, None)
        self.pending_adopts = {k: i for k, i in self.pending_adopts.items() if k[0] != mount}

    def _read_pins(self) -> dict[str, str]:
        return {m: p for m in self.bindings if (p := self.journal.pin(m)) is not None}

    async def states(self, path: str | None) -> dict:
        """`memfs ls --states [PATH]`: observe the scope first, then list it."""
        mounts = [split_path(path)] if path else [(m, "") for m in sorted(self.bindings)]
        out = []
        for mount, rel in mounts:
            res = await self.run_pass(mount, rel)
            out.append({**self.listing(mount, rel), "bytes_read": res.get("bytes_read", 0)})
        return {"mounts": out}

    # -- passes ------------------------------------------------------------------------
    def _state(self, mount: str) -> MountState:
        return self.mounts.setdefault(mount, MountState())

    def _lock(self, mount: str) -> trio.Lock:
        return self._locks.setdefault(mount, trio.Lock())

    async def pass_all(self) -> dict:
        out = {}
        for mount in list(self.bindings):
            try:
                out[mount] = await self.run_pass(mount)
            except MemfsError as exc:
                out[mount] = {"error": exc.message, "remedy": exc.remedy}
        return out

    async def on_access(self, node: Node, name: bytes | None = None) -> bool:
        """Observe the scope a lookup (node + name), an opendir (a directory node) or an open
        (a file node) touches, at most once a second per scope; never waits for a pass already
        running. True if a pass ran.

        A lookup of a directory the tree already has observes nothing: listing it does. A
        lookup of a name the tree lacks observes that one path (one stat), limited per path
        only, so a file just made on disk opens by name at once. An open observes its file (one
        stat; the fingerprint cache vouches for the bytes), unless a scope above it was observed
        within the second. Nodes of the read-only history and branch views are never observed:
        their paths only look like a live mount's."""
        if not self._live(node):
            return False
        mount, rel = self._backed(node.path())
        if mount is None or self.stopped:
            return False
        missing = False
        if name is not None:
            if name in (b".", b"..") or b"/" in name:
                return False
            child = self.ws.children(node).get(name) if node.kind == DIR else None
            if child is not None and child.kind == DIR and child.id not in self.ws.disk_only:
                return False
            missing = child is None
            rel = f"{rel}/{name_to_str(name)}" if rel else name_to_str(name)
        b = self.bindings[mount]
        if b.watch not in ACCESS_WATCH or self._lock(mount).locked():
            return False
        st = self._state(mount)
        now = time.monotonic()
        if len(st.observed) > 4096:
            st.observed = {k: t for k, t in st.observed.items() if now - t < ACCESS_INTERVAL}
        target = node if name is None else self.ws.children(node).get(name)
        # A disk-only file is disk's alone and may change at any moment: a listing's window
        # over its directory does not cover it (reading one that grew within a second of a
        # listing gave its old length), only its own path's last observation does (which
        # keeps the kernel's one retry of an open answered ESTALE from observing again).
        own = missing or (target is not None and target.id in self.ws.disk_only)
        for scope, at in st.observed.items():
            if now - at < ACCESS_INTERVAL and (scope == rel if own else _under(rel, scope)):
                return False
        if target is not None and target.kind == FILE and \
                await trio.to_thread.run_sync(self._as_seen, b, rel):
            st.observed[rel] = time.monotonic()
            return False  # disk holds what the last pass saw there: nothing to decide again
        try:
            await self.run_pass(mount, rel)
        except Exception as exc:  # noqa: BLE001 - a failed observation never fails a lookup
            log.warning("on-access pass of %s/%s failed: %s", mount, rel, exc)
            st.last_error = str(exc)
            return False
        finally:
            # The window counts from the end too: a slow pass is not followed at once by
            # another (the kernel's retry of an open answered ESTALE relies on this).
            st.observed[rel] = time.monotonic()
        return True

    def _as_seen(self, b: Binding, rel: str) -> bool:
        """Does disk still hold, at rel, the file the last pass over it saw? One lstat by
        path, compared with that pass's fingerprint under the walk's trust rule (a
        ctime-keeping filesystem, the root's device, both timestamps older than the racy
        window before the pass looked). Yes means a pass would decide nothing new from disk,
        so an open or a lookup skips it (~5 ms at 2,000 files); anything else runs the pass.
        A path reached through a swapped-in symlink cannot match: its inode, device and
        ctime would all have to be the same file's."""
        seen = self._seen_paths.get((b.mount, rel))
        if seen is None:
            fact = (self._facts.get(b.mount) or {}).get(rel)
            full = self._facts_seen.get(b.mount)
            if fact is None or full is None:
                return False
            seen = (fact.fingerprint, *full)
        fp, at, trusted, dev = seen
        if not trusted:
            return False
        try:
            now = os.stat(os.path.join(b.dir, rel), follow_symlinks=False)
        except (OSError, ValueError):
            return False
        return (stat.S_ISREG(now.st_mode) and now.st_dev == dev and Fingerprint.of(now) == fp
                and now.st_mtime_ns < at - RACY_NS and now.st_ctime_ns < at - RACY_NS)

    def _live(self, node: Node) -> bool:
        """Is the node in the live tree (not a history or branch view, not unlinked)?"""
        while node.parent is not None:
            node = node.parent
        return node is self.ws.root

    async def run_pass(self, mount: str, scope: str = "", *, path_sync: bool = False,
                       accept_root: bool = False, asked_on: str | None = None) -> dict:
        """Observe `scope` of a mount and apply what the rule takes (a path sync: what disk
        holds there). `asked_on`: the branch a path sync was asked on; if another one is
        selected when the pass gathers, it takes nothing and says so."""
        if mount not in self.bindings:
            raise MemfsError(f"mount {mount!r} is not bound to a backing directory",
                             f"`memfs attach {mount} DIR` binds it")
        with self._admitted():
            return await self._run_pass_admitted(mount, scope, path_sync, accept_root,
                                                 asked_on)

    async def _run_pass_admitted(self, mount: str, scope: str, path_sync: bool,
                                 accept_root: bool, asked_on: str | None) -> dict:
        async with self._lock(mount):
            try:
                try:
                    return await self._pass_locked(mount, scope, path_sync, accept_root,
                                                   asked_on)
                except OSError as exc:  # a conflict's disk side with no room to keep it
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    raise self._full(f"a pass over {mount!r} could not keep what it needs "
                                     f"({exc.strerror or exc})") from None
            except MemfsError as exc:  # e.g. the journal refusing after a failed append
                self._state(mount).last_error = str(exc)
                raise

    def _full(self, what: str) -> MemfsError:
        try:
            space = self.ws.space()
        except OSError:
            space = None
        return store_full(what, space, str(self.store.root), self.store.kind != "sqlite")

    @labelled("reconciler", lambda mount: f"reconciler: disk changes in {mount}")
    async def _pass_locked(self, mount: str, scope: str, path_sync: bool,
                           accept_root: bool, asked_on: str | None = None) -> dict:
        b = self.bindings[mount]
        st = self._state(mount)
        st.observed[scope] = time.monotonic()
        if mount not in self._swept:
            await self._sweep(b)
        if accept_root:
            try:
                rst = os.stat(b.dir)
            except OSError as exc:
                raise MemfsError(f"backing root {b.dir!r} is missing ({exc.strerror})",
                                 "bring the directory back; only an existing one can be "
                                 "accepted") from None
            recorded = await trio.to_thread.run_sync(self.journal.root, mount)
            if recorded is not None and tuple(recorded) != (rst.st_dev, rst.st_ino):
                # Only a replaced root: accepting an unchanged one would throw away evidence
                # and turn every draft into an unknown-provenance conflict.
                aside = await trio.to_thread.run_sync(self.journal.accept_root, mount,
                                                      rst.st_dev, rst.st_ino)
                self._root_accepted(mount)
                log.info("mount %s: root accepted, %d evidence records set aside", mount, aside)
        gathered = await self._gather_on_one_branch(b, st, scope)
        if isinstance(gathered, dict):
            return gathered
        epoch, branch, obs, evidence, pend, modes = gathered
        # On the loop from here to the plan: one branch, one tree.
        nodes, _ = self._store_nodes(mount, scope)
        view = self._store_view(nodes)
        table = self._pass_table(mount, scope)
        if path_sync and table.damaged:
            # A path sync names the paths whose intent it replaces: with disk taken there,
            # nothing is left for the damaged intent to protect.
            for p in set(view) | set(obs.files) | {p for p in evidence if _under(p, scope)}:
                table = table.with_entry(p, None)
            self.intents[mount] = table
            self.ws._touch(self.ws.root)
        pending = pending_from_journal(pend, branch)
        plan, sp = self._plan(mount, _PlanInputs(
            scope, path_sync, branch, asked_on if asked_on is not None else branch, obs, view,
            evidence, table, pending, modes))
        if sp.refused:
            return {"mount": mount, "refused": sp.refused}
        versions = {p: nodes[p].ver for p in (*sp.take, *sp.take_modes) if p in nodes}
        await trio.to_thread.run_sync(self._prepare, b, obs, sp, plan)
        edit = TreeEdit(self.ws, self.overlay, mount, None)
        applied: list[str] = []
        skipped: list[str] = []
        no_room: list[str] = []  # takes refused for lack of space in the store: skipped
        intent_ids: dict[str, int] = {}
        changed = False
        if sp.take:
            await self.ws.boundary()  # a take-in is an operation of its own (attribution.py)
        batches = _batches(sp.take, obs)
        for batch in batches:
            contents, ids = await trio.to_thread.run_sync(self._fetch, b, obs, batch, sp.take,
                                                          evidence, view, branch,
                                                          sp.record_modes)
            intent_ids.update(ids)
            # No await from this check to the end of the batch's tree change.
            changed = self.epoch != epoch or self.ws.branch != branch
            if changed:
                break
            edit.mnode = self._mount_node(mount)
            for path in batch:
                take = sp.take[path]
                if self._node_at(mount, path) is not nodes.get(path) or (
                        path in nodes and (nodes[path].ver != versions[path]
                                           or nodes[path].id in self.held_writers)):
                    skipped.append(path)  # changed in the workspace since it was decided,
                    continue  # or open for writing: the writes to come must reach the tree
                if isinstance(take, Content):
                    data = contents.get(path)
                    if data is None:
                        skipped.append(path)
                        continue
                    try:
                        put = edit.put_file(path, data, obs.files[path].fingerprint.mtime_ns,
                                            take.mode)
                    except WorkspaceError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        no_room.append(path)  # nothing changed there: decided again next
                        put = False
                    (applied if put else skipped).append(path)
                else:
                    edit.remove_file(path, obs)
                    applied.append(path)
            if len(batches) > 1:
                await self.ws.sync()  # a large take never holds more than a batch in memory
        if changed:
            skipped += [p for p in sp.take if p not in applied and p not in skipped]
        else:
            edit.mnode = self._mount_node(mount)
            skipped += self._apply_modes(mount, sp, nodes, versions, edit)
            self._apply_intent(mount, sp, set(skipped))
            # Disk-only: the plan's, and (a path sync) binary files it took over a type change.
            want = plan.disk_only | {p for p, t in sp.take.items() if t is ABSENT and
                                     (f := obs.files.get(p)) is not None and f.kind != "text"}
            edit.apply_overlay(scope, obs, want, set(skipped))
            self._apply_states(st, scope, obs, plan, sp, set(skipped))
            for path, c in sorted(sp.record_conflicts.items()):
                if path not in skipped:
                    self.record_event("conflict-recorded", mount=mount, path=path,
                                      kind=str(getattr(c, "kind", c)))
        entries, inodes = edit.entries, edit.inodes
        self.ws.invalidate(entries, inodes)
        # Evidence only once the tree it agrees with is durable. A pass that changed nothing
        # and vouches for nothing new (the steady state of on-access) does not wait for
        # other pending writes to commit: nothing it records depends on them.
        skipped_set = set(skipped)
        if intent_ids or entries or inodes or any(p not in skipped_set for p in sp.record):
            await self.ws.sync()
        if intent_ids:
            crash_point("backing:after-commit")  # tree durable, adoption intents pending
        still = await trio.to_thread.run_sync(self._record, mount, obs, sp, intent_ids,
                                              set(skipped))
        for key in [k for k, i in self.pending_adopts.items() if k[0] == mount and
                    i.id not in still]:
            del self.pending_adopts[key]  # settled by this pass
        marks = self._restored.get(mount)
        if marks and not changed:  # decided now: the rule recorded what it had to
            marks.difference_update(p for p, d in plan.decisions.items()
                                    if d.state != State.UNVERIFIED)
        taken = sorted(p for p in applied if isinstance(sp.take.get(p), Content))
        removed = sorted(p for p in applied if sp.take.get(p) is ABSENT and p in nodes)
        if taken or removed:  # a disk change taken into the tree is never silent
            self.record_event("adopted", mount=mount, branch=branch,
                              taken=taken[:EVENT_PATHS], removed=removed[:EVENT_PATHS],
                              counts={"taken": len(taken), "removed": len(removed)})
        st.last_pass = time.time()
        st.last_error = None
        full = {}
        if no_room:
            err = self._full(f"{len(no_room)} file(s) changed on disk could not be taken in "
                             f"({', '.join(no_room[:EVENT_PATHS])}); the workspace keeps "
                             "what it had there")
            st.last_error = str(err)
            full = {"error": err.message, "remedy": err.remedy}
        return {
            **full,
            "mount": mount, "scope": scope, "branch": branch,
            "taken": taken,
            "removed": removed,
            "skipped": sorted(skipped),
            "conflicts": sorted(sp.record_conflicts),
            "discarded": [{"path": d.path, "was": d.was, "op": d.op} for d in sp.discarded],
            "unverified": sorted(sp.unverified),
            "regions": [{"path": r.path, "reason": r.reason} for r in obs.regions],
            "incomplete": "the tree was replaced while the pass applied" if changed else None,
            "bytes_read": obs.bytes_read,  # file bytes the observation read (hashes, heads)
        }

    async def _sweep(self, b: Binding) -> None:
        """Remove the scratch files a write killed mid-way left in the backing directory: at
        the first pass of the mount in this process (the daemon's start, an attach, a
        daemon-less command), under the mount's lock, so no effect of ours is running there.
        A root that is unavailable is swept at the first pass that finds it back."""
        from memfs.reconcile.effects import sweep_scratch
        from memfs.reconcile.observe import VCS_DIRS

        recorded = await trio.to_thread.run_sync(self.journal.root, b.mount)
        try:
            removed = await trio.to_thread.run_sync(
                lambda: sweep_scratch(b.dir, root=RootId(*recorded) if recorded else None,
                                      skip=VCS_DIRS))
        except (RootUnavailable, OSError):
            return
        self._swept.add(b.mount)
        if removed:
            log.info("mount %s: removed %d scratch file(s) a killed write left: %s", b.mount,
                     len(removed), removed)
            self.record_event("scratch-removed", mount=b.mount, paths=removed)

    def _apply_modes(self, mount: str, sp: SyncPlan, nodes: Mapping[str, Node],
                     versions: dict[str, int], edit: TreeEdit) -> list[str]:
        """Disk's permission bits taken where the store keeps its content (a chmod on disk):
        the node's mode changes in place (no new inode; its attributes are invalidated), if
        it is still the node decided on, unchanged since. Returns the paths skipped."""
        skipped = []
        for path, mode in sorted(sp.take_modes.items()):
            node = self._node_at(mount, path)
            if node is None or node is not nodes.get(path) or node.ver != versions.get(path):
                skipped.append(path)  # changed in the workspace since: decided again next
                continue
            if node.mode & MODE_BITS != mode:
                self.ws.setattr(node, mode=(node.mode & ~MODE_BITS) | mode)
                edit.inodes.append(node.id)
        return skipped

    def _unwritable(self, nodes: Mapping[str, Node], mount: str) -> dict[str, str]:
        """Store entries no write can put on disk as they are, with why (materialize lists them,
        forced or not): a file with other hard links (disk would get separate copies, never
        the link), a FIFO, socket or device (no effect makes special files on disk)."""
        out = {}
        for path, node in nodes.items():
            links = getattr(node, "nlink", 1) or 1
            if links > 1:
                out[path] = (f"a hard link ({links} names share this file in the workspace): "
                             "written to disk it would be separate copies, so it is not written")
        for path, kind in self._store_specials(mount).items():
            out[path] = (f"a {_KIND_NAMES.get(kind, 'special file')} in the workspace: no "
                         "materialize makes special files on disk")
        return out

    def _store_specials(self, mount: str) -> dict[str, str]:
        """path -> kind of the mount's entries that are neither file, directory nor symlink."""
        top = self._mount_node(mount)
        out: dict[str, str] = {}
        stack: list[tuple[Node, str]] = [(top, "")] if top is not None else []
        while stack:
            d, prefix = stack.pop()
            for name, child in self.ws.children(d).items():
                rel = prefix + name_to_str(name)
                if child.kind == DIR:
                    stack.append((child, rel + "/"))
                elif child.kind not in (FILE, LINK):
                    out[rel] = child.kind
        return out

    def _plan(self, mount: str, given: _PlanInputs) -> tuple[PassPlan, SyncPlan]:
        """plan_pass and plan_sync (which refuses a path sync when the branch it gathered on
        is not the one it was asked on, `branch_now`). Both are pure, so inputs equal to the
        mount's last pass's give that pass's plans: on a quiet tree, comparing the inputs
        (dicts of shared objects) costs a few ms where deciding 100k paths again cost 0.4 s."""
        plans = self._plans.setdefault(mount, {})
        last = plans.get(given.scope)
        if last is not None and last[0].same(given):
            return last[1], last[2]
        plan = plan_pass(given.obs, given.view, given.evidence, given.table, given.pending,
                         branch=given.branch, modes=given.modes)
        sp = plan_sync(plan, given.obs, given.view,
                       path=given.scope if given.path_sync else None,
                       branch_now=given.branch_now)
        if len(plans) >= PLANS_KEPT:  # on-access passes each have a scope of their own;
            for other in [k for k in plans if k]:  # the whole mount's plans stay
                del plans[other]
        plans[given.scope] = (given, plan, sp)
        return plan, sp

    async def _gather_on_one_branch(self, b: Binding, st: MountState, scope: str):
        """(epoch, branch, observation, evidence, pending, P's modes) gathered while one branch and one
        tree stayed selected, or a dict saying why there is nothing to decide on."""
        for _ in range(GATHER_TRIES):
            # A change settling a pending adoption while the thread reads (settle_before_change
            # on the loop) leaves the intents and P read stale: the user's edit would read as
            # an interrupted conflict. So that counts as a change of view too.
            epoch, branch, settles = self.epoch, self.ws.branch, self.settles
            nodes, refs = self._store_nodes(b.mount, scope)
            try:
                obs, evidence, pend, modes = await trio.to_thread.run_sync(self._gather, b, scope,
                                                                    nodes, refs)
            except RootUnavailable as exc:
                remedy = _root_remedy(exc)
                if st.unavailable is None:  # once per outage, not once per pass
                    self.record_event("root-unavailable", mount=b.mount, error=exc.message,
                                      remedy=remedy)
                st.unavailable = (exc.message, remedy)
                st.last_pass = time.time()
                return {"mount": b.mount, "unavailable": exc.message, "remedy": remedy}
            if epoch == self.epoch and branch == self.ws.branch and settles == self.settles:
                st.unavailable = None
                st.incomplete = None
                return epoch, branch, obs, evidence, pend, modes
        st.incomplete = "the branch kept changing while the pass gathered"
        return {"mount": b.mount, "incomplete": st.incomplete}

    # -- materialize ---------------------------------------------------------------------
    async def materialize(self, paths: list[str] | None, *, force: bool = False,
                          apply_deletions: bool = False) -> dict:
        """`memfs materialize [PATH ...]`: write what the evidence says disk owes (plan.py's
        contract) through the write-ahead pushes, then observe again for the states."""
        wanted: dict[str, list[str]] = {}
        for path in paths or []:
            mount, rel = split_path(path)
            wanted.setdefault(mount, []).append(rel)
        out = {}
        for mount in sorted(wanted) if wanted else sorted(self.bindings):
            if mount not in self.bindings:
                raise MemfsError(f"mount {mount!r} is not bound to a backing directory",
                                 f"`memfs attach {mount} DIR` binds it")
            with self._admitted():
                async with self._lock(mount):
                    out[mount] = await self._materialize_locked(mount, wanted.get(mount),
                                                                force, apply_deletions)
        return {"mounts": out}

    @labelled("materialize", lambda mount: f"materialize: {mount}")
    async def _materialize_locked(self, mount: str, rels: list[str] | None, force: bool,
                                  apply_deletions: bool, auto: bool = False) -> dict:
        from memfs.reconcile.apply import run_materialize, settle
        from memfs.reconcile.plan import Skipped, plan_materialize

        b = self.bindings[mount]
        st = self._state(mount)
        await self.ws.sync()  # what is written is what the store durably holds
        gathered = await self._gather_on_one_branch(b, st, "")
        if isinstance(gathered, dict):
            return gathered
        epoch, branch, obs, evidence, pend, modes = gathered
        # The pin guard runs here, in the turn that selects the paths: no await from the
        # gathered branch to the plan.
        pinned = self.pins.get(mount)
        nodes, _ = self._store_nodes(mount)
        view = self._store_view(nodes)
        plan = plan_pass(obs, view, evidence, self._pass_table(mount, ""),
                         pending_from_journal(pend, branch), branch=branch, modes=modes)
        mplan = plan_materialize(plan, obs, paths=rels, force=force,
                                 apply_deletions=apply_deletions, pinned_branch=pinned,
                                 mount=mount, unwritable=self._unwritable(nodes, mount))
        # The bytes to write, taken now on the loop: a committed file by its immutable ref
        # (streamed in the thread), a dirty one by its live bytes.
        sources: dict[str, tuple[object, str]] = {}
        for w in [w for w in mplan.writes if w.path not in nodes]:
            # Unreachable by the rule (a write is owed only for store content); if a future plan
            # broke that, one path is refused instead of the whole mount's materialize failing.
            log.error("materialize of %s/%s: a write is owed but the store has no file", mount,
                      w.path)
            mplan.writes.remove(w)
            mplan.skipped.append(Skipped(w.path, "refused", "the store holds no file to write",
                                         f"`memfs sync {mount}/{w.path}` takes disk's side"))
        if auto:
            # Close-to-open: a file still open for writing through the mount may be half
            # written; its writer's close starts the round that writes it.
            held = [w for w in mplan.writes if nodes[w.path].id in self.held_writers]
            for w in held:
                mplan.writes.remove(w)
                self._auto_held.add(nodes[w.path].id)
                mplan.skipped.append(Skipped(w.path, "open-for-writing",
                                             "still open for writing through the mount",
                                             "it is written when the last writer closes it"))
        for w in mplan.writes:
            node = nodes[w.path]
            if node.dirty or node.ref is None:
                sources[w.path] = (self.ws.read(node, 0, node.size()), view[w.path].digest)
            else:
                sources[w.path] = ((node.ref, node.size()), view[w.path].digest)

        def content(path: str):
            src, digest = sources[path]
            data = src if isinstance(src, bytes) else ref_chunks(self.store, *src)
            return data, digest

        def still_selected() -> bool:  # asked from the worker thread before each effect
            delay = float(os.environ.get(PUSH_DELAY_ENV) or 0)
            if delay > 0:
                time.sleep(delay)
            return self.ws.branch == branch and self.epoch == epoch

        def run():
            settle(self.journal, mount, plan.decisions, plan.pending)
            result = run_materialize(self.journal, mount, b.dir,
                                     RootId(obs.root.dev, obs.root.ino), mplan, content,
                                     branch=branch, still_selected=still_selected)
            if not result.refused and not result.interrupted and pinned != branch:
                # Disk now holds this branch (nothing owed counts too: it already did). A push
                # cut short by a branch change leaves the pin as it was.
                self.journal.set_pin(mount, branch)
            return result

        result = await trio.to_thread.run_sync(run)
        if not result.refused and not result.interrupted:
            self.pins[mount] = branch
        if result.refused:
            self.record_event("write-refused", mount=mount, path=None, reason=result.refused)
        for s in result.skipped:
            self.record_event("write-refused", mount=mount, path=s["path"], state=s["state"],
                              reason=s["reason"])
        for f in result.failed:
            self.record_event("write-failed", mount=mount, path=f["path"], reason=f["message"])
        if result.written or result.removed:
            self.record_event("materialized", mount=mount, branch=branch, auto=auto,
                              written=result.written, removed=result.removed)
        await self._pass_locked(mount, "", False, False)  # conflicts converge, states refresh
        return {"mount": mount, "branch": branch, "pinned": self.pins.get(mount),
                "written": result.written, "removed": result.removed,
                "skipped": result.skipped, "deletions_left": result.deletions_left,
                "failed": result.failed, "refused": result.refused,
                "remedy": PIN_REMEDY.format(pinned=pinned, branch=branch)
                if result.refused and pinned is not None else None,
                "interrupted": result.interrupted}

    # -- gathering (worker thread) -----------------------------------------------------
    def _gather(self, b: Binding, scope: str, nodes: dict[str, Node],
                refs: dict[tuple[str, int], None]):
        # One snapshot of the journal; fingerprints of the scope only.
        got = self.journal.pass_inputs(b.mount, scope)
        expected = RootId(*got.root) if got.root else None
        evidence = self._evidence(b.mount, scope, got.evidence)
        pend = got.pending
        seen_at = time.time_ns()
        # Tracked: what needs a comparison (a store file, or P a digest). A disk-only file's P
        # is agreed absence: it is classified by its head alone, never hashed (a 4 GiB file
        # was read whole at every listing after the first).
        obs = observe(b.dir, expected_root=expected, scope=scope, cache=got.fingerprints,
                      tracked=lambda p: p in nodes or isinstance(evidence.get(p), str),
                      max_file_size=b.max_file_size, ignore=b.ignore,
                      follow_symlinks=b.follow_symlinks,
                      memo=self._walk_memos.setdefault(b.mount, WalkMemo()))
        seen = (seen_at, _ctime_trusted(b.dir), obs.root.dev)
        if not scope:
            self._facts[b.mount] = obs.files
            self._facts_seen[b.mount] = seen
        elif len(obs.files) <= SEEN_PATHS_PER_PASS:  # an open's or a lookup's own pass
            if len(self._seen_paths) > SEEN_PATHS_KEPT:
                self._seen_paths.clear()
            for path, fact in obs.files.items():
                self._seen_paths[(b.mount, path)] = (fact.fingerprint, *seen)
        for key in refs:
            if key not in self._digests:
                self._digests[key] = sys.intern(ref_digest(self.store, *key))
        return obs, evidence, pend, got.modes

    def _evidence(self, mount: str, scope: str, rows: Mapping[str, str | None]) -> dict:
        """P as the rule reads it (agreed absence as ABSENT), converted once per journal
        snapshot: the journal hands out the same read-only rows while it is unchanged."""
        with self._evidence_lock:  # gathers of two mounts run in two worker threads
            last = self._evidence_memo.get((mount, scope))
        if last is not None and last[0] is rows:
            return last[1]
        evidence = {p: (ABSENT if d is None else d) for p, d in rows.items()}
        with self._evidence_lock:
            if len(self._evidence_memo) >= PLANS_KEPT:  # as in _plan: whole mounts' stay
                for key in [k for k in self._evidence_memo if k[1]]:
                    del self._evidence_memo[key]
            self._evidence_memo[(mount, scope)] = (rows, evidence)
        return evidence

    def _prepare(self, b: Binding, obs: Observation, sp: SyncPlan, plan) -> None:
        """Settle the pending intents the plan resolved; keep new conflicts' disk sides."""
        from memfs.reconcile.apply import settle

        if plan.settling:
            settle(self.journal, b.mount, plan.settling, plan.pending)
        root = RootId(obs.root.dev, obs.root.ino)
        for path, c in sp.record_conflicts.items():
            digest = getattr(c, "disk", None)
            if digest and len(digest) == 32 and not (self.conflict_dir / digest).exists():
                fact = obs.files.get(path)
                if fact is not None and fact.size <= b.max_file_size:
                    data = read_contained(b.dir, root, path, digest)
                    if data is not None:
                        _keep_conflict_copy(self.conflict_dir, digest, data)

    def _fetch(self, b: Binding, obs: Observation, batch: list[str], take: dict,
               evidence: dict, view: dict[str, Content], branch: str,
               record_modes: Mapping[str, int] | None = None,
               ) -> tuple[dict[str, bytes], dict[str, int]]:
        """Read the disk bytes a batch takes (checked against the decided digest) and write
        the adoptions ahead."""
        root = RootId(obs.root.dev, obs.root.ino)
        record_modes = record_modes or {}
        contents: dict[str, bytes] = {}
        for path in batch:
            if isinstance(take[path], Content):
                data = read_contained(b.dir, root, path, take[path].digest)
                if data is not None:
                    contents[path] = data
        ids: dict[str, int] = {}
        for path in batch:
            if path not in evidence:
                continue  # first sight: no evidence a crash could leave stale
            if isinstance(take[path], Content) and path not in contents:
                continue
            old = view.get(path, ABSENT)
            new = take[path].digest if isinstance(take[path], Content) else None
            prior = evidence[path]  # what the decision resolved: a not-done redo starts there
            ids[path] = self.journal.begin_intent(
                b.mount, path, "adopt", old=old.digest if isinstance(old, Content) else None,
                new=new, branch=branch, root=(root.dev, root.ino),
                prior=None if prior is ABSENT else prior,
                mode=record_modes.get(path))  # P's mode on completion: disk's, agreed
            crash_point("backing:after-adopt-intent")  # intent durable, tree not yet changed
        return contents, ids

    def _record(self, mount: str, obs: Observation, sp: SyncPlan, intent_ids: dict[str, int],
                skipped: set[str]) -> set[int]:
        """Complete this pass's adoptions and record P; returns the ids still pending."""
        for path, iid in intent_ids.items():
            if path in skipped:
                self.journal.abandon_intent(iid)
            else:
                self.journal.complete_intent(iid)
        items = [(p, None if v is ABSENT else v, sp.record_modes.get(p))
                 for p, v in sp.record.items() if p not in skipped and p not in intent_ids]
        if items or self.journal.root(mount) is None:  # the root goes with the first evidence
            self.journal.record_evidence(mount, items, root=(obs.root.dev, obs.root.ino))
        if obs.hashed:
            self.journal.put_fingerprints(mount, dict(obs.hashed))  # type: ignore[arg-type]
        return {i.id for i in self.journal.pending_intents(mount)}

    # -- the store side ----------------------------------------------------------------
    def _mount_node(self, mount: str) -> Node | None:
        node = self.ws.children(self.ws.root).get(name_to_bytes(mount))
        return node if node is not None and node.kind == DIR else None

    def _node_at(self, mount: str, rel: str) -> Node | None:
        """The store file node at rel (None: none, or a disk-only node)."""
        node = self._mount_node(mount)
        for part in components(rel):
            if node is None or node.kind != DIR:
                return None
            node = self.ws.children(node).get(name_to_bytes(part))
        if node is None or node.kind != FILE or node.id in self.ws.disk_only:
            return None
        return node

    def _store_nodes(self, mount: str, scope: str = "",
                     ) -> tuple[Mapping[str, Node], dict[tuple[str, int], None]]:
        """Every committed-or-draft file of the mount under scope (disk-only nodes excluded),
        read-only, and the committed refs whose digest is not cached yet.

        Remembered, with the view built from it (`_store_view`), while nothing it depends on
        moved: every create, unlink, rename, write and truncate bumps `ws.mutation_seq`, a
        commit that marks drafts committed moves `ws.head` in the same loop turn, and a replaced
        tree bumps `epoch`. A pass asks twice, and a quiet tree's next pass asks the same
        question again; at 100k files the walk and the view cost more than the decisions."""
        key = self._store_key(mount, scope)
        memo = self._store_memo
        if memo is None or memo[0] != key:
            nodes = self._walk_store(key[-1], scope)
            refs = {}
            for node in nodes.values():
                if not node.dirty and node.ref is not None:
                    refs[(node.ref, node.data.size if node.data is not None else 0)] = None
            memo = self._store_memo = [key, MappingProxyType(nodes), refs, None]
        digests = self._digests  # only grows: a ref digested since is no longer wanted
        if memo[2]:
            memo[2] = {ref: None for ref in memo[2] if ref not in digests}
        return memo[1], dict(memo[2])

    def _store_key(self, mount: str, scope: str) -> tuple:
        ws = self.ws
        return (mount, scope, self.epoch, ws.mutation_seq, ws.head, self._mount_node(mount))

    def _walk_store(self, top: Node | None, scope: str) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        for part in components(scope):
            if top is None or top.kind != DIR:
                return nodes
            top = self.ws.children(top).get(name_to_bytes(part))
        if top is None or top.id in self.ws.disk_only:
            return nodes
        if top.kind == FILE:
            nodes[scope] = top
            return nodes
        # Once per file: locals instead of attribute lookups. Paths are interned, as the
        # journal's and the walk's are: a pass looks each one up in five maps, and equal keys
        # that are one object compare without touching their bytes (at 100k files that is
        # memory traffic the pass waits on).
        children, disk_only, intern = self.ws.children, self.ws.disk_only, sys.intern
        stack: list[tuple[Node, str]] = [(top, scope + "/" if scope else "")]
        while stack:
            d, prefix = stack.pop()
            for name, child in children(d).items():
                if child.id in disk_only:
                    continue
                kind = child.kind
                if kind == FILE:
                    nodes[intern(prefix + name.decode("utf-8", "surrogateescape"))] = child
                elif kind == DIR:
                    stack.append((child, prefix + name.decode("utf-8", "surrogateescape") + "/"))
        return nodes

    def _digest_now(self, node: Node) -> str:
        """The store side's digest. A committed file's by its immutable (ref, size); a draft's
        from its live bytes, remembered by (node id, ver) — ver moves on every write and
        truncate, so a draft is rehashed only after it changed, and a remembered digest is never
        served for other bytes (a stale one could read a draft as agreed and lose it)."""
        if not node.dirty and node.ref is not None:
            key = (node.ref, node.size())
            digest = self._digests.get(key)
            if digest is None:
                digest = self._digests[key] = sys.intern(ref_digest(self.store, *key))
            return digest
        ver = node.ver  # read before the bytes: a write meanwhile leaves a ver never asked for
        hit = self._draft_digests.get(node.id)
        if hit is not None and hit[0] == ver:
            return hit[1]
        h = xxhash.xxh3_128()
        size = node.size()
        for off in range(0, size, CHUNK_SIZE):
            h.update(self.ws.read(node, off, CHUNK_SIZE))
        digest = h.hexdigest() if size else EMPTY_DIGEST
        if len(self._draft_digests) >= 4096:  # committed or deleted drafts would linger
            self._draft_digests.clear()
        self._draft_digests[node.id] = (ver, digest)
        return digest

    def _store_view(self, nodes: Mapping[str, Node]) -> dict[str, Content]:
        """The rule's S for each store file (`_digest_now`, one shared Content per digest)."""
        from memfs.reconcile.rule import text_content

        memo = self._store_memo
        if memo is not None and memo[1] is nodes and memo[3] is not None and \
                memo[0] == self._store_key(memo[0][0], memo[0][1]):
            return memo[3]  # the same nodes, nothing moved: the same digests (read-only)
        digests, out = self._digests, {}
        for p, n in nodes.items():
            # The committed, already-hashed case inline: nearly every file of a quiet tree.
            digest = None if n.dirty or n.ref is None or n.data is None else \
                digests.get((n.ref, n.data.size))  # (ref, node.size()) for a file
            out[p] = text_content(digest if digest is not None else self._digest_now(n),
                                  n.mode & MODE_BITS)
        if memo is not None and memo[1] is nodes and memo[0] == self._store_key(memo[0][0],
                                                                                memo[0][1]):
            memo[3] = out  # shared from here on: nobody writes a view
        return out

    # -- applying to the live tree (on the loop, no await; see backing_tree.TreeEdit) --
    def _apply_intent(self, mount: str, sp: SyncPlan, skipped: set[str]) -> None:
        table = self.intents.get(mount, IntentTable())
        for path in sp.clear_intent:
            if path not in skipped:
                self._set_intent(mount, path, None)
        for path, c in sp.record_conflicts.items():
            if path in skipped or not isinstance(c, Conflict):
                continue
            old = table.get(path)
            self._set_intent(mount, path, PathIntent(old.tombstone, old.origin_store, c))

    def _apply_states(self, st: MountState, scope: str, obs: Observation, plan,
                      sp: SyncPlan, skipped: set[str]) -> None:
        # The same plans (Backing._plan) applied over the same scope, nothing skipped either
        # time: the states already hold what this would write. Only this method writes them.
        applied = (scope, plan, sp, not skipped)
        if st.applied is not None and st.applied[0] == scope and st.applied[1] is plan and \
                st.applied[2] is sp and st.applied[3] and not skipped:
            return
        st.applied = applied
        for p in [p for p in st.states if _under(p, scope)]:
            del st.states[p]
        for p in [p for p in st.disk_only if _under(p, scope)]:
            del st.disk_only[p]
        for p in [p for p in st.regions if _under(p, scope)]:
            del st.regions[p]
        listing = plan.listing()
        for path, take in sp.take.items():
            if path in skipped:
                # Not taken (changed in the workspace since, open for writing, disk changed
                # since): the next pass decides it; until then it is not known synced.
                listing[path] = ("unverified", None)
                continue
            if path not in listing:
                continue
            fact = obs.files.get(path)
            if take is ABSENT and fact is None:
                listing.pop(path, None)
            elif take is ABSENT:
                listing[path] = ("disk-only", None)
            else:
                listing[path] = ("synced", None)
        st.states.update(listing)
        for path, (state, _) in listing.items():
            if state == "disk-only" and (fact := obs.files.get(path)) is not None:
                st.disk_only[path] = (fact.size, fact.mime)
        for r in obs.regions:
            st.regions[r.path] = r.reason

    # -- reading disk-only files ---------------------------------------------------------
    async def read_disk(self, node: Node, off: int, size: int) -> bytes:
        mount, rel = self.ws.disk_only[node.id]
        b = self.bindings.get(mount)
        if b is None:
            raise WorkspaceError(errno.ENOENT, "the mount is no longer bound")
        root = self.journal.root(mount)
        return await trio.to_thread.run_sync(_pread_contained, b.dir,
                                             RootId(*root) if root else None, rel, off, size)


def _root_remedy(exc: RootUnavailable) -> str:
    """What to do about an unavailable root, for the case it is: a root that is another
    directory can be taken on purpose; a missing one can only come back."""
    if exc.reason == "replaced":
        return ACCEPT_ROOT_REMEDY
    return ("bring the directory (or the drive holding it) back; a running memfs notices "
            f"within {ROOT_POLL:g} s")


def _keep_conflict_copy(directory: Path, digest: str, data: bytes) -> None:
    """A conflict's disk side under <root>/conflicts/<digest>, durably: the file and its
    directory fsynced before the name appears for good (it is the only copy of disk's bytes
    once a path sync or a forced materialize replaces them)."""
    directory.mkdir(exist_ok=True)
    tmp = directory / f".{digest}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: the partial copy would only hold space
        raise
    finally:
        os.close(fd)
    os.replace(tmp, directory / digest)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _ctime_trusted(root_dir: str) -> bool:
    """Does the backing root's filesystem keep ctime (the walk's allowlist)?"""
    try:
        fd = os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fs_magic(fd) in CTIME_TRUSTED
    finally:
        os.close(fd)


def _pread_contained(root_dir: str, expected: RootId | None, rel: str, off: int,
                     size: int) -> bytes:
    try:
        fd, _ = open_contained_file(root_dir, rel, root=expected)
    except RootUnavailable as exc:
        raise WorkspaceError(errno.EIO, exc.message) from None
    except Refused:
        raise WorkspaceError(errno.ENOENT) from None
    try:
        return os.pread(fd, size, off)
    finally:
        os.close(fd)


__all__ = ["Backing", "Binding", "MountState", "WATCH_MODES", "split_path", "ref_digest"]
