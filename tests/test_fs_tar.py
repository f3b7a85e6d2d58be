"""tar -x of a real tree on the mount agrees with a native extraction (diff -r and metadata)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from helpers.png import make_png
from helpers.tree import diff_snapshots, snapshot

pytestmark = pytest.mark.mount


def make_tree(d: Path, seed: int = 7) -> None:
    """~600 entries: nested dirs, text, binary, empty, sparse, large, symlinks, odd modes."""
    rnd = random.Random(seed)
    png = make_png()
    for i in range(30):
        sub = d / f"dir{i % 6}" / f"sub{i % 4}" / f"leaf{i}"
        sub.mkdir(parents=True, exist_ok=True)
        for j in range(15):
            kind = j % 5
            p = sub / f"f{j}.{['txt', 'bin', 'png', 'empty', 'md'][kind]}"
            if kind == 0:
                p.write_text("".join(rnd.choice("abc \n") for _ in range(rnd.randint(1, 3000))))
            elif kind == 1:
                p.write_bytes(rnd.randbytes(rnd.randint(1, 70000)))
            elif kind == 2:
                p.write_bytes(png)
            elif kind == 3:
                p.touch()
            else:
                p.write_text(f"# note {i}-{j}\n" * rnd.randint(1, 50))
            os.chmod(p, rnd.choice([0o644, 0o600, 0o755, 0o444, 0o640]))
        os.symlink(f"f{rnd.randint(0, 14)}.txt", sub / "link")
    (d / "large.bin").write_bytes(rnd.randbytes(5 << 20))
    with open(d / "sparse.bin", "wb") as f:
        f.seek(3 << 20)
        f.write(b"end")
    (d / "name with spaces & ünïcode.txt").write_text("odd name\n")
    os.symlink("dir0/sub0", d / "dirlink")
    os.chmod(d / "dir1", 0o700)


def test_tar_extract_matches_native(mounted, native_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_tree(src)
    tarball = tmp_path / "tree.tar"
    subprocess.run(["tar", "-cf", str(tarball), "--sparse", "-C", str(src), "."], check=True)

    on_mount = mounted.work / "untar"
    on_mount.mkdir()
    for where in (native_dir, on_mount):
        res = subprocess.run(["tar", "-xpf", str(tarball), "-C", str(where)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"tar -x into {where}: {res.stderr}"

    diff = subprocess.run(["diff", "-r", "--no-dereference", str(native_dir), str(on_mount)],
                          capture_output=True, text=True, timeout=300)
    assert diff.returncode == 0, diff.stdout[-4000:] + diff.stderr
    want = snapshot(native_dir, mtimes=True)
    got = snapshot(on_mount, mtimes=True)
    assert len(want) > 500
    assert got == want, "\n".join(diff_snapshots(got, want)[:50])
