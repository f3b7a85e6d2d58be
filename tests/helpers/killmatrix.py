"""The kill matrix's shared steps: a daemon that kills itself at a crash point, reading the
journal while it is down, and the bytes each side holds."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import xxhash

from helpers.backing_mount import xattr
from memfs.store.journal import EvidenceRecord, Journal

OLD, NEW, SHELL, OTHER = b"old\n", b"workspace draft\n", b"shell edit\n", b"neither outcome\n"
def h(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def read(p: Path) -> bytes | None:
    """A file's bytes, or None if it is absent."""
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None


def start_crashing(mount_factory, monkeypatch: pytest.MonkeyPatch, point: str):
    """A daemon with MEMFS_CRASH_AT=point in its environment only (the CLI runs without)."""
    with monkeypatch.context() as env:
        env.setenv("MEMFS_CRASH_AT", point)
        m = mount_factory()
    m.require_real()
    return m


def pending(m, mount: str = "work") -> list:
    """The journal's pending write-ahead intents, read straight from the store (as a restart
    reads them)."""
    j = Journal(m.root / "store.db")
    try:
        return j.pending_intents(mount)
    finally:
        j.close()


def evidence(m, path: str) -> EvidenceRecord | None:
    """P's digest for a path (its mode left out: these cells are about content)."""
    j = Journal(m.root / "store.db")
    try:
        rec = j.evidence("work", path)
        return None if rec is None else EvidenceRecord(rec.digest)
    finally:
        j.close()


def killed(m) -> None:
    """The daemon died by its own SIGKILL at the crash point; drop the dead mount."""
    assert m.proc is not None
    try:
        rc = m.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon never reached its crash point; log:\n{m.log_text()}")
    assert rc == -signal.SIGKILL, f"the daemon exited {rc}, not by SIGKILL"
    m.kill()


def first_pass_done(m) -> bool:
    return m.status()["backing"]["work"]["last_pass"] is not None


def switch(m, branch: str) -> None:
    assert m.cli_json("branch", "switch", branch)["branch"] == branch


def state_of(m, path: str) -> tuple[str, str | None] | None:
    """A path's state as the mount shows it: its xattrs, or for an entry the mount does not
    list, .memfs/status (workspace-deleted entries and conflicts)."""
    p = m.work / path
    if os.path.lexists(p):
        return xattr(p), xattr(p, "user.memfs.conflict")
    st = m.status()["backing"]["work"]
    if path in st["workspace_deleted"]:
        return ("workspace-deleted", None)
    return ("conflict", None) if path in st["conflicts"] else None
