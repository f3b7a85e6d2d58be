"""Small changes to a big file cost the store what they write (docs/lifecycle.md, "Small
changes to big files"): a chunk that replaces another is kept as a patch over it
(memfs.store.delta), and what is kept so reads back byte for byte after a remount and after a
SIGKILL of the daemon in the middle of a writer. Every test runs on both backends
(tests/conftest.py BOTH_BACKENDS): the PostgreSQL store keeps patches as rows.

Found trying memfs as a user, before patches (each commit stored the touched 1 MiB chunk
whole): 200 small SQLite transactions in WAL mode (a 32 KiB database at the end) grew the
store's packs by 87 MiB; an app log appended a line at a time with fsync grows the store by
the file's size at every line (quadratic in the log's length). On a native disk both cost
what they write. The PostgreSQL store kept doing so after the embedded store stopped (100
fsynced 100-byte appends to a 512 KiB log: 50.5 MiB of chunk rows; 18 KB with patches).
`memfs du` counts it all as history, kept for a day by the default retention, so a local app
with a SQLite file in the mount fills the disk; a server log trickling into the mount does the
same without any fsync.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time

from helpers.store import chunk_bytes, patch_rows, store_check
from helpers.wait import wait_for

MiB = 1 << 20


def test_fsynced_appends_to_a_log_cost_what_they_write(mounted):
    mounted.require_real()
    log = mounted.work / "app.log"
    log.write_bytes(os.urandom(512 * 1024))
    mounted.cli("sync", check=False)
    os.sync()
    before = chunk_bytes(mounted.root)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        for _ in range(100):  # 100 lines of 100 bytes: 10 KB written
            os.write(fd, os.urandom(50).hex().encode())
            os.fsync(fd)
    finally:
        os.close(fd)
    grown = chunk_bytes(mounted.root) - before
    # A native disk grows by the 10 KB written; allow a whole chunk of slack and then some.
    assert grown < 4 * MiB, f"100 fsynced 100-byte appends grew the store by {grown / MiB:.1f} MiB"


def test_small_sqlite_transactions_cost_what_they_write(mounted):
    mounted.require_real()
    before = chunk_bytes(mounted.root)
    db = sqlite3.connect(mounted.work / "app.db", isolation_level=None)
    try:
        db.execute("pragma journal_mode=wal")
        db.execute("create table t(v text)")
        for i in range(200):
            db.execute("insert into t values (?)", (f"row {i}" * 10,))
    finally:
        db.close()
    size = sum(p.stat().st_size for p in mounted.work.glob("app.db*"))
    grown = chunk_bytes(mounted.root) - before
    assert grown < 8 * MiB, (
        f"200 small transactions ({size} bytes of database at the end) grew the store by "
        f"{grown / MiB:.1f} MiB")


def test_a_slow_log_without_fsync_costs_what_it_writes(mounted):
    """No fsync needed: every 100 ms group commit stores the log's last chunk again, so a log
    trickling 2 KB/s onto a 512 KiB file grew the store by ~25 MiB in 5 s (~5 MiB/s)."""
    mounted.require_real()
    log = mounted.work / "server.log"
    log.write_bytes(os.urandom(512 * 1024))
    fd = os.open(log, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    before = chunk_bytes(mounted.root)
    with open(log, "ab", buffering=0) as f:
        for _ in range(50):  # 5 KB over ~2.5 s, a line every 50 ms
            f.write(os.urandom(50).hex().encode())
            time.sleep(0.05)  # the writer's pace is the point, not a wait for memfs
        os.fsync(f.fileno())
    grown = chunk_bytes(mounted.root) - before
    assert grown < 4 * MiB, f"a 5 KB trickle grew the store by {grown / MiB:.1f} MiB"


# Appends numbered lines to a log, an fsync after each, and after each fsync returned writes
# the number of lines it holds to the promises file (outside the mount).
APPENDER = """
import hashlib, os, sys
log, promises = sys.argv[1], sys.argv[2]
fd = os.open(log, os.O_WRONLY | os.O_APPEND)
with open(promises, "a", buffering=1) as out:
    for i in range(100_000):
        os.write(fd, b"%06d %s\\n" % (i, hashlib.sha256(b"%d" % i).hexdigest().encode()))
        os.fsync(fd)
        out.write(f"{i + 1}\\n")
"""


def line(i: int) -> bytes:
    return b"%06d %s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest().encode())


def test_a_log_kept_as_patches_reads_back_after_a_sigkill_and_a_remount(mounted, tmp_path):
    """A 1.5 MiB log (its second chunk half full) appended a line per fsync; the daemon is
    SIGKILLed mid-writer: every acknowledged line is there, the file is exactly the first
    lines and nothing else, fsck is clean, and so again after a clean remount."""
    mounted.require_real()
    head = os.urandom(3 * MiB // 2)
    log = mounted.work / "app.log"
    log.write_bytes(head)
    fd = os.open(log, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    promises = tmp_path / "promises"
    promises.write_text("")
    writer = subprocess.Popen([sys.executable, "-c", APPENDER, str(log), str(promises)],
                              stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(promises.read_text().split()) >= 150, timeout=60), \
            "the writer acknowledged under 150 lines in 60 s"
        mounted.kill()
    finally:
        writer.kill()
        writer.wait()
    acked = int(promises.read_text().split()[-1])
    assert patch_rows(mounted.root) >= 100, "the appends were not kept as patches"
    store_check(mounted.root)
    mounted.remount()
    got = log.read_bytes()
    assert got[:len(head)] == head, "the log's first 1.5 MiB changed"
    tail = got[len(head):]
    n = tail.count(b"\n")
    assert n >= acked, f"{acked} lines were acknowledged, {n} survived the SIGKILL"
    assert tail == b"".join(line(i) for i in range(n)), "the log is not exactly its first lines"
    mounted.remount()
    assert log.read_bytes() == got, "a clean remount read the log back differently"
    store_check(mounted.root)
