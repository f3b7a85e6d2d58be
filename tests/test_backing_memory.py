"""What a bound mount costs the daemon per file, through a real mount: the daemon's RSS growth
from attaching a generated backing directory (the take-in and its commit) and one idle pass
after it, divided by the files (docs/lifecycle.md, "Memory")."""

from __future__ import annotations

import gc
import os
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest
import trio
import xxhash
from helpers.proc import rss
from helpers.require import require_tool

from memfs import heap
from memfs.backing.storeview import StoreView
from memfs.pathtable import FingerprintTable
from memfs.reconcile.facts import shared_content
from memfs.reconcile.observe import WalkFiles, WalkMemo, observe
from memfs.reconcile.rule import MODES, Content
from memfs.store import Store
from memfs.store.journal import FingerprintRow, Journal
from memfs.store.trees import DIR, FILE
from memfs.workspace import nodes
from memfs.workspace.workspace import Workspace

FILES = 20_000
PER_DIR = 100
# The daemon's RSS grown per file, attached and idle (see test_a_bound_mount_holds_its_bound).
# A regression guard above the run-to-run noise (~100 B), lowered as the figure drops; the
# target is well under 1 KB (docs/lifecycle.md, "Memory"). History (20k files): 5.36 KB before
# the compact nodes and memos, 3.6-3.9 KB before the heap trim and shared ints, 3.35 KB before
# the compact facts, 2.35-2.53 KB through the path tables (bound 2520, within that noise);
# 2070-2212 B once the walk keeps the files it hashes as columns (7 runs, 2026-12-02, load
# 6-9, main beside at 2352-2424 B: docs/performance.md, "The take-in's hashed files").
BOUND_PER_FILE = 2320


def tree(disk: Path, n: int) -> None:
    """n small files, PER_DIR to a directory: a source tree's shape."""
    for i in range(n):
        d = disk / f"d{i // PER_DIR:04d}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True)
        (d / f"f{i % PER_DIR:03d}.txt").write_text(f"file {i}\n")


@pytest.mark.mount
def test_a_bound_mount_holds_its_bound(mount_factory, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    tree(disk, FILES)
    m = mount_factory(root=tmp_path / "root")
    m.require_real()
    m.cli_json("sync")  # the daemon settled: nothing bound yet
    before = rss(m.proc.pid)
    res = m.cli_json("attach", "proj", str(disk))
    assert len(res["pass"]["taken"]) == FILES
    again = m.cli_json("sync")  # one idle pass: nothing more to take
    assert again["mounts"]["proj"]["taken"] == []
    grown = rss(m.proc.pid) - before
    per_file = grown / FILES
    print(f"daemon RSS grown {grown >> 20} MiB, {per_file:.0f} B a file")
    assert per_file < BOUND_PER_FILE, (
        f"the daemon grew {grown >> 20} MiB for {FILES} files: {per_file:.0f} B a file "
        f"(bound {BOUND_PER_FILE})")
    assert (m.mnt / "proj" / "d0199" / "f099.txt").read_text() == "file 19999\n"


# What the bound is made of, object by object (each fails without its sharing): a value kept per
# file and equal across files, or across the two sides of a pass, is one object, not one each.


def _traced(make):  # type: ignore[no-untyped-def]
    """What `make()` returns, and the bytes of Python objects it left allocated."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        got = make()
        gc.collect()
        return got, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_snapshot_keeps_its_rows_as_columns(tmp_path: Path) -> None:
    """The journal's snapshot keeps a file's fingerprint row as one index and `array`
    columns (memfs.pathtable), read from SQLite or patched by a write: ~135 B a file read
    with P the rows' digests (the steady state), where a dict entry, a 9-field tuple, its
    own ints and digest string cost ~255 B; the rows read back as written."""
    n = 5000

    def row(i: int) -> FingerprintRow:  # new int objects, as a stat or a row read gives them
        t = int(str(10**18 + i))
        return FingerprintRow(int(str(5000 + i)), t, int(str(t)), int(str(7000 + i)),
                              int("66305"), xxhash.xxh3_128_hexdigest(str(i).encode()),
                              "text", int(str(10**18 + 99)), "text/plain")

    # Paths interned, as the workspace's are: the snapshot shares them, they are not its cost.
    rows = {sys.intern(f"d{i // 100}/f{i}.txt"): row(i) for i in range(n)}
    j = Journal(tmp_path / "store.db")
    j.put_fingerprints("work", rows)
    j.record_evidence("work", [(p, r.digest, 0o644) for p, r in rows.items()])
    Journal(tmp_path / "store.db").pass_inputs("work")  # grows the interned strings' table
    other = Journal(tmp_path / "store.db")
    got, cost = _traced(lambda: other.pass_inputs("work"))
    assert type(got.fingerprints) is FingerprintTable and got.fingerprints == rows
    assert cost / n < 180, f"{cost / n:.0f} B a row read"
    j.pass_inputs("work")  # a snapshot current when the next write begins: patched by it
    j.put_fingerprints("work", {"c": row(n)})
    patched = j.pass_inputs("work").fingerprints
    assert type(patched) is FingerprintTable and patched == {**rows, "c": row(n)}


def test_files_hashed_in_one_directory_share_their_hash_time(tmp_path: Path) -> None:
    """The hash time a walk records is when the directory's first hash began (earlier than
    each file's own, so only stricter for the racy rule): one value for the directory."""
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text(f"{i}\n")
    ticks = iter(range(10**18, 10**18 + 100))
    hashed = observe(tmp_path, clock=lambda: next(ticks)).hashed
    assert len(hashed) == 5 and {r.hashed_at_ns for r in hashed.values()} == {10**18}


def test_a_walk_keeps_its_hashed_files_as_columns(tmp_path: Path) -> None:
    """A take-in's walk hashes every file, and what it keeps of them lives until the journal
    stores their rows: the attach's memory peak, whose arenas stay resident. The rows are one
    path table's columns with the modes beside (HashedFiles), a fact built when read: ~200 B
    a file with the path string, where a HashRecord, a FileFact, their ints and the interned
    digest were ~430 B. The facts and rows read as hashed."""
    disk = tmp_path / "disk"
    n = 2000
    tree(disk, n)
    observe(disk)  # the interned strings' table grown once
    got, cost = _traced(lambda: observe(disk))
    assert cost / n < 300, f"{cost / n:.0f} B a file"
    assert len(got.hashed) == len(got.files) == n
    fact = got.files["d0003/f007.txt"]
    assert fact.rehashed and fact.mode == 0o644 and fact.kind == "text"
    assert fact.digest == xxhash.xxh3_128_hexdigest(b"file 307\n") == \
        got.hashed["d0003/f007.txt"].digest
    assert fact.size == 9 and fact.seen == got.hashed["d0003/f007.txt"]
    j = Journal(tmp_path / "store.db")
    j.put_fingerprints("work", got.hashed)  # type: ignore[arg-type]
    assert j.fingerprints("work") == dict(got.hashed.items())


def test_a_quiet_walk_keeps_no_fact_a_file(tmp_path: Path) -> None:
    """A walk that makes its directories' memos keeps no fact object per file: the memos
    name the snapshot's rows by index with their modes, and the files are read through them,
    a fact built when read; a quiet walk after it takes every memo and reads the same."""
    disk = tmp_path / "disk"
    n = 2000
    tree(disk, n)
    j = Journal(tmp_path / "store.db")
    memo = WalkMemo()
    old = os.stat(disk).st_mtime_ns - 10**10  # hashed long after the files last changed
    first = observe(disk, memo=memo, clock=lambda: old + 2 * 10**10)
    j.put_fingerprints("work", dict(first.hashed))  # type: ignore[arg-type]
    snap = j.pass_inputs("work").fingerprints
    # Each directory decided against the rows, its memo made: the memos and the files kept
    # (was a fact a file in a memo's tuple, and a dict of them: ~130 B a file).
    made, cost = _traced(lambda: observe(disk, cache=snap, memo=memo))
    assert cost / n < 40, f"{cost / n:.0f} B a file"
    quiet = observe(disk, cache=snap, memo=memo)
    assert isinstance(quiet.files, WalkFiles) and not quiet.files.own
    assert len(quiet.files) == n and quiet.files == made.files
    assert quiet.files["d0001/f005.txt"].seen == snap["d0001/f005.txt"]


def test_the_store_view_and_the_disk_side_share_a_content(tmp_path: Path) -> None:
    """A file the store and disk agree on gets one Content for both S and D (the store view
    takes it from the disk side's cache), not a second object per file."""
    ws = Workspace(Store.open(tmp_path / "root"), commit_interval=0.05)
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    ws.write(ws.create(work, b"a.txt", FILE, 0o644, 0, 0), 0, b"hello\n")
    trio.run(ws.commit)
    view = StoreView(ws)
    got = view.view(view.nodes("work")[0])["a.txt"]
    digest = xxhash.xxh3_128_hexdigest(b"hello\n")
    assert got == Content(digest, "text", 0o644)
    assert got is shared_content(digest, "text", MODES[0o644])  # what Observation.disk gives
    ws.store.close()


def test_unloaded_files_of_one_size_share_their_data(tmp_path: Path) -> None:
    """A committed file whose chunk map is not loaded keeps only its size: one shared object
    per size (a FileData of its own was 72 bytes a node). A write loads the file's own data
    first, so the other file of that size is untouched; setting a field on the shared one
    fails loudly."""
    ws = Workspace(Store.open(tmp_path / "root"), commit_interval=0.05)
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    a = ws.create(work, b"a.txt", FILE, 0o644, 0, 0)
    b = ws.create(work, b"b.txt", FILE, 0o644, 0, 0)
    ws.write(a, 0, b"one\n")
    ws.write(b, 0, b"two\n")
    trio.run(ws.commit)
    assert a.data is b.data and isinstance(a.data, nodes.UnloadedData)
    with pytest.raises(TypeError, match="shared"):
        b.data.size = 99  # type: ignore[union-attr]
    ws.write(a, 0, b"ONE!\n")
    assert a.data is not b.data
    assert ws.read(a, 0, 10) == b"ONE!\n" and ws.read(b, 0, 10) == b"two\n"
    trio.run(ws.commit)
    assert ws.read(b, 0, 10) == b"two\n" and b.data.size == 4  # type: ignore[union-attr]
    ws.store.close()


def test_a_shared_content_costs_no_key_of_its_own() -> None:
    """The Contents D and S share are found by the digest alone (one kind and mode per digest
    is nearly every file): no key tuple per entry. A digest under a second mode still gets
    a Content of its own, shared in turn."""
    import tracemalloc

    digests = [sys.intern(xxhash.xxh3_128_hexdigest(str(i).encode())) for i in range(10_000)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = [shared_content(d, "text", MODES[0o644]) for d in digests]
        per = (tracemalloc.get_traced_memory()[0] - base) / len(digests)
    finally:
        tracemalloc.stop()
    assert per < 130, f"{per:.0f} B an entry"  # 85 measured; 158 with a key tuple each
    a = shared_content(digests[0], "text", MODES[0o755])
    assert a is not kept[0] and a.mode == 0o755 and kept[0].mode == 0o644
    assert shared_content(digests[0], "text", MODES[0o755]) is a
    assert shared_content(digests[0], "text", MODES[0o644]) is kept[0]


def test_a_decision_is_compact() -> None:
    """A take-in decides every file it takes, and the pass's plans are kept until the next
    pass: a Decision has slots and shares the empty requirement set (a dict and a
    frozenset of its own made it 440 bytes)."""
    import tracemalloc
    from dataclasses import replace

    from memfs.reconcile.rule import Action, Decision, Detail, State

    digests = [xxhash.xxh3_128_hexdigest(str(i).encode()) for i in range(10_000)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = [replace(Decision(Action.ADOPT_DISK, State.SYNCED, Detail.INGEST, record=d),
                        mode=MODES[0o644], record_mode=MODES[0o644]) for d in digests]
        per = (tracemalloc.get_traced_memory()[0] - base) / len(kept)
    finally:
        tracemalloc.stop()
    assert per < 200, f"{per:.0f} B a decision"  # 168 measured; 440 before


def test_nodes_share_their_mode_and_owner_ints(tmp_path: Path) -> None:
    """A node's mode, uid and gid are one int object per value (0o644 or a uid of 1000 built
    fresh was 32 bytes a node each), made or loaded from a committed tree."""
    ws = Workspace(Store.open(tmp_path / "root"), commit_interval=0.05)
    work = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
    a, b = (ws.create(work, n, FILE, int("644", 8), int("1000"), int(str(10**6)), )
            for n in (b"a", b"b"))
    assert a.mode is b.mode and a.uid is b.uid and a.gid is b.gid
    trio.run(ws.commit)
    ws.store.close()
    ws = Workspace(Store.open(tmp_path / "root"), commit_interval=0.05)
    kids = ws.children(ws.children(ws.root)[b"work"])
    a, b = kids[b"a"], kids[b"b"]
    assert a.mode == 0o644 and a.uid == 1000 and a.gid == 10**6
    assert a.mode is b.mode and a.uid is b.uid and a.gid is b.gid
    ws.store.close()


def test_nodes_made_in_one_clock_tick_share_their_time() -> None:
    """A take-in makes thousands of nodes a tick: their times are one int object (equal
    values; an int of its own is 32 bytes a node)."""
    for _ in range(100):
        a, b = nodes.now_ns(), nodes.now_ns()
        if a == b:
            assert a is b
            return
    require_tool("the clock ticked between every pair of calls: no coarse clock here "
                 "(CLOCK_REALTIME_COARSE ticks every few ms on Linux)")


def test_a_trim_gives_the_freed_heap_back() -> None:
    """What a worker thread allocated and freed stays in the process's RSS until the heap is
    trimmed (glibc keeps it in the thread's arena); memfs.heap.trim, which a large pass ends
    with, gives it back."""
    if not heap.trim():
        require_tool("no malloc_trim in this C library (not glibc)")
    kept: list[bytes] = []

    def churn() -> None:  # 64 MiB in 4 KB blocks (malloc's, not Python's small objects)
        blocks = [bytes(4096) for _ in range(16384)]
        kept.append(bytes(4096))  # above them all: the arena's top cannot just shrink
        blocks.clear()

    t = threading.Thread(target=churn)
    t.start()
    t.join()
    before = rss(os.getpid())
    heap.trim()
    given = before - rss(os.getpid())
    assert given > 32 << 20, f"the trim gave back {given >> 20} MiB of 64"


@pytest.mark.trio
async def test_status_counts_from_the_passes_converted_evidence(tmp_path: Path) -> None:
    """What status counts as owed reads P converted as the last whole pass converted it (the
    same journal snapshot), not a converted copy of its own: one map per mount, not two."""
    from helpers.backing import attached, close

    ws, b, _ = await attached(tmp_path, {f"f{i}.txt": f"{i}\n" for i in range(20)})
    await b.run_pass("work")
    await b.refresh_status()
    ours = b.passes.evidence_memos[("work", "")]
    assert len(ours.evidence) == 20
    assert b.owed._evidence["work"] is ours
    close(ws, b)


def test_evidence_with_no_agreed_absence_is_not_copied() -> None:
    """P converted for the rule is the journal's rows themselves when no row is an agreed
    absence (a bound mount's P after a take-in): no second map a file. One absence makes a
    converted copy, as the rule reads it."""
    from memfs.backing.gather import convert_evidence
    from memfs.reconcile.rule import ABSENT

    rows = {"a.txt": "d" * 32, "b.txt": "e" * 32}
    assert convert_evidence(rows).evidence is rows
    rows["gone.txt"] = None
    ev = convert_evidence(rows).evidence
    assert ev is not rows and ev["gone.txt"] is ABSENT and ev["a.txt"] == "d" * 32


def test_a_refs_digest_costs_no_key_tuple() -> None:
    """The store view's digests are keyed by the ref string (and the size it was hashed at),
    not by a (ref, size) tuple kept a file: a learned digest keeps no tuple of the pass's.
    The same ref at a second size (a file a truncate extended keeps its chunks) still has a
    digest of its own."""
    import tracemalloc

    from memfs.backing.storeview import RefDigests

    refs = [sys.intern("c:" + xxhash.xxh3_128_hexdigest(str(i).encode())) for i in range(10_000)]
    sizes = [int(str(5000 + i)) for i in range(10_000)]  # ints of their own, as rows give them
    hexes = [r[2:] for r in refs]
    digests = RefDigests()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        got = {(r, s): h for r, s, h in zip(refs, sizes, hexes, strict=True)}  # hash_refs
        digests.update(got)
        del got
        per = (tracemalloc.get_traced_memory()[0] - base) / len(refs)
    finally:
        tracemalloc.stop()
    assert per < 70, f"{per:.0f} B an entry"  # 53 measured; 85 with a key tuple each
    assert digests.of(refs[0], 5000) == refs[0][2:] and (refs[1], 5001) in digests
    assert digests.of(refs[0], 6000) is None and (refs[0], 5001) not in digests
    digests[(refs[0], 6000)] = "other"
    assert digests.of(refs[0], 6000) == "other" and digests.of(refs[0], 5000) == refs[0][2:]
    assert digests.get(("c:unknown", 1)) is None and len(digests) == 10_001


@pytest.mark.trio
async def test_the_store_view_keeps_no_object_per_unloaded_file(tmp_path: Path) -> None:
    """After a take-in the files are unloaded and a pass reads them from the tree rows; what the
    store view keeps of each between passes (the walk's files, their digests, the view S) is a
    row of packed columns (memfs/backing/storefiles.py, ~55 B), not a stand-in, its ref string
    and four map slots (~0.3 KB with the Contents the view kept)."""
    import gc
    import tracemalloc

    from helpers.backing import attached, close

    from memfs.backing.storeview import Unbuilt, hash_refs

    n = 3000  # a take-in this large unloads its files
    ws, b, _ = await attached(tmp_path, {f"f{i:04d}.txt": f"{i}\n" for i in range(n)})
    await b.run_pass("work")
    first = StoreView(ws)
    nodes, refs = first.nodes("work")
    assert len(nodes) == n and all(isinstance(u, Unbuilt) for u in nodes.values())
    got = hash_refs(ws.store, refs)  # the store's caches warmed: only the view is measured
    del nodes, first
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        view = StoreView(ws)
        nodes, refs = view.nodes("work")
        assert len(refs) == n
        del refs  # the pass's thread hashes them and lets them go
        view.learn(got)
        s = view.view(nodes)
        assert view.nodes("work")[1] == []  # every digest known
        gc.collect()
        per = (tracemalloc.get_traced_memory()[0] - base) / n
    finally:
        tracemalloc.stop()
    assert len(s) == n and s["f0007.txt"].digest == xxhash.xxh3_128_hexdigest(b"7\n")
    assert per < 100, f"{per:.0f} B a file"  # 54 measured; 286 with an object per file
    close(ws, b)


@pytest.mark.trio
async def test_files_loaded_after_a_walk_need_no_hash_again(tmp_path: Path) -> None:
    """A whole walk's table takes its unloaded files' digests out of `digests`; once a lookup
    loads their directory, the next walk must still know them (a ref is immutable): before
    the packed table nothing was hashed again, with it every loaded file was re-read from the
    store at the next pass (3000 of 3000 here)."""
    from helpers.backing import attached, close

    from memfs.backing.storeview import Unbuilt, hash_refs

    n = 3000  # a take-in this large unloads its files
    ws, b, _ = await attached(tmp_path, {f"f{i:04d}.txt": f"{i}\n" for i in range(n)})
    await b.run_pass("work")
    view = StoreView(ws)
    nodes, refs = view.nodes("work")
    assert all(isinstance(u, Unbuilt) for u in nodes.values()) and len(refs) == n
    view.learn(hash_refs(ws.store, refs))
    view.view(nodes)  # the mount's last whole view
    top = view.mount_node("work")
    assert top is not None
    ws.children(top)  # a lookup loads the directory: its files are nodes now
    ws.mutation_seq += 1  # a change elsewhere: the next question walks again
    again, refs = view.nodes("work")
    assert not any(isinstance(u, Unbuilt) for u in again.values())
    assert refs == [], f"{len(refs)} of {n} digests to hash again"
    close(ws, b)


@pytest.mark.trio
async def test_a_take_in_keeps_no_plan_past_its_pass(tmp_path: Path) -> None:
    """A pass that took files in made its plan on a view that is gone: kept (the planner's
    memo, the mount state's last applied plan), its decisions and the walk's records it holds
    stayed alive through the next pass's walk and store view, the attach's memory peak
    (docs/performance.md). A quiet pass's plan is still kept, for the next one to reuse."""
    from helpers.backing import attached, close

    from memfs.reconcile.plan import PassPlan

    n = 300
    ws, b, _ = await attached(tmp_path, {f"f{i:03d}.txt": f"{i}\n" for i in range(n)})
    gc.collect()
    assert "" not in b.planner.last.get("work", {})
    assert b.passes.states.of("work").applied is None
    big = [o for o in gc.get_objects() if isinstance(o, PassPlan) and len(o.decisions) >= n]
    assert big == [], "the take-in's plan is still alive"
    await b.run_pass("work")  # quiet: its plan is kept for the next pass
    assert "" in b.planner.last["work"]
    plan = b.planner.last["work"][""][1]
    await b.run_pass("work")
    assert b.planner.last["work"][""][1] is plan
    close(ws, b)
