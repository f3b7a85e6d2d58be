"""How history reads for people: commit and operation lines, changed paths with sizes, and
unified diffs (names only for binary files). Pure functions of store records."""

from __future__ import annotations

import difflib
import os
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

from memfs.store.backend import StoreBackend as Store
from memfs.store.history import Gap, LoggedCommit, OpRecord
from memfs.store.opspan import Span
from memfs.store.treediff import (
    ADDED,
    CHANGED,
    DIR,
    FILE,
    LINK,
    REMOVED,
    RENAMED,
    Change,
    read_file,
)
from memfs.store.trees import BLK, CHR, FIFO, SOCK, Entry

TEXT_LIMIT = 8 << 20  # a side larger than this is named, not diffed line by line
SNIFF = 8000  # bytes looked at for a NUL (as git does)
WORDS = {ADDED: "added", CHANGED: "changed", REMOVED: "removed", RENAMED: "renamed"}


KIND_NAMES = {FIFO: "a FIFO", SOCK: "a socket", CHR: "a character device",
              BLK: "a block device"}


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b",
            "\f": "\\f", "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def _escaped(text: str) -> str:
    """Control characters, backslash and quote as C escapes; a byte that is not UTF-8 (a
    surrogate-escaped name) as its octal escape, as git writes them."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\{o:03o}")
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\{o - 0xDC00:03o}")
        else:
            out.append(ch)
    return "".join(out)


def shown(path: str) -> str:
    """A path as one line shows it: as it is when plain, else C-quoted as git quotes it (a
    name holding a newline printed raw split a `log --stat` line in two, and one name read
    as two)."""
    plain = all(0x20 <= ord(ch) != 0x7F and ch not in '\\"' and not 0xDC80 <= ord(ch) <= 0xDCFF
                for ch in path)
    return path if plain else f'"{_escaped(path)}"'


def one_line(text: str) -> str:
    """A commit message or command line kept on its line (control characters escaped)."""
    return text if all(0x20 <= ord(ch) != 0x7F for ch in text) else \
        "".join(_ESCAPES.get(ch, f"\\{ord(ch):03o}") if ord(ch) < 0x20 or ord(ch) == 0x7F
                else ch for ch in text)


def kind_name(kind: str, ref: str = "") -> str:
    """A special file as people call it (the store's one-letter kinds are no words), a
    device with its major:minor."""
    name = KIND_NAMES.get(kind, f"an entry of kind {kind!r}")
    if kind in (CHR, BLK) and ref.isdigit():
        name += f" {os.major(int(ref))}:{os.minor(int(ref))}"
    return name


def when(ns: float) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def who(op: OpRecord | None, whole_group: bool = False) -> str:
    """Who made it: the pid, process group and uid (a whole group: the group)."""
    if op is None:
        return ""
    if op.kind != "process":
        return op.kind
    if whole_group:
        return f"process group {op.pgid}, uid {op.uid}"
    return f"pid {op.pid}, process group {op.pgid}, uid {op.uid}"


def commit_line(c: LoggedCommit) -> str:
    marks = "".join(f"  [mark {m}]" for m in c.marks)
    by = who(c.op)
    return f"{c.id[:12]}  {when(c.time_ns)}  {one_line(c.commit.message)}" \
        + (f"  ({by})" if by else "") \
        + marks


def gap_line(gap: Gap) -> str:
    """The commits the retention policy dropped below a kept one, and what they held."""
    n = len(gap.commits)
    held = gap.labels[:5]
    more = len(gap.labels) - len(held)
    what = (": " + "; ".join(f"`{one_line(x)}`" for x in held) + (f" and {more} more" if more else "")
            if held else "")
    unrecorded = f" ({gap.unrecorded} with no record of who made them)" if gap.unrecorded and \
        held else ""
    return (f"  ... {n} commit{'s' if n != 1 else ''} from {when(gap.oldest_ns)} to "
            f"{when(gap.newest_ns)} dropped by the retention policy on {when(gap.dropped_ns)} "
            f"({gap.reason}){what}{unrecorded}")


def span_line(s: Span) -> str:
    n = len(s.commits)
    newest = s.commits[0]
    by = who(s.op, s.whole_group)
    also = f"; with changes of {', '.join(map(one_line, s.others))}" if s.others else ""
    if s.quiet:
        also += f"; then {', '.join(map(one_line, dict.fromkeys(s.quiet)))}, changing only times"
    marks = "".join(f"  [mark {m}]" for m in newest.marks)
    return (f"{newest.id[:12]}  {when(newest.time_ns)}  {one_line(s.label)}  "
            f"({n} commit{'s' if n != 1 else ''}{'; ' + by if by else ''}{also})") + marks


def span_json(s: Span, changes: list[Change] | None) -> dict:
    doc = {
        "id": s.commits[0].id, "commits": [c.id for c in s.commits], "before": s.target,
        "time": s.commits[0].time_ns / 1e9, "first_time": s.commits[-1].time_ns / 1e9,
        "label": s.label, "whole_group": s.whole_group, "others": s.others,
        "quiet": list(s.quiet),
        "operation": s.op.to_json() if s.op else None,
        "pid": s.op.pid if s.op else None, "pgid": s.op.pgid if s.op else None,
        "uid": s.op.uid if s.op else None, "cmdline": s.label,
    }
    if changes is not None:
        doc["changes"] = [c.to_json() for c in changes]
    return doc


def change_lines(changes: list[Change] | None, with_sizes: bool) -> list[str]:
    """`    A  path  (size)` per change; with sizes, a summary line closes the list."""
    if not changes:
        if changes is None:
            return []
        return ["    (no path changed: directory times or reconciler records only)"]
    out = []
    for c in changes:
        path = f"{shown(c.old_path)} -> {shown(c.path)}" if c.status == RENAMED \
            else shown(c.path)
        if not with_sizes:
            out.append(f"    {c.status}  {path}")
            continue
        if c.status == CHANGED and c.kind != DIR:
            sz = f"{size(c.old_size)} -> {size(c.size)}" if c.old_size != c.size else size(c.size)
            sz += f"  ({c.detail})" if c.detail and c.detail != "content" else ""
        elif c.status == CHANGED:
            sz = f"({c.detail})"
        elif c.kind == DIR:
            sz = ""
        else:
            sz = size(c.size if c.status != REMOVED else c.old_size)
        out.append(f"    {c.status}  {path}  {sz}".rstrip())
    if with_sizes:
        out.append("    " + summary(changes))
    return out


def summary(changes: list[Change]) -> str:
    counts = Counter(c.status for c in changes if c.kind != DIR or c.status == CHANGED)
    before = sum(c.old_size or 0 for c in changes if c.kind != DIR)
    after = sum(c.size or 0 for c in changes if c.kind != DIR)
    n = sum(counts.values())
    parts = [f"{counts[s]} {WORDS[s]}" for s in (ADDED, CHANGED, REMOVED, RENAMED) if counts[s]]
    delta = after - before
    return (f"{n} path{'s' if n != 1 else ''}: {', '.join(parts) or 'directories only'}; "
            f"{'+' if delta >= 0 else '-'}{size(abs(delta))}")


def listing_lines(entries: list[Entry]) -> list[str]:
    out = []
    for e in entries:
        kind = {DIR: "d", FILE: "-", LINK: "l"}.get(e.kind, e.kind)
        name = shown(e.name) + ("/" if e.kind == DIR else f" -> {shown(e.ref)}"
                                if e.kind == LINK else "")
        out.append(f"{kind}{e.mode:04o}  {e.size if e.kind != DIR else '-':>10}  {name}")
    return out


# -- unified diffs -----------------------------------------------------------------------------
def diff_text(store: Store, changes: list[Change]) -> Iterator[str]:
    """git-like text: a unified diff for text files, one line naming a binary file, a
    rename, a new or removed directory, or a metadata change."""
    for c in changes:
        if c.kind == DIR:
            if c.status in (ADDED, REMOVED, RENAMED):
                yield _dir_line(c)
            elif c.detail:
                yield f"{_head(c.path, c.path)}{c.detail}\n"
            continue
        if c.status == RENAMED:
            yield (f"{_head(c.old_path, c.path)}rename from {shown(c.old_path)}\n"
                   f"rename to {shown(c.path)}\n")
            continue
        yield from _file_diff(store, c)


def _head(old: str, new: str) -> str:
    return f"diff {shown('a/' + old)} {shown('b/' + new)}\n"


def _dir_line(c: Change) -> str:
    if c.status == RENAMED:
        return f"rename directory {shown(c.old_path)} -> {shown(c.path)}\n"
    return f"{'new' if c.status == ADDED else 'removed'} directory {shown(c.path)}\n"


def _file_diff(store: Store, c: Change) -> Iterator[str]:
    a_name = shown(f"a/{c.path}") if c.status != ADDED else "/dev/null"
    b_name = shown(f"b/{c.path}") if c.status != REMOVED else "/dev/null"
    head = _head(c.path, c.path)
    if c.status == CHANGED and c.detail and "content" not in c.detail \
            and not c.detail.startswith("target"):
        yield head + c.detail + "\n"
        return
    if c.kind == LINK:
        old = [f"-> {c.old_ref}\n"] if c.status != ADDED else []
        new = [f"-> {c.ref}\n"] if c.status != REMOVED else []
        yield head + "".join(difflib.unified_diff(old, new, a_name, b_name))
        return
    if c.kind != FILE:
        ref = c.ref if c.status != REMOVED else c.old_ref
        yield head + f"{WORDS[c.status]} ({kind_name(c.kind, ref)})\n"
        return
    if max(c.old_size or 0, c.size or 0) > TEXT_LIMIT:
        yield head + (f"large file {WORDS[c.status]}: {size(c.old_size)} -> {size(c.size)} "
                      f"(not shown; memfs show REV:{shown(c.path)} gives the bytes)\n")
        return
    old = read_file(store, c.old_ref, c.old_size or 0) if c.status != ADDED else b""
    new = read_file(store, c.ref, c.size or 0) if c.status != REMOVED else b""
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        yield head + f"Binary files {a_name} and {b_name} differ\n"
        return
    body = "".join(_lines(difflib.unified_diff(old_text.splitlines(keepends=True),
                                               new_text.splitlines(keepends=True),
                                               a_name, b_name)))
    if not body:  # an empty file added or removed
        body = f"{'new' if c.status == ADDED else 'removed'} empty file\n"
    yield head + body


def _lines(diff: Iterator[str]) -> Iterator[str]:
    """A last line without a newline gets diff(1)'s marker (difflib would run it into the
    next line)."""
    for line in diff:
        yield line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _text(data: bytes) -> str | None:
    if b"\0" in data[:SNIFF]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
