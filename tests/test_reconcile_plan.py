"""Pass, sync, materialize and status contracts, decided over real observed directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.reconcile import intent as intent_mod
from memfs.reconcile.materialize_plan import plan_materialize
from memfs.reconcile.observe import observe
from memfs.reconcile.plan import (
    Discarded,
    count_owed,
    plan_pass,
    plan_sync,
)
from memfs.reconcile.rule import (
    ABSENT,
    NO_EVIDENCE,
    Conflict,
    Content,
    DiskUnknown,
    PathIntent,
    Pending,
)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(256)


def h(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


def text(data: bytes) -> Content:
    return Content(h(data), "text")


@pytest.fixture
def world(tmp_path: Path):
    """Disk after some shell work, the store with some workspace work, and the evidence."""
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    disk = {
        "same.txt": b"same\n",  # synced
        "drafted.txt": b"v1\n",  # workspace edited it: draft
        "shell-edit.txt": b"shell v2\n",  # shell edited it
        "both.txt": b"disk side\n",  # both edited: conflict
        "ws-deleted.txt": b"keep?\n",  # workspace deleted it
        "other-branch.txt": b"ob\n",  # this branch lacks it
        "legacy.txt": b"newer on disk\n",  # no evidence, differs (field report)
        "shot.png": PNG,  # binary, new on disk
        "src/new-on-disk.md": b"# new\n",
    }
    for name, data in disk.items():
        (root / name).write_bytes(data)
    store = {
        "same.txt": text(b"same\n"),
        "drafted.txt": text(b"v2 draft\n"),
        "shell-edit.txt": text(b"v1\n"),
        "both.txt": text(b"workspace side\n"),
        "shell-rm.txt": text(b"rm me\n"),
        "draft-rm.txt": text(b"draft\n"),
        "legacy.txt": text(b"stale tree\n"),
        "legacy-missing.txt": text(b"pre-evidence\n"),
        "new-in-ws.txt": text(b"created in the workspace\n"),
    }
    evidence = {
        "same.txt": h(b"same\n"),
        "drafted.txt": h(b"v1\n"),
        "shell-edit.txt": h(b"v1\n"),
        "both.txt": h(b"v1\n"),
        "shell-rm.txt": h(b"rm me\n"),
        "draft-rm.txt": h(b"v1\n"),
        "ws-deleted.txt": h(b"keep?\n"),
        "other-branch.txt": h(b"ob\n"),
    }
    table = intent_mod.IntentTable({
        "ws-deleted.txt": PathIntent(tombstone=True),
        "new-in-ws.txt": PathIntent(origin_store=True),
    })
    return root, store, evidence, table


def states(plan):
    return {p: (s if k is None else f"{s}:{k}") for p, (s, k) in plan.listing().items()}


def test_pass_lists_every_state(world):
    root, store, evidence, table = world
    obs = observe(root)
    plan = plan_pass(obs, store, evidence, table, branch="main")
    assert states(plan) == {
        "same.txt": "synced",
        "drafted.txt": "workspace-draft",
        "shell-edit.txt": "synced",  # adopted
        "both.txt": "conflict:both-changed",
        "draft-rm.txt": "conflict:deleted-on-disk",
        "ws-deleted.txt": "workspace-deleted",
        "other-branch.txt": "not-in-branch",
        "legacy.txt": "conflict:unknown-provenance",
        "legacy-missing.txt": "disk-missing-provenance-unknown",
        "new-in-ws.txt": "workspace-draft",
        "shot.png": "disk-only",
        "src/new-on-disk.md": "synced",
    }
    assert "shell-rm.txt" in plan.adoptions()  # removed from the store, listed nowhere


def test_sync_without_path_never_discards_a_draft(world):
    root, store, evidence, table = world
    obs = observe(root)
    plan = plan_pass(obs, store, evidence, table, branch="main")
    sync = plan_sync(plan, obs, store, branch_now="main")
    assert sync.discarded == []
    assert set(sync.take) == {"shell-edit.txt", "shell-rm.txt", "shot.png", "src/new-on-disk.md"}
    assert sync.take["shell-rm.txt"] is ABSENT and sync.take["shot.png"] is ABSENT  # disk-only
    for kept in ("drafted.txt", "both.txt", "draft-rm.txt", "ws-deleted.txt", "new-in-ws.txt",
                 "legacy.txt", "legacy-missing.txt"):
        assert kept not in sync.take
    assert set(sync.record_conflicts) == {"both.txt", "draft-rm.txt", "legacy.txt"}


def test_path_sync_takes_disk_and_lists_what_it_gave_up(world):
    root, store, evidence, table = world
    obs = observe(root)
    plan = plan_pass(obs, store, evidence, table, branch="main")
    sync = plan_sync(plan, obs, store, path="", branch_now="main")
    assert sorted(sync.discarded, key=lambda d: d.path) == [
        Discarded("both.txt", "conflict", "modified"),
        Discarded("draft-rm.txt", "conflict", "deleted"),
        Discarded("drafted.txt", "workspace-draft", "modified"),
        Discarded("legacy-missing.txt", "disk-missing-provenance-unknown", "deleted"),
        Discarded("legacy.txt", "conflict", "modified"),
        Discarded("new-in-ws.txt", "workspace-draft", "deleted"),
        Discarded("ws-deleted.txt", "workspace-deleted", "restored"),
    ]
    assert sync.take["drafted.txt"].digest == h(b"v1\n")
    assert "same.txt" not in sync.take  # agreed: kept as it is
    assert sync.take["other-branch.txt"].digest == h(b"ob\n")
    # A path sync is kept to its branch.
    moved = plan_sync(plan, obs, store, path="drafted.txt", branch_now="other")
    assert moved.refused and not moved.take


def test_path_sync_keeps_an_agreed_binary(tmp_path: Path):
    root = tmp_path / "r"
    root.mkdir()
    (root / "pic.png").write_bytes(PNG)
    store = {"pic.png": Content(h(PNG), "binary")}
    obs = observe(root)
    plan = plan_pass(obs, store, {"pic.png": h(PNG)}, intent_mod.IntentTable(), branch="b")
    sync = plan_sync(plan, obs, store, path="", branch_now="b")
    assert sync.take == {} and sync.discarded == [] and states(plan) == {"pic.png": "synced"}


def test_materialize_takes_up_only_what_is_owed(world):
    root, store, evidence, table = world
    obs = observe(root)
    plan = plan_pass(obs, store, evidence, table, branch="main")
    bare = plan_materialize(plan, obs)
    assert {w.path for w in bare.writes} == {"drafted.txt", "new-in-ws.txt"}
    assert all(not w.force for w in bare.writes)
    assert bare.unlinks == [] and bare.deletions_left == ["ws-deleted.txt"]
    skipped = {s.path: s for s in bare.skipped}
    assert set(skipped) == {"both.txt", "draft-rm.txt", "legacy.txt", "legacy-missing.txt"}
    assert "--force legacy.txt" in skipped["legacy.txt"].remedy
    # Force without a path changes nothing about copies without evidence (field report).
    forced = plan_materialize(plan, obs, force=True)
    assert {w.path for w in forced.writes} == {"drafted.txt", "new-in-ws.txt"}
    # Named and forced: the workspace's side is written over disk's.
    named = plan_materialize(plan, obs, paths=["legacy.txt", "both.txt"], force=True)
    assert {(w.path, w.force) for w in named.writes} == {("legacy.txt", True), ("both.txt", True)}
    # A pre-evidence entry disk lacks: written only when named.
    assert [w.path for w in plan_materialize(plan, obs, paths=["legacy-missing.txt"]).writes] == [
        "legacy-missing.txt"]
    # Deletions only with apply_deletions.
    dele = plan_materialize(plan, obs, apply_deletions=True)
    assert [(u.path, u.force) for u in dele.unlinks] == [("ws-deleted.txt", False)]


def test_materialize_pin_and_unverified(world):
    root, store, evidence, table = world
    (root / "locked").mkdir()
    obs = observe(root, ignore=["locked"])
    store = dict(store, **{"locked/x.txt": text(b"x\n")})
    plan = plan_pass(obs, store, dict(evidence, **{"locked/x.txt": h(b"old\n")}), table,
                     branch="feature")
    refused = plan_materialize(plan, obs, pinned_branch="main")
    assert refused.refused and not refused.writes
    ok = plan_materialize(plan, obs, pinned_branch="main", force=True)
    assert any(s.path == "locked/x.txt" and s.state == "unverified" for s in ok.skipped)


def test_status_counts_what_disk_owes_by_evidence():
    store = {"draft.txt": text(b"d2"), "same.txt": text(b"s"), "legacy.txt": text(b"l"),
             "new.txt": text(b"n"), "failed.txt": text(b"f2")}
    evidence = {"draft.txt": h(b"d1"), "same.txt": h(b"s"), "gone.txt": h(b"g"),
                "c.txt": h(b"c"), "failed.txt": h(b"f1")}
    table = intent_mod.IntentTable({
        "gone.txt": PathIntent(tombstone=True),
        "new.txt": PathIntent(origin_store=True),
        "c.txt": PathIntent(conflict=Conflict("both-changed", h(b"x"))),
    })
    counts = count_owed(store, evidence, table, {"failed.txt": Pending("write", h(b"f1"),
                                                                         h(b"f2"))})
    # draft, new, failed (its write never completed) / gone / c; legacy.txt never checked.
    assert (counts.pending_changes, counts.pending_workspace_deletions, counts.conflicts) == (3, 1,
                                                                                              1)


def test_a_change_no_materialize_writes_is_not_owed():
    """A hard-linked path's change (materialize skips it, forced or not) is not_carried, not
    owed; the same change at a plain path is owed; an agreed linked path counts nowhere."""
    store = {"linked.txt": text(b"l2"), "plain.txt": text(b"p2"), "agreed.txt": text(b"a"),
             "made.txt": text(b"m")}
    evidence = {"linked.txt": h(b"l1"), "plain.txt": h(b"p1"), "agreed.txt": h(b"a")}
    table = intent_mod.IntentTable({"made.txt": PathIntent(origin_store=True)})
    counts = count_owed(store, evidence, table,
                        unwritable=frozenset({"linked.txt", "agreed.txt", "made.txt"}))
    assert (counts.pending_changes, counts.not_carried) == (1, 2)
    assert count_owed(store, evidence, table).pending_changes == 3


def test_a_deletion_no_materialize_carries_is_not_owed():
    """A workspace deletion where the workspace now holds a link or special file (`ln -sf`
    over a synced file: materialize keeps disk's file while the link stands) is not_carried;
    the same deletion at a plain path is owed."""
    evidence = {"linked.txt": h(b"l"), "gone.txt": h(b"g")}
    table = intent_mod.IntentTable({"linked.txt": PathIntent(tombstone=True),
                                    "gone.txt": PathIntent(tombstone=True)})
    counts = count_owed({}, evidence, table, unwritable=frozenset({"linked.txt"}))
    assert (counts.pending_workspace_deletions, counts.not_carried) == (1, 1)
    assert count_owed({}, evidence, table).pending_workspace_deletions == 2


def test_accept_root_sets_evidence_aside_and_nothing_reads_deleted(tmp_path: Path):
    """After accept_root the old evidence is aside: a file the new root lacks stays in the
    workspace, a new one is taken in, nothing is taken as deleted; a second sync is a no-op."""
    from memfs.store.journal import Journal

    root = tmp_path / "new-root"
    root.mkdir()
    (root / "fresh.txt").write_bytes(b"fresh\n")
    (root / "same.txt").write_bytes(b"same\n")
    j = Journal(tmp_path / "store.db")
    j.record_evidence("work", [("kept.txt", h(b"k\n")), ("same.txt", h(b"same\n"))], root=(1, 1))
    obs = observe(root)
    j.accept_root("work", obs.root.dev, obs.root.ino)
    evidence = {p: r.digest for p, r in j.evidence_under("work").items()}
    assert evidence == {}
    store = {"kept.txt": text(b"k\n"), "same.txt": text(b"same\n")}
    plan = plan_pass(obs, store, evidence, intent_mod.IntentTable(), branch="main")
    sync = plan_sync(plan, obs, store, branch_now="main")
    assert {p: t.digest for p, t in sync.take.items()} == {"fresh.txt": h(b"fresh\n")}
    assert all(v is not ABSENT for v in sync.take.values())
    assert states(plan)["kept.txt"] == "disk-missing-provenance-unknown"
    j.record_evidence("work", sync.record.items(), root=(obs.root.dev, obs.root.ino))
    store["fresh.txt"] = text(b"fresh\n")
    evidence = {p: r.digest for p, r in j.evidence_under("work").items()}
    again = plan_sync(plan_pass(obs, store, evidence, intent_mod.IntentTable(), branch="main"),
                      obs, store, branch_now="main")
    assert again.take == {} and again.discarded == []


# --- properties of the contracts over random worlds -------------------------------------------

DIGESTS = [h(b"1"), h(b"2"), h(b"3")]


@dataclass
class World:
    """A pure stand-in for an Observation (the planning functions need only this protocol)."""

    scope: str
    files: dict
    regions: list
    disk_map: dict

    def disk(self, path):
        return self.disk_map.get(path, ABSENT)


side = st.one_of(st.just(ABSENT), st.builds(Content, st.sampled_from(DIGESTS),
                                             st.sampled_from(["text", "binary"])))
disk_side = st.one_of(side, st.just(DiskUnknown("unreadable")))
ev = st.one_of(st.just(NO_EVIDENCE), st.just(ABSENT), st.sampled_from(DIGESTS))
pi = st.builds(PathIntent, st.booleans(), st.booleans(),
               st.one_of(st.none(), st.builds(Conflict, st.just("both-changed"),
                                              st.sampled_from(DIGESTS))))
worlds = st.dictionaries(st.sampled_from([f"p{i}" for i in range(6)]),
                        st.tuples(disk_side, side, ev, pi), min_size=1)


def build(w):
    disk_map = {p: d for p, (d, _, _, _) in w.items()}
    files = {p: None for p, d in disk_map.items() if isinstance(d, Content)}
    obs = World("", files, [], disk_map)
    store = {p: s for p, (_, s, _, _) in w.items() if isinstance(s, Content)}
    evidence = {p: e for p, (_, _, e, _) in w.items() if e is not NO_EVIDENCE}
    table = intent_mod.IntentTable({p: i for p, (_, _, _, i) in w.items()})
    return obs, store, evidence, table


@settings(max_examples=300, deadline=None)
@given(worlds, st.booleans(), st.booleans())
def test_contracts_hold_in_any_world(w, force, apply_deletions):
    obs, store, evidence, table = build(w)
    plan = plan_pass(obs, store, evidence, table, branch="b")
    # A sync without a path never discards, and takes only paths whose store side is what disk
    # last agreed with (or that the store never had and never deleted).
    sync = plan_sync(plan, obs, store, branch_now="b")
    assert sync.discarded == []
    for p in sync.take:
        e = evidence.get(p, NO_EVIDENCE)
        s = store.get(p, ABSENT)
        s_val = ABSENT if s is ABSENT else s.digest
        assert (e is not NO_EVIDENCE and e == s_val) or (
            e is NO_EVIDENCE and s is ABSENT and not table.get(p).tombstone)
    # A bare materialize, forced or not, never overwrites a disk copy the evidence does not vouch
    # for, and never deletes without apply_deletions.
    mat = plan_materialize(plan, obs, force=force, apply_deletions=apply_deletions)
    for wr in mat.writes:
        d = obs.disk(wr.path)
        e = evidence.get(wr.path, NO_EVIDENCE)
        assert not wr.force
        assert (d is ABSENT) or (isinstance(d, Content) and d.digest == e)
    if not apply_deletions:
        assert mat.unlinks == []
    for u in mat.unlinks:
        assert not u.force and evidence.get(u.path) == obs.disk(u.path).digest
    # What was skipped or left is listed, never silently dropped.
    owed = {p for p, d in plan.decisions.items() if d.owes is not None}
    handled = ({x.path for x in mat.writes} | {x.path for x in mat.unlinks}
               | {x.path for x in mat.skipped} | set(mat.deletions_left))
    assert owed <= handled


# --- type changes: a file on one side where the other keeps a directory -----------------------


def test_type_changes_take_disk_only_where_the_store_gives_up_what_is_in_the_way(tmp_path: Path):
    """Disk: `gone/` agreed and removed, a file `gone` made; `kept` made a file where the
    store's kept/ holds a draft; `f` made a directory where the store's agreed file was; `g`
    made a directory where the store keeps a draft file. The plan puts a file only where
    nothing the store keeps is in the way; the others are type-changed conflicts (nothing
    taken, recorded or owed), and materialize says why it cannot write below them."""
    root = tmp_path / "root"
    root.mkdir()
    for rel, data in {"gone": b"x\n", "kept": b"k\n", "f/inner.txt": b"i\n",
                      "g/inner.txt": b"j\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    v1 = b"v1\n"
    store = {"gone/a.txt": text(v1), "kept/d.txt": text(b"draft\n"), "f": text(v1),
             "g": text(b"g draft\n")}
    evidence = {"gone/a.txt": h(v1), "kept/d.txt": h(v1), "f": h(v1), "g": h(v1)}
    obs = observe(root)
    plan = plan_pass(obs, store, evidence, intent_mod.IntentTable(), branch="main")
    assert states(plan) == {
        "gone": "synced", "kept": "conflict:type-changed", "kept/d.txt": "conflict:deleted-on-disk",
        "f/inner.txt": "synced", "g": "conflict:deleted-on-disk",
        "g/inner.txt": "conflict:type-changed"}
    for p in ("kept", "g/inner.txt"):
        assert plan.decisions[p].record is None and plan.decisions[p].owes is None
    sync = plan_sync(plan, obs, store, branch_now="main")
    assert set(sync.take) == {"gone", "gone/a.txt", "f", "f/inner.txt"}
    # A path sync takes disk's side under its path, saying what it gave up ...
    path_sync = plan_sync(plan, obs, store, path="kept", branch_now="main")
    assert path_sync.take["kept"].digest == h(b"k\n") and path_sync.take["kept/d.txt"] is ABSENT
    assert path_sync.discarded == [Discarded("kept/d.txt", "conflict", "deleted")]
    # ... but not below a file the store keeps outside it.
    inner = plan_sync(plan, obs, store, path="g/inner.txt", branch_now="main")
    assert "g/inner.txt" not in inner.take
    mplan = plan_materialize(plan, obs, paths=["g"], force=True, mount="work")
    (skip,) = mplan.skipped
    assert skip.state == "conflict: type-changed" and "`memfs sync work/g`" in skip.remedy
    assert mplan.writes == []


def test_a_disk_file_at_a_workspace_link_is_a_type_change_a_path_sync_takes(tmp_path: Path):
    """Disk's file where the workspace keeps a symlink (and no file): a plain pass takes
    nothing (a type-changed conflict, nothing recorded or owed); a path sync takes the file
    over the link (`replace`) and lists it discarded with what it replaced. The same for a
    workspace deletion of a synced file replaced by a link (`ln -sf`), which is no put."""
    root = tmp_path / "d"
    root.mkdir()
    (root / "n.txt").write_bytes(b"n\n")
    (root / "a.txt").write_bytes(b"a\n")
    obs = observe(root)
    evidence = {"a.txt": h(b"a\n")}
    table = intent_mod.IntentTable({"a.txt": PathIntent(tombstone=True)})
    specials = {"n.txt": "l", "a.txt": "l"}
    plan = plan_pass(obs, {}, evidence, table, branch="main", specials=specials)
    assert states(plan) == {"n.txt": "conflict:type-changed", "a.txt": "workspace-deleted"}
    assert plan.decisions["n.txt"].record is None and plan.decisions["n.txt"].owes is None
    assert "symbolic link" in (plan.decisions["n.txt"].reason or "")
    # (without them the rule takes it in, which the tree could never apply over the link)
    assert states(plan_pass(obs, {}, evidence, table, branch="main"))["n.txt"] == "synced"
    sync = plan_sync(plan, obs, {}, branch_now="main", specials=specials)
    assert "n.txt" not in sync.take and sync.replace == frozenset() and sync.discarded == []
    for path, was in (("n.txt", "conflict"), ("a.txt", "workspace-deleted")):
        one = plan_sync(plan, obs, {}, path=path, branch_now="main", specials=specials)
        assert one.take[path].digest == h((root / path).read_bytes()), one.take
        assert one.replace == frozenset({path})
        assert one.discarded == [Discarded(path, was, "restored", "symbolic link")]


def test_a_disk_directory_at_a_workspace_link_is_a_type_change_a_path_sync_takes(tmp_path: Path):
    """Disk's files below a path where the workspace keeps a symlink: a plain pass takes
    none of them (type-changed, the reason naming the link's path); a path sync below the link
    takes nothing and lists nothing discarded; a sync of the link's path takes them and
    lists the link replaced by disk's directory."""
    root = tmp_path / "d"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "new.txt").write_bytes(b"n\n")
    (root / "sub" / "c.txt").write_bytes(b"c\n")
    obs = observe(root)
    evidence = {"sub/c.txt": h(b"c\n")}
    table = intent_mod.IntentTable({"sub/c.txt": PathIntent(tombstone=True)})
    specials = {"sub": "l"}
    plan = plan_pass(obs, {}, evidence, table, branch="main", specials=specials)
    assert states(plan) == {"sub/new.txt": "conflict:type-changed",
                            "sub/c.txt": "workspace-deleted"}
    assert "'sub'" in (plan.decisions["sub/new.txt"].reason or "")
    below = plan_sync(plan, obs, {}, path="sub/c.txt", branch_now="main", specials=specials)
    assert below.take == {} and below.discarded == [] and below.replace == frozenset()
    whole = plan_sync(plan, obs, {}, path="sub", branch_now="main", specials=specials)
    assert set(whole.take) == {"sub/new.txt", "sub/c.txt"} and whole.replace == {"sub"}
    assert whole.discarded == [Discarded("sub/c.txt", "workspace-deleted", "restored"),
                               Discarded("sub", "not-writable", "replaced", "symbolic link")]
