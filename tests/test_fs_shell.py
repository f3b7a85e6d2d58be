"""The shell round trip: everyday commands give the same tree on memfs as on a native directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.png import make_png
from helpers.tree import diff_snapshots, snapshot

pytestmark = pytest.mark.mount

# Runs with cwd = the directory under test and $SRC = a native directory of inputs.
SCRIPT = r"""
set -euo pipefail
umask 022
mkdir -p a/b/c deep/er/still
cp "$SRC/picture.png" a/picture.png
cp -p "$SRC/picture.png" a/b/kept-times.png
cat "$SRC/picture.png" > a/b/c/via-cat.png
printf 'line one\n' > notes.txt
printf 'line two\n' >> notes.txt
echo 'line three' >> notes.txt
cat notes.txt notes.txt > twice.txt
cat a/picture.png >> twice.txt
mv twice.txt a/b/moved.txt
mv a/b/c/via-cat.png deep/er/renamed.png
echo gone > doomed.txt
rm doomed.txt
mkdir -p empty/inner
rmdir empty/inner
mkdir todelete && rmdir todelete
ln -s ../notes.txt a/link-to-notes
ln -s nowhere/at/all dangling
ln -s a/b dirlink
cat dirlink/moved.txt > through-link.txt
chmod 600 notes.txt
chmod 751 deep/er
chmod 4755 a/picture.png
chmod -w a/b/moved.txt
touch -d '2001-02-03 04:05:06.123456789' notes.txt
touch -d '1999-12-31 23:59:59' deep
touch -m -d '2020-06-07 08:09:10' a/picture.png
head -c 100000 /dev/zero | tr '\0' 'x' > big.txt
truncate -s 5000 big.txt
truncate -s 1M sparse.bin
printf 'tail' >> sparse.bin
truncate -s 0 emptied.txt
: > zero.txt
printf 'abc' > grow.txt && truncate -s 10 grow.txt
sed -i 's/two/2/' notes.txt || true
cp -r a copy-of-a
echo done >> copy-of-a/b/moved.txt 2>/dev/null || chmod u+w copy-of-a/b/moved.txt
"""

EXPLICIT_MTIMES = ["a/b/kept-times.png", "deep", "a/picture.png"]


def run_script(where: Path, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", SCRIPT], cwd=where, env={"SRC": str(src), "PATH":
                          "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C"},
                          capture_output=True, text=True, timeout=120)


def test_shell_round_trip_matches_native(mounted, native_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "picture.png").write_bytes(make_png())
    on_mount = mounted.work / "shell"
    on_mount.mkdir()

    native = run_script(native_dir, src)
    assert native.returncode == 0, native.stderr
    res = run_script(on_mount, src)
    assert res.returncode == 0, f"script failed on memfs: {res.stderr}"

    want = snapshot(native_dir, mtimes=EXPLICIT_MTIMES)
    got = snapshot(on_mount, mtimes=EXPLICIT_MTIMES)
    assert len(want) > 20
    assert got == want, "\n".join(diff_snapshots(got, want))


def test_redirect_truncates_existing_file(mounted) -> None:
    f = mounted.work / "f"
    subprocess.run(["bash", "-c", "printf 'long content' > f; : > f; printf ab > g; printf c > g"],
                   cwd=mounted.work, check=True)
    assert f.read_bytes() == b""
    assert (mounted.work / "g").read_bytes() == b"c"


def test_shell_reads_back_after_remount(mounted, native_dir: Path, tmp_path: Path) -> None:
    """The same tree is still there after a clean unmount and a new daemon (page cache gone)."""
    mounted.require_real()
    src = tmp_path / "src"
    src.mkdir()
    (src / "picture.png").write_bytes(make_png())
    on_mount = mounted.work / "shell"
    on_mount.mkdir()
    assert run_script(on_mount, src).returncode == 0
    before = snapshot(on_mount, mtimes=True)
    mounted.umount()
    mounted.remount()
    after = snapshot(on_mount, mtimes=True)
    assert after == before, "\n".join(diff_snapshots(after, before))
