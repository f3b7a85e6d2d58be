"""Fixtures for tests that run a real memfs mount (or, with MEMFS_TEST_NATIVE=1, a plain dir).

`mounted` yields a MemfsMount (see helpers/mount.py): .mnt, .root, .proc, .work, .cli(*args),
.cli_json(*args), .status(), .kill(), .umount(), .remount(). Teardown always unmounts and ends
the daemon; the daemon's log is attached to the report of a failing test.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.backing_mount import backed  # noqa: F401 - fixtures, registered here
from helpers.committer import sc, scan_receipts_for_bodies  # noqa: F401
from helpers.crashfixtures import scratch, shim  # noqa: F401
from helpers.mount import (
    NATIVE_ENV,
    MemfsMount,
    NativeDir,
    force_unmount,
    fuse_missing_reason,
    native_mode,
)
from helpers.pg import PgCluster, pg_missing
from helpers.require import REQUIRE_ENV, require_tool, tools_required

from memfs.store.backend import STORE_ENV, Location, record_location

MountFactory = Callable[..., MemfsMount | NativeDir]

# The store and fs contract suites: every test in these modules runs once on each backend
# (the embedded store and PostgreSQL), with the same assertions.
BOTH_BACKENDS = frozenset({
    "test_fs_edges", "test_fs_shell", "test_fs_git", "test_fs_tar", "test_fs_links",
    "test_fs_history", "test_fs_operations", "test_fs_model", "test_fs_bigfile",
    "test_fs_history_tools", "test_durability_restart", "test_durability_crash",
    "test_history_workspace", "test_cli_smoke", "test_backing_fulldisk",
    "test_lifecycle_small_changes",
})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    embedded_only = metafunc.definition.get_closest_marker("embedded_only") is not None
    if "store_backend" in metafunc.fixturenames and module in BOTH_BACKENDS \
            and not embedded_only:
        metafunc.parametrize("store_backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def store_backend(request: pytest.FixtureRequest) -> str:
    """"sqlite" (the embedded store), or "postgresql" in the BOTH_BACKENDS modules' second run."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def own_pg_cluster() -> Iterator[PgCluster]:
    """A started server of the test's own, for a test that stops, kills or restarts it (the
    session's is shared); destroyed after the test. Request it after `mount_factory`, so it
    is torn down first, as a server lost under the mounts is."""
    require_tool(pg_missing())
    cluster = PgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL server for the session (tests/helpers/pg.py)."""
    require_tool(pg_missing())
    cluster = PgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh, empty database of the session's server."""
    return pg_cluster.new_database()


@pytest.fixture
def store_env(request: pytest.FixtureRequest, store_backend: str,
              monkeypatch: pytest.MonkeyPatch) -> str:
    """For tests that open stores themselves: $MEMFS_STORE names a fresh database on the
    PostgreSQL run (a new root then uses it), and is unset on the embedded one."""
    if store_backend == "postgresql":
        monkeypatch.setenv(STORE_ENV, request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv(STORE_ENV, raising=False)
    return store_backend


def prepare_root(request: pytest.FixtureRequest, root: Path, backend: str) -> None:
    """A new root on the PostgreSQL run gets a database of its own (its store.json)."""
    if backend != "postgresql" or (root / "store.json").exists() or (root / "store.db").exists():
        return
    url = request.getfixturevalue("pg_cluster").new_database()
    record_location(root, Location("postgresql", url, os.urandom(8).hex()))


MOUNTING = ("mount_factory", "mounted", "backed")  # fixtures that start a real daemon


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that mounts carries the `mount` mark (`-m "not mount"` runs the rest), by
    the fixtures it uses, so a new mounting test cannot be left unmarked; a module that starts
    daemons by other means marks itself (pytestmark)."""
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in MOUNTING):
            item.add_marker(pytest.mark.mount)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    rep = yield
    _no_quiet_skips(rep)
    if rep.failed:
        for m in getattr(item, "memfs_mounts", []):
            rep.sections.append((f"memfs daemon log ({m.log})", m.log_text()))
    return rep


def _no_quiet_skips(rep: pytest.TestReport) -> None:
    """Under MEMFS_REQUIRE_TOOLS=1 (scripts/test) a skip is a failure, whoever raised it, so the
    closing summary shows 0 skipped: a tool's absence goes through require_tool, and only the
    plain-directory mode (MEMFS_TEST_NATIVE) may skip. An xfail is not a skip."""
    if not (rep.skipped and tools_required()) or hasattr(rep, "wasxfail"):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    if NATIVE_ENV in reason:
        return
    rep.outcome = "failed"
    rep.longrepr = (f"skipped under {REQUIRE_ENV}=1 (scripts/test runs every test): {reason}")


@pytest.fixture
def memfs_root(tmp_path: Path) -> Path:
    """An empty directory for a store root (the daemon's `init` fills it)."""
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.fixture
def mount_factory(request: pytest.FixtureRequest, tmp_path: Path,
                  store_backend: str) -> Iterator[MountFactory]:
    """make(root=None, name="mnt", extra_args=(), env=None) -> a started mount (env: extra
    environment for the daemon only, such as a test shim); all closed at teardown."""
    made: list[MemfsMount | NativeDir] = []
    request.node.memfs_mounts = made

    def make(root: Path | None = None, name: str = "mnt", extra_args: tuple[str, ...] = (),
             env: dict[str, str] | None = None) -> MemfsMount | NativeDir:
        if native_mode():
            m: MemfsMount | NativeDir = NativeDir(tmp_path / f"native-{name}")
            made.append(m)
            return m
        require_tool(fuse_missing_reason())
        if root is None:
            root = tmp_path / f"root-{name}"
        root.mkdir(parents=True, exist_ok=True)
        prepare_root(request, root, store_backend)
        m = MemfsMount(root, tmp_path / name, tmp_path / f"{name}-daemon.log", extra_args, env)
        made.append(m)
        m.start()
        return m

    try:
        yield make
    finally:
        for m in reversed(made):
            m.close()


@pytest.fixture
def mounted(mount_factory: MountFactory, memfs_root: Path) -> MemfsMount | NativeDir:
    """A running memfs mount of a fresh store, with MNT/work created."""
    return mount_factory(root=memfs_root)


@pytest.fixture
def native_dir(tmp_path: Path) -> Path:
    """A plain directory on the test machine's own filesystem, the reference for comparisons."""
    d = tmp_path / "native"
    d.mkdir()
    return d


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs, so a store root on it can really run out of space."""
    if native_mode():
        pytest.skip("MEMFS_TEST_NATIVE=1: ENOSPC needs a real daemon on a small filesystem")
    d = tmp_path / "small"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(d)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        require_tool(f"cannot mount a small tmpfs (needs root): {res.stderr.strip()}")
    try:
        yield d
    finally:
        force_unmount(tmp_path / "small-mnt")
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
