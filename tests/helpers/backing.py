"""In-process backing directories: a real store, a real directory, Backing driven in trio with
no FUSE mount (for what does not depend on the kernel)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memfs.backing import Backing, Binding
from memfs.store import Store
from memfs.workspace.workspace import Workspace


def open_backing(root: Path) -> tuple[Workspace, Backing]:
    ws = Workspace(Store.open(root), 0.0)
    return ws, Backing(ws)


async def attached(tmp_path: Path, files: dict[str, str], **binding: object,
                   ) -> tuple[Workspace, Backing, Path]:
    """A store at tmp_path/root with `work` attached to tmp_path/disk holding `files`."""
    disk = tmp_path / "disk"
    disk.mkdir()
    for name, text in files.items():
        (disk / name).write_text(text)
    ws, b = open_backing(tmp_path / "root")
    await b.attach(Binding("work", str(disk), **binding))  # type: ignore[arg-type]
    return ws, b, disk


def close(ws: Workspace, b: Backing) -> None:
    b.close()
    ws.store.close()


@contextmanager
def held_by_another_thread(lock: threading.Lock | threading.RLock,
                           seconds: float) -> Iterator[None]:
    """`lock` taken by another thread for `seconds` (as a worker holds a lock across an
    fsync); yields once it is held."""
    taken = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            time.sleep(seconds)

    t = threading.Thread(target=hold)
    t.start()
    taken.wait()
    try:
        yield
    finally:
        t.join()
