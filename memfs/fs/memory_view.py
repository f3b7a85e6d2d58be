"""`.memfs/memory/`: agent memory as files, each close of a changed record one commit.

    .memfs/memory/global.md                       Global memory
    .memfs/memory/workspaces/<mount>/<name>.md    a Workspace record
    .memfs/memory/workspaces/<mount>/index.md     generated, read-only

A name ending in `.md` (not starting with '.') is a record and must be a valid record name;
any other name is a scratch file kept in memory only, so an editor's write-to-temp-then-
rename save works: the rename onto `<name>.md` (or, beside it, `global.md`) is the commit.
A changed record is committed when it is flushed (close). Nothing is lost silently:

- what can be judged from the bytes alone (a control character, bytes that are not UTF-8,
  more bytes than the cap) is refused by the write() that brings it, with EINVAL, so
  `printf 'a\x01b' > x.md` fails in the shell, which ignores close();
- the rest (an empty record, the normalized text over the cap) is refused at close with
  EINVAL, and again at every close of the file until its last descriptor is released
  (`touch` closes a dup first), then the refused bytes are dropped. A refusal changes
  nothing in memory.

Everything here is read fresh (no kernel caching): consolidation may commit behind the
kernel's back. Trio thread only (the FUSE handlers).
"""

from __future__ import annotations

import errno
import logging
import re
import stat
from dataclasses import dataclass, field

import trio

from memfs.errors import MemfsError
from memfs.workspace.agent_memory import (
    INDEX_NAME,
    MAX_GLOBAL_BYTES,
    MAX_RECORD_BYTES,
    RECORD_SUFFIX,
    MemoryStore,
    validate_name,
)

log = logging.getLogger("memfs.fs.memory")

# Bytes no record may hold, found without decoding: C0 controls other than tab, newline,
# CR, FF and VT (the last three normalization may remove), DEL, and C1 controls (U+0080 to
# U+009F, which UTF-8 writes as C2 80..C2 9F).
CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")


class MemError(Exception):
    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(code, reason)
        self.errno = code
        self.reason = reason


@dataclass(eq=False)
class MemDir:
    id: int
    kind: str  # "top" | "list" | "ws"
    ws: str | None = None
    scratch: dict[bytes, MemFile] = field(default_factory=dict)


@dataclass(eq=False)
class MemFile:
    id: int
    ws: str | None  # None: global.md
    name: bytes
    scratch: bool = False
    pending: bytearray | None = None  # bytes written and not yet committed
    changed: bool = False

    @property
    def record(self) -> str:
        return self.name[: -len(RECORD_SUFFIX)].decode("utf-8", "surrogateescape")

    @property
    def is_index(self) -> bool:
        return self.ws is not None and self.name == (INDEX_NAME + RECORD_SUFFIX).encode()


def _ws(d: MemDir) -> str:
    """A workspace directory's workspace (only `ws` directories have one)."""
    assert d.ws is not None, d.kind
    return d.ws


def is_record_name(name: bytes) -> bool:
    return name.endswith(RECORD_SUFFIX.encode()) and not name.startswith(b".")


class MemoryView:
    def __init__(self, store: MemoryStore, mounts, alloc) -> None:
        self.store = store
        self._mounts = mounts  # () -> list[str]: the store mounts (workspaces)
        self._alloc = alloc
        self.nodes: dict[int, MemDir | MemFile] = {}
        self.top = self._add(MemDir(alloc(), "top"))
        self.list = self._add(MemDir(alloc(), "list"))
        self.global_file = self._add(MemFile(alloc(), None, b"global.md"))
        self._dirs: dict[str, MemDir] = {}
        self._files: dict[tuple[str, bytes], MemFile] = {}

    def _add(self, node):
        self.nodes[node.id] = node
        return node

    # -- names ---------------------------------------------------------------------
    def workspaces(self) -> list[str]:
        return sorted(set(self._mounts()) | set(self.store.workspaces()))

    def _ws_dir(self, ws: str) -> MemDir:
        d = self._dirs.get(ws)
        if d is None:
            d = self._dirs[ws] = self._add(MemDir(self._alloc(), "ws", ws))
        return d

    def _record_file(self, ws: str, name: bytes) -> MemFile:
        f = self._files.get((ws, name))
        if f is None:
            f = self._files[(ws, name)] = self._add(MemFile(self._alloc(), ws, name))
        return f

    def _record_names(self, ws: str) -> list[bytes]:
        gen = self.store.workspace_generation(ws)
        names = [(n + RECORD_SUFFIX).encode() for n in gen.records]
        return sorted(names + [(INDEX_NAME + RECORD_SUFFIX).encode()])

    def listing(self, d: MemDir) -> list[tuple[bytes, MemDir | MemFile]]:
        if d.kind == "top":
            return sorted([(b"global.md", self.global_file), (b"workspaces", self.list),
                           *d.scratch.items()])
        if d.kind == "list":
            return [(w.encode(), self._ws_dir(w)) for w in self.workspaces()]
        ws = _ws(d)
        out = [(n, self._record_file(ws, n)) for n in self._record_names(ws)]
        out += sorted(d.scratch.items())
        return sorted(out)

    def lookup(self, d: MemDir, name: bytes) -> MemDir | MemFile:
        if name in d.scratch:
            return d.scratch[name]
        for n, node in self.listing(d):
            if n == name:
                return node
        pending = self._files.get((d.ws, name)) if d.ws else None
        if pending is not None and pending.pending is not None:
            return pending  # created, not yet committed
        raise MemError(errno.ENOENT)

    # -- attributes and content ------------------------------------------------------
    def content(self, f: MemFile) -> bytes:
        if f.pending is not None:
            return bytes(f.pending)
        if f.ws is None:
            return self.store.global_generation().content.encode()
        gen = self.store.workspace_generation(f.ws)
        if f.is_index:
            return gen.index.encode()
        text = gen.records.get(f.record)
        return b"" if text is None else text.encode()

    def mode(self, node: MemDir | MemFile) -> int:
        if isinstance(node, MemDir):
            return stat.S_IFDIR | (0o555 if node.kind == "list" else 0o755)  # top: editors'
            # temp files beside global.md
        return stat.S_IFREG | (0o444 if node.is_index else 0o644)

    # -- changes -----------------------------------------------------------------------
    def create(self, d: MemDir, name: bytes) -> MemFile:
        if d.kind == "list" or (d.kind == "top" and is_record_name(name)):
            raise MemError(errno.EPERM)  # workspaces come from mounts; Global is global.md
        if name in d.scratch or any(n == name for n, _ in self.listing(d)):
            raise MemError(errno.EEXIST)
        if is_record_name(name):
            if name == (INDEX_NAME + RECORD_SUFFIX).encode():
                raise MemError(errno.EPERM)
            self._check_record_name(name)
            f = self._record_file(_ws(d), name)
            f.pending, f.changed = bytearray(), True
            return f
        f = self._add(MemFile(self._alloc(), d.ws, name, scratch=True, pending=bytearray()))
        d.scratch[name] = f
        return f

    def _check_record_name(self, name: bytes) -> None:
        try:
            validate_name(name[: -len(RECORD_SUFFIX)].decode("utf-8"))
        except (MemfsError, UnicodeDecodeError):
            raise MemError(errno.EINVAL) from None

    def open_for_write(self, f: MemFile, truncate: bool) -> None:
        if f.is_index:
            raise MemError(errno.EPERM)
        if f.pending is None:
            f.pending = bytearray() if truncate else bytearray(self.content(f))
        elif truncate:
            del f.pending[:]
        if truncate:
            f.changed = True

    def write(self, f: MemFile, off: int, data: bytes) -> int:
        if f.pending is None:
            self.open_for_write(f, False)
        buf = bytearray(f.pending or b"")  # open_for_write gave it one
        if len(buf) < off:
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(data)] = data
        self._judge(f, buf, "write")
        f.pending, f.changed = buf, True
        return len(data)

    def truncate(self, f: MemFile, size: int) -> None:
        if f.pending is None:
            self.open_for_write(f, False)
        buf = bytearray(f.pending or b"")  # open_for_write gave it one
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(bytes(size - len(buf)))
        self._judge(f, buf, "truncate")
        f.pending, f.changed = buf, True

    def _judge(self, f: MemFile, buf: bytearray, op: str) -> None:
        """Refuse, before they land, bytes the commit at close would surely refuse. A scratch
        file is judged when it is renamed onto a record name."""
        if f.scratch:
            return
        cap = MAX_GLOBAL_BYTES if f.ws is None else MAX_RECORD_BYTES
        why = None
        if len(buf) > cap:
            why = f"{len(buf)} bytes, over the {cap}-byte cap"
        elif (bad := CONTROL_BYTES.search(buf)) is not None:
            why = f"control character {bytes(bad.group()).decode('latin-1')!r} at byte {bad.start()}"
        else:
            try:
                bytes(buf).decode("utf-8")
            except UnicodeDecodeError as exc:
                if not (exc.reason == "unexpected end of data" and exc.end == len(buf)):
                    why = f"not UTF-8 at byte {exc.start} ({exc.reason})"  # a cut tail may
                    # still be completed by the next write
        if why is not None:
            log.warning("memory %s refused at %s(): %s", self._label(f), op, why)
            raise MemError(errno.EINVAL, why)

    def _label(self, f: MemFile) -> str:
        return "global.md" if f.ws is None else f"{f.ws}/{f.name.decode(errors='replace')}"

    async def flush(self, f: MemFile) -> None:
        """Commit a changed record (one MemoryStore commit). A refusal changes nothing and
        keeps the refused bytes until the last descriptor is released, so every close of
        the file reports it."""
        if f.scratch or not f.changed or f.pending is None:
            return
        text = bytes(f.pending)
        try:
            await self._commit(f.ws, f.record if f.ws else None, text)
        except MemError as exc:
            log.warning("memory %s refused at close: %s", self._label(f), exc.reason)
            raise
        if f.pending == text:  # nothing written meanwhile (another descriptor)
            f.pending, f.changed = None, False

    def released(self, f: MemFile) -> None:
        """The last descriptor of `f` is closed: what was not committed (refused, or only
        read) is dropped, so the file shows memory's content again."""
        if not f.scratch:
            f.pending, f.changed = None, False

    async def _commit(self, ws: str | None, record: str | None, data: bytes) -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemError(errno.EINVAL, f"not UTF-8 ({exc.reason})") from None
        store = self.store
        if ws is None:
            def call() -> str:
                return store.replace_global(text)
        else:
            assert record is not None  # a workspace's file is a record

            def call() -> str:
                return store.put_record(ws, record, text)
        try:
            await trio.to_thread.run_sync(call)
        except MemfsError as exc:  # a refused record (EINVAL), or the store's server's
            raise MemError(getattr(exc, "errno", None) or errno.EINVAL, str(exc)) from None

    async def unlink(self, d: MemDir, name: bytes) -> None:
        if name in d.scratch:
            del d.scratch[name]
            return
        if d.kind != "ws":
            raise MemError(errno.EPERM)
        f = self.lookup(d, name)
        if not isinstance(f, MemFile) or f.is_index:
            raise MemError(errno.EPERM)
        if f.record in self.store.workspace_generation(_ws(d)).records:
            await trio.to_thread.run_sync(self.store.delete_record, _ws(d), f.record)
        f.pending, f.changed = None, False

    async def rename(self, od: MemDir, oname: bytes, nd: MemDir, nname: bytes) -> None:
        if od.kind == nd.kind == "top":
            return await self._rename_top(od, oname, nname)
        if od.kind != "ws" or nd.kind != "ws" or od.ws != nd.ws:
            raise MemError(errno.EXDEV if od.kind == nd.kind == "ws" else errno.EPERM)
        src = self.lookup(od, oname)
        if not isinstance(src, MemFile) or src.is_index or nname == b"index.md":
            raise MemError(errno.EPERM)
        data = self.content(src)
        if is_record_name(nname):
            self._check_record_name(nname)
            target = nname[: -len(RECORD_SUFFIX)].decode()
            if not src.scratch and src.pending is None:
                await trio.to_thread.run_sync(self.store.rename_record, _ws(od), src.record,
                                              target)
            else:
                await self._commit(nd.ws, target, data)
                if src.scratch:
                    od.scratch.pop(oname, None)
                else:
                    src.pending, src.changed = None, False
                    await self.unlink(od, oname)
            return
        # Onto a scratch name (an editor's backup): the record leaves, its bytes stay here.
        if not src.scratch:
            await self.unlink(od, oname)
        else:
            od.scratch.pop(oname, None)
        moved = self._add(MemFile(self._alloc(), nd.ws, nname, scratch=True,
                                  pending=bytearray(data)))
        nd.scratch[nname] = moved

    async def _rename_top(self, d: MemDir, oname: bytes, nname: bytes) -> None:
        """An editor's save of Global: its temp file renamed onto `global.md` is one commit.
        Global itself cannot leave (as `rm global.md` cannot): renaming it away is EPERM, so
        an editor falls back to copying its backup."""
        src = d.scratch.get(oname)
        if src is None or nname == b"workspaces" or (is_record_name(nname)
                                                     and nname != b"global.md"):
            raise MemError(errno.EPERM)
        if nname == b"global.md":
            await self._commit(None, None, self.content(src))
            d.scratch.pop(oname, None)
            return
        d.scratch.pop(oname)
        d.scratch.pop(nname, None)
        src.name = nname
        d.scratch[nname] = src
