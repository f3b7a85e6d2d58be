"""The workload registry: each workload is a named function of a Context returning a Measure."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Context:
    """Where a workload runs and what it may use.

    `dir` is this side's directory on the filesystem under test, shared by the workloads of
    one run in order (read-4k reads what write-4k wrote); `scratch` is a native
    directory for inputs (tarballs, generated trees) that must not be timed; `daemon_pid` is the
    memfs daemon's pid (None on the native side); `scale` shrinks counts under --quick.
    """

    dir: Path
    scratch: Path
    scale: float
    daemon_pid: int | None
    side: str
    drop_caches: bool = True  # may a workload drop the kernel's caches (root only)
    store_root: Path | None = None  # the memfs side's store root (None: native)

    def chunk_bytes(self) -> int | None:
        """Bytes the memfs side's store keeps for chunks: its packs (the embedded store) or
        its chunk rows' bytes (PostgreSQL); None on the native side."""
        if self.store_root is None:
            return None
        if (self.store_root / "packs").is_dir():
            return sum(p.stat().st_size for p in (self.store_root / "packs").glob("*.pack"))
        from memfs.store.backend import read_location

        loc = read_location(self.store_root)
        if loc is None:
            return None
        import psycopg

        with psycopg.connect(loc.url) as conn:
            return conn.execute("SELECT COALESCE(SUM(octet_length(data)), 0) FROM chunks"
                                ).fetchone()[0]

    def forget_inodes(self) -> None:
        """Drop the kernel's dentry and inode caches (not the page cache of what stays)."""
        if self.drop_caches and os.geteuid() == 0:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("2\n")

    def cold(self) -> None:
        """Drop the kernel's page, dentry and inode caches (a cold start for both sides); a
        no-op without root, which the run's header says."""
        if self.drop_caches and os.geteuid() == 0:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")

    def n(self, full: int) -> int:
        return max(1, int(full * self.scale))


@dataclass
class Measure:
    """`amount` units of work done in `seconds`; `extra` holds side figures (e.g. peak RSS)."""

    amount: float
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)  # FUSE requests, memfs side only

    @property
    def rate(self) -> float:
        return self.amount / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Workload:
    name: str
    group: str
    unit: str
    fn: Callable[[Context], Measure]
    min_ratio: float | None  # target: memfs rate / native rate must be at least this
    describe: str


WORKLOADS: dict[str, Workload] = {}


class RequestCount:
    """FUSE requests the daemon answered in a workload's last `timed()` section, the one its
    Measure reports (set-up, and another workload run first as a fallback, are not counted).
    run_side installs `source` for the memfs side only."""

    source: Callable[[], dict[str, int]] | None = None
    counted: dict[str, int] = {}

    @classmethod
    def start(cls) -> dict[str, int]:
        cls.counted = {}
        return cls.source() if cls.source else {}

    @classmethod
    def stop(cls, before: dict[str, int]) -> None:
        if cls.source is None:
            return
        for op, n in cls.source().items():
            if n > before.get(op, 0):
                cls.counted[op] = cls.counted.get(op, 0) + n - before.get(op, 0)


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn` took; the daemon's requests meanwhile go to RequestCount.counted."""
    before = RequestCount.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    RequestCount.stop(before)
    return seconds


def workload(name: str, group: str, unit: str, min_ratio: float | None = None
             ) -> Callable[[Callable[[Context], Measure]], Callable[[Context], Measure]]:
    """Register a workload. min_ratio 0.25 reads "within 4x native" (rates, higher is better)."""

    def deco(fn: Callable[[Context], Measure]) -> Callable[[Context], Measure]:
        doc = (fn.__doc__ or name).strip().splitlines()[0]
        WORKLOADS[name] = Workload(name, group, unit, fn, min_ratio, doc)
        return fn

    return deco
