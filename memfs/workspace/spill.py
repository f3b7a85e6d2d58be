"""Where the changed pieces of a file that left the tree go: a scratch file on the store's disk.

A file unlinked (or replaced by a rename, or by an undo) while a process still has it open is
never committed again, but the process may go on writing it: sort, databases and editors keep
temporary files this way. Its changed pieces would otherwise stay in the daemon's memory for as
long as the handle lives. Past SPILL_AT bytes they move to an anonymous file under
`<root>/staging/` (O_TMPFILE where the filesystem has it, else created and unlinked at once), at
the piece's own offset; the file's space is the store filesystem's, so statfs and the write
admission count it. It goes when the node is forgotten, and with the process in any case.

FileData reads a piece from memory first, then from here, then from the committed chunks.

Threads: `write_pieces` runs in a worker thread (Workspace.spill); `read`, `trim` and `close`
on the loop. Each piece offset is written by one spill at a time (the loop serializes them).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import trio

from memfs.durable import mkdir_durable
from memfs.store.chunks import CHUNK_SIZE

SPILL_AT = 4 << 20  # changed bytes of a detached file kept in memory before they spill
STAGING = "staging"


class Spill:
    def __init__(self, root: Path) -> None:
        d = root / STAGING
        mkdir_durable(d)
        try:
            self.fd = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except (OSError, AttributeError):
            fd, name = tempfile.mkstemp(dir=d, prefix="spill-")
            os.unlink(name)
            self.fd = fd
        self.present: dict[int, int] = {}  # piece -> bytes of it held here

    def write_pieces(self, pieces: dict[int, bytes]) -> None:
        """Worker thread: write pieces at their offsets (the caller then marks them present)."""
        for idx, data in pieces.items():
            view, pos = memoryview(data), idx * CHUNK_SIZE
            while view:
                n = os.pwrite(self.fd, view, pos)
                view, pos = view[n:], pos + n

    def read(self, idx: int, start: int, length: int) -> bytes:
        have = self.present.get(idx, 0)
        length = max(0, min(length, have - start))
        return os.pread(self.fd, length, idx * CHUNK_SIZE + start) if length else b""

    def trim(self, last: int, keep: int | None) -> None:
        """A truncate: pieces after `last` go; `last` keeps `keep` bytes (None: all)."""
        for idx in [i for i in self.present if i > last]:
            del self.present[idx]
        if keep is not None and last in self.present:
            self.present[last] = min(self.present[last], keep)
        end = max((i * CHUNK_SIZE + n for i, n in self.present.items()), default=0)
        os.ftruncate(self.fd, end)  # give the disk back

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.present = {}


async def spill_pieces(f, root: Path) -> None:
    """Move a detached file's changed pieces to its scratch file; a piece changed while they
    were written stays in memory, being newer (loop; the writes in a worker thread)."""
    fd = f.data
    if fd.spill is None:
        fd.spill = await trio.to_thread.run_sync(Spill, root)
    pieces = {i: bytes(b) for i, b in fd.dirty.items()}
    gens = dict(fd.gen)
    await trio.to_thread.run_sync(fd.spill.write_pieces, pieces)
    if f.data is not fd or fd.spill.fd < 0:
        return  # truncated to a new FileData or forgotten meanwhile
    for i, data in pieces.items():
        if i in fd.dirty and fd.gen.get(i) == gens.get(i):
            del fd.dirty[i]
            del fd.gen[i]
            fd.spill.present[i] = len(data)
