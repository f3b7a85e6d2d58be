"""The `gc` group: garbage collection of a store with 100k files and 1,000 commits.

The memfs side builds its own store (in a child process, so the build's memory is not the
daemon's), keeping nothing by age, mounts it, and runs `memfs gc` through the daemon while a
reader opens and reads files through the mount; the same reader runs first with no GC for
the baseline. Reported: the GC's time and what it dropped, the daemon's RSS before and its peak
during the GC, and the reader's latency (p50 / p99 / max per open+read+close, each one FUSE
lookup, open, read and release) before and during the GC. The rate is the reader's reads/s
during the GC; the native side runs the same reader over a plain tree of the same shape.
With --store postgresql the same store is built and collected in a database of its own
(memfs.store.pg.gc).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.daemon import REPO, BenchMount, memfs
from benchmarks.fs_workloads import RssPeak, vm_kib
from benchmarks.registry import Context, Measure, workload

PG_URL_ENV = "MEMFS_BENCH_GC_URL"  # the PostgreSQL side's database for this workload (run_pg)

BUILD = r"""
import random, sys, trio
from pathlib import Path
from memfs.store import open_store
from memfs.store.retention import Policy
from memfs.store.trees import DIR, FILE
from memfs.workspace.workspace import Workspace
root, top, files_per_dir, commits = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = open_store(root, url=sys.argv[5] if len(sys.argv) > 5 else None)
if store.kind != "sqlite":
    assert store.claim("main").writable
ws = Workspace(store)
work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
nodes = []
for a in range(top):
    da = ws.create(work, f"a{a:02d}".encode(), DIR, 0o755, 0, 0)
    for b in range(top):
        db = ws.create(da, f"d{b:02d}".encode(), DIR, 0o755, 0, 0)
        for c in range(files_per_dir):
            f = ws.create(db, f"f{c:02d}".encode(), FILE, 0o644, 0, 0)
            ws.write(f, 0, f"{a}/{b}/{c}\n".encode() * 20)
            nodes.append(f)
trio.run(ws.commit)
rng = random.Random(1)
for _ in range(commits - 1):  # each commit rewrites 5 files: the old bytes become history
    for f in rng.sample(nodes, 5):
        ws.truncate(f, 0)
        ws.write(f, 0, rng.randbytes(2000))
    trio.run(ws.commit)
ws.store.set_policy(Policy(keep_all=0, hourly=0, daily=0))
if store.kind != "sqlite":
    store.release("main")
ws.store.close()
"""


def _shape(ctx: Context) -> tuple[int, int, int]:
    """(top, files per directory, commits): 32 x 32 x 100 = 102,400 files, 1,000 commits."""
    if ctx.scale < 1:
        return 10, 100, 100
    return 32, 100, 1000


def _paths(base: Path, top: int, per: int) -> list[Path]:
    return [base / f"a{a:02d}" / f"d{b:02d}" / f"f{c:02d}"
            for a in range(top) for b in range(top) for c in range(per)]


class Reader(threading.Thread):
    """open + read + close of files in random order, each timed, until stopped."""

    def __init__(self, paths: list[Path], seed: int) -> None:
        super().__init__(daemon=True)
        self.paths = paths[:]
        random.Random(seed).shuffle(self.paths)
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.seconds = 0.0  # how long it read (it stops early once every path was read)

    def run(self) -> None:
        start = time.perf_counter()
        i = 0
        while not self.stop.is_set() and i < len(self.paths):
            t = time.perf_counter()
            with open(self.paths[i], "rb") as f:
                f.read()
            self.latencies.append(time.perf_counter() - t)
            i += 1
        self.seconds = time.perf_counter() - start


def _figures(lat: list[float], when: str) -> dict[str, float]:
    if not lat:
        return {}
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    return {f"reader p50 ms {when}": q[49] * 1e3, f"reader p99 ms {when}": q[98] * 1e3,
            f"reader max ms {when}": max(lat) * 1e3}


@workload("gc", "gc", "reads/s")
def gc_100k(ctx: Context) -> Measure:
    """GC of 100k files / 1,000 commits beside a reader (rate: the reader's, during GC)"""
    top, per, commits = _shape(ctx)
    if ctx.side == "native":
        tree = ctx.scratch / "gc-native"
        for p in _paths(tree, top, per):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x" * 2000)
        r = Reader(_paths(tree, top, per), seed=2)
        r.start()
        time.sleep(5)
        r.stop.set()
        r.join()
        return Measure(len(r.latencies), r.seconds, _figures(r.latencies, "native"))
    base = ctx.scratch / ("gc-memfs-pg" if ctx.side == "memfs-pg" else "gc-memfs")
    root = base / "root"
    url = [os.environ[PG_URL_ENV]] if ctx.side == "memfs-pg" else []  # a database of its own
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", BUILD, str(root), str(top), str(per), str(commits),
                    *url], check=True, cwd=REPO)
    build_seconds = time.perf_counter() - t
    with BenchMount(root, base / "mnt", base / "daemon.log", []) as bm:
        assert bm.proc is not None
        paths = _paths(bm.mnt / "work", top, per)
        before = Reader(paths[: len(paths) // 2], seed=3)
        before.start()
        time.sleep(5)
        before.stop.set()
        before.join()
        rss_before = vm_kib(bm.proc.pid, "VmRSS") / 1024
        during = Reader(paths[len(paths) // 2:], seed=4)
        watch = RssPeak(bm.proc.pid)
        watch.start()
        during.start()
        t = time.perf_counter()
        out = subprocess.run(memfs(root, "gc", "--json"), capture_output=True, text=True,
                             cwd=REPO, check=True)
        seconds = time.perf_counter() - t
        during.stop.set()
        during.join()
        watch.done.set()
        watch.join()
        report = json.loads(out.stdout)
    extra = {"gc seconds": seconds, "gc commits dropped": report["commits_dropped"],
             "gc MiB given back": report["returned"] / (1 << 20),
             "gc objects freed": report["objects_freed"],
             "gc chunks freed": report["chunks_freed"],
             "gc MiB of rows freed": (report["chunk_bytes_freed"]
                                      + report["object_bytes_freed"]) / (1 << 20),
             "build seconds": build_seconds,
             "daemon RSS MiB before GC": rss_before,
             "daemon peak RSS MiB during GC": watch.peak_kib / 1024,
             "reader reads/s before GC": len(before.latencies) / max(before.seconds, 1e-9),
             **_figures(before.latencies, "before GC"), **_figures(during.latencies, "during GC")}
    return Measure(len(during.latencies), max(during.seconds, 1e-9), extra)
