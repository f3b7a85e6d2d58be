"""Conflict copies: a recorded conflict's disk side, kept by digest under <root>/conflicts/.

Owns the directory `<store root>/conflicts/` and nothing in memory. `keep` runs in a pass's
worker thread (it fsyncs); `files` runs on the loop to list `.memfs/conflicts/` and stats the
store's own filesystem (one `exists()` per conflict: allowed loop-side I/O, see
docs/architecture.md). Which paths are in conflict is branch intent's (memfs.backing.intent).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from memfs.reconcile.intent import IntentTable


class ConflictCopies:
    def __init__(self, store_root: Path) -> None:
        self.dir = Path(store_root) / "conflicts"

    def has(self, digest: str) -> bool:
        return (self.dir / digest).exists()

    def keep(self, digest: str, data: bytes) -> None:
        """Durably: the file and its directory fsynced before the name appears for good (it
        is the only copy of disk's bytes once a path sync or a forced materialize replaces
        them). Worker thread."""
        self.dir.mkdir(exist_ok=True)
        tmp = self.dir / f".{digest}.tmp"
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
        os.replace(tmp, self.dir / digest)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def files(self, intents: Mapping[str, IntentTable]) -> dict[str, Path | None]:
        """'mount/path' -> the file holding the conflict's recorded disk side (None: absent)."""
        out: dict[str, Path | None] = {}
        for mount, table in intents.items():
            for path in table:
                c = table.get(path).conflict
                if c is None:
                    continue
                blob = self.dir / c.disk if c.disk else None
                out[f"{mount}/{path}"] = blob if blob is not None and blob.exists() else None
        return out


__all__ = ["ConflictCopies"]
