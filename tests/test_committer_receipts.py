"""Receipts as files (exact round trip, atomic writes, damage reported) and the review lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.consolidate.lock import LOCK_NAME, held_here, review_lock
from memfs.consolidate.receipts import (
    SCOPES,
    STATES,
    ChangeHash,
    HistoryEntry,
    Receipt,
    ReceiptError,
    ScopeRevisions,
    SourceSnapshot,
    check_review_id,
    new_review_id,
    parse_receipt,
    read_receipt,
    receipt_path,
    remove_temp_files,
    render_receipt,
    scan_receipts,
    write_receipt,
)
from memfs.errors import MemfsError
from memfs.rootdir import receipts_dir

HEX = st.text("0123456789abcdef", min_size=1, max_size=64)
TEXT = st.text(max_size=40)
IDS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,40}\Z")


def receipts() -> st.SearchStrategy[Receipt]:
    scope_revs = st.builds(ScopeRevisions, HEX, st.none() | HEX)
    return st.builds(
        Receipt,
        review_id=IDS,
        state=st.sampled_from(STATES),
        workspace=TEXT,
        source=st.builds(SourceSnapshot, TEXT, st.integers(0, 10**9), HEX),
        scopes=st.dictionaries(st.sampled_from(SCOPES), scope_revs),
        proposal_hash=HEX,
        changes=st.lists(st.builds(ChangeHash, st.sampled_from(["put", "delete"]), TEXT,
                                   st.none() | HEX), max_size=5).map(tuple),
        worker_attempt=TEXT,
        consolidator_version=TEXT,
        created_at=TEXT,
        updated_at=TEXT,
        detail=TEXT,
        observed=st.dictionaries(TEXT, HEX, max_size=3),
        history=st.lists(st.builds(HistoryEntry, TEXT, st.sampled_from(STATES), TEXT, TEXT),
                         max_size=3).map(tuple),
    )


def sample(**over: object) -> Receipt:
    base = dict(
        review_id="20261130T010000Z-abc", state="committing", workspace="work",
        source=SourceSnapshot("s1", 3, "ab" * 32),
        scopes={"workspace": ScopeRevisions("aa" * 32, "bb" * 32)}, proposal_hash="cc" * 32,
        changes=(ChangeHash("delete", "old", None), ChangeHash("put", "editor", "dd" * 32)),
        worker_attempt="att-1", consolidator_version="v2", created_at="t0", updated_at="t1",
    )
    return Receipt(**{**base, **over})


@settings(max_examples=200, deadline=None)
@given(receipts())
def test_render_then_parse_is_exact(receipt: Receipt) -> None:
    text = render_receipt(receipt)
    assert parse_receipt(text) == receipt
    assert text.startswith(f"# Consolidation receipt {receipt.review_id}\n")


def test_markdown_summary_is_readable_and_never_parsed() -> None:
    text = render_receipt(sample())
    assert "- state: **committing**" in text
    assert "| put | \"editor\" |" in text
    tampered = text.replace("- state: **committing**", "- state: **committed**")
    assert parse_receipt(tampered).state == "committing"  # the JSON block is the truth


@pytest.mark.parametrize("mutate, why", [
    (lambda t: t.replace("```json memfs-receipt/1", "```json"), "no ```json"),
    (lambda t: t.replace('"state": "committing"', '"state": "done"'), "unknown state"),
    (lambda t: t.replace('"detail": ""', '"detail": "", "body": "x"'), "fields differ"),
    (lambda t: t.replace('"turn_count": 3', '"turn_count": "3"'), "not an integer"),
    (lambda t: t.replace('"scopes": {', '"scopes": {"elsewhere": {"before": "a", '
                         '"planned_after": null}, ', 1), "unknown scope"),
    (lambda t: t[: t.index("```json") + 40], "no ```json"),
])
def test_malformed_receipts_are_refused(mutate, why: str) -> None:
    with pytest.raises(ReceiptError, match=why):
        parse_receipt(mutate(render_receipt(sample())))


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "../x", "a b", "x" * 129])
def test_unsafe_review_ids_are_refused(bad: str) -> None:
    with pytest.raises(ReceiptError):
        check_review_id(bad)


def test_new_review_ids_are_safe_and_distinct() -> None:
    ids = {check_review_id(new_review_id()) for _ in range(50)}
    assert len(ids) == 50


def test_write_is_atomic_replace_and_leaves_no_temp(tmp_path: Path) -> None:
    r = sample()
    path = write_receipt(tmp_path, r)
    assert path == str(receipts_dir(tmp_path) / f"{r.review_id}.md")
    assert read_receipt(tmp_path, r.review_id) == r
    done = r.finished("committed", "commit", "swapped in")
    write_receipt(tmp_path, done)
    assert read_receipt(tmp_path, r.review_id) == done
    assert [h.state for h in done.history] == ["committed"]
    assert sorted(os.listdir(receipts_dir(tmp_path))) == [f"{r.review_id}.md"]
    assert read_receipt(tmp_path, "absent") is None


def test_scan_reports_damage_and_temp_files_instead_of_skipping(tmp_path: Path) -> None:
    good = sample(review_id="b-good", created_at="2")
    older = sample(review_id="a-older", created_at="1")
    write_receipt(tmp_path, good)
    write_receipt(tmp_path, older)
    d = receipts_dir(tmp_path)
    (d / "c-broken.md").write_text("# not a receipt\n")
    (d / "d-misnamed.md").write_text(render_receipt(sample(review_id="other")))
    (d / ".tmp-x-1-ab").write_text("half")
    (d / "notes.txt").write_text("ignored: not a receipt name")
    scan = scan_receipts(tmp_path)
    assert [r.review_id for r in scan.receipts] == ["a-older", "b-good"]
    assert sorted(p.name for p, _ in scan.damaged) == ["c-broken.md", "d-misnamed.md"]
    assert [p.name for p in scan.temp_files] == [".tmp-x-1-ab"]
    remove_temp_files(tmp_path, scan.temp_files)
    assert scan_receipts(tmp_path).temp_files == []
    assert scan_receipts(tmp_path / "nowhere").receipts == []


def test_crash_before_rename_keeps_the_old_receipt(tmp_path: Path) -> None:
    """A SIGKILLed rewrite leaves the previous receipt intact (ordering only, not fsync)."""
    r = sample()
    write_receipt(tmp_path, r)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from memfs.consolidate.receipts import read_receipt, write_receipt\n"
        "root = Path(sys.argv[1])\n"
        "r = read_receipt(root, sys.argv[2])\n"
        "write_receipt(root, r.finished('committed', 'commit'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), r.review_id],
                          env={**os.environ, "MEMFS_CRASH_AT": "receipt-before-rename"})
    assert proc.returncode == -9
    scan = scan_receipts(tmp_path)
    assert scan.receipts == [r]
    assert len(scan.temp_files) == 1
    assert receipt_path(tmp_path, r.review_id).read_text() == render_receipt(r)


# --- the review lock -----------------------------------------------------------------------


def test_lock_serializes_threads_and_reports_holder(tmp_path: Path) -> None:
    inside, overlaps = [0], []

    def work() -> None:
        with review_lock(tmp_path):
            inside[0] += 1
            overlaps.append(inside[0])
            time.sleep(0.01)
            inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1] * 8
    assert (tmp_path / LOCK_NAME).exists()
    assert not held_here(tmp_path)
    with review_lock(tmp_path):
        assert held_here(tmp_path)
        with pytest.raises(MemfsError, match="already holds"):
            with review_lock(tmp_path):
                pass


def test_lock_waits_for_another_thread_then_times_out(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    def holder() -> None:
        with review_lock(tmp_path):
            started.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    started.wait(5)
    try:
        with pytest.raises(MemfsError, match="another review holds"):
            with review_lock(tmp_path, timeout=0.2):
                pass
    finally:
        release.set()
        t.join()


def test_lock_holds_across_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from memfs.consolidate.lock import review_lock\n"
        "with review_lock(Path(sys.argv[1])):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(MemfsError, match="another review holds"):
            with review_lock(tmp_path, timeout=0.3):
                pass
        assert time.monotonic() - t0 >= 0.3
        proc.kill()  # SIGKILL: the kernel drops the flock, no stale lock remains
        proc.wait()
        with review_lock(tmp_path, timeout=5):
            assert held_here(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
