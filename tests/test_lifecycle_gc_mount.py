"""GC through a real mount: beside writers, under a shell standing in history, with a file
held open after it was deleted; undo refusing what GC dropped; du and the dry run."""

from __future__ import annotations

import os
import random
import subprocess
import threading

import pytest
from helpers.gcstore import keep_nothing_by_age
from helpers.space import fsync_path
from helpers.store import store_check

pytestmark = pytest.mark.mount

MiB = 1 << 20


def test_gc_beside_a_writer_loses_nothing(mounted) -> None:
    """A writer rewrites, deletes and re-creates files (content that GC is sweeping comes
    back, so commits dedup against dying chunks) while `memfs gc` runs again and again."""
    mounted.require_real()
    keep_nothing_by_age(mounted)
    pool = [random.Random(i).randbytes(200_000 + 1000 * i) for i in range(5)]
    model: dict[str, bytes] = {}
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            name = f"f{rng.randrange(6)}"
            p = mounted.work / name
            if name in model and rng.random() < 0.3:
                p.unlink()
                del model[name]
            else:
                model[name] = rng.choice(pool)
                p.write_bytes(model[name])
            if rng.random() < 0.2:
                fsync_path(mounted.work)

    t = threading.Thread(target=writer)
    t.start()
    try:
        freed = 0
        for _ in range(8):
            res = mounted.cli_json("gc")
            freed += res["chunks_freed"]
            if res["problems"]:
                errors += res["problems"]
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert freed, "GC swept nothing while the writer ran"
    fsync_path(mounted.work)
    for name, data in model.items():
        assert (mounted.work / name).read_bytes() == data, name
    assert sorted(os.listdir(mounted.work)) == sorted(model)
    mounted.umount()
    store_check(mounted.root)
    mounted.remount()
    for name, data in model.items():
        assert (mounted.work / name).read_bytes() == data, name


def test_what_is_open_or_shown_survives_the_gc_that_drops_its_history(mounted) -> None:
    mounted.require_real()
    keep_nothing_by_age(mounted)
    old = os.urandom(2 * MiB)
    (mounted.work / "old").write_bytes(old)
    fsync_path(mounted.work)
    cid = mounted.cli_json("log", "-n", "1")[0]["id"]
    view = mounted.mnt / ".memfs" / "history" / cid / "work"
    shell = subprocess.Popen(["sh", "-c", "read line; cat old"], cwd=view, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    held = open(mounted.work / "old", "rb")
    try:
        (mounted.work / "old").unlink()
        (mounted.work / "new").write_bytes(b"new")
        fsync_path(mounted.work)
        res = mounted.cli_json("gc")
        assert res["commits_dropped"] >= 1
        assert held.read() == old, "an open file lost its bytes to GC"
        out, _ = shell.communicate(b"\n", timeout=30)
        assert out == old, "a shell standing in a history view lost it to GC"
    finally:
        held.close()
        if shell.poll() is None:
            shell.kill()
    res = mounted.cli("undo", "1", check=False)
    assert res.returncode == 1 and "dropped by the retention policy" in res.stderr, res.stderr
    assert (mounted.work / "new").read_bytes() == b"new", "a refused undo changed the tree"
    store_check_live(mounted)


def store_check_live(m) -> None:
    assert m.cli_json("fsck")["ok"]


def test_du_and_a_dry_run(mounted) -> None:
    mounted.require_real()
    mounted.cli("config", "space-floor", "0")  # the windows decide, not the host's free space
    (mounted.work / "live").write_bytes(os.urandom(MiB))
    (mounted.work / "gone").write_bytes(os.urandom(2 * MiB))
    fsync_path(mounted.work)
    (mounted.work / "gone").unlink()
    fsync_path(mounted.work)
    du = mounted.cli_json("du")
    assert du["live"] >= MiB and du["history"] >= 2 * MiB and du["reclaimable"] == 0, du
    text = mounted.cli("du").stdout
    assert "live data" in text and "history" in text and "reclaimable" in text, text
    keep_nothing_by_age(mounted)
    dry = mounted.cli_json("gc", "--dry-run")
    assert dry["dry_run"] and dry["commits_dropped"] >= 1 and dry["reclaimable_bytes"] >= 2 * MiB
    assert mounted.cli_json("du")["reclaimable"] >= 2 * MiB, "the dry run reclaimed"
    assert mounted.cli_json("log", "-n", "50")[-1]["message"] == "init", "dry run dropped"
    done = mounted.cli_json("gc")
    assert done["chunk_bytes_freed"] >= 2 * MiB
    assert mounted.cli_json("du")["reclaimable"] == 0


def test_a_history_view_only_browsed_does_not_keep_its_bytes_from_gc(mounted) -> None:
    """Found in a user trial: after `grep -r x .memfs/history/by-time` (a day-two search of
    history, no process left in it), deleting a 2 MiB file and `memfs gc` gave back 5 KiB;
    `memfs du` said the file's bytes were 'live data: what branch heads and checkpoints name'."""
    mounted.require_real()
    keep_nothing_by_age(mounted)
    mounted.cli("config", "space-floor", "0")
    (mounted.work / "gone").write_bytes(os.urandom(2 * MiB))
    fsync_path(mounted.work)
    subprocess.run(["grep", "-r", "-q", "no-such-text", str(mounted.mnt / ".memfs" / "history"
                                                            / "by-time")], timeout=60)
    (mounted.work / "gone").unlink()
    (mounted.work / "kept").write_bytes(b"kept")
    fsync_path(mounted.work)
    assert mounted.cli_json("du")["live"] < MiB, "a deleted file counted as live data"
    done = mounted.cli_json("gc")
    assert done["commits_dropped"] >= 1 and done["chunk_bytes_freed"] >= 2 * MiB, done


def test_releasing_browsed_views_spares_a_shell_standing_in_one(mounted) -> None:
    """GC lets the kernel forget the views only browsed (memfs.fs.view_release), but a view a
    process stands in keeps its name: that shell's getcwd() and its reads still work, and
    the history it stands in is kept."""
    mounted.require_real()
    keep_nothing_by_age(mounted)
    mounted.cli("config", "space-floor", "0")
    old = os.urandom(2 * MiB)
    (mounted.work / "old").write_bytes(old)
    fsync_path(mounted.work)
    days = mounted.mnt / ".memfs" / "history" / "by-time"
    # The view's root (the name a release would take from the kernel) of the commit that has
    # `old`: found by its id, not as the last name listed (two commits of one second sort
    # by id, so the last name was an earlier commit once in a CI run).
    cid = mounted.cli_json("log", "-n", "1")[0]["id"]
    (view,) = [p for day in days.iterdir() for p in day.iterdir() if p.name.endswith(cid[:12])]
    assert (view / "work" / "old").exists()
    shell = subprocess.Popen(["sh", "-c", "read line; /bin/pwd -P; cat work/old"], cwd=view,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        subprocess.run(["grep", "-r", "-q", "no-such-text", str(days)], timeout=60)
        (mounted.work / "old").unlink()
        fsync_path(mounted.work)
        done = mounted.cli_json("gc")
        out, err = shell.communicate(b"\n", timeout=30)
        assert shell.returncode == 0, err
        assert out == str(view).encode() + b"\n" + old, "the shell's view lost its name or data"
        assert done["chunk_bytes_freed"] < MiB, "GC freed what a shell's view still shows"
    finally:
        if shell.poll() is None:
            shell.kill()
    assert (view / "work" / "old").read_bytes() == old
    store_check_live(mounted)
