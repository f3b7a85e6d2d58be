"""Run a real memfs daemon for a test: start, wait, CLI, SIGKILL, remount, and always clean up.

A FUSE mount left behind by a test hangs every later test that touches it, so `close()` never
raises and always ends with the mountpoint unmounted and the daemon gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.require import fuse_missing, require_tool

REPO = Path(__file__).resolve().parents[2]
NATIVE_ENV = "MEMFS_TEST_NATIVE"
MOUNT_TIMEOUT = 20.0


def native_mode() -> bool:
    """MEMFS_TEST_NATIVE=1: fs tests run against a plain directory (to develop test logic)."""
    return os.environ.get(NATIVE_ENV) == "1"


def fuse_missing_reason() -> str | None:
    """Why a real mount cannot run here, or None if it can (pass it to require_tool)."""
    return fuse_missing()


def memfs_cmd(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "memfs", "--root", str(root), *args]


def is_mounted(mnt: Path) -> bool:
    """True while the kernel has a mount at `mnt`, even a dead one (ENOTCONN)."""
    target = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        for line in f:
            point = line.split()[1].encode().decode("unicode_escape")
            if point == target:
                return True
    return False


def force_unmount(mnt: Path) -> None:
    """fusermount3 -u, falling back to a lazy -uz; never raises."""
    for flags in ("-u", "-uz"):
        if not is_mounted(mnt):
            return
        try:
            subprocess.run(["fusermount3", flags, str(mnt)], capture_output=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if is_mounted(mnt):
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=15)


class MemfsMount:
    """One store root mounted at one mountpoint by a foreground daemon subprocess."""

    native = False

    def __init__(
        self, root: Path, mnt: Path, log: Path, extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.mnt = mnt
        self.log = log
        self.extra_args = extra_args
        self.env = dict(env or {})  # the daemon's own extra environment (test shims)
        self.proc: subprocess.Popen[bytes] | None = None
        self.work = mnt / "work"
        self.initialized = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """init (idempotent), mount in the foreground, wait until the kernel shows the mount."""
        self.mnt.mkdir(parents=True, exist_ok=True)
        if not self.initialized:
            init = subprocess.run(memfs_cmd(self.root, "init"), capture_output=True, text=True,
                                  cwd=REPO, timeout=60)
            assert init.returncode == 0, f"memfs init failed: {init.stdout}{init.stderr}"
            self.initialized = True
        logf = open(self.log, "ab")
        logf.write(f"\n==== mount at {time.strftime('%H:%M:%S')} ====\n".encode())
        logf.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        cmd = memfs_cmd(self.root, "mount", str(self.mnt), "--foreground", *self.extra_args)
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO,
                                     env=env, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"memfs mount exited with {self.proc.returncode} before mounting; "
                    f"log:\n{self.log_text()}")
            if is_mounted(self.mnt) and os.path.ismount(self.mnt):
                self.work.mkdir(exist_ok=True)
                return
            time.sleep(0.05)
        raise AssertionError(f"memfs did not mount within {MOUNT_TIMEOUT}s; log:\n{self.log_text()}")

    def kill(self) -> None:
        """SIGKILL the daemon (no flush, no commit) and drop the dead mount."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True, timeout=15)

    def umount(self) -> subprocess.CompletedProcess[str]:
        """The user's way out: `memfs umount MNT` (flush, commit, unmount); waits for the daemon."""
        out = self.cli("umount", str(self.mnt))
        if self.proc is not None:
            self.proc.wait(timeout=30)
        return out

    def remount(self) -> None:
        """Mount the same root again (after kill() or umount())."""
        if self.proc is not None and self.proc.poll() is None:
            self.umount()
        force_unmount(self.mnt)
        self.start()

    def close(self) -> None:
        """Teardown: unmount (gently, then lazily) and make sure the daemon is gone."""
        try:
            force_unmount(self.mnt)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=30)

    # -- talking to it -----------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `memfs --root ROOT ARGS...`; with check, a non-zero exit fails the test."""
        out = subprocess.run(memfs_cmd(self.root, *args), capture_output=True, text=True,
                             cwd=REPO, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(
                f"memfs {' '.join(args)} exited {out.returncode}\n"
                f"stdout: {out.stdout}\nstderr: {out.stderr}")
        return out

    def cli_json(self, *args: str) -> object:
        return json.loads(self.cli(*args, "--json").stdout)

    def status(self) -> dict[str, object]:
        """The daemon's own view, read through the mount: .memfs/status."""
        with open(self.mnt / ".memfs" / "status") as f:
            return json.load(f)

    def log_text(self, tail: int = 20000) -> str:
        try:
            return self.log.read_text(errors="replace")[-tail:]
        except OSError:
            return "(no daemon log)"

    def require_real(self) -> None:
        """Nothing to skip: this is a real mount."""


class NativeDir:
    """MEMFS_TEST_NATIVE=1 stand-in: a plain directory with the same attributes."""

    native = True
    proc = None

    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.mnt = base / "mnt"
        self.work = self.mnt / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = base / "daemon.log"

    def require_real(self) -> None:
        """Native comparison mode has no daemon: skipped, or failed under scripts/test (which
        never sets the mode: a run of every test must not have it on)."""
        require_tool(f"{NATIVE_ENV}=1: needs a real memfs daemon (CLI, SIGKILL, remount)")

    def cli(self, *args: str, **_kw: object) -> subprocess.CompletedProcess[str]:
        self.require_real()
        raise AssertionError("unreachable")

    cli_json = cli
    status = cli

    def kill(self) -> None:
        self.require_real()

    def umount(self) -> None:
        self.require_real()

    def remount(self) -> None:
        self.require_real()

    def close(self) -> None:
        pass

    def log_text(self, tail: int = 20000) -> str:
        return "(native directory, no daemon)"
