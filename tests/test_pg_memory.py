"""Agent memory on a store shared in PostgreSQL: one truth for every host.

Revisions are compare-and-swap rows (memfs.memory.shared), equal bit for bit to the file
store's; the review lock also holds across hosts (an advisory lock in the database).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from helpers.pg import host_root, pg_missing
from helpers.require import require_tool

from memfs.consolidate.lock import review_lock
from memfs.errors import MemfsError
from memfs.memory.errors import StaleRevision
from memfs.memory.preview import Put, preview_workspace_changes
from memfs.memory.shared import SharedMemoryStore, open_memory_store
from memfs.memory.store import MemoryStore
from memfs.store.pg.conn import Conn


def shared(url: str, root: Path) -> SharedMemoryStore:
    """A host's own connection (open_memory_store shares one per process)."""
    return SharedMemoryStore(Conn(url, autocommit=False), root)


def test_two_hosts_share_memory_and_a_stale_commit_is_refused(tmp_path: Path,
                                                              pg_url: str) -> None:
    a = shared(pg_url, host_root(tmp_path, "a", pg_url))
    b = shared(pg_url, host_root(tmp_path, "b", pg_url))
    files = MemoryStore(tmp_path / "files")
    rev = a.put_record("work", "editor", "# Editor\ntabs\n")
    assert rev == files.put_record("work", "editor", "# Editor\ntabs\n")  # the same revision
    seen = b.workspace_generation("work")
    assert seen.revision == rev and seen.records == {"editor": "# Editor\ntabs\n"}
    assert b.workspaces() == ["work"]
    # Both hosts preview against one revision: the first commit wins, the second is stale.
    pa = preview_workspace_changes(seen, [Put("lang", "# Lang\nPython\n")])
    pb = preview_workspace_changes(seen, [Put("lang", "# Lang\nRust\n")])
    won = a.commit_workspace("work", pa, rev)
    with pytest.raises(StaleRevision):
        b.commit_workspace("work", pb, rev)
    assert b.read_record("work", "lang") == "# Lang\nPython\n"
    assert [g.revision for g in b.history("work")] == [won, rev]
    g = a.replace_global("# Prefs\nconcise\n")
    assert b.global_generation().revision == g == files.replace_global("# Prefs\nconcise\n")
    assert open_memory_store(tmp_path / "files-root").__class__ is MemoryStore


def test_the_review_lock_holds_across_hosts(tmp_path: Path, pg_url: str) -> None:
    ra, rb = host_root(tmp_path, "a", pg_url), host_root(tmp_path, "b", pg_url)
    held, release = threading.Event(), threading.Event()

    def a_reviews() -> None:
        with review_lock(ra):
            held.set()
            release.wait(30)

    t = threading.Thread(target=a_reviews)
    t.start()
    try:
        assert held.wait(30)
        start = time.monotonic()
        with pytest.raises(MemfsError, match="another host"):
            with review_lock(rb, timeout=0.5):
                pass
        assert time.monotonic() - start >= 0.5
    finally:
        release.set()
        t.join()
    with review_lock(rb, timeout=5):  # free again once a's review ended
        pass


@pytest.mark.mount
def test_a_record_written_through_one_mount_is_read_through_the_other(
        mount_factory, pg_url: str, tmp_path: Path) -> None:
    require_tool(pg_missing())
    a = mount_factory(root=host_root(tmp_path, "a", pg_url), name="a")
    b = mount_factory(root=host_root(tmp_path, "b", pg_url), name="b")
    (a.work / "x").write_text("so the workspace exists\n")
    (b.mnt / ".memfs/memory").stat()
    rec = a.mnt / ".memfs/memory/workspaces/work/editor.md"
    rec.write_text("# Editor\nwritten on host a\n")
    other = b.mnt / ".memfs/memory/workspaces/work/editor.md"
    deadline = time.monotonic() + 20
    while True:
        try:
            if other.read_text() == "# Editor\nwritten on host a\n":
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "host b never showed host a's record"
        time.sleep(0.1)
    assert not os.path.exists(b.root / "memory" / "workspaces")  # no copy in b's root
