"""The walk's directory memos against the walk without them, on real directories: a walk
with the mount's memos (observe.WalkMemo) must give the same facts, listings and regions as a
walk without, after any sequence of changes."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfs.reconcile.observe import Observation, WalkMemo, observe

NAMES = ["a.txt", "b.md", "c.log", "d", "e"]
DIRS = ["", "d", "d/e", ".git", "x"]


def _path(draw_dir: str, name: str) -> str:
    return f"{draw_dir}/{name}" if draw_dir else name


ops = st.tuples(
    st.sampled_from(["write", "same-size", "touch", "rm", "mkdir", "rmtree", "symlink",
                     "fifo", "rename", "file-for-dir", "nothing"]),
    st.sampled_from(DIRS), st.sampled_from(NAMES), st.sampled_from(DIRS),
    st.sampled_from(NAMES), st.binary(max_size=6))


def _apply(root: Path, op: tuple) -> None:
    kind, d1, n1, d2, n2, data = op
    a, b = root / _path(d1, n1), root / _path(d2, n2)
    if a.is_symlink() or a.is_fifo():
        if kind in ("write", "same-size", "rmtree", "file-for-dir"):
            return  # opening a FIFO (rmtree opens its path) would block the test
    try:
        if kind == "write":
            a.write_bytes(data)
        elif kind == "same-size":  # new bytes, the same size, the mtime put back
            st_ = os.stat(a)
            a.write_bytes(bytes((x + 1) % 256 for x in a.read_bytes()))
            os.utime(a, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        elif kind == "touch":
            os.utime(a, ns=(1_000_000_000, 1_000_000_000))
        elif kind == "rm":
            a.unlink()
        elif kind == "mkdir":
            a.mkdir()
        elif kind == "rmtree":
            import shutil
            shutil.rmtree(a)
        elif kind == "symlink":
            a.symlink_to(os.path.relpath(b, a.parent))
        elif kind == "fifo":
            os.mkfifo(a)
        elif kind == "rename":
            os.rename(a, b)
        elif kind == "file-for-dir":
            import shutil
            shutil.rmtree(a)
            a.write_bytes(data)
    except OSError:
        pass  # the op did not apply to this tree: a no-op, like "nothing"


def _same(got: Observation, want: Observation) -> None:
    assert got.files == want.files
    assert sorted(got.regions, key=repr) == sorted(want.regions, key=repr)
    assert got.listed == want.listed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(ops, max_size=4), min_size=1, max_size=8),
       follow=st.booleans(), ignore=st.sampled_from([(), ("*.log",), ("d/e",)]),
       keep_cache=st.lists(st.booleans(), min_size=8, max_size=8),
       scoped_first=st.lists(st.booleans(), min_size=8, max_size=8))
def test_memo_walk_equals_plain_walk(steps, follow, ignore, keep_cache, scoped_first):
    """After each batch of changes, the memo walk (whole, and scoped to a directory) sees
    exactly what a walk without memos sees, whether the cache is the same object as last time,
    an equal copy, or a new snapshot with the fresh hashes added (as the journal's)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for d in ("d/e", ".git", "x"):
            (root / d).mkdir(parents=True, exist_ok=True)
        for d in DIRS:
            for n in NAMES[:3]:
                (root / _path(d, n)).write_bytes(n.encode())
        memo = WalkMemo()
        cache: dict = {}
        kw = dict(follow_symlinks=follow, ignore=ignore, racy_ns=0)
        for i, batch in enumerate(steps):
            for op in batch:
                _apply(root, op)
            time.sleep(0.001)  # later than the changes, so the cache vouches for them
            if scoped_first[i]:  # a scoped walk may refresh memos a whole walk then takes
                scoped = observe(root, cache=cache, memo=memo, scope="d", **kw)
                _same(scoped, observe(root, cache=cache, scope="d", **kw))
            got = observe(root, cache=cache, memo=memo, **kw)
            _same(got, observe(root, cache=cache, **kw))
            if not scoped_first[i]:
                scoped = observe(root, cache=cache, memo=memo, scope="d", **kw)
                _same(scoped, observe(root, cache=cache, scope="d", **kw))
            if got.hashed:
                cache = {**cache, **got.hashed}  # a new snapshot, as the journal's
            elif not keep_cache[i]:
                cache = dict(cache)  # an equal snapshot, another object: rows by value


def test_scoped_walk_refreshing_a_memo_breaks_the_whole_walk_shortcut(tmp_path: Path):
    """A whole quiet walk hands out the last whole walk's files only if it took the very same
    memos: a scoped walk that saw a change in between has refreshed one of them."""
    (tmp_path / "d").mkdir()
    for name in ("a.txt", "d/b.txt"):
        (tmp_path / name).write_text("one\n")
    cache: dict = {}
    memo = WalkMemo()
    for _ in range(3):
        time.sleep(0.001)
        got = observe(tmp_path, cache=cache, memo=memo, racy_ns=0)
        cache = {**cache, **got.hashed}
    quiet = observe(tmp_path, cache=cache, memo=memo, racy_ns=0)
    assert observe(tmp_path, cache=cache, memo=memo, racy_ns=0).files is quiet.files
    (tmp_path / "d" / "b.txt").write_text("two, longer\n")  # d's own entry is unchanged
    scoped = observe(tmp_path, cache=cache, memo=memo, racy_ns=0, scope="d")
    assert scoped.files["d/b.txt"].size == len("two, longer\n")
    cache = {**cache, **scoped.hashed}
    time.sleep(0.001)
    observe(tmp_path, cache=cache, memo=memo, racy_ns=0, scope="d")  # d's memo made afresh
    whole = observe(tmp_path, cache=cache, memo=memo, racy_ns=0)
    assert whole.files == observe(tmp_path, cache=cache, racy_ns=0).files
    assert whole.files["d/b.txt"].size == len("two, longer\n")


def test_an_ignored_directory_replaced_by_a_file_is_listed_as_a_file(tmp_path: Path):
    """Hypothesis's find in CI: `d/e` ignored, a directory, then removed and a file written
    at its name. d's listing is the same names, so the memo walk reused d's ignored regions,
    kind and all, and said `d/e/` (a directory) where the plain walk said a file."""
    (tmp_path / "d" / "e").mkdir(parents=True)
    memo = WalkMemo()
    kw = dict(ignore=("d/e",), racy_ns=0)
    first = observe(tmp_path, cache={}, memo=memo, **kw)
    assert [(r.path, r.kind) for r in first.regions] == [("d/e", "dir")]
    (tmp_path / "d" / "e").rmdir()
    (tmp_path / "d" / "e").write_bytes(b"")
    got = observe(tmp_path, cache={}, memo=memo, **kw)
    _same(got, observe(tmp_path, cache={}, **kw))
    assert [(r.path, r.kind) for r in got.regions] == [("d/e", "")]
