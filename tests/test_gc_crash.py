"""`memfs gc` killed at every step, and cut by a power cut that keeps only what was synced:
each leaves a store that opens, passes fsck, reads every chunk back under its digest and keeps
byte for byte every commit (and its intents) the policy keeps; a second run finishes the job.
The kill matrix runs on both backends: the embedded store's steps, and a PostgreSQL store's
(memfs.store.pg.gc: no packs, two points inside a transaction before its COMMIT).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from crashmodel.replay import Policy, append_mark, crash_image, read_log, resolve, snapshot
from helpers import gcstore
from helpers.mount import REPO, memfs_cmd

from memfs.store.backend import Location, read_location, record_location
from memfs.store.gc import CRASH_ENV, CRASH_POINTS
from memfs.store.packs import store_usage
from memfs.store.pg.gc import PG_CRASH_POINTS

MiB = 1 << 20


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, gcstore.Expected]:
    root = tmp_path_factory.mktemp("gcbase") / "root"
    return root, gcstore.build(root)


def gc(root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(memfs_cmd(root, "gc", "--json"), capture_output=True, text=True,
                          cwd=REPO, timeout=120, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def pg_base(tmp_path_factory: pytest.TempPathFactory, pg_cluster
            ) -> tuple[Path, gcstore.Expected]:
    """The same store in PostgreSQL (each test runs on a copy of its database)."""
    root = tmp_path_factory.mktemp("gcbase-pg") / "root"
    url = pg_cluster.new_database()
    record_location(root, Location("postgresql", url, "host-gc"))
    return root, gcstore.build(root, url)


def _copy(request: pytest.FixtureRequest, backend: str, dest: Path
          ) -> tuple[Path, gcstore.Expected, Callable[[Path], int]]:
    """A copy of the backend's base store at `dest`, and how to measure what it takes."""
    if backend == "sqlite":
        src, expected = request.getfixturevalue("base")
        shutil.copytree(src, dest)
        return dest, expected, store_usage
    src, expected = request.getfixturevalue("pg_base")
    shutil.copytree(src, dest)
    loc = read_location(src)
    assert loc is not None
    url = request.getfixturevalue("pg_cluster").clone_database(loc.url)
    (dest / "store.json").unlink()  # the copy's record names the copy's database
    record_location(dest, Location("postgresql", url, loc.host))
    return dest, expected, _chunk_bytes


def _chunk_bytes(root: Path) -> int:
    from memfs.store.backend import open_store

    store = open_store(root, create=False)
    try:
        return store._query("SELECT COALESCE(SUM(octet_length(data)), 0) FROM chunks")[0][0]
    finally:
        store.close()


@pytest.mark.parametrize(("backend", "point"), [("sqlite", p) for p in CRASH_POINTS] +
                         [("postgresql", p) for p in PG_CRASH_POINTS])
def test_sigkill_at_every_step(request: pytest.FixtureRequest, tmp_path: Path, backend: str,
                               point: str) -> None:
    root, expected, usage = _copy(request, backend, tmp_path / "root")
    before = usage(root)
    res = gc(root, {CRASH_ENV: point})
    assert res.returncode == -signal.SIGKILL, f"never reached {point}: {res.stdout}{res.stderr}"
    assert gcstore.check(root, expected) == []
    res = gc(root)  # the next run finishes what the killed one began
    assert res.returncode == 0, res.stderr
    assert gcstore.check(root, expected) == []
    assert usage(root) <= before - 3 * MiB, "the space was not given back"
    assert gc(root).returncode == 0 and gcstore.check(root, expected) == []


def test_a_power_cut_anywhere_in_a_gc_run(base, shim: Path, tmp_path: Path,  # noqa: F811
                                          scratch: Path) -> None:  # noqa: F811
    """The GC under the crashlog shim (pack rewrite, row moves, removals, tombstones), then
    power cuts before and after every sync and at random points, under adversarial mixes of
    what was not synced."""
    failures = cut_failures(base, shim, tmp_path, scratch, skip="")
    assert not failures, failures[:3]


@pytest.mark.parametrize(("skip", "expect"), [
    (".pack", "differ"),  # the rewritten pack's bytes never synced: rows name lost bytes
    ("/packs", "differ"),  # the new pack's name never synced: rows name a missing file
])
def test_the_model_catches_a_gc_that_skips_a_sync(base, shim: Path, tmp_path: Path,  # noqa: F811
                                                  scratch: Path, skip: str,  # noqa: F811
                                                  expect: str) -> None:
    failures = cut_failures(base, shim, tmp_path, scratch, skip=skip, stop_after=1)
    assert failures, f"with {skip} syncs skipped, no cut broke the store"


def cut_failures(base, shim: Path, tmp_path: Path, scratch: Path, *, skip: str,  # noqa: F811
                 stop_after: int = 10**9) -> list[str]:
    src, expected = base
    root, log = tmp_path / "root", tmp_path / "crash.log"
    shutil.copytree(src, root)
    start = snapshot(root)
    env = dict(os.environ, LD_PRELOAD=str(shim), MEMFS_CRASHLOG=str(log),
               MEMFS_CRASHLOG_DIR=str(root), MEMFS_CRASHLOG_SKIP_SYNC=skip,
               PYTHONPATH=str(REPO))
    append_mark(log, "process gc")
    res = subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), "gc"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    events, kinds = resolve(read_log(log), root, start)
    names = [e for e in events if e.kind == "ns" and e.idx >= 0]
    assert any(e.op[0] == "unlink" for e in names), "the run removed no pack"
    end = max(e.idx for e in events) + 1
    syncs = sorted({c for e in events if e.kind == "sync" for c in (e.idx, e.idx + 1)})
    rng = random.Random(11)
    plan = [(c, Policy("drop", "drop")) for c in syncs]
    for n, c in enumerate(sorted(rng.sample(range(end + 1), min(40, end + 1))) + [end]):
        plan += [(c, Policy("random", "random", n)), (c, Policy("random", "drop", n, grain=512)),
                 (c, Policy("keep", "prefix", n)), (c, Policy("drop", "random", n))]
    out = []
    for cut, policy in plan:
        img = scratch / "img"
        shutil.rmtree(img, ignore_errors=True)
        img.mkdir(parents=True)
        crash_image(events, kinds, cut, policy, img)
        problems = gcstore.check(img, expected)
        if problems:
            out.append(f"cut {cut}/{end} ({policy}): {problems[:2]}")
            if len(out) >= stop_after:
                break
    return out
