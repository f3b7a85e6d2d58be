"""Undo, branches and checkpoints through the CLI while mounted; past states under .memfs/.

"At once" means the next fd-less read (a new `cat`), `ls` and `stat` already see the restored
tree: the daemon must invalidate the kernel's page and dentry caches, not wait for timeouts.
Files change to contents of the same length so that a stale cached page cannot hide behind a
size change.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.files import gone, write_durably

pytestmark = pytest.mark.mount


def cat(path: Path) -> bytes:
    return subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout


def ls(path: Path) -> list[str]:
    return sorted(subprocess.run(["ls", "-A", str(path)], capture_output=True, text=True,
                                 check=True).stdout.split())


def warm(path: Path) -> None:
    """Pull name, attributes and pages into the kernel caches."""
    os.stat(path)
    cat(path)
    ls(path.parent)


def commits_since(m, head: str) -> int:
    log = m.cli_json("log", "-n", "200")
    ids = [c["id"] for c in log]
    assert head in ids, f"head {head} not in log {ids}"
    return ids.index(head)


def test_undo_shows_earlier_tree_at_once(mounted) -> None:
    mounted.require_real()
    doc = mounted.work / "doc.txt"
    write_durably(doc, b"version-one-AAAA\n")
    head1 = mounted.status()["head"]
    write_durably(doc, b"version-two-BBBB\n")
    write_durably(mounted.work / "new.txt", b"born after one\n")
    for p in (doc, mounted.work / "new.txt"):
        warm(p)
    assert cat(doc) == b"version-two-BBBB\n"

    n = commits_since(mounted, head1)
    assert n >= 1
    # Past the first commit: refused by name, nothing moves (N parents back, on each backend).
    head = mounted.status()["head"]
    refused = mounted.cli("undo", "--commits", "100000", check=False)
    assert refused.returncode == 1 and "goes past the first commit" in refused.stderr, \
        refused.stderr
    assert mounted.status()["head"] == head
    mounted.cli("undo", "--commits", str(n))
    assert mounted.status()["head"] == head1, "undo --commits N moves the branch back N commits"

    assert cat(doc) == b"version-one-AAAA\n", "stale page after undo"
    assert os.stat(doc).st_size == len(b"version-one-AAAA\n")
    assert "new.txt" not in ls(mounted.work), "stale name in readdir after undo"
    assert gone(mounted.work / "new.txt"), "stale dentry after undo"
    # The history still has the undone state.
    old = mounted.mnt / ".memfs" / "history" / head1 / "work" / "doc.txt"
    assert old.read_bytes() == b"version-one-AAAA\n"


def test_branch_switch_shows_other_tree_at_once(mounted) -> None:
    mounted.require_real()
    main = mounted.status()["branch"]
    a = mounted.work / "a.txt"
    write_durably(a, b"main-content-1\n")
    mounted.cli("branch", "create", "side")
    mounted.cli("branch", "switch", "side")
    assert mounted.status()["branch"] == "side"
    assert cat(a) == b"main-content-1\n"
    write_durably(a, b"side-content-2\n")
    write_durably(mounted.work / "side-only.txt", b"side\n")
    warm(a)
    warm(mounted.work / "side-only.txt")

    mounted.cli("branch", "switch", main)
    assert mounted.status()["branch"] == main
    assert cat(a) == b"main-content-1\n", "stale page after branch switch"
    assert "side-only.txt" not in ls(mounted.work)
    assert gone(mounted.work / "side-only.txt"), "stale dentry after branch switch"

    assert {main, "side"} <= set(os.listdir(mounted.mnt / ".memfs" / "branches"))
    side = mounted.mnt / ".memfs" / "branches" / "side" / "work"
    assert (side / "a.txt").read_bytes() == b"side-content-2\n"
    assert (side / "side-only.txt").read_bytes() == b"side\n"
    assert {main, "side"} <= {b if isinstance(b, str) else b["name"]
                              for b in branch_names(mounted)}

    mounted.cli("branch", "switch", "side")
    assert cat(a) == b"side-content-2\n"
    assert cat(mounted.work / "side-only.txt") == b"side\n"


def branch_names(m) -> list[object]:
    listing = m.cli_json("branch", "list")
    return listing["branches"] if isinstance(listing, dict) else listing


def test_checkpoint_can_be_branched_from(mounted) -> None:
    mounted.require_real()
    c = mounted.work / "c.txt"
    write_durably(c, b"before\n")
    mounted.cli("checkpoint", "cp1")
    write_durably(c, b"after!\n")
    (mounted.work / "later").mkdir()
    warm(c)
    mounted.cli("branch", "create", "fromcp", "--at", "cp1")
    mounted.cli("branch", "switch", "fromcp")
    assert cat(c) == b"before\n"
    assert gone(mounted.work / "later")


def test_history_and_branches_are_read_only(mounted) -> None:
    mounted.require_real()
    write_durably(mounted.work / "h.txt", b"h\n")
    head = mounted.status()["head"]
    past = mounted.mnt / ".memfs" / "history" / head / "work"
    assert (past / "h.txt").read_bytes() == b"h\n"
    for attempt in (lambda: open(past / "h.txt", "wb"),
                    lambda: open(past / "new", "wb"),
                    lambda: os.unlink(past / "h.txt"),
                    lambda: os.mkdir(past / "d"),
                    lambda: open(mounted.mnt / ".memfs" / "status", "w")):
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno in (errno.EROFS, errno.EPERM, errno.EACCES)


def test_log_records_the_writing_process(mounted) -> None:
    mounted.require_real()
    target = mounted.work / "by-child.txt"
    code = ("import os,sys\nf=open(sys.argv[1],'wb')\nf.write(b'child')\nf.flush()\nos.fsync(f.fileno())\n"
            "print(os.getpid())")
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                         text=True, check=True)
    pid = int(out.stdout)
    log = mounted.cli_json("log", "-n", "20")
    for entry in log:
        assert {"id", "parent", "time", "message", "processes"} <= set(entry)
    procs = [p for c in log for p in c["processes"] if p["pid"] == pid]
    assert procs, f"no commit names pid {pid}: {log}"
    assert procs[0]["uid"] == os.getuid()
    assert procs[0]["comm"].startswith("python")
