"""The committer tests' shared scenario: a real root (sessions, memory generations, a worker
session holding the accepted final draft), the BODY-... markers every body carries and the
autouse scan of receipts for them, and a Review carried to another process as JSON."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memfs.consolidate.committer import (
    Review,
    plan_from_proposal,
    snapshot_of,
)
from memfs.consolidate.proposal import parse_proposal
from memfs.consolidate.receipts import Receipt, new_review_id, scan_receipts
from memfs.consolidate.worker import WorkerSession, new_attempt_id, worker_session_path
from memfs.memory.sessions import SessionStore
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir, receipts_dir, sessions_dir

OLD_EDITOR = "# Editor\nBODY-OLD-EDITOR-4b1d: indent with spaces\n"
SCRATCH = "BODY-SCRATCH-77aa temporary note\n"
NEW_EDITOR = "# Editor\nBODY-NEW-EDITOR-91ce: indent with tabs\n"
LANG = "# Language\nBODY-LANG-3c2e: Python 3.11\n"
GLOBAL = "# Preferences\nBODY-GLOBAL-a5f0: concise answers\n"
ALT = "BODY-ALT-0d9e another proposal\n"
ONLINE = "BODY-ONLINE-e1f4 written through the mount\n"
MARKERS = [line.split(":")[0].split(" ")[0] for line in
           (OLD_EDITOR.split("\n")[1], SCRATCH, NEW_EDITOR.split("\n")[1], LANG.split("\n")[1],
            GLOBAL.split("\n")[1], ALT, ONLINE)]
TURNS = [("user", "I prefer tabs over spaces."), ("assistant", "Noted: tabs."),
         ("tool", "ls output"), ("user", "And we use Python 3.11.")]
WS = "work"
SCENARIOS: list[Scenario] = []


class Scenario:
    """A root with one session, a workspace with two records, and Global memory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memory = MemoryStore(memory_dir(root))
        self.sessions = SessionStore(sessions_dir(root))
        self.sid = self.sessions.new(WS)
        self.sessions.append_many(self.sid, TURNS)
        self.memory.put_record(WS, "editor", OLD_EDITOR)
        self.memory.put_record(WS, "scratch", SCRATCH)
        SCENARIOS.append(self)

    @staticmethod
    def raw(glob: bool = False, editor: str = NEW_EDITOR) -> dict[str, Any]:
        changes: list[dict[str, Any]] = [
            {"op": "put", "name": "lang", "content": LANG, "evidence": [{"from": 4, "to": 4}]},
            {"op": "delete", "name": "scratch", "evidence": [{"from": 1, "to": 2}]},
            {"op": "put", "name": "editor", "content": editor,
             "evidence": [{"from": 1, "to": 2}]},
        ]
        if glob:
            changes.append({"op": "replace-global", "content": GLOBAL,
                            "evidence": [{"from": 1, "to": 1}]})
        return {"changes": changes, "final": True}

    def prepare(self, raw: dict[str, Any], review_id: str | None = None) -> Review:
        """Freeze, parse, and keep the accepted final draft in a worker session, as the
        worker would; the returned Review is what the orchestrator hands the committer."""
        frozen = self.sessions.freeze(self.sid)
        current = self.memory.workspace_generation(WS)
        glob = self.memory.global_generation()
        proposal = parse_proposal(raw, frozen, current, glob)
        attempt = new_attempt_id()
        session = WorkerSession(worker_session_path(self.root, attempt))
        session.append("draft", step=1, call_id="c1", final=True, changes=raw["changes"])
        session.append("result", step=1, call_id="c1", accepted=True, final=True,
                       is_error=False, content="accepted as final")
        session.close()
        return Review(review_id or new_review_id(), snapshot_of(frozen), WS, current.revision,
                      plan_from_proposal(proposal), attempt, glob.revision)

    def ws_rev(self) -> str:
        return self.memory.workspace_generation(WS).revision

    def global_rev(self) -> str:
        return self.memory.global_generation().revision

    def records(self) -> dict[str, str]:
        return self.memory.workspace_generation(WS).records

    def receipts(self) -> list[Receipt]:
        scan = scan_receipts(self.root)
        assert not scan.damaged
        return scan.receipts

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memfs", "--root", str(self.root), *args],
                              capture_output=True, text=True, timeout=60)


def assert_no_bodies(root: Path) -> int:
    """No receipt under `root` holds any memory or proposal body; returns files scanned."""
    d = receipts_dir(root)
    names = os.listdir(d) if d.is_dir() else []
    for name in names:
        text = (d / name).read_text()
        for marker in MARKERS:
            assert marker not in text, f"{name} contains the body marked {marker}"
    return len(names)


@pytest.fixture(autouse=True)
def scan_receipts_for_bodies() -> Iterator[None]:
    """After each test, every receipt a Scenario's root holds is scanned for bodies (a test
    that made no Scenario scans nothing)."""
    start = len(SCENARIOS)
    yield
    for sc in SCENARIOS[start:]:
        assert_no_bodies(sc.root)


@pytest.fixture
def sc(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path / "root")


def states(receipt: Receipt) -> list[str]:
    return [h.state for h in receipt.history]


def review_to_json(review: Review, raw: dict[str, Any]) -> dict[str, Any]:
    return {"review_id": review.review_id, "source": review.source.__dict__,
            "workspace": review.workspace, "workspace_revision": review.workspace_revision,
            "global_revision": review.global_revision, "worker_attempt": review.worker_attempt,
            "raw": raw}


def review_from_json(root: Path, job: dict[str, Any]) -> Review:
    """Rebuild a Review in another process: re-parse the raw proposal against the frozen
    prefix and the current generations, as the orchestrator does."""
    from memfs.consolidate.committer import frozen_prefix
    from memfs.consolidate.receipts import SourceSnapshot

    source = SourceSnapshot(**job["source"])
    memory = MemoryStore(memory_dir(root))
    frozen = frozen_prefix(SessionStore(sessions_dir(root)), source)
    proposal = parse_proposal(job["raw"], frozen, memory.workspace_generation(job["workspace"]),
                              memory.global_generation())
    return Review(job["review_id"], source, job["workspace"], job["workspace_revision"],
                  plan_from_proposal(proposal), job["worker_attempt"], job["global_revision"])
