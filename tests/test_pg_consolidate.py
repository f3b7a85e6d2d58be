"""Two hosts consolidating one workspace of a store shared in PostgreSQL, end to end.

Each host is a root of its own on one database, whose workspace memory, agent sessions and
consolidation receipts are shared rows (memfs.memory.shared, memfs.memory.shared_sessions,
memfs.consolidate.shared_receipts). Both reviews are prepared
against the same workspace revision and committed by two processes, one per host, started
while a review holds the shared review lock: the lock serializes them across hosts, one
commits and the other ends as a target conflict that changed nothing, and both receipts are
listed alike by either host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers.pg import host_root, pg_missing
from helpers.require import require_tool

from memfs.consolidate.committer import Review, plan_from_proposal, snapshot_of
from memfs.consolidate.lock import review_lock
from memfs.consolidate.proposal import parse_proposal
from memfs.consolidate.receipts import new_review_id, scan_receipts
from memfs.consolidate.worker import new_attempt_id, open_worker_session
from memfs.memory.shared import SharedMemoryStore
from memfs.memory.shared_sessions import open_session_store
from memfs.store.pg.conn import Conn

WS = "work"
OLD = "# Editor\nindent with spaces\n"
TURNS = [("user", "I prefer tabs over spaces."), ("assistant", "Noted: tabs."),
         ("tool", "ls output"), ("user", "And we use Python 3.11.")]

CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_pg_consolidate import review_from_json
from memfs.consolidate.committer import commit_review
root = Path(sys.argv[1])
review = review_from_json(root, json.loads(Path(sys.argv[2]).read_text()))
print("ready", flush=True)
print(commit_review(root, review).state, flush=True)
"""


def proposal(editor: str) -> dict[str, Any]:
    return {"changes": [{"op": "put", "name": "editor", "content": editor,
                         "evidence": [{"from": 1, "to": 2}]}], "final": True}


def prepare(root: Path, memory: SharedMemoryStore, raw: dict[str, Any]) -> dict[str, Any]:
    """This host's session, frozen and reviewed as the worker would: the job a committer
    process rebuilds its Review from."""
    sessions = open_session_store(root)
    sid = sessions.new(WS)
    sessions.append_many(sid, TURNS)
    frozen = sessions.freeze(sid)
    current, glob = memory.workspace_generation(WS), memory.global_generation()
    parse_proposal(raw, frozen, current, glob)  # accepted as final
    attempt = new_attempt_id()
    session = open_worker_session(root, attempt)
    session.append("draft", step=1, call_id="c1", final=True, changes=raw["changes"])
    session.append("result", step=1, call_id="c1", accepted=True, final=True, is_error=False,
                   content="accepted as final")
    session.close()
    return {"review_id": new_review_id(), "source": snapshot_of(frozen).__dict__,
            "workspace_revision": current.revision, "global_revision": glob.revision,
            "worker_attempt": attempt, "raw": raw}


def review_from_json(root: Path, job: dict[str, Any]) -> Review:
    """The Review in the committer's process, parsed against the shared generations."""
    from memfs.consolidate.committer import frozen_prefix
    from memfs.consolidate.receipts import SourceSnapshot
    from memfs.memory.shared import open_memory_store

    source = SourceSnapshot(**job["source"])
    memory = open_memory_store(root)
    frozen = frozen_prefix(open_session_store(root), source)
    parsed = parse_proposal(job["raw"], frozen, memory.workspace_generation(WS),
                            memory.global_generation())
    return Review(job["review_id"], source, WS, job["workspace_revision"],
                  plan_from_proposal(parsed), job["worker_attempt"], job["global_revision"])


def test_two_hosts_consolidating_one_workspace(tmp_path: Path, pg_url: str) -> None:
    require_tool(pg_missing())
    roots = [host_root(tmp_path, name, pg_url) for name in ("a", "b")]
    mems = [SharedMemoryStore(Conn(pg_url, autocommit=False), r) for r in roots]
    base = mems[0].put_record(WS, "editor", OLD)
    jobs = []
    for root, memory, editor in zip(roots, mems, ("# Editor\ntabs (a)\n", "# Editor\ntabs (b)\n"),
                                    strict=True):
        job = root / "job.json"
        job.write_text(json.dumps(prepare(root, memory, proposal(editor))))
        jobs.append(job)
    here = str(Path(__file__).parent)
    with review_lock(roots[0]):  # a review on host a holds the lock while both start
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(r), str(j), here],
                                  stdout=subprocess.PIPE, text=True)
                 for r, j in zip(roots, jobs, strict=True)]
        assert [p.stdout.readline().strip() for p in procs if p.stdout] == ["ready", "ready"]
        time.sleep(0.5)  # both inside commit_review, waiting for the lock
        assert all(p.poll() is None for p in procs), "a review ran while the lock was held"
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["committed", "target-conflict"], outs
    won = outs.index("committed")
    ids = [json.loads(j.read_text())["review_id"] for j in jobs]
    scans = [scan_receipts(root) for root in roots]
    for scan in scans:  # both receipts are the store's, seen alike from either host
        assert not scan.damaged and sorted(r.review_id for r in scan.receipts) == sorted(ids)
    assert scans[0].receipts == scans[1].receipts
    by_id = {r.review_id: r for r in scans[0].receipts}
    first, second = by_id[ids[won]], by_id[ids[1 - won]]
    assert first.state == "committed" and second.state == "target-conflict"
    assert [h.state for h in second.history] == ["target-conflict"]  # nothing of it landed
    after = first.scopes["workspace"].planned_after
    assert second.observed == {"workspace": after}
    for memory in mems:  # both hosts read the winner's record
        assert memory.workspace_generation(WS).revision == after
        assert memory.read_record(WS, "editor") == f"# Editor\ntabs ({'ab'[won]})\n"
    assert [g.revision for g in mems[1].history(WS)] == [after, base]
