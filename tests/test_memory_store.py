"""MemoryStore: real generation files, compare-and-swap, online record operations."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
from helpers.memory import run_python, snapshot

from memfs.memory.errors import InvalidRecord, MemoryDamaged, NoSuchRecord, StaleRevision
from memfs.memory.generation import workspace_revision
from memfs.memory.preview import Delete, Put, preview_global_change, preview_workspace_changes
from memfs.memory.store import MemoryStore


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(tmp_path / "memory")


def test_empty_store_reads_without_creating_anything(store: MemoryStore) -> None:
    gen = store.workspace_generation("work")
    assert gen.records == {} and gen.seq == 0 and gen.revision == workspace_revision({})
    assert store.global_generation().content == ""
    assert store.history("work") == [] and store.workspaces() == []
    assert not store.root.exists()


def test_commit_writes_plain_files_readable_with_cat(store: MemoryStore) -> None:
    before = store.workspace_generation("work")
    plan = preview_workspace_changes(before, [Put("editor", "# Editor\r\n- tabs  \n"),
                                              Put("lang", "Python 3.11")])
    assert store.commit_workspace("work", plan, before.revision) == plan.revision
    store.replace_global("# Global\n- English\n")
    out = subprocess.run(["cat", "workspaces/work/editor.md", "workspaces/work/index.md",
                          "global.md"], cwd=store.root, capture_output=True, text=True, check=True)
    assert out.stdout == ("# Editor\n- tabs\n"
                          "# Memory index\n\n- editor.md: Editor\n- lang.md: Python 3.11\n"
                          "# Global\n- English\n")
    after = store.workspace_generation("work")
    assert after.records == plan.records and after.index == plan.index and after.seq == 1
    assert sorted(os.listdir(store.root / "workspaces" / "work")) == [
        ".manifest.json", "editor.md", "index.md", "lang.md"]


def test_stale_revision_is_refused_and_changes_nothing(store: MemoryStore) -> None:
    base = store.workspace_generation("work")
    mine = preview_workspace_changes(base, [Put("a", "mine")])
    theirs = preview_workspace_changes(base, [Put("b", "theirs")])
    store.commit_workspace("work", theirs, base.revision)
    before = snapshot(store.root)
    with pytest.raises(StaleRevision, match="never merged"):
        store.commit_workspace("work", mine, base.revision)
    assert snapshot(store.root) == before
    g = store.global_generation()
    store.commit_global("# one\n", g.revision)
    with pytest.raises(StaleRevision):
        store.commit_global("# two\n", g.revision)
    assert store.global_generation().content == "# one\n"


def test_no_change_keeps_revision_and_skips_the_swap(store: MemoryStore) -> None:
    rev = store.put_record("work", "a", "# A\n")
    g = store.replace_global("# G\n")
    before = snapshot(store.root)
    cur = store.workspace_generation("work")
    plan = preview_workspace_changes(cur, [Put("a", "# A\r\n\n")])
    assert plan.no_change and plan.diff == ()
    assert store.commit_workspace("work", plan, rev) == rev
    assert store.put_record("work", "a", "# A   \n") == rev
    assert store.commit_global("# G\n\n", g) == g
    assert store.replace_global("\n# G") == g
    assert snapshot(store.root) == before
    assert store.workspace_generation("work").seq == 1 and store.global_generation().seq == 1


def test_tampered_preview_is_refused(store: MemoryStore) -> None:
    cur = store.workspace_generation("work")
    plan = preview_workspace_changes(cur, [Put("a", "# A\n")])
    for bad in (dataclasses.replace(plan, records={"a": "# A  \n"}),
                dataclasses.replace(plan, records={"../x": "# A\n"}),
                dataclasses.replace(plan, records={"a": "# B\n"}),
                dataclasses.replace(plan, index="# forged\n")):
        with pytest.raises(InvalidRecord):
            store.commit_workspace("work", bad, cur.revision)
    with pytest.raises(InvalidRecord):
        store.commit_workspace("other", plan, cur.revision)
    assert snapshot(store.root) == {}


def test_online_record_operations(store: MemoryStore) -> None:
    r1 = store.put_record("work", "a", "# A\n")
    r2 = store.rename_record("work", "a", "b")
    assert store.read_record("work", "b") == "# A\n"
    with pytest.raises(NoSuchRecord):
        store.read_record("work", "a")
    r3 = store.delete_record("work", "b")
    assert len({r1, r2, r3}) == 3
    assert store.workspace_generation("work").records == {}
    with pytest.raises(NoSuchRecord):
        store.delete_record("work", "b")
    before = snapshot(store.root)
    for name, content in (("../evil", "x"), ("index", "x"), ("ok", ""), ("ok", "\x00"),
                          ("ok", "x" * 70000)):
        with pytest.raises(InvalidRecord):
            store.put_record("work", name, content)
    with pytest.raises(InvalidRecord):
        store.replace_global("bad \x01")
    assert snapshot(store.root) == before
    assert [i.seq for i in store.history("work")] == [3, 2, 1]
    assert store.history("work")[0].current and store.history("work")[1].names == ("b",)


def test_preview_refuses_duplicates_and_missing_deletes(store: MemoryStore) -> None:
    cur = store.workspace_generation("work")
    with pytest.raises(InvalidRecord, match="two changes"):
        preview_workspace_changes(cur, [Put("a", "x"), Delete("a")])
    with pytest.raises(InvalidRecord, match="no such record"):
        preview_workspace_changes(cur, [Delete("a")])
    g = preview_global_change(store.global_generation(), None)
    assert g.no_change


def test_damaged_generation_is_reported_not_trusted(store: MemoryStore) -> None:
    store.put_record("work", "a", "# A\n")
    path = store.root / "workspaces" / "work" / "a.md"
    os.chmod(path, 0o644)
    path.write_text("# edited behind memfs' back\n")
    with pytest.raises(MemoryDamaged, match="does not match"):
        store.workspace_generation("work")


def test_a_commit_prunes_no_generation(store: MemoryStore) -> None:
    """Which generations stay is the retention policy's, applied by gc
    (tests/test_memory_retention.py); a commit keeps every one."""
    for i in range(35):
        store.put_record("work", "a", f"version {i}")
    hist = store.history("work")
    assert [h.seq for h in hist] == list(range(35, 0, -1))
    assert store.read_record("work", "a") == "version 34\n"


def test_concurrent_cas_across_processes_has_one_winner(tmp_path: Path) -> None:
    """Two processes commit against the same revision; the flock makes exactly one win."""
    root = tmp_path / "memory"
    base = MemoryStore(root).workspace_generation("work").revision
    code = """
        import sys, time
        from pathlib import Path
        from memfs.memory.errors import StaleRevision
        from memfs.memory.preview import Put, preview_workspace_changes
        from memfs.memory.store import MemoryStore
        s = MemoryStore(Path(sys.argv[1]))
        plan = preview_workspace_changes(s.workspace_generation("work"), [Put(sys.argv[2], "x")])
        while time.time() < float(sys.argv[3]):
            pass
        try:
            s.commit_workspace("work", plan, sys.argv[4]); print("won")
        except StaleRevision:
            print("stale")
    """
    import sys
    import textwrap
    import time

    start = str(time.time() + 1.0)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(root), name,
                               start, base], stdout=subprocess.PIPE, text=True, env=env)
             for name in ("p1", "p2")]
    results = sorted(p.communicate(timeout=30)[0].strip() for p in procs)
    assert results == ["stale", "won"]
    assert len(MemoryStore(root).workspace_generation("work").records) == 1


def test_reader_in_another_process_sees_committed_generation(store: MemoryStore) -> None:
    rev = store.put_record("work", "a", "# A\n")
    out = run_python(f"""
        from pathlib import Path
        from memfs.memory.store import MemoryStore
        print(MemoryStore(Path({str(store.root)!r})).workspace_generation("work").revision)
    """)
    assert out.stdout.strip() == rev, out.stderr
