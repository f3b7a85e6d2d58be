"""MemoryStore: Global memory and per-workspace record generations as plain files.

Layout under the memory root (see docs/memory.md):

    .lock                                   flock: commits exclusive, reads shared
    global.md -> generations/global/<gen>/global.md
    workspaces/<ws> -> ../generations/workspaces/<ws>/<gen>
    generations/global/<gen>/{global.md,.manifest.json}
    generations/workspaces/<ws>/<gen>/{<name>.md...,index.md,.manifest.json}

`<gen>` is `<seq:08d>-<revision[:16]>`. A commit builds the whole next generation in a temporary
directory, fsyncs it, names it, and swaps one symlink by rename(2): a reader (or `cat`) sees
the old generation or the new one, never a mix. Generations newer than the current link are
leftovers of a commit that died before its swap; the next commit removes them.

A commit prunes nothing: which generations stay is the store's retention policy, applied by
`prune` (memfs gc, through memfs.consolidate.memory_retention, which knows the receipts;
the crash-safe steps are memfs.memory.prune's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn, TypeVar

from memfs.memory import prune
from memfs.memory.durable import FsOps, crash_point, flocked, shared_if_free
from memfs.memory.errors import InvalidRecord, MemoryDamaged, NoSuchRecord, StaleRevision
from memfs.memory.generation import (
    GlobalGeneration,
    WorkspaceGeneration,
    canonical_json,
    content_hash,
    empty_global,
    empty_workspace,
    global_revision,
    render_index,
    workspace_revision,
)
from memfs.memory.preview import (
    Change,
    Delete,
    Put,
    WorkspacePreview,
    finish_workspace_preview,
    preview_global_change,
    preview_workspace_changes,
)
from memfs.memory.prune import DROPPED_DIR, HIDDEN
from memfs.memory.records import (
    INDEX_NAME,
    RECORD_SUFFIX,
    normalize_record_content,
    validate_name,
    validate_workspace,
)
from memfs.memory.retention import (
    Dropped,
    GenRow,
    NoSuchRevision,
    dropped_refusal,
)

MANIFEST = ".manifest.json"
INDEX_FILE = INDEX_NAME + RECORD_SUFFIX
GLOBAL_FILE = "global.md"
UNLOCKED_TRIES = 3  # reads without the lock (a commit holds it) start again this often
_GEN_RE = re.compile(r"^(\d{8})-([0-9a-f]{16})$")
T = TypeVar("T")

# Named points of a commit, in order, for SIGKILL tests (MEMFS_CRASH_AT).
COMMIT_CRASH_POINTS = ("files-written", "generation-synced", "generation-named",
                       "link-created", "swapped", "swap-synced")


@dataclass(frozen=True)
class GenerationInfo:
    """One kept generation, for `memfs memory log`."""

    scope: str  # "global" or "workspace"
    workspace: str | None
    seq: int
    revision: str
    parent_revision: str
    created: str
    current: bool
    names: tuple[str, ...]  # record names (workspace) or () for Global


class MemoryStore:
    """Reads and compare-and-swap commits of memory generations under one memory root."""

    def __init__(self, root: Path, ops: FsOps | None = None) -> None:
        self.root = Path(root)
        self.ops = ops or FsOps()
        # Generation directories never change once named (name = seq + revision), so a verified
        # read can be kept; only the link is read again each time.
        self._cache: dict[tuple[str | None, str], GlobalGeneration | WorkspaceGeneration] = {}

    # ---- paths -------------------------------------------------------------------------
    @property
    def _lock(self) -> Path:
        return self.root / ".lock"

    def _ws_link(self, ws: str) -> Path:
        return self.root / "workspaces" / ws

    def _ws_gens(self, ws: str) -> Path:
        return self.root / "generations" / "workspaces" / ws

    @property
    def _global_link(self) -> Path:
        return self.root / GLOBAL_FILE

    @property
    def _global_gens(self) -> Path:
        return self.root / "generations" / "global"

    def _read_locked(self, fn: Callable[[], T]) -> T:
        """A read that never waits for a commit (the FUSE layer reads memory on its event
        loop, and a review may hold the exclusive lock across fsyncs). With the lock free it
        reads under LOCK_SH as before. While a commit holds it, it reads without: the link
        only ever names a complete, fsynced generation, which the commit never changes and
        a prune never removes while it is current, so the read sees the generation before
        the commit or the one after. Should a generation vanish under the read (a prune
        right after a commit replaced it), the read starts again from the link."""
        if not self.root.is_dir():
            return fn()
        with shared_if_free(self._lock) as locked:
            if locked:
                return fn()
            for _ in range(UNLOCKED_TRIES - 1):
                try:
                    return fn()
                except (FileNotFoundError, MemoryDamaged):
                    continue
            return fn()

    # ---- reads -------------------------------------------------------------------------
    def global_generation(self) -> GlobalGeneration:
        return self._read_locked(self._load_global)

    def workspace_generation(self, workspace: str) -> WorkspaceGeneration:
        ws = validate_workspace(workspace)
        return self._read_locked(lambda: self._load_workspace(ws))

    def read_record(self, workspace: str, name: str) -> str:
        return self._record(self.workspace_generation(workspace), name)

    @staticmethod
    def _record(gen: WorkspaceGeneration, name: str) -> str:
        """One record of a generation, or NoSuchRecord (both stores read records so)."""
        norm = validate_name(name)
        if norm not in gen.records:
            raise NoSuchRecord(f"no record {norm!r} in workspace {gen.workspace!r}",
                               "list the workspace's records with `memfs memory show`")
        return gen.records[norm]

    def workspaces(self) -> list[str]:
        """Workspaces that have a committed generation, sorted."""
        d = self.root / "workspaces"
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if p.is_symlink() and not p.name.startswith("."))

    def history(self, workspace: str | None) -> list[GenerationInfo]:
        """Kept generations of a workspace (or Global when None), newest first."""
        ws = None if workspace is None else validate_workspace(workspace)
        return self._read_locked(lambda: self._history(ws))

    def _history(self, ws: str | None) -> list[GenerationInfo]:
        link, gens = ((self._global_link, self._global_gens) if ws is None
                      else (self._ws_link(ws), self._ws_gens(ws)))
        current = self._current_gen_name(link, ws is None)
        if current is None:
            return []
        cur_seq = int(current[:8])
        out: list[GenerationInfo] = []
        for name in sorted(os.listdir(gens), reverse=True):
            m = _GEN_RE.match(name)
            if not m or int(m.group(1)) > cur_seq:
                continue
            try:
                manifest = json.loads((gens / name / MANIFEST).read_text())
            except (OSError, ValueError):
                continue
            out.append(GenerationInfo(
                scope="global" if ws is None else "workspace", workspace=ws,
                seq=int(m.group(1)), revision=manifest["revision"],
                parent_revision=manifest["parent"], created=manifest["created"],
                current=name == current, names=tuple(sorted(manifest.get("records", {})))))
        return out

    def _current_gen_name(self, link: Path, is_global: bool) -> str | None:
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return None
        parts = Path(target).parts
        name = parts[-2] if is_global else parts[-1]
        if not _GEN_RE.match(name):
            raise MemoryDamaged(f"{link} points at {target!r}, not a generation",
                                "restore the link to a directory under generations/")
        return name

    def _load_global(self) -> GlobalGeneration:
        name = self._current_gen_name(self._global_link, True)
        if name is None:
            return empty_global()
        return self._load_global_gen(name)

    def _load_global_gen(self, name: str) -> GlobalGeneration:
        cached = self._cache.get((None, name))
        if isinstance(cached, GlobalGeneration):
            return cached
        gen_dir = self._global_gens / name
        manifest = self._manifest(gen_dir)
        content = (gen_dir / GLOBAL_FILE).read_bytes().decode()
        revision = global_revision(content)
        if revision != manifest.get("revision"):
            raise MemoryDamaged(f"Global generation {name} does not match its revision",
                                "restore it from a backup or an older generation")
        gen = GlobalGeneration(content=content, revision=revision, seq=int(name[:8]))
        self._cache[(None, name)] = gen
        return gen

    def _load_workspace(self, ws: str) -> WorkspaceGeneration:
        name = self._current_gen_name(self._ws_link(ws), False)
        if name is None:
            return empty_workspace(ws)
        return self._load_workspace_gen(ws, name)

    def _load_workspace_gen(self, ws: str, name: str) -> WorkspaceGeneration:
        cached = self._cache.get((ws, name))
        if isinstance(cached, WorkspaceGeneration):
            return dataclasses.replace(cached, records=dict(cached.records))
        gen_dir = self._ws_gens(ws) / name
        manifest = self._manifest(gen_dir)
        records: dict[str, str] = {}
        for entry in sorted(os.listdir(gen_dir)):
            if entry in (MANIFEST, INDEX_FILE):
                continue
            records[entry[: -len(RECORD_SUFFIX)]] = (gen_dir / entry).read_bytes().decode()
        index = (gen_dir / INDEX_FILE).read_bytes().decode()
        revision = workspace_revision(records)
        if revision != manifest.get("revision") or index != render_index(records):
            raise MemoryDamaged(f"workspace {ws!r} generation {name} does not match its revision",
                                "restore it from a backup or an older generation")
        gen = WorkspaceGeneration(workspace=ws, records=records, index=index, revision=revision,
                                  seq=int(name[:8]))
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[(ws, name)] = gen
        return dataclasses.replace(gen, records=dict(records))

    @staticmethod
    def _manifest(gen_dir: Path) -> dict:
        try:
            return json.loads((gen_dir / MANIFEST).read_bytes())
        except (OSError, ValueError) as exc:
            raise MemoryDamaged(f"generation {gen_dir} has no readable manifest",
                                "restore it from a backup or an older generation") from exc

    # ---- commits -----------------------------------------------------------------------
    def commit_workspace(self, workspace: str, preview: WorkspacePreview,
                         expected_revision: str) -> str:
        """Swap in `preview` if the workspace is still at `expected_revision`; return the
        revision now current. A preview with no change keeps the revision and swaps nothing."""
        ws = self._preview_target(workspace, preview)
        with self._writing():
            current = self._load_workspace(ws)
            return self._commit_records(current,
                                        self._checked(current, preview, expected_revision))

    def commit_global(self, content: str, expected_revision: str) -> str:
        """Replace Global if it is still at `expected_revision`; return the current revision."""
        with self._writing():
            current = self._load_global()
            self._check_expected("Global memory", current.revision, expected_revision)
            return self._commit_global(current, content)

    def put_record(self, workspace: str, name: str, content: str) -> str:
        """One online write (a file closed in the mount): one commit, last writer wins."""
        return self._apply(workspace, [Put(name, content)])

    def delete_record(self, workspace: str, name: str) -> str:
        ws, norm = validate_workspace(workspace), validate_name(name)
        with self._writing():
            current = self._load_workspace(ws)
            self._record(current, norm)  # NoSuchRecord unless it is there
            return self._commit_records(current, preview_workspace_changes(current,
                                                                           [Delete(norm)]))

    def rename_record(self, workspace: str, old: str, new: str) -> str:
        """`mv old.md new.md` in the mount: one commit, replacing `new` if it exists."""
        ws, src, dst = validate_workspace(workspace), validate_name(old), validate_name(new)
        with self._writing():
            current = self._load_workspace(ws)
            self._record(current, src)  # NoSuchRecord unless it is there
            if src == dst:
                return current.revision
            changes: list[Change] = [Delete(src), Put(dst, current.records[src])]
            return self._commit_records(current, preview_workspace_changes(current, changes))

    def replace_global(self, content: str) -> str:
        """One online write of global.md: one commit, last writer wins."""
        with self._writing():
            return self._commit_global(self._load_global(), content)

    def _apply(self, workspace: str, changes: Sequence[Change]) -> str:
        ws = validate_workspace(workspace)
        with self._writing():
            current = self._load_workspace(ws)
            return self._commit_records(current, preview_workspace_changes(current, changes))

    def _writing(self) -> AbstractContextManager[None]:
        self.ops.makedirs(self.root)
        return flocked(self._lock, exclusive=True)

    @staticmethod
    def _preview_target(workspace: str, preview: WorkspacePreview) -> str:
        """The workspace a commit of `preview` goes to (it must be the preview's own)."""
        ws = validate_workspace(workspace)
        if preview.workspace != ws:
            raise InvalidRecord(f"preview is for workspace {preview.workspace!r}, not {ws!r}",
                                "preview against the workspace you commit to")
        return ws

    @staticmethod
    def _checked(current: WorkspaceGeneration, preview: WorkspacePreview,
                 expected: str) -> WorkspacePreview:
        """`preview` replayed, if `current` is still the revision it was made against (and
        the one the caller expects); StaleRevision if not."""
        MemoryStore._check_expected(f"workspace {current.workspace!r}", current.revision,
                                    expected)
        if preview.before_revision != current.revision:
            raise StaleRevision("the preview was computed against another revision",
                                "preview again against the current generation")
        return MemoryStore._replay(current, preview)

    @staticmethod
    def _check_expected(what: str, actual: str, expected: str) -> None:
        if actual != expected:
            raise StaleRevision(
                f"{what} is at revision {actual[:16]}, not the expected {str(expected)[:16]}",
                "read the current generation, preview again and retry; stale changes are never "
                "merged")

    @staticmethod
    def _replay(current: WorkspaceGeneration, preview: WorkspacePreview) -> WorkspacePreview:
        """Re-run the generation algorithm on the preview's records, so a hand-made or altered
        preview cannot commit content the algorithm would not produce."""
        records: dict[str, str] = {}
        for name, content in preview.records.items():
            norm = validate_name(name)
            if norm != name or normalize_record_content(content) != content or name in records:
                raise InvalidRecord(f"record {name!r} in the preview is not normalized",
                                    "build previews with preview_workspace_changes()")
            records[name] = content
        again = finish_workspace_preview(current, records)
        if again.revision != preview.revision or again.index != preview.index:
            raise InvalidRecord("the preview's revision does not match its records",
                                "build previews with preview_workspace_changes()")
        return again

    def _commit_records(self, current: WorkspaceGeneration, preview: WorkspacePreview) -> str:
        if preview.no_change:
            return current.revision
        files = {f"{n}{RECORD_SUFFIX}": c.encode() for n, c in preview.records.items()}
        files[INDEX_FILE] = preview.index.encode()
        manifest = {"records": {n: content_hash(c) for n, c in preview.records.items()},
                    "workspace": current.workspace, "scope": "workspace"}
        self._swap_in(self._ws_link(current.workspace), self._ws_gens(current.workspace),
                      current.seq, preview.revision, current.revision, files, manifest)
        return preview.revision

    def _commit_global(self, current: GlobalGeneration, content: str) -> str:
        planned = preview_global_change(current, content)
        if planned.no_change:
            return current.revision
        self._swap_in(self._global_link, self._global_gens, current.seq, planned.revision,
                      current.revision, {GLOBAL_FILE: planned.content.encode()},
                      {"scope": "global"}, link_file=GLOBAL_FILE)
        return planned.revision

    def _swap_in(self, link: Path, gens: Path, cur_seq: int, revision: str, parent: str,
                 files: dict[str, bytes], manifest: dict, link_file: str | None = None) -> str:
        """Build, fsync, name and swap in one generation. Caller holds the exclusive lock."""
        ops = self.ops
        ops.makedirs(gens)
        ops.makedirs(link.parent)
        self._remove_leftovers(link.parent, gens, cur_seq)
        seq = cur_seq + 1
        name = f"{seq:08d}-{revision[:16]}"
        tmp = gens / f".tmp-{secrets.token_hex(6)}"
        ops.mkdir(tmp)
        for fname, data in files.items():
            ops.write_file(tmp / fname, data)
        manifest = dict(manifest, format=1, seq=seq, revision=revision, parent=parent,
                        created=datetime.now(UTC).isoformat(timespec="seconds"))
        ops.write_file(tmp / MANIFEST, canonical_json(manifest))
        crash_point("files-written")
        ops.fsync_dir(tmp)
        crash_point("generation-synced")
        ops.rename(tmp, gens / name)
        ops.fsync_dir(gens)
        crash_point("generation-named")
        target = os.path.relpath(gens / name, link.parent)
        if link_file:
            target = os.path.join(target, link_file)
        tmp_link = link.parent / f".{link.name}.swap-{secrets.token_hex(6)}"
        ops.symlink(target, tmp_link)
        crash_point("link-created")
        ops.rename(tmp_link, link)
        crash_point("swapped")
        ops.fsync_dir(link.parent)
        crash_point("swap-synced")
        return name

    def _remove_leftovers(self, link_dir: Path, gens: Path, cur_seq: int) -> None:
        """Drop what a commit that died before its swap left behind (never the current)."""
        for entry in os.listdir(gens):
            m = _GEN_RE.match(entry)
            if entry.startswith((".tmp-", HIDDEN)) or (m and int(m.group(1)) > cur_seq):
                self.ops.remove_tree(gens / entry)
        for entry in os.listdir(link_dir):
            if entry.startswith(".") and ".swap-" in entry:
                self.ops.remove_tree(link_dir / entry)

    # ---- retention (memfs.memory.retention; applied by memfs gc) ---------------------------
    def _scope(self, ws: str | None) -> tuple[Path, Path, bool]:
        """(link, generations directory, is Global) of a scope."""
        if ws is None:
            return self._global_link, self._global_gens, True
        return self._ws_link(ws), self._ws_gens(ws), False

    def _rows(self, gens: Path, cur_seq: int) -> list[tuple[str, GenRow]]:
        """The named generations up to the current one whose manifest reads, oldest first
        (one that does not read is never pruned: fsck names it)."""
        out = []
        for name in sorted(os.listdir(gens)) if gens.is_dir() else ():
            m = _GEN_RE.match(name)
            if not m or int(m.group(1)) > cur_seq:
                continue
            try:
                manifest = json.loads((gens / name / MANIFEST).read_bytes())
                out.append((name, GenRow(int(m.group(1)), str(manifest["revision"]),
                                         str(manifest["created"]))))
            except (OSError, ValueError, KeyError):
                continue
        return out

    def prune(self, workspace: str | None, keep: Callable[[Sequence[GenRow], int],
                                                          dict[int, str]],
              why: str, now_ns: int, dry_run: bool = False) -> list[Dropped]:
        """Drop the generations `keep` does not name (memfs.memory.prune)."""
        ws = None if workspace is None else validate_workspace(workspace)
        return prune.prune(self, ws, keep, why, now_ns, dry_run)

    def dropped(self, workspace: str | None) -> list[Dropped]:
        """The scope's tombstones, oldest drop first (a file a crash cut short is skipped:
        its generations are still there, the prune that wrote it had not hidden any)."""
        ws = None if workspace is None else validate_workspace(workspace)
        d = self._scope(ws)[1] / DROPPED_DIR
        out: list[Dropped] = []
        for name in sorted(os.listdir(d)) if d.is_dir() else ():
            if name.startswith("."):
                continue
            try:
                out += [Dropped.from_json(x) for x in json.loads((d / name).read_bytes())]
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def generation_at(self, workspace: str | None, revision: str
                      ) -> GlobalGeneration | WorkspaceGeneration:
        """The kept generation with `revision` (a prefix of 8 or more hex digits will do);
        RevisionDropped if retention dropped it, NoSuchRevision if the scope never had it."""
        ws = None if workspace is None else validate_workspace(workspace)
        return self._read_locked(lambda: self._generation_at(ws, revision))

    def _generation_at(self, ws: str | None, revision: str
                       ) -> GlobalGeneration | WorkspaceGeneration:
        rev = check_revision_text(revision)
        empty = empty_global() if ws is None else empty_workspace(ws)
        if empty.revision.startswith(rev):
            return empty
        link, gens, is_global = self._scope(ws)
        current = self._current_gen_name(link, is_global)
        rows = [] if current is None else self._rows(gens, int(current[:8]))
        hits = {r.revision: name for name, r in rows if r.revision.startswith(rev)}
        scope = "Global" if ws is None else f"workspace {ws!r}"
        if len(hits) > 1:
            raise NoSuchRevision(f"{rev} names {len(hits)} revisions of {scope} memory",
                                 "give more of the revision (`memfs memory log` lists them)")
        if hits:
            (name,) = hits.values()
            return (self._load_global_gen(name) if ws is None
                    else self._load_workspace_gen(ws, name))
        return _absent(scope, rev, self.dropped(ws))

    def check(self) -> list[str]:
        """fsck of memory: every scope's link names a generation, and every generation up to
        it reads and matches its revision (a hidden or newer leftover is no problem)."""
        problems = []
        for ws in [None, *self.workspaces()]:
            link, gens, is_global = self._scope(ws)
            scope = "Global" if ws is None else f"workspace {ws!r}"
            try:
                current = self._current_gen_name(link, is_global)
                if current is None:
                    continue
                if not (gens / current).is_dir():
                    problems.append(f"{scope} memory: the current generation {current} is "
                                    "missing")
                    continue
                for name in sorted(os.listdir(gens)):
                    m = _GEN_RE.match(name)
                    if m and int(m.group(1)) <= int(current[:8]):
                        self._check_gen(ws, gens, name)
            except (MemoryDamaged, OSError, UnicodeDecodeError) as exc:
                problems.append(f"{scope} memory: {exc}")
        return problems

    def _check_gen(self, ws: str | None, gens: Path, name: str) -> None:
        """Read one generation; one a prune took away while it was read (the daemon's GC
        runs beside fsck, without this lock) is no problem: it is gone, not damaged."""
        try:
            self._load_global_gen(name) if ws is None else self._load_workspace_gen(ws, name)
        except (MemoryDamaged, OSError, UnicodeDecodeError):
            if (gens / name).exists():
                raise


def check_revision_text(revision: str) -> str:
    rev = revision.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{8,64}", rev):
        raise InvalidRecord(f"{revision!r} is not a memory revision",
                            "give 8 to 64 hex digits of one (`memfs memory log` lists them)")
    return rev


def _absent(scope: str, rev: str, dropped: Sequence[Dropped]) -> NoReturn:
    """The refusal for a revision no kept generation has: dropped (its tombstone) or never."""
    for d in reversed(dropped):
        if d.revision.startswith(rev):
            raise dropped_refusal(scope, d)
    raise NoSuchRevision(f"{scope} memory has no revision {rev}",
                         "`memfs memory log` lists the kept generations and their revisions")
