"""Memory records written through the mount are never lost silently.

Bytes that can be judged alone (a control character, not UTF-8, over the cap) are refused
by the write() that brings them, so the shell sees the error (it ignores close()). An empty
record is refused at every close until the file is released, so `touch` reports it too.
Each case runs real shell tools against a real mount and checks memory did not change.
"""

from __future__ import annotations

import errno
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from memfs.memory.records import MAX_RECORD_BYTES
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir

pytestmark = pytest.mark.mount


@dataclass
class Memory:
    dir: Path  # MNT/.memfs/memory/workspaces/work
    root: Path
    mount: object

    def generation(self) -> tuple[str, int]:
        gen = MemoryStore(memory_dir(self.root)).workspace_generation("work")
        return gen.revision, gen.seq

    def names(self) -> list[str]:
        return sorted(p.name for p in self.dir.iterdir())

    def log(self) -> str:
        return self.mount.log_text()


@pytest.fixture
def mem(mount_factory, tmp_path: Path) -> Memory:
    m = mount_factory(root=tmp_path / "root")
    m.require_real()
    d = m.mnt / ".memfs" / "memory" / "workspaces" / "work"
    (d / "keep.md").write_text("# Keep\n")
    return Memory(d, tmp_path / "root", m)


def sh(cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("data,why", [
    (r"bad\001ctl\n", "control character '\\x01' at byte 3"),
    (r"nul\000\n", "control character '\\x00' at byte 3"),
    (r"c1 \302\205 next line\n", "control character"),
    (r"caf\351\n", "not UTF-8 at byte 3"),
])
def test_bytes_judged_at_write_fail_in_the_shell(mem: Memory, data: str, why: str):
    before = mem.generation()
    out = sh(f"printf '{data}' > '{mem.dir}/bad.md'")
    assert out.returncode != 0, "the shell was told nothing"
    assert "Invalid argument" in out.stderr
    assert mem.generation() == before
    assert mem.names() == ["index.md", "keep.md"]
    assert why in mem.log()


def test_over_the_cap_fails_at_the_write_that_crosses_it(mem: Memory, tmp_path: Path):
    big = tmp_path / "big.md"
    big.write_bytes(b"x" * (MAX_RECORD_BYTES + 1))
    before = mem.generation()
    out = sh(f"cat '{big}' > '{mem.dir}/big.md'")
    assert out.returncode != 0 and "Invalid argument" in out.stderr
    assert mem.generation() == before
    fd = os.open(mem.dir / "keep.md", os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(OSError) as exc:
            os.write(fd, b"y" * MAX_RECORD_BYTES)  # appending past the cap, to a kept record
        assert exc.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert (mem.dir / "keep.md").read_text() == "# Keep\n"


def test_a_utf8_character_split_across_writes_is_fine(mem: Memory):
    data = "# Café\n".encode()
    cut = data.index(b"\xc3") + 1
    fd = os.open(mem.dir / "split.md", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data[:cut])
        os.write(fd, data[cut:])
    finally:
        os.close(fd)
    assert (mem.dir / "split.md").read_text() == "# Café\n"


def test_an_empty_record_is_refused_at_every_close_and_not_created(mem: Memory):
    before = mem.generation()
    out = sh(f"touch '{mem.dir}/empty.md'")
    assert out.returncode == 1, "touch closes a dup first, then reports its own close"
    assert "Invalid argument" in out.stderr
    fd = os.open(mem.dir / "empty2.md", os.O_WRONLY | os.O_CREAT, 0o644)
    with pytest.raises(OSError) as exc:
        os.close(fd)
    assert exc.value.errno == errno.EINVAL
    assert mem.generation() == before
    assert mem.names() == ["index.md", "keep.md"]
    assert "record content is empty" in mem.log()
    emptied = sh(f": > '{mem.dir}/keep.md'; cat '{mem.dir}/keep.md'")  # emptying is refused too
    assert emptied.stdout == "# Keep\n"


def test_after_a_refusal_the_file_shows_memory_again(mem: Memory):
    fd = os.open(mem.dir / "keep.md", os.O_WRONLY | os.O_TRUNC)
    with pytest.raises(OSError):
        os.close(fd)  # truncated to nothing: refused
    assert (mem.dir / "keep.md").read_text() == "# Keep\n"
    with open(mem.dir / "keep.md", "a") as f:
        f.write("- more\n")
    assert (mem.dir / "keep.md").read_text() == "# Keep\n- more\n"
