"""The global journal: evidence, root identity, intents, and the failed-append rule.

The failed append is injected with libfiu (Debian libfiu0): a child process runs with the POSIX
preload shim, and enables an EIO/ENOSPC failure point at SQLite's real write or fdatasync.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.require import LIBFIU, libfiu_missing, require_tool

from memfs.errors import MemfsError
from memfs.store.journal import EvidenceRecord, FingerprintRow, Journal

A, B, C = "a" * 32, "b" * 32, "c" * 32
FIU = LIBFIU


def test_evidence_root_and_restart(tmp_path: Path):
    db = tmp_path / "store.db"
    j = Journal(db)
    assert j.evidence("work", "a.txt") is None and j.root("work") is None
    j.record_evidence("work", [("a.txt", A), ("gone.txt", None), ("d/x", B), ("d0", A)],
                      root=(1, 2))
    assert j.root("work") == (1, 2)
    assert j.evidence("work", "a.txt") == EvidenceRecord(A)
    assert j.evidence("work", "gone.txt") == EvidenceRecord(None)
    assert set(j.evidence_under("work", "d")) == {"d/x"}
    # Another root is refused, never silently recorded over.
    with pytest.raises(MemfsError, match="accept-root"):
        j.record_evidence("work", [("a.txt", B)], root=(1, 3))
    assert j.evidence("work", "a.txt") == EvidenceRecord(A)
    j.close()
    j2 = Journal(db)  # a restart keeps the root and the evidence
    assert j2.root("work") == (1, 2) and j2.evidence("work", "d/x") == EvidenceRecord(B)
    assert j2.accept_root("work", 1, 3) == 4
    assert j2.root("work") == (1, 3) and j2.evidence_under("work") == {}
    aside = sqlite3.connect(db).execute("SELECT count(*) FROM journal_evidence_aside").fetchone()
    assert aside == (4,)


def test_a_journal_made_before_priors_gets_the_column_and_keeps_its_intents(tmp_path: Path):
    """Existing journals keep working: an intents table without `prior` gets it at open; its
    rows read prior None (not recorded), new adoptions carry theirs ("" absent, a digest)."""
    db = tmp_path / "store.db"
    old = sqlite3.connect(db)
    old.executescript("""
        CREATE TABLE journal_intents (
            id INTEGER PRIMARY KEY AUTOINCREMENT, mount TEXT NOT NULL, path TEXT NOT NULL,
            op TEXT NOT NULL, branch TEXT, old TEXT, new TEXT,
            state TEXT NOT NULL DEFAULT 'pending', created_at REAL NOT NULL, settled_at REAL);
        INSERT INTO journal_intents (mount, path, op, branch, old, new, created_at)
            VALUES ('work', 'a.txt', 'adopt', 'main', 'aaaa', 'bbbb', 0);
    """)
    old.close()
    j = Journal(db)
    k = Journal(db)  # a second opener finds the column there
    (legacy,) = j.pending_intents("work")
    assert (legacy.op, legacy.old, legacy.new, legacy.prior) == ("adopt", "aaaa", "bbbb", None)
    j.begin_intent("work", "b.txt", "adopt", old=A, new=B, branch="main", prior=A)
    j.begin_intent("work", "c.txt", "adopt", old=None, new=B, branch="main", prior=None)
    assert [i.prior for i in k.pending_intents("work")] == [None, A, ""]
    j.close()
    k.close()


def test_a_redo_supersedes_only_its_own_branchs_intents(tmp_path: Path):
    """Completing main's intent abandons main's older ones for the path, never side's: only
    side's tree can tell whether side's step happened."""
    j = Journal(tmp_path / "store.db")
    j.record_evidence("work", [("a.txt", A)], root=(1, 2))
    side = j.begin_intent("work", "a.txt", "adopt", old=A, new=B, branch="side", prior=A)
    old_main = j.begin_intent("work", "a.txt", "write", old=A, new=C, branch="main")
    redo = j.begin_intent("work", "a.txt", "write", old=A, new=C, branch="main")
    j.complete_intent(redo)
    assert [i.id for i in j.pending_intents("work")] == [side]
    assert old_main not in [i.id for i in j.pending_intents("work")]
    j.close()


def test_accept_root_abandons_the_old_directorys_intents(tmp_path: Path):
    j = Journal(tmp_path / "store.db")
    j.record_evidence("work", [("a.txt", A)], root=(1, 2))
    j.begin_intent("work", "a.txt", "write", old=A, new=B, branch="main")
    j.begin_intent("other", "a.txt", "write", old=A, new=B, branch="main", root=(1, 9))
    j.accept_root("work", 1, 3)
    assert j.pending_intents("work") == [] and len(j.pending_intents("other")) == 1
    j.close()


def test_intents_write_ahead(tmp_path: Path):
    j = Journal(tmp_path / "store.db")
    j.record_evidence("work", [("a.txt", A)], root=(1, 2))
    i = j.begin_intent("work", "a.txt", "write", old=A, new=B, branch="main")
    u = j.begin_intent("work", "b.txt", "unlink", old=A, new=None)
    pend = j.pending_intents("work")
    assert [(x.path, x.op, x.old, x.new) for x in pend] == [
        ("a.txt", "write", A, B), ("b.txt", "unlink", A, None)]
    assert j.evidence("work", "a.txt") == EvidenceRecord(A)  # P moves only on completion
    j.complete_intent(i)
    assert j.evidence("work", "a.txt") == EvidenceRecord(B)
    j.abandon_intent(u)
    assert j.pending_intents("work") == [] and j.evidence("work", "b.txt") is None
    with pytest.raises(MemfsError):
        j.complete_intent(i)  # not pending any more
    assert not j.needs_reopen  # a refusal of ours is not an I/O failure


def test_fingerprint_cache(tmp_path: Path):
    j = Journal(tmp_path / "store.db")
    row = FingerprintRow(3, 10, 11, 12, 13, A, "text", 99)
    j.put_fingerprints("work", {"a": row, "b": row})
    j.put_fingerprints("work", {"b": None})
    assert j.fingerprints("work") == {"a": row}


def test_fingerprints_of_a_prefix(tmp_path: Path):
    """A scoped pass reads the cache of its scope only: the scope itself and what lies below
    it, never a sibling whose name merely starts the same."""
    j = Journal(tmp_path / "store.db")
    row = FingerprintRow(3, 10, 11, 12, 13, A, "text", 99)
    j.put_fingerprints("work", {p: row for p in ("src", "src/a", "src/d/b", "srcx", "src-y/c",
                                                  "top")})
    j.put_fingerprints("other", {"src/a": row})
    assert set(j.fingerprints("work", "src")) == {"src", "src/a", "src/d/b"}
    assert set(j.fingerprints("work", "src/d")) == {"src/d/b"}
    assert set(j.fingerprints("work")) == {"src", "src/a", "src/d/b", "srcx", "src-y/c", "top"}
    got = j.pass_inputs("work", "src")
    assert set(got.fingerprints) == {"src", "src/a", "src/d/b"}


def test_pass_inputs_one_snapshot_never_stale(tmp_path: Path):
    """pass_inputs remembers evidence and fingerprints between passes, but a change made
    through this journal, or committed by another connection (another process, the store's own
    connection), is seen by the very next call."""
    db = tmp_path / "store.db"
    j = Journal(db)
    row = FingerprintRow(3, 10, 11, 12, 13, A, "text", 99)
    j.record_evidence("work", [("a.txt", A), ("gone.txt", None)], root=(1, 2))
    j.put_fingerprints("work", {"a.txt": row})
    first = j.pass_inputs("work")
    assert first.root == (1, 2) and first.pending == []
    assert first.evidence == {"a.txt": A, "gone.txt": None}
    assert first.fingerprints == {"a.txt": row}
    with pytest.raises(TypeError):  # shared between passes, so read-only
        first.evidence["a.txt"] = B  # type: ignore[index]
    with pytest.raises(TypeError):
        first.fingerprints["a.txt"] = row  # type: ignore[index]
    again = j.pass_inputs("work")  # unchanged: the very same objects
    assert again.evidence is first.evidence and again.fingerprints is first.fingerprints
    assert again.evidence["a.txt"] == A
    # Another connection commits: the remembered snapshot must not be served.
    other = Journal(db)
    newer = row._replace(size=4, digest=B)
    other.record_evidence("work", [("a.txt", B)])
    other.put_fingerprints("work", {"a.txt": newer, "b.txt": row})
    got = j.pass_inputs("work")
    assert got.evidence["a.txt"] == B and got.fingerprints == {"a.txt": newer, "b.txt": row}
    # So must a plain SQLite connection (the store's is one) writing the same tables.
    with sqlite3.connect(db) as raw:
        raw.execute("DELETE FROM journal_fingerprints WHERE path='b.txt'")
    assert set(j.pass_inputs("work").fingerprints) == {"a.txt"}
    # And our own writes: an intent, evidence, a dropped fingerprint.
    i = j.begin_intent("work", "c.txt", "write", old=None, new=A)
    j.record_evidence("work", [("gone.txt", A)])
    j.put_fingerprints("work", {"a.txt": None})
    got = j.pass_inputs("work")
    assert [it.id for it in got.pending] == [i]
    assert got.evidence["gone.txt"] == A and got.fingerprints == {}
    other.close()


def test_intent_survives_sigkill(tmp_path: Path):
    """begin_intent returns only once the intent is committed (synchronous=FULL): a SIGKILL right
    after it leaves the intent pending for the next opener. (Proves ordering, not fsync.)"""
    db = tmp_path / "store.db"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from memfs.store.journal import Journal
        j = Journal({str(db)!r})
        j.begin_intent("work", "a.txt", "write", old=None, new={A!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    pend = Journal(db).pending_intents("work", "a.txt")
    assert len(pend) == 1 and pend[0].new == A and pend[0].old is None


CHILD = textwrap.dedent("""
    import ctypes, json, sys
    from memfs.store.journal import Journal, JournalNeedsReopen
    point, errno_value, db = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    fiu = ctypes.CDLL("libfiu.so.0")
    fiu.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
    out = {}
    j = Journal(db)
    j.record_evidence("work", [("a.txt", "A" * 32)], root=(1, 2))
    fiu.fiu_enable(point.encode(), 1, ctypes.c_void_p(errno_value), 0)
    try:
        j.record_evidence("work", [("a.txt", "B" * 32)])
        out["append"] = "ok"
    except JournalNeedsReopen as exc:
        out["append"] = "needs-reopen"
        out["message"] = str(exc)
    fiu.fiu_disable(point.encode())
    refused = []
    for name, call in [
        ("evidence", lambda: j.evidence("work", "a.txt")),
        ("evidence_under", lambda: j.evidence_under("work")),
        ("record", lambda: j.record_evidence("work", [("b.txt", "C" * 32)])),
        ("intent", lambda: j.begin_intent("work", "a.txt", "write", old=None, new=None)),
        ("pending", lambda: j.pending_intents("work")),
        ("fingerprints", lambda: j.fingerprints("work")),
        ("root", lambda: j.root("work")),
        ("pass_inputs", lambda: j.pass_inputs("work")),
    ]:
        try:
            call()
        except JournalNeedsReopen:
            refused.append(name)
    out["refused"] = refused
    j.reopen()
    rec = j.evidence("work", "a.txt")
    out["after_reopen"] = rec.digest if rec else None
    out["b_recorded"] = j.evidence("work", "b.txt") is not None
    j.record_evidence("work", [("c.txt", "C" * 32)])
    out["writable"] = j.evidence("work", "c.txt") is not None
    print(json.dumps(out))
""")


@pytest.mark.parametrize("point,errno_value", [
    ("posix/io/sync/fdatasync", 5),  # EIO at the WAL's fdatasync on commit
    ("posix/io/rw/pwrite", 5),  # EIO writing the WAL frame
    ("posix/io/rw/pwrite", 28),  # ENOSPC writing the WAL frame
])
def test_failed_append_poisons_until_reopen(tmp_path: Path, point: str, errno_value: int):
    require_tool(libfiu_missing())
    db = tmp_path / "store.db"
    env = dict(os.environ, LD_PRELOAD=":".join(FIU))
    proc = subprocess.run([sys.executable, "-c", CHILD, point, str(errno_value), str(db)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["append"] == "needs-reopen"
    assert "reopen" in out["message"]
    # A full disk is mended by freeing space first (a reopen alone fails at the next write);
    # an I/O error's remedy is the reopen.
    full = f"free space on the filesystem that holds {tmp_path} first (`df {tmp_path}`"
    assert (full in out["message"]) == (errno_value == 28), out["message"]
    assert out["refused"] == ["evidence", "evidence_under", "record", "intent", "pending",
                              "fingerprints", "root", "pass_inputs"]
    # After the reopen the journal reads what the file holds — the old or the new value,
    # whichever SQLite made durable — and agrees with an independent reader.
    fresh = sqlite3.connect(db).execute(
        "SELECT digest FROM journal_evidence WHERE path='a.txt'").fetchone()[0]
    assert out["after_reopen"] in ("A" * 32, "B" * 32)
    assert out["after_reopen"] == fresh
    assert out["b_recorded"] is False  # nothing was written while poisoned
    assert out["writable"] is True


def test_a_reopen_that_fails_refuses_until_one_succeeds(tmp_path: Path):
    """A reopen whose new connection cannot open leaves the journal refusing (naming the
    reopen), never holding a closed connection that fails every call another way."""
    db = tmp_path / "store.db"
    j = Journal(db)
    j.record_evidence("m", [("a.txt", "A" * 32)], root=(1, 2))
    j.close()  # (a second close inside reopen is harmless)
    j = Journal(db)
    aside = tmp_path / "aside.db"
    db.rename(aside)
    db.mkdir()  # no database can open here
    with pytest.raises(sqlite3.Error):
        j.reopen()
    assert j.needs_reopen
    with pytest.raises(MemfsError, match="reopen"):
        j.evidence("m", "a.txt")
    db.rmdir()
    aside.rename(db)
    j.reopen()
    assert j.evidence("m", "a.txt") == EvidenceRecord("A" * 32)
    j.close()


def _fresh(db: Path, mount: str, prefix: str):
    """pass_inputs from a journal with nothing remembered: the file's truth."""
    j = Journal(db)
    try:
        got = j.pass_inputs(mount, prefix)
        return dict(got.evidence), dict(got.fingerprints), got.pending
    finally:
        j.close()


def test_remembered_snapshots_follow_every_write(tmp_path: Path):
    """Writes through this journal patch its remembered snapshots (or forget them); writes by
    another journal or a plain connection move the trigger-kept count. After each of a seeded
    random run of writes, every prefix's pass_inputs equals a fresh read of the file."""
    import random

    rng = random.Random(3)
    db = tmp_path / "store.db"
    j, other = Journal(db), Journal(db)
    paths = ["a.txt", "src/b.txt", "src/c.txt", "src/deep/d.txt", "srcx.txt"]
    prefixes = ["", "src", "src/deep", "srcx.txt"]
    digests = [A, B, "c" * 32, None]
    j.record_evidence("work", [("a.txt", A)], root=(1, 2))
    pending: list[int] = []
    for step in range(300):
        p, d = rng.choice(paths), rng.choice(digests)
        row = FingerprintRow(rng.randrange(9), step, step, 5, 6, rng.choice([A, B]), "text", 7)
        op = rng.randrange(9)
        if op == 0:
            j.record_evidence("work", [(p, d), (rng.choice(paths), rng.choice(digests))])
        elif op == 1:
            j.put_fingerprints("work", {p: row, rng.choice(paths): None})
        elif op == 2:
            pending.append(j.begin_intent("work", p, "write", old=None, new=d))
        elif op == 3 and pending:
            try:
                j.complete_intent(pending.pop(rng.randrange(len(pending))))
            except MemfsError:
                pass  # superseded: a later intent of its path completed first
        elif op == 4 and pending:
            j.abandon_intent(pending.pop())
        elif op == 5:
            j.forget_evidence("work", [p])
        elif op == 6:
            other.record_evidence("work", [(p, d)])
            other.put_fingerprints("work", {p: row})
        elif op == 7:
            with sqlite3.connect(db) as raw:
                raw.execute("DELETE FROM journal_fingerprints WHERE path=?", (p,))
        else:
            with sqlite3.connect(db) as raw:  # the store's own tables: no journal change
                raw.execute("CREATE TABLE IF NOT EXISTS other (x)")
                raw.execute("INSERT INTO other VALUES (?)", (step,))
        for prefix in rng.sample(prefixes, 2):
            got = j.pass_inputs("work", prefix)
            want = _fresh(db, "work", prefix)
            assert (dict(got.evidence), dict(got.fingerprints), got.pending) == want, (step, op)
    j.close()
    other.close()


def test_a_snapshot_outlives_commits_to_other_tables(tmp_path: Path):
    """The store commits to its own tables on every group commit; that no longer makes a pass
    read 100k rows again. A write through the journal patches only what it changed."""
    db = tmp_path / "store.db"
    j = Journal(db)
    j.record_evidence("work", [("a.txt", A)], root=(1, 2))
    j.put_fingerprints("work", {"a.txt": FingerprintRow(1, 2, 3, 4, 5, A, "text", 6)})
    first = j.pass_inputs("work")
    with sqlite3.connect(db) as raw:
        raw.execute("CREATE TABLE other (x)")
        raw.execute("INSERT INTO other VALUES (1)")
    again = j.pass_inputs("work")
    assert again.evidence is first.evidence and again.fingerprints is first.fingerprints
    i = j.begin_intent("work", "b.txt", "write", old=None, new=B)  # no evidence moved
    assert j.pass_inputs("work").evidence is first.evidence
    j.complete_intent(i)  # P := B for b.txt, patched in
    after = j.pass_inputs("work")
    assert after.evidence == {"a.txt": A, "b.txt": B}
    assert after.fingerprints is first.fingerprints
    j.close()


def test_names_that_are_not_utf8_are_kept_as_their_bytes(tmp_path: Path):
    """Every path column takes a name that is not UTF-8 (a surrogate escape in Python) as its
    own bytes, and gives the same escape back: evidence, prefix reads, intents, fingerprints."""
    db = tmp_path / "store.db"
    j = Journal(db)
    bad, under = "bad-\udce9.txt", "d\udcff/x"
    j.record_evidence("work", [(bad, A), (under, B), ("d/ok", A)], root=(1, 2))
    assert j.evidence("work", bad) == EvidenceRecord(A)
    assert set(j.evidence_under("work", "d\udcff")) == {under}
    assert set(j.evidence_under("work", "d")) == {"d/ok"}
    i = j.begin_intent("work", bad, "write", old=A, new=B, branch="main")
    assert [x.path for x in j.pending_intents("work", bad)] == [bad]
    j.complete_intent(i)
    assert j.evidence("work", bad) == EvidenceRecord(B)
    fp = FingerprintRow(1, 2, 3, 4, 5, A, "text", 6)
    j.put_fingerprints("work", {under: fp})
    assert j.pass_inputs("work", "d\udcff").fingerprints == {under: fp}
    raw = sqlite3.connect(db).execute(
        "SELECT CAST(path AS BLOB) FROM journal_evidence WHERE path >= 'bad' AND path < 'bae'"
    ).fetchall()
    assert raw == [(b"bad-\xe9.txt",)]  # the name's own bytes
    j.forget_evidence("work", [bad])
    assert j.evidence("work", bad) is None
    j.close()


def test_evidence_carries_the_agreed_mode_and_old_evidence_reads_none(tmp_path: Path):
    """P's mode: recorded with the digest (record_evidence, an intent's completion), shared in
    pass_inputs.modes; a journal made before modes gets the column, its rows read None (the
    rule then takes disk's mode, never writes over it)."""
    db = tmp_path / "store.db"
    old = sqlite3.connect(db)
    old.executescript("""
        CREATE TABLE journal_evidence (mount TEXT NOT NULL, path TEXT NOT NULL, digest TEXT,
            recorded_at REAL NOT NULL, PRIMARY KEY (mount, path)) WITHOUT ROWID;
        INSERT INTO journal_evidence VALUES ('work', 'old.txt', 'aaaa', 0);
    """)
    old.close()
    j = Journal(db)
    assert j.evidence("work", "old.txt") == EvidenceRecord("aaaa", None)
    j.record_evidence("work", [("run.sh", A, 0o755), ("gone.txt", None, None)], root=(1, 2))
    got = j.pass_inputs("work")
    assert got.modes == {"run.sh": 0o755} and got.evidence["old.txt"] == "aaaa"
    i = j.begin_intent("work", "run.sh", "write", old=A, new=B, branch="main", mode=0o644)
    assert j.pending_intents("work")[0].mode == 0o644
    j.complete_intent(i)
    again = j.pass_inputs("work")  # patched in place, not re-read
    assert again.modes == {"run.sh": 0o644} and again.evidence["run.sh"] == B
    assert j.evidence("work", "run.sh") == EvidenceRecord(B, 0o644)
    j.close()
    fresh = Journal(db).pass_inputs("work")
    assert dict(fresh.modes) == {"run.sh": 0o644}
