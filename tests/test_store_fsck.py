"""memfs fsck checks link counts and references: a store damaged on purpose is reported."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import trio

from memfs.store import Store
from memfs.store.trees import decode_dir, encode_dir, object_id
from memfs.workspace.workspace import DIR, FILE, Workspace


def linked_store(root: Path) -> str:
    """A store whose head has work/a (linked as work/d/b) and a directory work/d."""
    ws = Workspace.open(root)

    async def build() -> str:
        w = ws.create(ws.root, b"work", DIR, 0o755, 0, 0)
        d = ws.create(w, b"d", DIR, 0o755, 0, 0)
        f = ws.create(w, b"a", FILE, 0o644, 0, 0)
        ws.write(f, 0, b"shared")
        ws.link(f, d, b"b")
        return await ws.commit("linked")

    head = trio.run(build)
    ws.store.close()
    return head


def put(conn: sqlite3.Connection, data: bytes) -> str:
    oid = object_id(data)
    conn.execute("INSERT OR IGNORE INTO objects VALUES (?, ?)", (oid, data))
    return oid


def fsck(root: Path) -> list[str]:
    store = Store.open(root, create=False)
    try:
        return store.fsck()
    finally:
        store.close()


def test_linked_store_is_consistent(tmp_path: Path) -> None:
    linked_store(tmp_path)
    assert fsck(tmp_path) == []


def test_wrong_link_count_and_dangling_name_are_reported(tmp_path: Path) -> None:
    head = linked_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    (table,) = conn.execute("SELECT inodes FROM commit_inodes WHERE commit_id = ?",
                            (head,)).fetchone()
    (data,) = conn.execute("SELECT data FROM objects WHERE id = ?", (table,)).fetchone()
    rows = json.loads(data)
    key = rows[0][0]
    rows[0][11] = 3
    conn.execute("UPDATE commit_inodes SET inodes = ? WHERE commit_id = ?",
                 (put(conn, json.dumps(rows).encode()), head))
    assert any(f"inode {key} records 3 link(s) but 2 name(s)" in p for p in fsck(tmp_path))
    conn.execute("UPDATE commit_inodes SET inodes = ? WHERE commit_id = ?",
                 (put(conn, b"[]"), head))
    assert any(f"2 name(s) point at inode {key}, which its inode table lacks" in p
               for p in fsck(tmp_path))


def test_wrong_directory_link_count_is_reported(tmp_path: Path) -> None:
    head = linked_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    (tree,) = conn.execute("SELECT tree FROM commits WHERE id = ?", (head,)).fetchone()
    (data,) = conn.execute("SELECT data FROM objects WHERE id = ?", (tree,)).fetchone()
    top = decode_dir(data)
    top[0].nlink = 5  # work has one subdirectory: 3
    conn.execute("UPDATE commits SET tree = ? WHERE id = ?", (put(conn, encode_dir(top)), head))
    problems = fsck(tmp_path)
    assert any("/work: directory link count 5, but it has 1 subdirectories" in p
               for p in problems), problems
