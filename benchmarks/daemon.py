"""Start a memfs mount for a benchmark run and always take it down again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def memfs(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "memfs", "--root", str(root), *args]


def mounted(mnt: Path) -> bool:
    target = os.path.realpath(mnt)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


class BenchMount:
    """A foreground daemon on `root`, mounted at `mnt`, its log in `log`."""

    def __init__(self, root: Path, mnt: Path, log: Path, extra: list[str],
                 store: str | None = None) -> None:
        self.root, self.mnt, self.log, self.extra = root, mnt, log, extra
        self.store = store  # a PostgreSQL URL, or None for the embedded store
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BenchMount:
        self.mnt.mkdir(parents=True, exist_ok=True)
        init = ["init"] + (["--store", self.store] if self.store else [])
        subprocess.run(memfs(self.root, *init), check=True, cwd=REPO, capture_output=True)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                memfs(self.root, "mount", str(self.mnt), "--foreground", *self.extra),
                stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        deadline = time.monotonic() + 30
        while not mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"memfs did not mount; see {self.log}")
            time.sleep(0.05)
        return self

    def __exit__(self, *_exc: object) -> None:
        if mounted(self.mnt):
            subprocess.run(memfs(self.root, "umount", str(self.mnt)), cwd=REPO,
                           capture_output=True, timeout=300)
        for flags in ("-u", "-uz"):
            if mounted(self.mnt):
                subprocess.run(["fusermount3", flags, str(self.mnt)], capture_output=True)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
