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
import sys
import tempfile
from pathlib import Path

from benchmarks.daemon import BenchMount
from benchmarks.registry import WORKLOADS, Context, Measure, Workload

# Modules that register workloads; another group (e.g. "reconcile") adds its module here.
MODULES = ("benchmarks.fs_workloads", "benchmarks.reconcile_workloads", "benchmarks.gc_workloads")


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
            "load average (1/5/15 min) at start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def run_side(side: str, wl: list[Workload], d: Path, scratch: Path, scale: float,
             pid: int | None) -> dict[str, Measure]:
    out = {}
    for w in wl:
        ctx = Context(dir=d, scratch=scratch, scale=scale, daemon_pid=pid, side=side)
        out[w.name] = m = w.fn(ctx)
        print(f"  {side:6} {w.name:22} {m.rate:12,.1f} {w.unit}  ({m.seconds:.2f}s)",
              file=sys.stderr, flush=True)
    return out


def cell(m: Measure | None, unit: str) -> str:
    return f"{m.rate:,.1f} {unit} ({m.seconds:.2f} s)" if m else "-"


def table(wl: list[Workload], native: dict[str, Measure], mem: dict[str, Measure]) -> str:
    rows = ["| workload | native | memfs | memfs/native | target |", "|---|---|---|---|---|"]
    for w in wl:
        n, m = native.get(w.name), mem.get(w.name)
        ratio = m.rate / n.rate if n and m and n.rate else None
        target = ""
        if w.min_ratio is not None:
            verdict = "-" if ratio is None else ("met" if ratio >= w.min_ratio else "MISSED")
            target = f"≥ {w.min_ratio:g}: {verdict}"
        shown = "-" if ratio is None else f"{ratio:.2f}"
        rows.append(f"| {w.describe} | {cell(n, w.unit)} | {cell(m, w.unit)} | {shown} | "
                    f"{target} |")
        for key, value in (m.extra if m else {}).items():
            ok = ("< 200: " + ("met" if value < 200 else "MISSED")) if key == "daemon peak RSS MiB" \
                else ""
            rows.append(f"| {key} | | {value:,.1f} | | {ok} |")
        for key, value in (n.extra if n else {}).items():
            rows.append(f"| {key} | {value:,.1f} | | | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="*", help="workload names or groups (default: fs)")
    p.add_argument("--quick", action="store_true", help="a tenth of the sizes, for a smoke run")
    p.add_argument("--base", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the native dir and the store root go (same filesystem)")
    p.add_argument("--commit-interval", help="passed to memfs mount")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--native-only", action="store_true", help="skip the memfs side")
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
        native = run_side("native", wl, native_dir, scratch, scale, None)
        mem: dict[str, Measure] = {}
        if not args.native_only:
            extra = ["--commit-interval", args.commit_interval] if args.commit_interval else []
            with BenchMount(base / "root", base / "mnt", base / "daemon.log", extra) as bm:
                d = bm.mnt / "bench"
                d.mkdir()
                assert bm.proc is not None
                mem = run_side("memfs", wl, d, scratch, scale, bm.proc.pid)
        if args.json:
            print(json.dumps({"machine": info, "quick": args.quick, "results": {
                w.name: {side: vars(r[w.name]) | {"rate": r[w.name].rate, "unit": w.unit}
                         for side, r in (("native", native), ("memfs", mem)) if w.name in r}
                for w in wl}}, indent=2))
        else:
            print(", ".join(f"{k}: {v}" for k, v in info.items()))
            print(table(wl, native, mem))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
