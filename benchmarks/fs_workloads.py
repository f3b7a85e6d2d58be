"""The foundation's workloads (issue 2): metadata, small files, git, tar, sequential I/O."""

from __future__ import annotations

import os
import random
import subprocess
import tarfile
import threading
from pathlib import Path

from benchmarks.registry import Context, Measure, timed, workload

GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@memfs.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@memfs.invalid",
}


def make_empty_files(d: Path, n: int) -> list[str]:
    d.mkdir(exist_ok=True)
    names = [str(d / f"f{i:05d}") for i in range(n)]
    for p in names:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    return names


@workload("create", "fs", "files/s")
def create_empty(ctx: Context) -> Measure:
    """create 10k empty files"""
    n = ctx.n(10_000)
    return Measure(n, timed(lambda: make_empty_files(ctx.dir / "c", n)))


@workload("stat-warm", "fs", "stats/s", min_ratio=0.5)
def stat_warm(ctx: Context) -> Measure:
    """stat 10k files, warm (second pass)"""
    names = make_empty_files(ctx.dir / "s", ctx.n(10_000))
    for p in names:
        os.stat(p)

    def again() -> None:
        for p in names:
            os.stat(p)

    return Measure(len(names), timed(again))


@workload("write-4k", "fs", "files/s")
def write_small(ctx: Context) -> Measure:
    """write 10k 4 KiB files"""
    d = ctx.dir / "w"
    d.mkdir()
    n, payload = ctx.n(10_000), os.urandom(4096)

    def run() -> None:
        for i in range(n):
            fd = os.open(d / f"f{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, payload)
            os.close(fd)

    return Measure(n, timed(run))


@workload("read-4k", "fs", "files/s")
def read_small(ctx: Context) -> Measure:
    """read the 10k 4 KiB files, warm (fresh opens; one untimed pass first)"""
    d = ctx.dir / "w"
    names = sorted(os.listdir(d)) if d.exists() else []
    if not names:
        write_small(ctx)
        names = sorted(os.listdir(d))

    def run() -> None:
        for name in names:
            fd = os.open(d / name, os.O_RDONLY)
            os.read(fd, 8192)
            os.close(fd)

    run()
    return Measure(len(names), timed(run))


@workload("unlink-4k", "fs", "files/s")
def unlink_small(ctx: Context) -> Measure:
    """unlink the 10k 4 KiB files"""
    d = ctx.dir / "w"
    if not d.exists():
        write_small(ctx)
    names = [d / n for n in os.listdir(d)]
    return Measure(len(names), timed(lambda: [os.unlink(p) for p in names]))


def make_source_tree(d: Path, files: int) -> None:
    """A source-code-like tree: 50 files per directory, 0.2-12 KiB each, fixed seed."""
    rnd = random.Random(42)
    for i in range(files):
        sub = d / f"pkg{i // 500}" / f"mod{(i // 50) % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        size = rnd.randint(200, 12_000)
        (sub / f"file{i}.py").write_bytes(
            (f"# file {i}\n" + "x = 1\n" * (size // 6)).encode()[:size])


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args], cwd=cwd,
                   env=GIT_ENV, check=True, stdout=subprocess.DEVNULL)


@workload("git-init-add-commit", "fs", "files/s", min_ratio=0.25)
def git_init_add_commit(ctx: Context) -> Measure:
    """git init && git add -A && git commit of a 5k-file tree"""
    n = ctx.n(5_000)
    repo = ctx.dir / "repo"
    make_source_tree(repo, n)

    def run() -> None:
        git(repo, "init", "-q")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "bench")

    return Measure(n, timed(run))


@workload("git-status-warm", "fs", "files/s")
def git_status_warm(ctx: Context) -> Measure:
    """git status, warm (second run), on the 5k-file repo"""
    repo = ctx.dir / "repo"
    if not (repo / ".git").exists():
        git_init_add_commit(ctx)
    git(repo, "status", "--porcelain")
    return Measure(ctx.n(5_000), timed(lambda: git(repo, "status", "--porcelain")))


def make_tarball(scratch: Path, files: int) -> Path:
    tarball = scratch / f"tree-{files}.tar"
    if not tarball.exists():
        src = scratch / f"tree-{files}"
        make_source_tree(src, files)
        with tarfile.open(tarball, "w") as tf:
            tf.add(src, arcname="tree")
    return tarball


@workload("tar-x", "fs", "entries/s", min_ratio=0.25)
def tar_extract(ctx: Context) -> Measure:
    """tar -x of a generated 5k-file tarball"""
    n = ctx.n(5_000)
    tarball = make_tarball(ctx.scratch, n)
    dest = ctx.dir / "untar"
    dest.mkdir()
    return Measure(n, timed(lambda: subprocess.run(["tar", "-xf", str(tarball), "-C", str(dest)],
                                                   check=True)))


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class RssPeak(threading.Thread):
    def __init__(self, pid: int | None) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kib, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while self.pid and not self.done.wait(0.02):
            self.peak_kib = max(self.peak_kib, vm_kib(self.pid, "VmRSS"))


@workload("seq-write", "fs", "MiB/s", min_ratio=0.6)
def seq_write(ctx: Context) -> Measure:
    """512 MiB sequential write + fsync (1 MiB writes); daemon peak RSS alongside"""
    mib = ctx.n(512)
    block = bytearray(os.urandom(1 << 20))
    watch = RssPeak(ctx.daemon_pid)
    watch.start()

    def run() -> None:
        with open(ctx.dir / "seq.bin", "wb", buffering=0) as f:
            for i in range(mib):
                block[:8] = i.to_bytes(8, "little")
                f.write(block)
            os.fsync(f.fileno())

    try:
        seconds = timed(run)
    finally:
        watch.done.set()
        watch.join()
    extra = {"daemon peak RSS MiB": watch.peak_kib / 1024} if ctx.daemon_pid else {}
    return Measure(mib, seconds, extra)


@workload("seq-read", "fs", "MiB/s")
def seq_read(ctx: Context) -> Measure:
    """read the 512 MiB file back (page cache dropped first)"""
    path = ctx.dir / "seq.bin"
    if not path.exists():
        seq_write(ctx)
    total = 0

    def run() -> None:
        nonlocal total
        with open(path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while block := f.read(1 << 20):
                total += len(block)

    seconds = timed(run)
    return Measure(total / (1 << 20), seconds)


@workload("log-append", "fs", "appends/s")
def log_append(ctx: Context) -> Measure:
    """fsynced 100-byte appends to a 4 MiB log; the store's growth alongside (a patch each)"""
    n = ctx.n(2000)
    path = ctx.dir / "app.log"
    with open(path, "wb", buffering=0) as f:
        f.write(os.urandom(4 << 20))
        os.fsync(f.fileno())
    before = ctx.chunk_bytes()

    def run() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(n):
                os.write(fd, b"%08d %s\n" % (i, os.urandom(45).hex().encode()))
                os.fsync(fd)
        finally:
            os.close(fd)

    seconds = timed(run)
    after = ctx.chunk_bytes()
    extra = {"store growth KiB": (after - before) / 1024} if after is not None and \
        before is not None else {}
    return Measure(n, seconds, extra)


@workload("rewrite", "fs", "MiB/s")
def rewrite(ctx: Context) -> Measure:
    """rewrite a 256 MiB file in place with new bytes (1 MiB writes, fsync)

    Each piece is compared with the one it replaces (memfs.store.delta), then stored whole:
    the cost of trying a patch where none pays."""
    mib = ctx.n(256)
    path = ctx.dir / "rewrite.bin"
    block = bytearray(os.urandom(1 << 20))
    with open(path, "wb", buffering=0) as f:
        for i in range(mib):
            block[:8] = i.to_bytes(8, "little")
            f.write(block)
        os.fsync(f.fileno())
    block = bytearray(os.urandom(1 << 20))

    def run() -> None:
        with open(path, "r+b", buffering=0) as f:
            for i in range(mib):
                block[:8] = i.to_bytes(8, "little")
                f.write(block)
            os.fsync(f.fileno())

    return Measure(mib, timed(run))
