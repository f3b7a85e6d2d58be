"""Immutable tree objects: directory listings and file manifests.

A directory object lists its entries sorted by name; each entry carries the metadata a
stat needs and a reference to its content: a child directory's object id, a file's
manifest reference, or a symlink's target. Unchanged subtrees keep their ids, so a write
touches only the objects on its path (structural sharing).

File references: "" is an empty file, "c:<chunk>" a file of one chunk at offset 0, and
"m:<object>" a manifest listing (index, chunk) pairs; absent indexes are holes.

Special files (FIFO, socket, character and block device) keep their st_rdev, in decimal, as
their reference. A directory's entry may carry its link count (2 + subdirectories).

Hard links: an inode with more than one name lives in its commit's inode table, an object of
rows like a directory's, keyed by a random inode key instead of a name, each with its link
count. A directory row for such a name is just [name, "h", key]: the metadata and content are
kept once, in the table, so a write through one name never has to find and rewrite the
directories of the others (which may not even be loaded). See docs/architecture.md.

Names are bytes on Linux; they are stored as str with surrogateescape so that any name
the kernel hands us round-trips.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field

DIR, FILE, LINK = "d", "f", "l"
FIFO, SOCK, CHR, BLK = "p", "s", "c", "b"
SPECIAL = (FIFO, SOCK, CHR, BLK)
HARD = "h"  # a directory row naming an inode-table entry (a hard-linked inode)
KINDS = (DIR, FILE, LINK, *SPECIAL)


def object_id(data: bytes) -> str:
    """Identities that carry trust use BLAKE2b (collision-resistant)."""
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def name_to_str(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def name_to_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


@dataclass
class Entry:
    name: str
    kind: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    size: int
    ref: str
    xattrs: dict[str, str] = field(default_factory=dict)  # name -> latin-1 text of the bytes
    atime_ns: int | None = None  # stored only when it differs from mtime (set by utimes)
    # A directory's 2 + subdirectories, or an inode-table row's number of names; None: not
    # recorded (every entry of stores made before link counts; a plain entry has one name).
    nlink: int | None = None

    def to_list(self) -> list:
        if self.kind == HARD:
            return [self.name, HARD, self.ref]
        row = [self.name, self.kind, self.mode, self.uid, self.gid, self.mtime_ns, self.ctime_ns,
               self.size, self.ref]
        atime = None if self.atime_ns in (None, self.mtime_ns) else self.atime_ns
        if self.xattrs or atime is not None or self.nlink is not None:
            row.append(self.xattrs)
        if atime is not None or self.nlink is not None:
            row.append(atime)
        if self.nlink is not None:
            row.append(self.nlink)
        return row

    @classmethod
    def from_list(cls, row: list) -> Entry:
        if row[1] == HARD:
            return cls(row[0], HARD, 0, 0, 0, 0, 0, 0, row[2])
        xattrs = row[9] if len(row) > 9 else {}
        atime = row[10] if len(row) > 10 else None
        nlink = row[11] if len(row) > 11 else None
        return cls(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], xattrs,
                   atime, nlink)


def hard_entry(name: str, key: str) -> Entry:
    """A directory's row for one name of an inode kept in the inode table."""
    return Entry(name, HARD, 0, 0, 0, 0, 0, 0, key)


def new_inode_key() -> str:
    """Keys are random (64 bits): unique within a tree without a counter to keep durable."""
    return secrets.token_hex(8)


def encode_dir(entries: list[Entry]) -> bytes:
    return encode_rows([encode_row(e) for e in entries])


def encode_row(e: Entry) -> tuple[str, bytes]:
    """One entry's part of its directory object, with its name to sort by."""
    return e.name, json.dumps(e.to_list(), separators=(",", ":")).encode()


def encode_rows(rows: list[tuple[str, bytes]]) -> bytes:
    """A directory object from encoded rows, sorted by name. Rows of clean entries are
    cached by the workspace, so a commit in a wide directory only joins bytes."""
    return b"[" + b",".join(row for _, row in sorted(rows)) + b"]"


def decode_dir(data: bytes) -> list[Entry]:
    return [Entry.from_list(row) for row in json.loads(data)]


def encode_inodes(rows: list[tuple[str, bytes]]) -> bytes:
    """An inode table from encoded rows (entries named by inode key), sorted by key."""
    return encode_rows(rows)


def decode_inodes(data: bytes) -> dict[str, Entry]:
    return {e.name: e for e in decode_dir(data)}


def encode_manifest(size: int, chunks: dict[int, str]) -> bytes:
    return json.dumps({"size": size, "chunks": sorted(chunks.items())}, separators=(",", ":")).encode()


def decode_manifest(data: bytes) -> tuple[int, dict[int, str]]:
    doc = json.loads(data)
    return doc["size"], {int(i): c for i, c in doc["chunks"]}


def xattrs_to_store(xattrs: dict[bytes, bytes]) -> dict[str, str]:
    return {name_to_str(k): v.decode("latin-1") for k, v in xattrs.items()}


def xattrs_from_store(xattrs: dict[str, str]) -> dict[bytes, bytes]:
    return {name_to_bytes(k): v.encode("latin-1") for k, v in xattrs.items()}
