"""Effects on real directories: containment, freshness, hard links, races, faults and kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash
from helpers.require import LIBFIU, libfiu_missing, require_tool

from memfs.reconcile.contained import Refused, RootId, RootUnavailable, open_root
from memfs.reconcile.effects import sweep_scratch, unlink_file, write_file
from memfs.reconcile.observe import observe
from memfs.reconcile.rule import ABSENT
from memfs.testing import FAULT_HOOKS

FIU = LIBFIU


def h(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def rid_of(path: Path) -> RootId:
    fd, rid = open_root(path, None)
    os.close(fd)
    return rid


def snapshot(path: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            out[str(p.relative_to(path))] = None if p.is_dir() else p.read_bytes()
    return out


@pytest.fixture
def env(tmp_path: Path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    (outside / "d").mkdir(parents=True)
    (outside / "secret.txt").write_bytes(b"outside original\n")
    (outside / "d" / "victim.txt").write_bytes(b"v\n")
    yield root, outside, rid_of(root)
    FAULT_HOOKS.clear()


def test_nested_new_file_and_overwrite(env):
    root, _, rid = env
    w = write_file(root, "a/b/c.txt", b"hello\n", root=rid, expected=ABSENT)
    assert (root / "a/b/c.txt").read_bytes() == b"hello\n" and w.digest == h(b"hello\n")
    assert observe(root).files["a/b/c.txt"].digest == w.digest
    os.chmod(root / "a/b/c.txt", 0o600)
    w2 = write_file(root, "a/b/c.txt", b"v2\n", root=rid, expected=w.digest)
    assert (root / "a/b/c.txt").read_bytes() == b"v2\n"
    assert os.stat(root / "a/b/c.txt").st_mode & 0o777 == 0o600  # mode kept across the rename
    assert not [n for n in os.listdir(root / "a/b") if n.startswith(".memfs-tmp-")]
    assert unlink_file(root, "a/b/c.txt", root=rid, expected=w2.digest)
    assert not (root / "a/b/c.txt").exists()
    assert unlink_file(root, "a/b/c.txt", root=rid, expected=w2.digest) is False


def test_freshness_refusals_unless_forced(env):
    root, _, rid = env
    (root / "f.txt").write_bytes(b"planned\n")
    (root / "f.txt").write_bytes(b"edited after planning\n")
    with pytest.raises(Refused) as e:
        write_file(root, "f.txt", b"workspace\n", root=rid, expected=h(b"planned\n"))
    assert e.value.reason == "changed" and not e.value.touched
    assert (root / "f.txt").read_bytes() == b"edited after planning\n"
    write_file(root, "f.txt", b"workspace\n", root=rid, expected=h(b"planned\n"), force=True)
    assert (root / "f.txt").read_bytes() == b"workspace\n"
    # A file that appeared where the plan saw none; one deleted where the plan saw one.
    (root / "new.txt").write_bytes(b"shell made me\n")
    with pytest.raises(Refused, match="appeared"):
        write_file(root, "new.txt", b"w\n", root=rid, expected=ABSENT)
    with pytest.raises(Refused, match="deleted on disk"):
        write_file(root, "gone.txt", b"w\n", root=rid, expected=h(b"x"))
    with pytest.raises(Refused) as e:
        unlink_file(root, "new.txt", root=rid, expected=h(b"planned\n"))
    assert e.value.reason == "changed" and (root / "new.txt").exists()


def test_hard_link_refused_with_and_without_force(env):
    root, outside, rid = env
    os.link(outside / "secret.txt", root / "h.txt")
    for force in (False, True):
        with pytest.raises(Refused) as e:
            write_file(root, "h.txt", b"written by the workspace\n", root=rid,
                       expected=h(b"outside original\n"), force=force)
        assert e.value.reason == "hard-link" and "copy" in e.value.remedy
        assert (outside / "secret.txt").read_bytes() == b"outside original\n"
    # The way out the message teaches: copy to a new name, move it over, write again.
    subprocess.run(["cp", str(root / "h.txt"), str(root / "h.copy")], check=True)
    subprocess.run(["mv", str(root / "h.copy"), str(root / "h.txt")], check=True)
    write_file(root, "h.txt", b"written by the workspace\n", root=rid,
               expected=h(b"outside original\n"))
    assert (outside / "secret.txt").read_bytes() == b"outside original\n"


def test_hard_link_made_after_planning(env):
    root, outside, rid = env
    (root / "f.txt").write_bytes(b"one\n")
    FAULT_HOOKS["effect:checked"] = lambda: os.link(root / "f.txt", outside / "late-link")
    with pytest.raises(Refused):
        write_file(root, "f.txt", b"two\n", root=rid, expected=h(b"one\n"), force=True)
    assert (outside / "late-link").read_bytes() == b"one\n"


def test_edit_during_forced_write_checks_is_not_overwritten(env):
    root, _, rid = env
    (root / "f.txt").write_bytes(b"one\n")
    FAULT_HOOKS["effect:checked"] = lambda: (root / "f.txt").write_bytes(b"edit in the window\n")
    with pytest.raises(Refused) as e:
        write_file(root, "f.txt", b"workspace\n", root=rid, expected=h(b"one\n"), force=True)
    assert e.value.reason == "changed"
    assert (root / "f.txt").read_bytes() == b"edit in the window\n"


def test_edit_after_unlink_hash_is_not_removed(env):
    root, _, rid = env
    (root / "f.txt").write_bytes(b"one\n")
    FAULT_HOOKS["effect:checked"] = lambda: (root / "f.txt").write_bytes(b"edited later\n")
    with pytest.raises(Refused):
        unlink_file(root, "f.txt", root=rid, expected=h(b"one\n"))
    assert (root / "f.txt").read_bytes() == b"edited later\n"


def test_non_regular_targets_and_symlinked_parents(env):
    root, outside, rid = env
    os.mkfifo(root / "pipe")
    (root / "dir").mkdir()
    (root / "link").symlink_to(outside / "secret.txt")
    (root / "dlink").symlink_to(outside / "d")
    before = snapshot(outside)
    for path in ("pipe", "dir", "link", "dlink/victim.txt", "dlink/new.txt"):
        for force in (False, True):
            with pytest.raises(Refused):
                write_file(root, path, b"x\n", root=rid, expected=ABSENT, force=force)
            with pytest.raises(Refused):
                unlink_file(root, path, root=rid, expected=h(b"v\n"), force=force)
    assert snapshot(outside) == before


def test_parent_swapped_for_outside_symlink_after_planning(env):
    """Planned against a real directory; by the effect it is a symlink to outside."""
    root, outside, rid = env
    (root / "d").mkdir()
    (root / "d" / "victim.txt").write_bytes(b"v\n")
    before = snapshot(outside)

    def swap() -> None:
        os.rename(root / "d", root / "d.aside")
        (root / "d").symlink_to(outside / "d")
    for force in (False, True):
        FAULT_HOOKS["effect:checked"] = swap
        with pytest.raises(Refused):
            write_file(root, "d/victim.txt", b"x\n", root=rid, expected=h(b"v\n"), force=force)
        FAULT_HOOKS["effect:checked"] = swap
        with pytest.raises(Refused):
            unlink_file(root, "d/victim.txt", root=rid, expected=h(b"v\n"), force=force)
        FAULT_HOOKS.clear()
        (root / "d").unlink()
        os.rename(root / "d.aside", root / "d")
    assert snapshot(outside) == before
    assert (root / "d" / "victim.txt").read_bytes() == b"v\n"


def test_replaced_root_takes_no_write(env):
    root, _, rid = env
    root.rename(root.with_name("away"))
    root.mkdir()
    for force in (False, True):
        with pytest.raises(RootUnavailable):
            write_file(root, "a.txt", b"x", root=rid, expected=ABSENT, force=force)
    assert os.listdir(root) == []


def test_root_replaced_during_write(env):
    root, _, rid = env
    (root / "d").mkdir()

    def replace_root() -> None:
        root.rename(root.with_name("away"))
        root.mkdir()
    FAULT_HOOKS["effect:checked"] = replace_root
    with pytest.raises(Refused) as e:
        write_file(root, "d/a.txt", b"x", root=rid, expected=ABSENT)
    assert e.value.reason == "moved"
    assert os.listdir(root) == [] and os.listdir(root.with_name("away") / "d") == []


SWAPPER = textwrap.dedent("""
    import os, sys, time
    from memfs.reconcile.contained import RENAME_EXCHANGE, renameat2
    root = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    mode = sys.argv[2]
    renameat2(root, "d", root, "dswap", RENAME_EXCHANGE)
    print("swapping", flush=True)
    n = 0
    while True:
        n += 1
        try:
            if mode == "exchange":
                renameat2(root, "d", root, "dswap", RENAME_EXCHANGE)
                if n % 2:
                    time.sleep(0.0002)  # leave the real directory in place now and then
            else:  # rename away, symlink in, then back: "d" is sometimes missing too
                os.rename("d", "d.aside", src_dir_fd=root, dst_dir_fd=root)
                os.symlink(sys.argv[3], "d", dir_fd=root)
                os.unlink("d", dir_fd=root)
                os.rename("d.aside", "d", src_dir_fd=root, dst_dir_fd=root)
        except OSError:
            # A write may have made a new "d" while it was missing (inside the root, where
            # mkdirat put it): move that aside so the swapping goes on.
            try:
                os.rename("d", f"made{n}", src_dir_fd=root, dst_dir_fd=root)
            except OSError:
                pass
""")


@pytest.mark.parametrize("mode", ["exchange", "rename"])
def test_swap_race_writes_nothing_outside(env, mode: str):
    """A child swaps root/d for a symlink to outside/d in a tight loop while 300 write rounds
    or more (half forced) and unlinks run: zero bytes and zero new entries outside the root."""
    root, outside, rid = env
    (root / "d").mkdir()
    (root / "d" / "victim.txt").write_bytes(b"v\n")
    (root / "dswap").symlink_to(outside / "d")
    before = snapshot(outside)
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), mode, str(outside / "d")],
                            stdout=subprocess.PIPE)
    outcomes = {"written": 0, "refused": 0}
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"swapping\n"
        # 300 rounds at least; more while the swapper has not yet been seen to win one (on an
        # idle machine 300 rounds can all run before the child is scheduled once).
        for i in range(3000):
            if i >= 300 and outcomes["refused"]:
                break
            force = i % 2 == 1
            try:
                write_file(root, f"d/f{i}.txt", b"payload %d\n" % i, root=rid, expected=ABSENT,
                           force=force)
                outcomes["written"] += 1
            except Refused:
                outcomes["refused"] += 1
            try:
                write_file(root, "d/victim.txt", b"v\n", root=rid, expected=h(b"v\n"),
                           force=force)
            except Refused:
                pass
            try:
                unlink_file(root, "d/victim.txt", root=rid, expected=h(b"v\n"), force=force)
            except Refused:
                pass
    finally:
        proc.kill()
        proc.wait()
    assert snapshot(outside) == before, "something reached outside the root"
    assert outcomes["refused"] > 0, outcomes  # the race really ran
    if mode == "exchange":  # "d" is always the real directory or the symlink: both outcomes
        assert outcomes["written"] > 0, outcomes


def test_scratch_left_by_a_kill_is_skipped_and_swept(env):
    root, _, rid = env
    (root / "f.txt").write_bytes(b"old\n")
    old = h(b"old\n")
    code = textwrap.dedent(f"""
        from memfs.reconcile.contained import RootId
        from memfs.reconcile.effects import write_file
        write_file({str(root)!r}, "f.txt", b"new\\n", root=RootId({rid.dev}, {rid.ino}),
                   expected={old!r})
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          env=dict(os.environ, MEMFS_CRASH_AT="effect:temp-synced"))
    assert proc.returncode == -signal.SIGKILL
    assert (root / "f.txt").read_bytes() == b"old\n"  # the name still holds the old file
    o = observe(root)
    assert set(o.files) == {"f.txt"} and any(r.reason == "memfs-scratch" for r in o.regions)
    assert len(sweep_scratch(root, root=rid)) == 1
    assert os.listdir(root) == ["f.txt"]
    # Killed after the rename: the new file is whole (ordering; durability rests on fsync).
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          env=dict(os.environ, MEMFS_CRASH_AT="effect:renamed"))
    assert proc.returncode == -signal.SIGKILL
    assert (root / "f.txt").read_bytes() == b"new\n"


FAULT_CHILD = textwrap.dedent("""
    import ctypes, json, sys
    from memfs.reconcile.contained import Refused, RootId
    from memfs.testing import FAULT_HOOKS
    from memfs.reconcile.effects import EffectFailed, write_file
    point, err, when, root, dev, ino, expected = sys.argv[1:8]
    fiu = ctypes.CDLL("libfiu.so.0")
    fiu.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
    enable = lambda: fiu.fiu_enable(point.encode(), 1, ctypes.c_void_p(int(err)), 0)
    if when == "now":
        enable()
    else:
        FAULT_HOOKS[when] = enable
    out = {}
    try:
        write_file(root, "d/f.txt", b"new content\\n", root=RootId(int(dev), int(ino)),
                   expected=expected)
        out["result"] = "ok"
    except EffectFailed as exc:
        out.update(result="failed", reason=exc.reason, touched=exc.touched)
    except Refused as exc:
        out.update(result="refused", reason=exc.reason, touched=exc.touched)
    fiu.fiu_disable(point.encode())
    FAULT_HOOKS.clear()
    write_file(root, "d/f.txt", b"new content\\n", root=RootId(int(dev), int(ino)),
               expected=expected, force=True)
    out["retry"] = "ok"
    print(json.dumps(out))
""")


@pytest.mark.parametrize("point,err,when,result,touched", [
    ("posix/io/sync/fsync", 5, "now", "refused", False),  # EIO on the written file's fsync
    ("posix/io/rw/write", 28, "now", "refused", False),  # ENOSPC on write
    ("posix/io/sync/fsync", 5, "effect:renamed", "failed", True),  # EIO on a directory fsync
])
def test_faults_leave_the_path_owed_and_a_retry_completes(env, point, err, when, result,
                                                           touched):
    require_tool(libfiu_missing())
    root, _, rid = env
    (root / "d").mkdir()
    (root / "d" / "f.txt").write_bytes(b"old\n")
    proc = subprocess.run(
        [sys.executable, "-c", FAULT_CHILD, point, str(err), when, str(root), str(rid.dev),
         str(rid.ino), h(b"old\n")],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, LD_PRELOAD=":".join(FIU)))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == result and out["touched"] is touched, out
    assert out["retry"] == "ok"
    assert (root / "d" / "f.txt").read_bytes() == b"new content\n"
    assert sorted(os.listdir(root / "d")) == ["f.txt"]  # no scratch left behind


def test_contained_read_of_a_disk_only_file(env):
    from memfs.reconcile.contained import open_contained_file

    root, outside, rid = env
    (root / "pics").mkdir()
    (root / "pics" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n....")
    fd, st = open_contained_file(root, "pics/a.png", root=rid)
    try:
        assert os.pread(fd, 100, 0).startswith(b"\x89PNG") and st.st_size == 12
    finally:
        os.close(fd)
    os.mkfifo(root / "pics" / "pipe")
    (root / "pics" / "out.png").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside / "d")
    for rel in ("pics/pipe", "pics/out.png", "outdir/victim.txt", "pics", "pics/../a"):
        with pytest.raises(Refused):
            open_contained_file(root, rel, root=rid)
    root.rename(root.with_name("away"))
    root.mkdir()
    with pytest.raises(RootUnavailable):
        open_contained_file(root, "pics/a.png", root=rid)


@pytest.mark.timeout(30)
def test_fifo_swapped_in_after_the_check_neither_blocks_nor_passes(env):
    """A FIFO replaces the file between its lstat and its open: the open is non-blocking and the
    descriptor fails the regular-file check, for a write and an unlink, forced or not."""
    root, _, rid = env

    def swap() -> None:
        (root / "f.txt").unlink()
        os.mkfifo(root / "f.txt")
    for force in (False, True):
        (root / "f.txt").write_bytes(b"one\n")
        FAULT_HOOKS["effect:before-open"] = swap
        with pytest.raises(Refused) as e:
            write_file(root, "f.txt", b"two\n", root=rid, expected=h(b"one\n"), force=force)
        assert e.value.reason == "changed" and not e.value.touched
        (root / "f.txt").unlink()
        (root / "f.txt").write_bytes(b"one\n")
        with pytest.raises(Refused):
            unlink_file(root, "f.txt", root=rid, expected=h(b"one\n"), force=force)
        FAULT_HOOKS.clear()
        assert (root / "f.txt").is_fifo()
        (root / "f.txt").unlink()
