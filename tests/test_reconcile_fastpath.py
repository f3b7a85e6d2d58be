"""The unchanged fast path and the caches behind a quiet pass: each gives exactly what the slow
way gives.

- `decide_unchanged` and plan_pass's use of it are held to the full rule over generated inputs
  (disk, store, evidence, branch intent, pending intents, damaged tables, unreadable regions).
- A draft's digest is remembered by (node id, ver): a write after the digest was taken must be
  seen, or a draft would read as agreed with disk and be overwritten by a disk edit.
- The store walk a pass remembers is dropped by any change to the tree.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.backing import Backing, Binding
from memfs.reconcile.contained import RootId
from memfs.reconcile.intent import IntentTable
from memfs.reconcile.materialize_plan import plan_materialize
from memfs.reconcile.observe import FileFact, Fingerprint, Observation, Region
from memfs.reconcile.plan import (
    PassPlan,
    count_owed,
    plan_pass,
    plan_sync,
)
from memfs.reconcile.rule import (
    ABSENT,
    NO_EVIDENCE,
    NO_INTENT,
    SYNCED_UNCHANGED,
    Conflict,
    ConflictKind,
    Content,
    PathIntent,
    Pending,
    decide,
    decide_unchanged,
)
from memfs.store import Store
from memfs.workspace.workspace import FILE, Workspace

A, B, C = "a" * 32, "b" * 32, "c" * 32
DIGESTS = st.sampled_from([A, B, C])
KINDS = st.sampled_from(["text", "binary", "oversize"])
EVIDENCE = st.one_of(st.just(NO_EVIDENCE), st.just(ABSENT), DIGESTS)
PATHS = ["a", "b", "d/c", "d/e", "f/g", "f/h"]


# --- the rule-level fast path -----------------------------------------------------------------


MODES = st.one_of(st.none(), st.sampled_from([0o644, 0o755]))


@given(st.one_of(st.none(), DIGESTS), DIGESTS, EVIDENCE, KINDS, MODES, MODES, MODES)
@settings(max_examples=500, deadline=None)
def test_decide_unchanged_is_the_rule(disk, store, p, kind, dm, sm, pm):
    """Where it answers, it answers what `decide` does (no intent); it answers exactly when
    disk, store and P are one digest and one mode."""
    fast = decide_unchanged(disk, store, p, dm, sm, pm)
    if fast is not None:
        assert fast == decide(Content(disk, kind, dm), Content(store, "text", sm), p, NO_INTENT,
                              pm)
    assert (fast is not None) == (disk is not None and disk == store == p and dm == sm == pm)


# --- plan_pass over generated worlds ----------------------------------------------------------


def _fact(path: str, digest: str | None, kind: str) -> FileFact:
    fp = Fingerprint(1, 2, 3, 4, 5)
    return FileFact.of(path, 1, fp, digest, kind, "text/plain", False)  # type: ignore[arg-type]


@st.composite
def worlds(draw):
    """A mount's worth of paths, each either unchanged (disk = store = P, often with intent or
    a pending intent on top) or anything at all; sometimes an unreadable directory, sometimes
    a damaged intent table."""
    files, view, evidence, intents, pending = {}, {}, {}, {}, {}
    for path in PATHS:
        if draw(st.booleans()):  # unchanged on all three sides
            x = draw(DIGESTS)
            files[path] = _fact(path, x, draw(KINDS))
            view[path] = Content(x)
            evidence[path] = x
        else:
            disk = draw(st.sampled_from(["absent", "file", "untracked-oversize"]))
            if disk == "file":
                files[path] = _fact(path, draw(DIGESTS), draw(KINDS))
            elif disk == "untracked-oversize":
                files[path] = _fact(path, None, "oversize")
            if draw(st.booleans()):
                view[path] = Content(draw(DIGESTS))
            p = draw(EVIDENCE)
            if p is not NO_EVIDENCE:
                evidence[path] = p
        if draw(st.integers(0, 3)) == 0:
            conflict = draw(st.one_of(st.none(), st.builds(
                Conflict, st.sampled_from([k.value for k in ConflictKind]),
                st.one_of(st.none(), DIGESTS))))
            intents[path] = PathIntent(draw(st.booleans()), draw(st.booleans()), conflict)
        if draw(st.integers(0, 3)) == 0:
            pending[path] = draw(st.builds(
                Pending, st.sampled_from(["write", "unlink", "adopt"]),
                st.one_of(st.just(ABSENT), DIGESTS), st.one_of(st.just(ABSENT), DIGESTS),
                st.booleans()))
    regions = []
    listed = {"", "d", "f"}
    if draw(st.booleans()):  # f/ unreadable: nothing under it observed, nothing proven absent
        regions = [Region("f", "unreadable")]
        listed.discard("f")
        files = {p: f for p, f in files.items() if not p.startswith("f/")}
    damaged = draw(st.booleans()) and draw(st.booleans())
    replaced = frozenset(draw(st.sets(st.sampled_from(PATHS)))) if damaged else frozenset()
    table = IntentTable({p: i for p, i in intents.items() if not damaged or p in replaced},
                        damaged, "test" if damaged else "", replaced)
    obs = Observation(RootId(1, 2), "", files, listed, regions)
    return obs, view, evidence, table, pending


def _slow(plan: PassPlan) -> PassPlan:
    """The same decisions, none of them the shared object: the shortcuts downstream of
    plan_pass (listing, sync, materialize) are never taken on it."""
    return PassPlan(plan.branch, {p: dataclasses.replace(d) for p, d in plan.decisions.items()},
                    list(plan.regions))


@given(worlds())
@settings(max_examples=400, deadline=None)
def test_plan_pass_fast_path_gives_the_rules_decision(world):
    obs, view, evidence, table, pending = world
    plan = plan_pass(obs, view, evidence, table, pending, branch="main")
    assert set(plan.decisions) == set(view) | set(evidence) | set(table) | set(pending) | set(
        obs.files)
    for path, got in plan.decisions.items():
        pi = table.get(path)
        if path in pending:
            pi = dataclasses.replace(pi, pending=pending[path])
        want = decide(obs.disk(path), view.get(path, ABSENT), evidence.get(path, NO_EVIDENCE),
                      pi)
        assert got == want, path
    # Downstream, the shared decision's shortcuts change nothing either.
    slow = _slow(plan)
    assert plan.listing() == {p: (str(d.state), str(d.conflict) if d.conflict else None)
                              for p, d in sorted(slow.decisions.items()) if d.state is not None}
    for path in (None, "a", "d"):
        assert plan_sync(plan, obs, view, path=path, branch_now="main") == \
            plan_sync(slow, obs, view, path=path, branch_now="main")
    for paths, force, deletions in ((None, False, False), (["d"], True, True), (["a"], False,
                                                                                 True)):
        assert plan_materialize(plan, obs, paths=paths, force=force,
                                apply_deletions=deletions) == \
            plan_materialize(slow, obs, paths=paths, force=force, apply_deletions=deletions)
    # count_owed skips the intent lookup for unmarked paths; the counts are those of a table
    # asked about every path.
    assert count_owed(view, evidence, table, pending) == count_owed(
        view, evidence, _AskEveryPath(table), pending)


class _AskEveryPath:
    """An intent table that hides its entries, so count_owed asks `get` for every path."""

    damaged = True  # count_owed then takes no shortcut

    def __init__(self, table: IntentTable) -> None:
        self.table = table
        self.entries: dict = {}

    def get(self, path: str) -> PathIntent:
        return self.table.get(path)

    def __iter__(self):
        return iter(self.table)


def test_fast_path_taken_only_without_intent():
    """Unchanged paths share SYNCED_UNCHANGED; one with a tombstone, a pending intent or in a
    damaged table goes through the full rule (and, for the first two, still reads synced)."""
    files = {p: _fact(p, A, "text") for p in ("x", "tomb", "pend", "d/y")}
    obs = Observation(RootId(1, 2), "", files, {"", "d"}, [])
    view = {p: Content(A) for p in files}
    evidence = dict.fromkeys(files, A)
    table = IntentTable({"tomb": PathIntent(tombstone=True)})
    pending = {"pend": Pending("adopt", B, A)}
    plan = plan_pass(obs, view, evidence, table, pending, branch="main")
    assert plan.decisions["x"] is SYNCED_UNCHANGED and plan.decisions["d/y"] is SYNCED_UNCHANGED
    assert plan.decisions["tomb"] is not SYNCED_UNCHANGED
    assert plan.decisions["tomb"] == SYNCED_UNCHANGED  # the rule agrees, by value
    assert plan.decisions["pend"].resolve_pending == "done"
    damaged = plan_pass(obs, view, evidence, IntentTable(damaged=True), {}, branch="main")
    assert all(str(d.state) == "unverified" for d in damaged.decisions.values())


# --- the store side: a draft's digest, the remembered walk ------------------------------------


def _open(root: Path) -> tuple[Workspace, Backing]:
    ws = Workspace(Store.open(root), 0.0)
    return ws, Backing(ws)


def _file(ws: Workspace, *names: bytes):
    node = ws.root
    for name in names:
        node = ws.children(node)[name]
    return node


def h(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@pytest.mark.trio
async def test_a_written_draft_is_rehashed_never_a_stale_digest(tmp_path: Path):
    """The draft digest cache keys on (node id, ver). Keyed on the id alone, the second write
    below would keep the first digest: status would count no draft, and the pass would see
    S = P, take the shell's edit as "only disk changed" and overwrite the draft with it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "f.txt").write_bytes(b"agreed\n")
    ws, b = _open(tmp_path / "root")
    try:
        await b.attach(Binding("work", str(disk)))
        await ws.commit()
        f = _file(ws, b"work", b"f.txt")
        assert (await b.owed.count("work")).changes == 0
        # A write of the same bytes makes a draft (dirty) whose digest is the agreed one.
        ws.write(f, 0, b"agreed\n")
        assert f.dirty and b.view.digest_now(f) == h(b"agreed\n")
        assert (await b.owed.count("work")).changes == 0
        # Then a real edit of the same size, still uncommitted.
        ws.write(f, 0, b"edited\n")
        assert (await b.owed.count("work")).changes == 1
        # A shell edits disk: disk, store and P all differ, so the draft is kept as a conflict.
        (disk / "f.txt").write_bytes(b"shell edit\n")
        res = await b.run_pass("work")
        assert res.taken == [] and res.conflicts == ["f.txt"]
        assert ws.read(_file(ws, b"work", b"f.txt"), 0, 100) == b"edited\n"
        assert b.listing("work").entries[0].state == "conflict"
    finally:
        b.close()
        ws.store.close()


@pytest.mark.trio
async def test_remembered_store_walk_follows_every_tree_change(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "a.txt").write_text("a\n")
    ws, b = _open(tmp_path / "root")
    try:
        await b.attach(Binding("work", str(disk)))
        await ws.commit()
        assert set(b.view.nodes("work")[0]) == {"a.txt"}
        work = _file(ws, b"work")
        new = ws.create(work, b"n.txt", FILE, 0o644, 0, 0)
        assert set(b.view.nodes("work")[0]) == {"a.txt", "n.txt"}
        ws.write(new, 0, b"n\n")
        view = b.view.view(b.view.nodes("work")[0])
        assert view["n.txt"].digest == h(b"n\n")  # a draft: its live bytes, no ref yet
        await ws.commit()  # a commit changes refs and drafts, not paths: noticed all the same
        nodes, refs = b.view.nodes("work")
        assert set(nodes) == {"a.txt", "n.txt"} and (new.ref, 2) in refs
        assert b.view.view(nodes) == view
        ws.rename(work, b"n.txt", work, b"m.txt")
        assert set(b.view.nodes("work")[0]) == {"a.txt", "m.txt"}
        ws.unlink(work, b"a.txt")
        assert set(b.view.nodes("work")[0]) == {"m.txt"}
        await ws.commit()
        await ws.undo()  # the tree is replaced (the rename and unlink undone): walked again
        assert set(b.view.nodes("work")[0]) == {"a.txt", "n.txt"}
    finally:
        b.close()
        ws.store.close()
