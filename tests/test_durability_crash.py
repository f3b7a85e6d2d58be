"""Durability: whatever fsync acknowledged survives a SIGKILL of the daemon.

A SIGKILL leaves the page cache and the disk intact, so these tests prove the *ordering* (the
daemon answers fsync only after its commit reached the database and blobs with fsync); they
cannot prove the disk honoured fsync on power loss. That part rests on SQLite's
synchronous=FULL and on the store fsyncing blobs and directories.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.store import store_check
from helpers.tree import file_digest, read_all

pytestmark = pytest.mark.mount

WRITER = Path(__file__).parent / "helpers" / "writer.py"


def test_fsynced_file_survives_sigkill(mounted) -> None:
    mounted.require_real()
    payload = random.Random(1).randbytes(3 << 20)
    path = mounted.work / "precious.bin"
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    # Renamed and dir-fsynced: the name is promised too.
    (mounted.work / "sub").mkdir()
    with open(mounted.work / "sub" / "tmp", "wb") as f:
        f.write(b"renamed content")
        f.flush()
        os.fsync(f.fileno())
    os.rename(mounted.work / "sub" / "tmp", mounted.work / "sub" / "final")
    dfd = os.open(mounted.work / "sub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)

    mounted.kill()
    store_check(mounted.root)
    mounted.remount()

    assert file_digest(path) == hashlib.sha256(payload).hexdigest()
    assert os.path.getsize(path) == len(payload)
    assert (mounted.work / "sub" / "final").read_bytes() == b"renamed content"
    assert not (mounted.work / "sub" / "tmp").exists()


def test_pending_count_drops_after_fsync(mounted) -> None:
    """status.pending counts what is not yet durable; an fsync leaves nothing pending."""
    mounted.require_real()
    with open(mounted.work / "f", "wb") as f:
        f.write(b"x" * 1000)
        f.flush()
        os.fsync(f.fileno())
        assert mounted.status()["pending"] == 0


def expected_from_log(log: Path) -> tuple[dict[str, set[str | None]], dict[str, tuple[int, str]]]:
    """Parse the writer's promises: exact contents per path, and durable prefixes."""
    exact: dict[str, set[str | None]] = {}
    prefix: dict[str, tuple[int, str]] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue  # a line cut by the writer's own death
        if parts[0] == "durable":
            exact[parts[1]] = {parts[2]}
        elif parts[0] == "pending":
            exact.setdefault(parts[1], {None}).add(parts[2])
        elif parts[0] == "prefix" and len(parts) == 4:
            prefix[parts[1]] = (int(parts[2]), parts[3])
    return exact, prefix


def check_promises(log: Path) -> int:
    exact, prefix = expected_from_log(log)
    for path, accepted in exact.items():
        got = file_digest(path) if os.path.exists(path) else None
        assert got in accepted, f"{path}: content {got} is none of the acknowledged {accepted}"
    for path, (length, digest) in prefix.items():
        with open(path, "rb") as f:
            head = f.read(length)
        assert len(head) == length, f"{path}: {len(head)} bytes, fdatasync promised {length}"
        assert hashlib.sha256(head).hexdigest() == digest, f"{path}: durable prefix changed"
    return len(exact) + len(prefix)


def test_sigkill_at_random_moments_keeps_every_fsync(mounted, tmp_path: Path) -> None:
    mounted.require_real()
    kills = int(os.environ.get("MEMFS_CRASH_KILLS", "20"))
    rnd = random.Random(int(os.environ.get("MEMFS_CRASH_SEED", "20261130")))
    log = tmp_path / "promises.log"  # outside the mount
    promised = 0
    for n in range(kills):
        writers = []  # two at once: the daemon interleaves their requests
        for w in ("a", "b"):
            target = mounted.work / f"it{n}{w}"
            target.mkdir()
            writers.append(subprocess.Popen(
                [sys.executable, str(WRITER), str(target), str(log), str(2 * n + (w == "b"))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            time.sleep(rnd.uniform(0.1, 1.5))
            mounted.kill()
        finally:
            for writer in writers:
                writer.kill()
                writer.wait()
        if n % 2 or n == kills - 1:  # fsck costs a second; every other kill and the last
            store_check(mounted.root)
        mounted.remount()
        read_all(mounted.work)  # every listed file reads to the end (no missing blob)
        promised = check_promises(log)
    assert promised > kills, f"only {promised} promises in {kills} runs: workload too slow?"


def test_fsync_of_one_file_commits_everything_before_it(mounted) -> None:
    """The commit an fsync forces covers the whole store, not only the fsynced file."""
    mounted.require_real()
    (mounted.work / "unsynced.txt").write_bytes(b"written, never fsynced")
    (mounted.work / "gone.txt").write_bytes(b"x")
    os.unlink(mounted.work / "gone.txt")
    fd = os.open(mounted.work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # fsync of a directory, unrelated to the file above
    finally:
        os.close(fd)
    mounted.kill()
    mounted.remount()
    assert (mounted.work / "unsynced.txt").read_bytes() == b"written, never fsynced"
    assert not (mounted.work / "gone.txt").exists()


@pytest.mark.parametrize("interval_ms", [100, 1000])
def test_group_commit_within_interval(mount_factory, memfs_root, interval_ms: int) -> None:
    """Without fsync, a write is durable once the group commit ran: within the interval
    (plus slack for a loaded machine), and not before it when the interval is long."""
    m = mount_factory(root=memfs_root, extra_args=("--commit-interval", str(interval_ms)))
    m.require_real()
    while m.status()["pending"] != 0:  # let the fixture's mkdir commit: start from clean
        time.sleep(0.01)
    (m.work / "lazy.txt").write_bytes(b"no fsync")
    start = time.monotonic()
    while m.status()["pending"] != 0:
        assert time.monotonic() - start < interval_ms / 1000 + 2.0, "group commit overdue"
        time.sleep(0.01)
    waited = time.monotonic() - start
    if interval_ms >= 1000:
        assert waited > 0.3 * interval_ms / 1000, f"committed after {waited:.2f}s, not batched"
    m.kill()
    m.remount()
    assert (m.work / "lazy.txt").read_bytes() == b"no fsync"
