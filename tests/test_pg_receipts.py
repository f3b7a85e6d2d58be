"""Consolidation receipts in a store shared in PostgreSQL: any host recovers any host's review.

Host a (a root of its own) commits a review in a child process that SIGKILLs itself at one
named point of the barrier (MEMFS_CRASH_AT, as tests/test_committer_crash.py does on one
host); host b, another root on the same database, lists a's receipt with `memfs receipts`
and runs `memfs recover`, which must reach the end a's own recovery would: replay what was
not swapped in yet (from a's worker session and source session, rows too), mark committed
what was, finish as a target conflict what someone else overwrote, and nothing at all for a
receipt whose write never committed. A session made through one host is listed, shown and
appended to through the other. Then the schema: a version-1 store gains the new tables in
place, and a store of a newer memfs is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.pg import host_root as host
from helpers.pg import pg_missing
from helpers.require import require_tool
from helpers.stub_server import StubServer
from helpers.wait import wait_for
from helpers.worker import PUT_TABS, consolidate
from test_pg_consolidate import OLD, WS, prepare

from memfs.consolidate.receipts import read_receipt, render_receipt
from memfs.errors import MemfsError
from memfs.memory.sessions import SessionStore
from memfs.memory.shared import SharedMemoryStore
from memfs.rootdir import receipts_dir
from memfs.store.pg import schema
from memfs.store.pg.conn import Conn

NEW = "# Editor\ntabs\n"
GLOBAL = "# Preferences\nconcise answers\n"
ONLINE = "written by host b meanwhile\n"

CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_pg_consolidate import review_from_json
from memfs.consolidate.committer import commit_review
root = Path(sys.argv[1])
print(commit_review(root, review_from_json(root, json.loads(Path(sys.argv[2]).read_text()))).state)
"""


def raw(glob: bool) -> dict[str, Any]:
    changes: list[dict[str, Any]] = [{"op": "put", "name": "editor", "content": NEW,
                                      "evidence": [{"from": 1, "to": 2}]}]
    if glob:
        changes.append({"op": "replace-global", "content": GLOBAL,
                        "evidence": [{"from": 1, "to": 1}]})
    return {"changes": changes, "final": True}


def crash_on_a(a: Path, memory: SharedMemoryStore, glob: bool, point: str) -> str:
    """Host a's review, its committer killed at `point`; the review id."""
    job = prepare(a, memory, raw(glob))
    path = a / "job.json"
    path.write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(a), str(path),
                           str(Path(__file__).parent)],
                          env={**os.environ, "MEMFS_CRASH_AT": point}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -9, f"did not die at {point}: {proc.stdout} {proc.stderr}"
    return job["review_id"]


def cli(root: Path, *args: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def hosts(tmp_path: Path, pg_url: str) -> tuple[Path, Path, SharedMemoryStore]:
    require_tool(pg_missing())
    a, b = host(tmp_path, "a", pg_url), host(tmp_path, "b", pg_url)
    memory = SharedMemoryStore(Conn(pg_url, autocommit=False), a)
    memory.put_record(WS, "editor", OLD)
    return a, b, memory


#   point                     Global? b writes meanwhile   b's recover     end state
MATRIX = [
    ("commit-after-receipt", False, None, "replay", "committed"),
    ("commit-after-receipt", True, None, "replay", "committed"),
    ("commit-between-scopes", True, None, "replay", "committed"),
    ("commit-after-swap", False, None, "mark-committed", "committed"),
    ("commit-after-swap", True, None, "mark-committed", "committed"),
    ("commit-after-receipt", False, "workspace", "target-conflict", "target-conflict"),
    ("commit-between-scopes", True, "global", "target-conflict", "target-conflict"),
]


@pytest.mark.parametrize("point, glob, online, action, state", MATRIX,
                         ids=[f"{m[0]}{'-with-global' if m[1] else ''}"
                              f"{'-then-b-writes-' + m[2] if m[2] else ''}" for m in MATRIX])
def test_host_b_recovers_the_review_host_a_left_committing(
        hosts: tuple[Path, Path, SharedMemoryStore], point: str, glob: bool,
        online: str | None, action: str, state: str) -> None:
    a, b, memory = hosts
    ws0, g0 = memory.workspace_generation(WS).revision, memory.global_generation().revision
    review_id = crash_on_a(a, memory, glob, point)

    # b sees a's receipt, committing, and no file of it under either root.
    code, listed = cli(b, "receipts")
    assert code == 0 and [(r["review_id"], r["state"]) for r in listed["receipts"]] == [
        (review_id, "committing")]
    assert not receipts_dir(a).exists() and not receipts_dir(b).exists()
    receipt = read_receipt(b, review_id)
    assert receipt is not None
    planned = {s: r.planned_after for s, r in receipt.scopes.items()}
    swapped_ws = point != "commit-after-receipt"
    assert memory.workspace_generation(WS).revision == (planned["workspace"] if swapped_ws
                                                         else ws0)
    if glob:
        assert memory.global_generation().revision == (planned["global"]
                                                       if point == "commit-after-swap" else g0)
    written = None
    if online == "workspace":
        written = memory.put_record(WS, "editor", ONLINE)
    elif online == "global":
        written = memory.replace_global(ONLINE)

    code, report = cli(b, "recover")
    assert code == 0 and report["unresolved"] == 0, report
    assert [(o["review_id"], o["action"], o["state"]) for o in report["outcomes"]] == [
        (review_id, action, state)]
    after = read_receipt(a, review_id)  # host a reads the end b wrote
    assert after is not None and after.state == state
    assert [h.by for h in after.history][-1] == "recover"
    if state == "committed":
        assert memory.read_record(WS, "editor") == NEW
        assert memory.workspace_generation(WS).revision == planned["workspace"]
        if glob:
            assert memory.global_generation().content == GLOBAL
    elif online == "workspace":  # never overwritten, never rolled back
        assert after.observed == {"workspace": written}
        assert memory.read_record(WS, "editor") == ONLINE
    else:  # the Workspace half stays; Global keeps b's write
        assert after.observed == {"workspace": planned["workspace"], "global": written}
        assert memory.read_record(WS, "editor") == NEW

    # Recovering again, on either host, changes nothing.
    for root in (a, b):
        code, again = cli(root, "recover")
        assert code == 0 and [o["action"] for o in again["outcomes"]] == ["nothing"]
    assert read_receipt(b, review_id) == after


def test_a_receipt_whose_write_never_committed_is_not_there(
        hosts: tuple[Path, Path, SharedMemoryStore]) -> None:
    """Killed between the row's INSERT and its COMMIT: the server rolls it back, so no host
    finds a receipt, and memory was never touched (the receipt comes first)."""
    a, b, memory = hosts
    ws0 = memory.workspace_generation(WS).revision
    review_id = crash_on_a(a, memory, False, "receipt-before-rename")
    for root in (a, b):
        assert not receipts_dir(root).exists()  # no file, not even a cut-short one
        assert read_receipt(root, review_id) is None
        code, report = cli(root, "recover")
        assert code == 0 and report["outcomes"] == []
    assert memory.workspace_generation(WS).revision == ws0


def test_a_session_recorded_on_one_host_is_read_and_continued_on_another(
        hosts: tuple[Path, Path, SharedMemoryStore]) -> None:
    a, b, _ = hosts
    code, made = cli(a, "session", "new", "--workspace", WS)
    sid = made["id"]
    assert cli(a, "session", "append", sid, "--role", "user", "--text", "tabs, please")[1][
        "turn"] == 1
    turn = a / "turn.txt"  # a NUL in a turn: JSON escapes it, so its row can hold it
    turn.write_text("tabs\x00it is")
    assert cli(b, "session", "append", sid, "--role", "assistant", "--file", str(turn))[1][
        "turn"] == 2
    listed = cli(b, "session", "list")[1]["sessions"]
    assert [(s["id"], s["workspace"], s["turn_count"]) for s in listed] == [(sid, WS, 2)]
    shown = [cli(root, "session", "show", sid)[1] for root in (a, b)]
    assert shown[0] == shown[1]
    assert [(t["index"], t["role"], t["text"]) for t in shown[0]["turns"]] == [
        (1, "user", "tabs, please"), (2, "assistant", "tabs\x00it is")]
    # The same turns in a file store hash alike: one format, two places.
    files = SessionStore(a / "elsewhere")
    other = files.import_turns([("user", "tabs, please"), ("assistant", "tabs\x00it is")])
    assert files.freeze(other).content_hash == shown[0]["content_hash"]
    assert not (a / "sessions").exists() and not (b / "sessions").exists()
    code, out = cli(b, "session", "show", "20260101T000000Z-00000000")
    assert code == 1 and out["error"].startswith(
        "no session '20260101T000000Z-00000000' in the PostgreSQL store at postgresql://")


def test_a_version_1_store_gains_the_receipts_table(pg_url: str) -> None:
    require_tool(pg_missing())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(schema.MIGRATIONS[1])
        conn.execute("INSERT INTO memfs_meta VALUES ('schema', '1')")
        assert schema.create(conn) == 1
        assert schema.version(conn) == schema.SCHEMA_VERSION
        for table in ("receipts", "sessions", "session_turns", "worker_events"):
            assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None
        assert schema.create(conn) == schema.SCHEMA_VERSION  # once only


def test_a_newer_memfs_store_is_refused(pg_url: str) -> None:
    require_tool(pg_missing())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema.create(conn)
        conn.execute("UPDATE memfs_meta SET value = %s WHERE key = 'schema'",
                     (str(schema.SCHEMA_VERSION + 1),))
        with pytest.raises(MemfsError, match="newer memfs"):
            schema.create(conn)
        assert schema.version(conn) == schema.SCHEMA_VERSION + 1  # nothing changed


def test_a_real_consolidate_killed_on_a_is_replayed_by_b(
        hosts: tuple[Path, Path, SharedMemoryStore]) -> None:
    """`memfs consolidate` itself (the worker loop against a stub model on loopback) on host
    a, SIGKILLed once its receipt is committing: b replays it from the worker session the
    loop wrote as rows, and the record is what a's own recovery would have written."""
    a, b, memory = hosts
    code, made = cli(a, "session", "new", "--workspace", "ws-alpha")
    sid = made["id"]
    cli(a, "session", "append", sid, "--role", "user", "--text",
        "Please always indent with tabs, in every project of mine.")
    with StubServer() as stub:
        stub.push({"propose": {"changes": [PUT_TABS], "final": True}})
        code, _out, err = consolidate(a, stub, "openai", sid,
                                      env={"MEMFS_CRASH_AT": "commit-after-receipt"})
    assert code == -9, err
    assert memory.workspaces() == [WS]  # nothing of the review landed
    listed = cli(b, "receipts", "--state", "committing")[1]["receipts"]
    assert len(listed) == 1
    code, report = cli(b, "recover")
    assert code == 0 and [o["action"] for o in report["outcomes"]] == ["replay"], report
    assert memory.read_record("ws-alpha", "indentation") == PUT_TABS["content"]
    receipt = read_receipt(a, listed[0]["review_id"])
    assert receipt is not None and receipt.state == "committed"
    assert memory.workspace_generation("ws-alpha").revision == receipt.scopes[
        "workspace"].planned_after
    assert not (a / "sessions").exists()  # the worker's log is rows, not a file of a's


def test_the_mount_on_one_host_shows_the_receipt_of_a_review_on_another(
        hosts: tuple[Path, Path, SharedMemoryStore], mount_factory) -> None:
    a, b, memory = hosts
    m = mount_factory(root=a)
    m.require_real()
    code, made = cli(b, "session", "new", "--workspace", "ws-alpha")
    cli(b, "session", "append", made["id"], "--role", "user", "--text",
        "Please always indent with tabs, in every project of mine.")
    with StubServer([{"propose": {"changes": [PUT_TABS], "final": True}}]) as stub:
        code, out, err = consolidate(b, stub, "openai", made["id"])
    assert code == 0 and out["state"] == "committed", err
    assert out["receipt"].startswith(f"receipt {out['review_id']} in the PostgreSQL store at ")
    view = m.mnt / ".memfs" / "receipts"
    assert os.listdir(view) == [f"{out['review_id']}.md"]
    text = (view / f"{out['review_id']}.md").read_text()
    assert text == render_receipt(read_receipt(a, out["review_id"]))
    assert "**committed**" in text and out["worker_attempt"] in text
    record = m.mnt / ".memfs" / "memory" / "workspaces" / "ws-alpha" / "indentation.md"
    assert record.read_text() == PUT_TABS["content"]


def test_a_host_that_lost_the_review_lock_cannot_overwrite_the_end_another_recorded(
        hosts: tuple[Path, Path, SharedMemoryStore], pg_url: str) -> None:
    """The review lock is a database session's: if host a's lock connection is cut mid-commit
    (here: terminated by the server, right after a's receipt is durable), host b may recover
    the review meanwhile. b replays it and records `committed`; a, going on, finds memory
    moved (its CAS refuses) and would record a target conflict: the row refuses that, so the
    first end stands and memory holds the one swap."""
    from test_pg_consolidate import review_from_json

    from memfs.consolidate.committer import commit_review
    from memfs.consolidate.lock import REVIEW_KEY
    from memfs.consolidate.receipts import ReceiptError
    from memfs.testing import FAULT_HOOKS

    a, b, memory = hosts
    job = prepare(a, memory, raw(False))
    review = review_from_json(a, job)
    seen: dict[str, Any] = {}

    def cut_lock_then_recover_on_b() -> None:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            pids = [r[0] for r in admin.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND "
                "((classid::bigint << 32) | objid::bigint) = %s", (REVIEW_KEY,)).fetchall()]
            assert len(pids) == 1, pids
            admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        seen["recover"] = cli(b, "recover")

    FAULT_HOOKS["commit-after-receipt"] = cut_lock_then_recover_on_b
    try:
        with pytest.raises(ReceiptError, match="already finished as committed"):
            commit_review(a, review)
    finally:
        FAULT_HOOKS.clear()
    code, report = seen["recover"]
    assert code == 0 and [o["action"] for o in report["outcomes"]] == ["replay"]
    after = read_receipt(a, review.review_id)
    assert after is not None and after.state == "committed"
    assert [h.by for h in after.history] == ["commit", "recover"]
    assert memory.read_record(WS, "editor") == NEW
    assert len(memory.history(WS)) == 2  # the put before the review, and one swap


def test_a_locked_receipts_table_holds_only_the_listing_not_the_mount(
        hosts: tuple[Path, Path, SharedMemoryStore], mount_factory, pg_url: str) -> None:
    """`.memfs/receipts/` on a PostgreSQL store asks the database in a worker thread: while
    another session holds the table locked, `ls` of it waits, and every other request of the
    mount is answered meanwhile (the query ran on the FUSE loop, so a `cat` hung with it)."""
    a, _, _ = hosts
    m = mount_factory(root=a)
    m.require_real()
    (m.work / "notes.txt").write_text("still here\n")
    with psycopg.connect(pg_url) as locker, psycopg.connect(pg_url, autocommit=True) as look:
        locker.execute("LOCK TABLE receipts IN ACCESS EXCLUSIVE MODE")
        ls = subprocess.Popen(["ls", str(m.mnt / ".memfs" / "receipts")],
                              stdout=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: look.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                "query LIKE '%%FROM receipts%%'").fetchone()[0] == 1, timeout=30), \
                "the listing never waited on the locked table"  # type: ignore[index]
            cat = subprocess.run(["cat", str(m.work / "notes.txt")], capture_output=True,
                                 text=True, timeout=20)
            assert cat.stdout == "still here\n" and ls.poll() is None
        finally:
            locker.rollback()
            out, _ = ls.communicate(timeout=30)
    assert ls.returncode == 0 and out == ""
