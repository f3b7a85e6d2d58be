"""`scripts/bench [WORKLOAD|GROUP ...] [--quick] [--json]`: native vs memfs, one table.

Each workload runs first on a native directory, then on a memfs mount whose store root lives
on the same filesystem, so the ratio compares like with like. Rates are "higher is better";
the ratio column is memfs rate / native rate, checked against the issue's targets.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.daemon import BenchMount
from benchmarks.registry import WORKLOADS, Context, Measure, RequestCount, Workload

# Modules that register workloads; another group (e.g. "reconcile") adds its module here.
MODULES = ("benchmarks.fs_workloads", "benchmarks.agent_workloads",
           "benchmarks.reconcile_workloads", "benchmarks.gc_workloads")


def load() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


def select(names: list[str]) -> list[Workload]:
    groups = {w.group for w in WORKLOADS.values()}
    chosen: list[Workload] = []
    for name in names or ["fs"]:
        if name in groups:
            chosen += [w for w in WORKLOADS.values() if w.group == name]
        elif name in WORKLOADS:
            chosen.append(WORKLOADS[name])
        else:
            sys.exit(f"bench: unknown workload or group {name!r}; known: "
                     f"{', '.join(sorted(groups | set(WORKLOADS)))}")
    return list({w.name: w for w in chosen}.values())


def fs_type(path: Path) -> str:
    """The type of the mount holding `path` (from /proc/self/mounts: ext4, not "ext2/ext3")."""
    real, best, kind = os.path.realpath(path), "", "?"
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, point, fstype = line.split()[:3]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, kind = point, fstype
    return kind


def machine(base: Path) -> dict[str, str]:
    fstype = fs_type(base)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.machine())
    return {"nproc": str(os.cpu_count()), "kernel": platform.release(), "cpu": cpu,
            "filesystem": f"{fstype} ({base})", "python": platform.python_version(),
            "load average (1/5/15 min) at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "cold workloads": "kernel caches dropped" if os.geteuid() == 0
            else "warm (not root: caches cannot be dropped)"}


def run_side(side: str, wl: list[Workload], d: Path, scratch: Path, scale: float,
             pid: int | None, requests: Callable[[], dict[str, int]] | None = None,
             forget_between: bool = False, store_root: Path | None = None) -> dict[str, Measure]:
    """Run the workloads in order on one side; with `requests`, each Measure also gets the
    FUSE requests the daemon answered in its timed section (see RequestCount). With
    `forget_between`, the kernel's dentry and inode caches are dropped before each workload
    (see --compare)."""
    out = {}
    RequestCount.source = requests
    for w in wl:
        ctx = Context(dir=d, scratch=scratch, scale=scale, daemon_pid=pid, side=side,
                      store_root=store_root)
        if forget_between:
            ctx.forget_inodes()
        RequestCount.counted = {}
        try:
            out[w.name] = m = w.fn(ctx)
        except (OSError, subprocess.CalledProcessError) as exc:
            if side != "compare":
                raise
            # Another filesystem's limits are its own (passthrough_hp holds a descriptor per
            # inode and runs out of them on the largest trees): the row says so, the run goes on.
            print(f"  {side:7} {w.name:22} failed: {exc}", file=sys.stderr, flush=True)
            continue
        m.requests = dict(RequestCount.counted)
        print(f"  {side:7} {w.name:22} {m.rate:12,.1f} {w.unit}  ({m.seconds:.2f}s)",
              file=sys.stderr, flush=True)
    return out


def request_counter(root: Path) -> Callable[[], dict[str, int]]:
    """The running daemon's request counts, read over its control socket."""
    from memfs.control import call

    def counts() -> dict[str, int]:
        result = call(root, "requests")
        assert isinstance(result, dict)
        return {str(k): int(v) for k, v in result.items()}

    return counts


def per_unit(m: Measure) -> str:
    """FUSE requests per unit of work, with the three most frequent operations."""
    total = sum(m.requests.values())
    if not total:
        return "-"
    top = sorted(m.requests.items(), key=lambda kv: -kv[1])[:3]
    return f"{total / m.amount:.1f} ({', '.join(f'{op} {n / m.amount:.1f}' for op, n in top)})"


def cell(m: Measure | None, unit: str) -> str:
    return f"{m.rate:,.1f} {unit} ({m.seconds:.2f} s)" if m else "-"


def ratio(a: Measure | None, b: Measure | None) -> float | None:
    return a.rate / b.rate if a and b and b.rate else None


def shown(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def table(wl: list[Workload], native: dict[str, Measure], mem: dict[str, Measure],
          other: dict[str, Measure] | None = None, pg: bool = False) -> str:
    """One row per workload; with `other` (--compare DIR) a third column and memfs/other;
    with `pg` (--store postgresql) `other` is memfs on PostgreSQL, and the last ratio is
    PostgreSQL/SQLite."""
    head = "| workload | native | memfs |"
    rule = "|---|---|---|"
    if other is not None:
        head += " memfs on PostgreSQL |" if pg else " compared |"
        rule += "---|"
    head += " memfs/native |" + ("" if other is None else
                                 " PostgreSQL/SQLite |" if pg else " memfs/compared |")
    head += " target | requests per unit (top 3) |"
    rule += "---|" * (4 if other is not None else 3)
    rows = [head, rule]
    for w in wl:
        n, m = native.get(w.name), mem.get(w.name)
        r = ratio(m, n)
        target = ""
        if w.min_ratio is not None:
            verdict = "-" if r is None else ("met" if r >= w.min_ratio else "MISSED")
            target = f"≥ {w.min_ratio:.2g}: {verdict}"
        row = f"| {w.describe} | {cell(n, w.unit)} | {cell(m, w.unit)} |"
        if other is not None:
            row += f" {cell(other.get(w.name), w.unit)} |"
        row += f" {shown(r)} |"
        if other is not None:
            o = other.get(w.name)
            row += f" {shown(ratio(o, m) if pg else ratio(m, o))} |"
        row += f" {target} | {per_unit(m) if m else '-'} |"
        rows.append(row)
        pad = " |" * (3 if other is not None else 1)  # the ratio columns (and compared)
        o = other.get(w.name) if other is not None else None
        keys = list(m.extra if m else {}) + [k for k in (o.extra if o else {})
                                             if not m or k not in m.extra]
        for key in keys:
            value = m.extra.get(key) if m else None
            ok = (" < 200: " + ("met" if value < 200 else "MISSED")) \
                if key == "daemon peak RSS MiB" and value is not None else ""
            mine = "" if value is None else f"{value:,.1f}"
            if other is None:
                rows.append(f"| {key} | | {mine} |{pad}{ok} | |")
                continue
            theirs = o.extra.get(key) if o else None  # the PostgreSQL (or compared) side's
            rows.append(f"| {key} | | {mine} | {'' if theirs is None else f'{theirs:,.1f}'} |"
                        f"{pad[2:]}{ok} | |")
        for key, value in (n.extra if n else {}).items():
            rows.append(f"| {key} | {value:,.1f} | |{pad} | |")
    return "\n".join(rows)


def run_pg(store: str, wl: list[Workload], base: Path, scratch: Path, scale: float,
           extra: list[str], forget: bool) -> dict[str, Measure]:
    """The memfs side again, on a PostgreSQL store: at URL, or a throwaway loopback server
    (tests/helpers/pg.py, as the tests start it) for "postgresql"."""
    skipped = [w.name for w in wl if w.group == "gc"]
    if skipped and store != "postgresql":  # it needs a database of its own to build and drop
        print(f"  memfs-pg {', '.join(skipped)}: runs on the throwaway server only "
              "(--store postgresql)", file=sys.stderr, flush=True)
        wl = [w for w in wl if w.group != "gc"]
    cluster = None
    url = store
    if store == "postgresql":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from helpers.pg import PgCluster

        cluster = PgCluster()
        cluster.start()
        url = cluster.new_database()
        from benchmarks.gc_workloads import PG_URL_ENV

        os.environ[PG_URL_ENV] = cluster.new_database()
    try:
        with BenchMount(base / "pgroot", base / "pgmnt", base / "pgdaemon.log", extra,
                        store=url) as bm:
            d = bm.mnt / "bench"
            d.mkdir()
            assert bm.proc is not None
            return run_side("memfs-pg", wl, d, scratch, scale, bm.proc.pid,
                            request_counter(bm.root), forget_between=forget,
                            store_root=bm.root)
    finally:
        if cluster is not None:
            cluster.destroy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="*", help="workload names or groups (default: fs)")
    p.add_argument("--quick", action="store_true", help="a tenth of the sizes, for a smoke run")
    p.add_argument("--base", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the native dir and the store root go (same filesystem)")
    p.add_argument("--commit-interval", help="passed to memfs mount")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--native-only", action="store_true", help="skip the memfs side")
    p.add_argument("--compare", type=Path, metavar="DIR",
                   help="also run every workload in DIR (e.g. a C passthrough mount), a third "
                        "column; every side then starts each workload with the kernel's dentry "
                        "and inode caches dropped (a passthrough holds a descriptor per cached "
                        "inode and would run out)")
    p.add_argument("--store", metavar="postgresql|URL",
                   help="also run the memfs side on a PostgreSQL store (a throwaway server "
                        "started here, or the database at URL), a third column and the "
                        "PostgreSQL/SQLite ratio")
    args = p.parse_args(argv)
    load()
    wl = select(args.workloads)
    scale = 0.1 if args.quick else 1.0
    info = machine(args.base)
    base = Path(tempfile.mkdtemp(prefix="memfs-bench-", dir=args.base))
    try:
        scratch, native_dir = base / "scratch", base / "native"
        scratch.mkdir()
        native_dir.mkdir()
        forget = args.compare is not None
        native = run_side("native", wl, native_dir, scratch, scale, None, forget_between=forget)
        other: dict[str, Measure] | None = None
        if args.compare is not None:
            cmp_dir = Path(tempfile.mkdtemp(prefix="memfs-bench-", dir=args.compare))
            try:
                other = run_side("compare", wl, cmp_dir, scratch, scale, None,
                                 forget_between=True)
            finally:
                shutil.rmtree(cmp_dir, ignore_errors=True)
        mem: dict[str, Measure] = {}
        if not args.native_only:
            extra = ["--commit-interval", args.commit_interval] if args.commit_interval else []
            with BenchMount(base / "root", base / "mnt", base / "daemon.log", extra) as bm:
                d = bm.mnt / "bench"
                d.mkdir()
                assert bm.proc is not None
                mem = run_side("memfs", wl, d, scratch, scale, bm.proc.pid,
                               request_counter(bm.root), forget_between=forget,
                               store_root=bm.root)
        if args.store and not args.native_only:
            other = run_pg(args.store, wl, base, scratch, scale, extra, forget)
        if args.json:
            print(json.dumps({"machine": info, "quick": args.quick, "results": {
                w.name: {side: vars(r[w.name]) | {"rate": r[w.name].rate, "unit": w.unit}
                         for side, r in (("native", native), ("memfs", mem),
                                         ("postgresql" if args.store else "compare", other or {}))
                if w.name in r}
                for w in wl}}, indent=2))
        else:
            print(", ".join(f"{k}: {v}" for k, v in info.items()))
            print(table(wl, native, mem, other, pg=bool(args.store)))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
