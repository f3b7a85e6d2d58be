"""The kill matrix: SIGKILL a real process after the intent and after the effect, then restart.

A child process runs one write-ahead step (a materialize write, a materialize unlink, an
auto-materialize new-file write, a shell-edit adoption) against a real journal and a real
directory, and kills itself at MEMFS_CRASH_AT. The test then reopens everything as a restart
would, observes, decides on the branch (and on another branch), and checks that nothing is
lost: no draft overwritten, no deletion resurrected, disk matching neither outcome an
interrupted conflict, and a retry completing. Kills prove ordering; durability rests on fsync.
"""

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

from memfs.reconcile import apply, intent
from memfs.reconcile.materialize_plan import plan_materialize
from memfs.reconcile.observe import observe
from memfs.reconcile.plan import pending_from_journal, plan_pass
from memfs.reconcile.rule import ABSENT, Action, ConflictKind, Content, Detail, PathIntent, State
from memfs.store.journal import EvidenceRecord, Journal

OLD, NEW, SHELL = b"old\n", b"workspace draft\n", b"shell edit\n"
MOUNT = "work"


def h(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


CHILD = textwrap.dedent("""
    import json, os, sys
    import xxhash
    from memfs.reconcile import apply
    from memfs.reconcile.contained import RootId
    from memfs.reconcile.rule import ABSENT
    from memfs.testing import crash_point
    from memfs.store.journal import Journal
    op, db, root, dev, ino, store_file, old, new, shell = sys.argv[1:10]
    hx = lambda s: xxhash.xxh3_128(s.encode()).hexdigest()
    j = Journal(db)
    rid = RootId(int(dev), int(ino))
    if op == "write":
        apply.push_write(j, "work", root, rid, "f.txt", new.encode(), new_digest=hx(new),
                         expected=hx(old), branch="main")
    elif op == "new":
        apply.push_write(j, "work", root, rid, "n/new.txt", new.encode(), new_digest=hx(new),
                         expected=ABSENT, branch="main")
    elif op == "unlink":
        apply.push_unlink(j, "work", root, rid, "f.txt", expected=hx(old), branch="main")
    elif op == "adopt":
        # An adoption's order, as a pass runs it (memfs.backing.passes): the intent (the store
        # side's old and new values), the tree change made durable, then the completion.
        iid = j.begin_intent("work", "f.txt", "adopt", old=hx(old), new=hx(shell),
                             branch="main", root=(rid.dev, rid.ino))
        crash_point("apply:after-intent")
        with open(store_file, "w") as f:
            json.dump({"f.txt": shell}, f)
            f.flush()
            os.fsync(f.fileno())
        crash_point("apply:after-effect")
        j.complete_intent(iid)
""")


def run_child(op: str, point: str, tmp: Path, root: Path, rid, store_file: Path) -> None:
    args = [op, str(tmp / "store.db"), str(root), str(rid.dev), str(rid.ino), str(store_file),
            OLD.decode(), NEW.decode(), SHELL.decode()]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                          env=dict(os.environ, MEMFS_CRASH_AT=point), timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.fixture
def setup(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "f.txt").write_bytes(OLD)
    rid = observe(root).root
    j = Journal(tmp_path / "store.db")
    j.record_evidence(MOUNT, [("f.txt", h(OLD))], root=(rid.dev, rid.ino))
    j.close()
    store_file = tmp_path / "store.json"
    store_file.write_text(json.dumps({"f.txt": OLD.decode()}))
    return tmp_path, root, rid, store_file


def restart_and_decide(tmp: Path, root: Path, rid, store: dict[str, bytes], table, branch="main"):
    j = Journal(tmp / "store.db")  # a restart: a new process view of the journal
    obs = observe(root, expected_root=rid)
    pending = pending_from_journal(j.pending_intents(MOUNT), branch)
    evidence = {p: (ABSENT if r.digest is None else r.digest)
                for p, r in j.evidence_under(MOUNT).items()}
    view = {p: Content(h(b)) for p, b in store.items()}
    return j, obs, plan_pass(obs, view, evidence, table, pending, branch=branch)


def redo(j: Journal, obs, plan, root: Path, rid, store: dict[str, bytes], **kw) -> None:
    """The next materialize: what the plan says disk owes, through the write-ahead steps."""
    mat = plan_materialize(plan, obs, **kw)
    for w in mat.writes:
        apply.push_write(j, MOUNT, root, rid, w.path, store[w.path], new_digest=h(store[w.path]),
                         expected=w.expected, force=w.force, branch=plan.branch)
    for u in mat.unlinks:
        apply.push_unlink(j, MOUNT, root, rid, u.path, expected=u.expected, force=u.force,
                          branch=plan.branch)


@pytest.mark.parametrize("point", ["apply:after-intent", "effect:renamed", "apply:after-effect"])
def test_materialize_write_killed(setup, point: str):
    tmp, root, rid, store_file = setup
    run_child("write", point, tmp, root, rid, store_file)
    store = {"f.txt": NEW}  # the draft in the branch
    table = intent.IntentTable()
    j, obs, plan = restart_and_decide(tmp, root, rid, store, table)
    dec = plan.decisions["f.txt"]
    assert dec.owes == "write" and dec.record is None  # still owed; nothing completed by a look
    if point == "apply:after-intent":
        assert (root / "f.txt").read_bytes() == OLD
        assert dec.state == State.WORKSPACE_DRAFT and dec.resolve_pending == "not-done"
    else:
        assert (root / "f.txt").read_bytes() == NEW
        assert dec.state == State.SYNCED and dec.detail == Detail.PENDING_WRITE_SEEN
    assert j.evidence(MOUNT, "f.txt") == EvidenceRecord(h(OLD))
    # Another branch, without the file, neither replays nor reads a false conflict.
    _, _, other = restart_and_decide(tmp, root, rid, {}, table, branch="other")
    assert other.decisions["f.txt"].state in (State.NOT_IN_BRANCH, State.WORKSPACE_DRAFT)
    assert other.decisions["f.txt"].owes is None
    # The retry completes with its barriers.
    apply.settle(j, MOUNT, plan.decisions)
    redo(j, obs, plan, root, rid, store)
    assert (root / "f.txt").read_bytes() == NEW
    assert j.evidence(MOUNT, "f.txt") == EvidenceRecord(h(NEW)) and j.pending_intents(MOUNT) == []
    _, _, after = restart_and_decide(tmp, root, rid, store, table)
    assert after.decisions["f.txt"].state == State.SYNCED and after.decisions["f.txt"].owes is None


def test_write_interrupted_then_disk_edited_is_a_conflict(setup):
    tmp, root, rid, store_file = setup
    run_child("write", "apply:after-intent", tmp, root, rid, store_file)
    (root / "f.txt").write_bytes(SHELL)  # disk matches neither outcome
    j, obs, plan = restart_and_decide(tmp, root, rid, {"f.txt": NEW}, intent.IntentTable())
    dec = plan.decisions["f.txt"]
    assert dec.action == Action.INTERRUPTED and dec.conflict == ConflictKind.INTERRUPTED
    assert dec.record_conflict is not None and dec.record_conflict.disk == h(SHELL)
    assert apply.settle(j, MOUNT, plan.decisions) == {"f.txt": "interrupted"}
    # Sticky: the branch intent now holds the conflict; a bare materialize refuses the path.
    table = intent.IntentTable({"f.txt": PathIntent(conflict=dec.record_conflict)})
    j, obs, plan = restart_and_decide(tmp, root, rid, {"f.txt": NEW}, table)
    assert plan.decisions["f.txt"].state == State.CONFLICT
    assert not plan_materialize(plan, obs).writes and (root / "f.txt").read_bytes() == SHELL


@pytest.mark.parametrize("point", ["apply:after-intent", "effect:unlinked", "apply:after-effect"])
def test_materialize_unlink_killed(setup, point: str):
    tmp, root, rid, store_file = setup
    run_child("unlink", point, tmp, root, rid, store_file)
    table = intent.IntentTable({"f.txt": PathIntent(tombstone=True)})
    j, obs, plan = restart_and_decide(tmp, root, rid, {}, table)
    dec = plan.decisions["f.txt"]
    assert dec.state == State.WORKSPACE_DELETED and dec.owes == "unlink"  # never resurrected
    assert dec.action != Action.ADOPT_DISK
    apply.settle(j, MOUNT, plan.decisions)
    redo(j, obs, plan, root, rid, {}, apply_deletions=True)
    assert not (root / "f.txt").exists()
    assert j.evidence(MOUNT, "f.txt") == EvidenceRecord(None) and j.pending_intents(MOUNT) == []


@pytest.mark.parametrize("point", ["apply:after-intent", "effect:renamed"])
def test_auto_materialize_new_file_killed(setup, point: str):
    tmp, root, rid, store_file = setup
    run_child("new", point, tmp, root, rid, store_file)
    store = {"f.txt": OLD, "n/new.txt": NEW}
    table = intent.IntentTable({"n/new.txt": PathIntent(origin_store=True)})
    j, obs, plan = restart_and_decide(tmp, root, rid, store, table)
    dec = plan.decisions["n/new.txt"]
    assert dec.owes == "write" and dec.state in (State.WORKSPACE_DRAFT, State.SYNCED)
    apply.settle(j, MOUNT, plan.decisions)
    redo(j, obs, plan, root, rid, store)
    assert (root / "n/new.txt").read_bytes() == NEW
    assert j.evidence(MOUNT, "n/new.txt") == EvidenceRecord(h(NEW))


@pytest.mark.parametrize("point", ["apply:after-intent", "apply:after-effect"])
def test_shell_edit_adoption_killed(setup, point: str):
    tmp, root, rid, store_file = setup
    (root / "f.txt").write_bytes(SHELL)
    run_child("adopt", point, tmp, root, rid, store_file)
    store = {k: v.encode() for k, v in json.loads(store_file.read_text()).items()}
    j, obs, plan = restart_and_decide(tmp, root, rid, store, intent.IntentTable())
    dec = plan.decisions["f.txt"]
    if point == "apply:after-intent":  # the tree never took it: adopt again
        assert store["f.txt"] == OLD and dec.action == Action.ADOPT_DISK
        assert dec.resolve_pending == "not-done"
    else:  # the tree took it: the intent completes
        assert store["f.txt"] == SHELL and dec.resolve_pending == "done"
        assert dec.state == State.SYNCED
        apply.settle(j, MOUNT, plan.decisions)
        assert j.evidence(MOUNT, "f.txt") == EvidenceRecord(h(SHELL))
    assert (root / "f.txt").read_bytes() == SHELL  # disk's edit is never lost


def test_failed_barrier_listing_then_disk_restored_keeps_the_draft(setup):
    """Killed after the rename, before the directory barrier; a listing sees the new bytes but
    completes nothing; then disk goes back to the prior version (as a lost write would leave
    it): the draft is kept and still owed, never replaced by the older disk copy."""
    tmp, root, rid, store_file = setup
    run_child("write", "effect:renamed", tmp, root, rid, store_file)
    store = {"f.txt": NEW}
    j, obs, plan = restart_and_decide(tmp, root, rid, store, intent.IntentTable())
    assert plan.decisions["f.txt"].detail == Detail.PENDING_WRITE_SEEN
    assert plan.decisions["f.txt"].record is None
    (root / "f.txt").write_bytes(OLD)
    j, obs, plan = restart_and_decide(tmp, root, rid, store, intent.IntentTable())
    dec = plan.decisions["f.txt"]
    assert dec.state == State.WORKSPACE_DRAFT and dec.owes == "write"
    assert dec.action != Action.ADOPT_DISK


def test_run_materialize_lists_refusals_and_keeps_them_owed(tmp_path: Path):
    from memfs.reconcile.plan import count_owed

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "f.txt").write_bytes(OLD)
    (root / "d.txt").write_bytes(OLD)
    (outside / "shared").write_bytes(OLD)
    os.link(outside / "shared", root / "g.txt")
    rid = observe(root).root
    j = Journal(tmp_path / "store.db")
    j.record_evidence(MOUNT, [(p, h(OLD)) for p in ("f.txt", "g.txt", "d.txt")],
                      root=(rid.dev, rid.ino))
    store = {"f.txt": NEW, "g.txt": NEW, "n/new.txt": NEW}
    table = intent.IntentTable({"n/new.txt": PathIntent(origin_store=True),
                                "d.txt": PathIntent(tombstone=True)})

    def run():
        obs = observe(root, expected_root=rid)
        evidence = {p: (ABSENT if r.digest is None else r.digest)
                    for p, r in j.evidence_under(MOUNT).items()}
        view = {p: Content(h(b)) for p, b in store.items()}
        plan = plan_pass(obs, view, evidence, table, branch="main")
        res = apply.run_materialize(j, MOUNT, root, rid, plan_materialize(plan, obs),
                                    lambda p: (store[p], h(store[p])), branch="main")
        evidence = {p: (ABSENT if r.digest is None else r.digest)
                    for p, r in j.evidence_under(MOUNT).items()}
        return res, count_owed(view, evidence, table)

    res, owed = run()
    assert sorted(res.written) == ["f.txt", "n/new.txt"] and res.deletions_left == ["d.txt"]
    assert [s["path"] for s in res.skipped] == ["g.txt"] and "copy" in res.skipped[0]["remedy"]
    assert (outside / "shared").read_bytes() == OLD
    assert (owed.pending_changes, owed.pending_workspace_deletions) == (1, 1)  # g.txt, d.txt
    subprocess.run(["cp", str(root / "g.txt"), str(root / "g.copy")], check=True)
    subprocess.run(["mv", str(root / "g.copy"), str(root / "g.txt")], check=True)
    res, owed = run()
    assert res.written == ["g.txt"] and res.skipped == []
    assert (owed.pending_changes, owed.pending_workspace_deletions) == (0, 1)
