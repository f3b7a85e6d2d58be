"""Memory through a real mount: shell writes, an editor's save and rm each commit once.

Uses the mount fixtures of tests/conftest.py (the fs layer's); skips where FUSE is missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.require import require_tool

from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir

pytestmark = pytest.mark.mount


def _seqs(root: Path) -> list[int]:
    return [h.seq for h in MemoryStore(memory_dir(root)).history("work")]


def test_shell_writes_editor_save_and_rm_each_commit_one_generation(mount_factory,
                                                                       tmp_path: Path) -> None:
    root = tmp_path / "root"
    m = mount_factory(root=root)
    m.require_real()
    ws = m.mnt / ".memfs" / "memory" / "workspaces" / "work"
    assert ws.is_dir(), "the mount's workspace `work` has a memory directory"

    subprocess.run(["sh", "-c", f"echo '# Editor' > '{ws}/editor.md'"], check=True)
    assert _seqs(root) == [1]
    assert (ws / "editor.md").read_text() == "# Editor\n"
    assert "- editor.md: Editor" in (ws / "index.md").read_text()

    # An editor's save: write a temp file beside it, fsync, rename over the record.
    tmp = ws / ".editor.md.swp"
    with open(tmp, "w") as f:
        f.write("# Editor\r\n- Tabs, width 4.   \n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, ws / "editor.md")
    assert _seqs(root) == [2, 1]
    assert (ws / "editor.md").read_text() == "# Editor\n- Tabs, width 4.\n"  # normalized

    subprocess.run(["mv", str(ws / "editor.md"), str(ws / "tabs.md")], check=True)
    assert _seqs(root) == [3, 2, 1]
    assert sorted(p.name for p in ws.iterdir()) == ["index.md", "tabs.md"]

    subprocess.run(["rm", str(ws / "tabs.md")], check=True)
    assert _seqs(root) == [4, 3, 2, 1]
    assert MemoryStore(memory_dir(root)).workspace_generation("work").records == {}

    glob = m.mnt / ".memfs" / "memory" / "global.md"
    glob.write_text("# Global\n- English\n")
    assert MemoryStore(memory_dir(root)).global_generation().content == "# Global\n- English\n"


def test_bad_names_and_records_are_refused_and_change_nothing(mount_factory,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "root"
    m = mount_factory(root=root)
    m.require_real()
    ws = m.mnt / ".memfs" / "memory" / "workspaces" / "work"
    (ws / "keep.md").write_text("# Keep\n")
    before = MemoryStore(memory_dir(root)).workspace_generation("work")

    for name in ("index.md", "a\x01b.md", "x" * 120 + ".md"):
        with pytest.raises(OSError) as info:
            (ws / name).write_text("# nope\n")
        assert info.value.errno in (errno.EINVAL, errno.EPERM, errno.ENAMETOOLONG), name
    with pytest.raises(OSError) as info:
        (ws / "bad.md").write_text("bell \x07\n")  # refused when the file is closed
    assert info.value.errno in (errno.EINVAL, errno.EPERM)
    with pytest.raises(OSError):
        (ws / "index.md").unlink()

    after = MemoryStore(memory_dir(root)).workspace_generation("work")
    assert after.revision == before.revision and after.seq == before.seq
    assert sorted(p.name for p in ws.iterdir()) == ["index.md", "keep.md"]


def test_memory_files_are_readable_with_cat_when_the_daemon_is_stopped(mount_factory,
                                                                     tmp_path: Path) -> None:
    root = tmp_path / "root"
    m = mount_factory(root=root)
    m.require_real()
    ws = m.mnt / ".memfs" / "memory" / "workspaces" / "work"
    (ws / "editor.md").write_text("# Editor\n- tabs\n")
    (m.mnt / ".memfs" / "memory" / "global.md").write_text("# Global\n")
    m.umount()
    mem = memory_dir(root)
    out = subprocess.run(["cat", str(mem / "workspaces" / "work" / "editor.md"),
                          str(mem / "workspaces" / "work" / "index.md"), str(mem / "global.md")],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "# Editor\n- tabs\n# Memory index\n\n- editor.md: Editor\n# Global\n"


def _edit_like_editors(d: Path, name: str) -> list[str]:
    """`sed -i`, vim and a write-temp-then-rename save of `d/name`; what each printed."""
    said = []
    for cmd in (["sed", "-i", "s/one/two/", name],
                ["vim", "-u", "NONE", "-N", "-es", "-c", "set nobackup writebackup",
                 "-c", "%s/two/three/", "-c", "wq", name]):
        out = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (cmd, out.stderr)
        said.append(out.stderr)
    tmp = d / f".{name}.tmp"
    with open(tmp, "x") as f:
        f.write((d / name).read_text().replace("three", "four"))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, d / name)
    return said


def test_editors_save_global_and_records_as_in_a_native_directory(mount_factory,
                                                                  tmp_path: Path) -> None:
    """Found in a user trial: `sed -i` (and any temp-then-rename save) of
    `.memfs/memory/global.md` failed ("couldn't open temporary file ./sedXXXXXX: Operation not
    permitted": no temp file could be made beside Global), and `sed -i` of a record warned
    "preserving permissions for './sedXXXXXX': Operation not permitted" (the ACL copy got
    EPERM, where a filesystem without ACLs answers ENOTSUP and sed says nothing)."""
    require_tool(None if shutil.which("vim") else "vim is missing (scripts/_setup.sh installs it)")
    m = mount_factory(root=tmp_path / "root")
    m.require_real()
    mem = m.mnt / ".memfs" / "memory"
    native = tmp_path / "native"
    native.mkdir()
    for d in (native, mem, mem / "workspaces" / "work"):
        name = "global.md" if d != mem / "workspaces" / "work" else "note.md"
        (d / name).write_text("- one\n")
        assert _edit_like_editors(d, name) == ["", ""], d
        assert (d / name).read_text() == "- four\n", d
        left = {p.name for p in d.iterdir()} - {name, "workspaces", "index.md"}
        assert not left, f"a temp file or backup stayed in {d}: {left}"
    store = MemoryStore(memory_dir(m.root))
    assert store.global_generation().content == "- four\n"
    assert store.workspace_generation("work").records == {"note": "- four\n"}
    assert oct((mem).stat().st_mode & 0o777) == "0o755", "a user's editor may write beside Global"
    for bad, code in (("other.md", errno.EPERM), ("workspaces", errno.EISDIR)):
        with pytest.raises(OSError) as info:
            (mem / ".t").write_text("x")
            os.rename(mem / ".t", mem / bad)
        assert info.value.errno == code, bad
    (mem / ".t").unlink()
    with pytest.raises(OSError) as info:
        os.rename(mem / "global.md", mem / "global.md~")  # Global cannot leave
    assert info.value.errno == errno.EPERM
    assert store.global_generation().content == "- four\n"
