"""A 1 GiB file streams through memfs: written and read back exactly, daemon memory bounded."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.mount

GIB = 1 << 30
CHUNK = 1 << 20
RSS_LIMIT = 200 << 20


def proc_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


class RssWatch(threading.Thread):
    """Samples the daemon's VmRSS; VmHWM (the kernel's own peak) is read at the end too."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, proc_kib(self.pid, "VmRSS"))


def test_one_gib_file_round_trip_with_bounded_rss(mounted) -> None:
    mounted.require_real()
    path: Path = mounted.work / "big.bin"
    base = bytearray(os.urandom(CHUNK))
    watch = RssWatch(mounted.proc.pid)
    watch.start()
    written = hashlib.sha256()
    try:
        with open(path, "wb", buffering=0) as f:
            for i in range(GIB // CHUNK):
                base[:8] = i.to_bytes(8, "little")  # every chunk distinct: no dedup shortcut
                f.write(base)
                written.update(base)
            os.fsync(f.fileno())
        assert os.stat(path).st_size == GIB
        read = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            # Drop the (clean) cached pages so the read really comes from the daemon.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while block := f.read(CHUNK):
                read.update(block)
    finally:
        watch.stop.set()
        watch.join()
    hwm = proc_kib(mounted.proc.pid, "VmHWM")
    assert read.hexdigest() == written.hexdigest()
    assert max(hwm, watch.peak) < RSS_LIMIT, f"daemon peak RSS {max(hwm, watch.peak) >> 20} MiB"
    # pytest keeps the last runs' tmp dirs: don't leave a GiB of blobs behind.
    mounted.umount()
    shutil.rmtree(mounted.root)
