"""The swap: a commit killed at any step leaves the old generation or the new, never a mix.

Two kinds of crash. SIGKILL of a real process at each named point (MEMFS_CRASH_AT) proves the
ordering of steps; it cannot prove durability, since the page cache survives a killed process.
The power-cut model records every file operation of a commit and rebuilds, for every prefix,
only what fsync made durable (a directory's entries only once that directory was fsynced),
then opens a store on that tree.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest
from helpers.memory import run_python, snapshot

from memfs.memory.durable import FsOps
from memfs.memory.generation import global_revision, workspace_revision
from memfs.memory.preview import Delete, Put, preview_workspace_changes
from memfs.memory.store import COMMIT_CRASH_POINTS, MemoryStore

OLD = {"a": "# A\n", "b": "# B\n"}
NEW = {"a": "# A, changed\n", "c": "# C\n"}  # b deleted, c added: a mix would be visible
BEFORE_SWAP = {"files-written", "generation-synced", "generation-named", "link-created"}


def _seed(root: Path) -> MemoryStore:
    store = MemoryStore(root)
    for name, content in OLD.items():
        store.put_record("work", name, content)
    store.replace_global("# Global old\n")
    return store


def _assert_consistent(store: MemoryStore) -> tuple[dict[str, str], str]:
    """Read what is current and check it against its manifest and the plain files."""
    gen = store.workspace_generation("work")  # raises MemoryDamaged on a revision mismatch
    assert gen.records in (OLD, NEW), gen.records
    link = store.root / "workspaces" / "work"
    manifest = json.loads((link / ".manifest.json").read_text())
    assert manifest["revision"] == gen.revision == workspace_revision(gen.records)
    on_disk = {p.name[:-3]: p.read_text() for p in link.iterdir()
               if p.suffix == ".md" and p.name != "index.md"}
    assert on_disk == gen.records
    glob = store.global_generation()
    assert glob.content in ("# Global old\n", "# Global new\n")
    assert glob.revision == global_revision((store.root / "global.md").read_text())
    return gen.records, glob.content


@pytest.mark.parametrize("point", COMMIT_CRASH_POINTS)
def test_sigkill_at_each_step_leaves_old_or_new(tmp_path: Path, point: str) -> None:
    root = tmp_path / "memory"
    store = _seed(root)
    old_rev = store.workspace_generation("work").revision
    out = run_python(f"""
        from pathlib import Path
        from memfs.memory.preview import Put, Delete, preview_workspace_changes
        from memfs.memory.store import MemoryStore
        s = MemoryStore(Path({str(root)!r}))
        cur = s.workspace_generation("work")
        plan = preview_workspace_changes(cur, [Put("a", {NEW['a']!r}), Delete("b"),
                                               Put("c", {NEW['c']!r})])
        s.commit_workspace("work", plan, cur.revision)
        g = s.global_generation()
        s.commit_global("# Global new\\n", g.revision)
    """, env={"MEMFS_CRASH_AT": point})
    assert out.returncode == -signal.SIGKILL, out.stderr
    records, glob = _assert_consistent(store)
    assert records == (OLD if point in BEFORE_SWAP else NEW)
    assert glob == "# Global old\n"  # the workspace commit died first
    # A commit that died before its swap left no trace in history ...
    assert [h.revision for h in store.history("work")][0] == store.workspace_generation(
        "work").revision
    assert all(h.seq <= store.workspace_generation("work").seq for h in store.history("work"))
    # ... and the next commit cleans up what it left and succeeds.
    cur = store.workspace_generation("work")
    plan = preview_workspace_changes(cur, [Put("d", "# D\n")])
    assert store.commit_workspace("work", plan, cur.revision) == plan.revision
    leftovers = [k for k in snapshot(root) if ".tmp-" in k or ".swap-" in k]
    assert leftovers == []
    seqs = [h.seq for h in store.history("work")]
    assert seqs == sorted(set(seqs), reverse=True) and seqs[0] == cur.seq + 1
    if point in BEFORE_SWAP:
        assert store.workspace_generation("work").revision != old_rev


@pytest.mark.parametrize("point", ["generation-named", "swapped"])
def test_sigkill_during_global_commit(tmp_path: Path, point: str) -> None:
    root = tmp_path / "memory"
    store = _seed(root)
    out = run_python(f"""
        from pathlib import Path
        from memfs.memory.store import MemoryStore
        s = MemoryStore(Path({str(root)!r}))
        s.replace_global("# Global new\\n")
    """, env={"MEMFS_CRASH_AT": point})
    assert out.returncode == -signal.SIGKILL, out.stderr
    _, glob = _assert_consistent(store)
    assert glob == ("# Global old\n" if point in BEFORE_SWAP else "# Global new\n")
    assert store.replace_global("# Global third\n") == global_revision("# Global third\n")


class PowerCutModel(FsOps):
    """Does every operation for real and mirrors it in a model of what a power cut keeps.

    Directories are inodes with entry maps, `live` (what the kernel shows) and `durable`
    (what survives). File data is durable at write_file (it fsyncs); a directory's entries
    become durable only when that directory is fsynced. `cut(k)` rebuilds the durable tree
    after the first k recorded operations.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ino = itertools.count(1)
        self.live: dict[int, dict[str, tuple]] = {}
        self.root_ino = self._import(root)
        self.durable_at: list[dict[int, dict[str, tuple]]] = [self._copy(self.live)]
        self.durable = self._copy(self.live)

    @staticmethod
    def _copy(state: dict[int, dict[str, tuple]]) -> dict[int, dict[str, tuple]]:
        return {ino: dict(entries) for ino, entries in state.items()}

    def _import(self, path: Path) -> int:
        ino = next(self.ino)
        self.live[ino] = {}
        for child in path.iterdir():
            if child.is_symlink():
                self.live[ino][child.name] = ("link", os.readlink(child))
            elif child.is_dir():
                self.live[ino][child.name] = ("dir", self._import(child))
            else:
                self.live[ino][child.name] = ("file", child.read_bytes())
        return ino

    def _dir(self, path: Path) -> int:
        ino = self.root_ino
        for part in path.relative_to(self.root).parts:
            kind, ref = self.live[ino][part]
            assert kind == "dir"
            ino = ref
        return ino

    def _step(self) -> None:
        self.durable_at.append(self._copy(self.durable))

    def mkdir(self, path: Path) -> None:
        super().mkdir(path)
        ino = next(self.ino)
        self.live[ino] = {}
        self.durable[ino] = {}
        self.live[self._dir(path.parent)][path.name] = ("dir", ino)
        self._step()

    def write_file(self, path: Path, data: bytes) -> None:
        super().write_file(path, data)
        self.live[self._dir(path.parent)][path.name] = ("file", data)
        self._step()

    def symlink(self, target: str, path: Path) -> None:
        super().symlink(target, path)
        self.live[self._dir(path.parent)][path.name] = ("link", target)
        self._step()

    def rename(self, src: Path, dst: Path) -> None:
        super().rename(src, dst)
        assert src.parent == dst.parent, "the model covers same-directory renames only"
        entries = self.live[self._dir(src.parent)]
        entries[dst.name] = entries.pop(src.name)
        self._step()

    def fsync_dir(self, path: Path) -> None:
        super().fsync_dir(path)
        ino = self._dir(path)
        self.durable[ino] = dict(self.live[ino])
        self._step()

    def remove_tree(self, path: Path) -> None:
        super().remove_tree(path)
        self.live[self._dir(path.parent)].pop(path.name, None)
        self._step()

    def cut(self, k: int, dest: Path) -> Path:
        """Materialize the durable tree after k operations into `dest`."""
        state = self.durable_at[k]

        def build(ino: int, where: Path) -> None:
            where.mkdir()
            for name, (kind, ref) in state.get(ino, {}).items():
                if kind == "dir":
                    build(ref, where / name)
                elif kind == "link":
                    os.symlink(ref, where / name)
                else:
                    (where / name).write_bytes(ref)

        build(self.root_ino, dest)
        return dest


def test_power_cut_after_any_operation_keeps_old_or_new(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    _seed(root)
    model = PowerCutModel(root)
    store = MemoryStore(root, ops=model)
    cur = store.workspace_generation("work")
    plan = preview_workspace_changes(cur, [Put("a", NEW["a"]), Delete("b"), Put("c", NEW["c"])])
    store.commit_workspace("work", plan, cur.revision)
    store.commit_global("# Global new\n", store.global_generation().revision)
    steps = len(model.durable_at)
    assert steps > 10
    seen = []
    for k in range(steps):
        records, glob = _assert_consistent(MemoryStore(model.cut(k, tmp_path / f"cut{k}")))
        seen.append((records == NEW, glob == "# Global new\n"))
    assert seen[0] == (False, False) and seen[-1] == (True, True)
    assert seen == sorted(seen), "a later cut must never show an older generation"


def test_power_cut_during_a_prune_never_loses_a_kept_generation_or_a_tombstone(
        tmp_path: Path) -> None:
    """A retention prune (memfs.memory.store.prune) cut after any operation: every kept
    generation reads whole, and a generation that is gone has left its tombstone (so a read
    of it is refused by name, never as unknown)."""
    root = tmp_path / "memory"
    store = MemoryStore(root)
    for i in range(5):
        store.put_record("work", "n", f"# N\nversion {i}\n")
    revs = {g.seq: g.revision for g in store.history("work")}
    before = {seq: store.generation_at("work", rev).records for seq, rev in revs.items()}
    model = PowerCutModel(root)
    dropped = MemoryStore(root, ops=model).prune(
        "work", lambda rows, cur: {cur: "current", 2: "a receipt"}, "a test", 10**18)
    assert sorted(d.seq for d in dropped) == [1, 3, 4]
    assert len(model.durable_at) > 8
    for k in range(len(model.durable_at)):
        cut = MemoryStore(model.cut(k, tmp_path / f"cut{k}"))
        assert cut.check() == [], k
        kept = {g.seq for g in cut.history("work")}
        assert {5, 2} <= kept, (k, kept)
        for seq in kept:
            assert cut.generation_at("work", revs[seq]).records == before[seq]
        gone = set(before) - kept
        assert gone <= {d.seq for d in cut.dropped("work")}, (k, gone)
    assert {g.seq for g in MemoryStore(model.cut(len(model.durable_at) - 1,
                                                 tmp_path / "last")).history("work")} == {5, 2}

