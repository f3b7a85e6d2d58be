"""Observation on real directories: facts, fingerprints, absence, containment, the root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers.require import require_tool, root_missing

from memfs.reconcile.contained import RootId, RootUnavailable
from memfs.reconcile.observe import HEAD, WalkFiles, WalkMemo, observe
from memfs.reconcile.rule import ABSENT, Content, DiskUnknown

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
LATER = 10_000_000_000  # a clock 10 s ahead: entries hashed "long after" their last change


def later() -> int:
    return time.time_ns() + LATER


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "src" / "b.md").write_text("# b\n")
    (root / "src" / "deep" / "c.txt").write_text("c\n")
    (root / "img.png").write_bytes(PNG)
    return root


def test_facts_kinds_and_absence(tree: Path):
    obs = observe(tree)
    assert obs.complete
    assert obs.files["img.png"].kind == "binary" and obs.files["img.png"].mime == "image/png"
    assert obs.files["img.png"].size == len(PNG)
    assert isinstance(obs.disk("a.txt"), Content) and obs.disk("a.txt").kind == "text"
    assert obs.disk("missing.txt") is ABSENT
    assert obs.disk("src/deep/nope") is ABSENT
    assert obs.disk("a.txt/under-a-file") is ABSENT
    assert obs.disk("no/such/dir/x") is ABSENT
    # The same bytes give the same digest as the content address the effects compute.
    assert obs.files["src/b.md"].digest == observe(tree, scope="src/b.md").files["src/b.md"].digest


def test_scope_file_and_missing_scope(tree: Path):
    one = observe(tree, scope="src/deep/c.txt")
    assert set(one.files) == {"src/deep/c.txt"}
    assert isinstance(one.disk("a.txt"), DiskUnknown)  # outside the scope proves nothing
    gone = observe(tree, scope="src/deep/gone.txt")
    assert gone.disk("src/deep/gone.txt") is ABSENT
    chain = observe(tree, scope="x/y/z.txt")
    assert chain.disk("x/y/z.txt") is ABSENT


def test_shell_changes_350_entries(tmp_path: Path):
    """Seed 002's problem: a PNG copied in with cp appears; three logs removed with rm vanish."""
    root = tmp_path / "r"
    root.mkdir()
    for i in range(349):
        (root / f"f{i:03}.log").write_text(f"log {i}\n")
    (tmp_path / "shot.png").write_bytes(PNG)
    before = observe(root)
    subprocess.run(["cp", str(tmp_path / "shot.png"), str(root / "shot.png")], check=True)
    subprocess.run(["rm", str(root / "f001.log"), str(root / "f002.log"), str(root / "f003.log")],
                   check=True)
    after = observe(root, cache=before.hashed)
    assert after.files["shot.png"].kind == "binary" and after.files["shot.png"].size == len(PNG)
    for name in ("f001.log", "f002.log", "f003.log"):
        assert after.disk(name) is ABSENT
    assert len(after.files) == 347


def test_fingerprint_trusted_only_when_safe(tree: Path):
    first = observe(tree, clock=later)
    cache = first.hashed
    again = observe(tree, cache=cache)
    assert not again.files["a.txt"].rehashed  # unchanged, old, on ext4/tmpfs: trusted

    # utimes back to the old mtime: ctime moved, so it is rehashed and the new bytes are seen.
    st = os.stat(tree / "a.txt")
    (tree / "a.txt").write_text("ALPHA\n")
    os.utime(tree / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    o = observe(tree, cache=cache)
    assert o.files["a.txt"].rehashed and o.disk("a.txt") != first.disk("a.txt")

    # cp -p and touch -r restore mtime too; ctime still gives them away.
    (tree / "other.txt").write_text("OTHER!\n")
    subprocess.run(["cp", "-p", str(tree / "other.txt"), str(tree / "src" / "b.md")], check=True)
    subprocess.run(["touch", "-r", str(tree / "img.png"), str(tree / "src" / "deep" / "c.txt")],
                   check=True)
    o = observe(tree, cache=cache)
    assert o.files["src/b.md"].rehashed
    assert o.files["src/b.md"].digest == o.files["other.txt"].digest
    assert o.files["src/deep/c.txt"].rehashed

    # A filesystem off the allowlist: every observation rehashes.
    o = observe(tree, cache=first.hashed, trusted_fs=frozenset())
    assert all(f.rehashed for f in o.files.values())


def test_same_size_rewrite_inside_racy_window(tree: Path):
    """Hashed moments after a change, the entry is racy: an immediate same-size rewrite (which a
    coarse clock could leave with the same fingerprint) is still seen."""
    (tree / "a.txt").write_text("one\n")
    first = observe(tree)
    (tree / "a.txt").write_text("two\n")
    o = observe(tree, cache=first.hashed)
    assert o.files["a.txt"].rehashed
    assert o.files["a.txt"].digest != first.files["a.txt"].digest
    # Even with nothing changed, an entry hashed inside the window is not trusted.
    assert observe(tree, cache=o.hashed).files["a.txt"].rehashed


def test_untracked_oversize_reads_only_a_head(tree: Path):
    big = tree / "big.png"
    big.write_bytes(PNG + b"\0" * (1 << 20))
    o = observe(tree, max_file_size=1024, scope="big.png")
    fact = o.files["big.png"]
    assert fact.digest is None and fact.kind == "oversize" and fact.mime == "image/png"
    assert o.bytes_read <= HEAD
    tracked = observe(tree, max_file_size=1024, scope="big.png", tracked={"big.png"})
    assert tracked.files["big.png"].digest is not None and tracked.files["big.png"].kind == "oversize"


def test_incomplete_regions_prove_nothing(tree: Path, tmp_path: Path):
    outside = tmp_path / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "secret.txt").write_text("secret\n")
    (outside / "d" / "x.txt").write_text("x\n")
    (tree / "to-file").symlink_to(outside / "secret.txt")
    (tree / "to-dir").symlink_to(outside / "d")
    (tree / ".git" / "objects").mkdir(parents=True)
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.mkfifo(tree / "src" / "pipe")
    (tree / "build").mkdir()
    (tree / "build" / "out.o").write_bytes(b"\0\1")
    o = observe(tree, ignore=["build"])
    reasons = {r.path: r.reason for r in o.regions}
    assert reasons["to-file"].startswith("symlink") and reasons["to-dir"].startswith("symlink")
    assert reasons[".git"] == "vcs" and reasons["build"] == "ignored"
    # A FIFO is a disk-only fact from its lstat alone: never opened, never hashed.
    pipe = o.files["src/pipe"]
    assert (pipe.kind, pipe.digest, pipe.mime) == ("special", None, "inode/fifo")
    assert "src/pipe" not in reasons
    for path in ("to-dir/x.txt", ".git/HEAD", "build/out.o", "to-file"):
        assert isinstance(o.disk(path), DiskUnknown), path
    secret_digest = observe(outside).files["secret.txt"].digest
    assert all(f.digest != secret_digest for f in o.files.values())
    assert not any(p.startswith(("to-dir", ".git", "build")) for p in o.files)
    # Following symlinks reaches files inside the root only.
    (tree / "inside-link").symlink_to("src/b.md")
    f = observe(tree, follow_symlinks=True)
    assert f.files["inside-link"].digest == f.files["src/b.md"].digest
    assert isinstance(f.disk("to-file"), DiskUnknown) and isinstance(f.disk("to-dir/x.txt"),
                                                                       DiskUnknown)


def test_walk_limit_is_reported(tree: Path):
    o = observe(tree, limit=3)
    assert any("limit" in r.reason for r in o.regions)
    missing = [p for p in ("src/deep/c.txt", "src/b.md", "img.png", "a.txt") if p not in o.files]
    assert missing and all(isinstance(o.disk(p), DiskUnknown) for p in missing)


def test_root_missing_or_replaced_is_unavailable(tree: Path):
    o = observe(tree)
    rid = o.root
    aside = tree.with_name("aside")
    tree.rename(aside)
    with pytest.raises(RootUnavailable) as e:
        observe(tree, expected_root=rid)
    assert e.value.reason == "missing"
    tree.mkdir()  # the empty mountpoint an unplugged drive leaves
    with pytest.raises(RootUnavailable) as e:
        observe(tree, expected_root=rid)
    assert e.value.reason == "replaced" and "accept-root" in e.value.remedy
    tree.rmdir()
    aside.rename(tree)
    assert set(observe(tree, expected_root=rid).files) == set(o.files)
    # A symlinked root is configuration: followed, and its identity is the target's.
    link = tree.with_name("link-to-root")
    link.symlink_to(tree)
    assert observe(link, expected_root=rid).root == rid


SWAPPER = textwrap.dedent("""
    import os, sys
    from memfs.reconcile.contained import RENAME_EXCHANGE, renameat2
    root = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    renameat2(root, "d", root, "dswap", RENAME_EXCHANGE)
    print("swapping", flush=True)
    while True:
        renameat2(root, "d", root, "dswap", RENAME_EXCHANGE)
""")


def test_directory_swapped_for_outside_symlink_proves_no_absence(tmp_path: Path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (outside / "d").mkdir(parents=True)
    (root / "d" / "known.txt").write_text("known\n")
    (outside / "d" / "secret.txt").write_text("secret\n")
    (root / "dswap").symlink_to(outside / "d")
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"swapping\n"
        seen = {"content": 0, "unknown": 0}
        for _ in range(300):
            o = observe(root)
            d = o.disk("d/known.txt")
            assert d is not ABSENT, o.regions
            seen["content" if isinstance(d, Content) else "unknown"] += 1
            assert "d/secret.txt" not in o.files and "dswap/secret.txt" not in o.files
            assert o.disk("d/secret.txt") is not ABSENT or "d" in o.listed
    finally:
        proc.kill()
        proc.wait()
    assert seen["unknown"] > 0  # the race was really run


NOBODY = textwrap.dedent("""
    import json, os, sys
    from memfs.reconcile.observe import observe
    from memfs.reconcile.rule import DiskUnknown
    os.setgid(65534)
    os.setuid(65534)
    o = observe(sys.argv[1])
    print(json.dumps({
        "regions": {r.path: r.reason for r in o.regions},
        "files": sorted(o.files),
        "locked_unknown": isinstance(o.disk("locked/inside.txt"), DiskUnknown),
        "unreadable_file_unknown": isinstance(o.disk("mine.txt"), DiskUnknown),
    }))
""")


def test_chmod_000_directory_reads_unverified():
    require_tool(root_missing("drop to uid 65534 for chmod 000"))
    base = Path(tempfile.mkdtemp(prefix="memfs-obs-"))
    try:
        os.chmod(base, 0o755)
        root = base / "root"
        (root / "locked").mkdir(parents=True)
        (root / "locked" / "inside.txt").write_text("x\n")
        (root / "open.txt").write_text("o\n")
        (root / "mine.txt").write_text("m\n")
        os.chmod(root / "locked", 0)
        os.chmod(root / "mine.txt", 0)
        out = subprocess.run([sys.executable, "-c", NOBODY, str(root)], capture_output=True,
                             text=True, timeout=60, cwd="/")
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        assert res["regions"]["locked"] == "unreadable"
        assert res["regions"]["mine.txt"] == "unreadable"
        assert res["files"] == ["open.txt"]
        assert res["locked_unknown"] and res["unreadable_file_unknown"]
    finally:
        for p in (base / "root" / "locked", base / "root" / "mine.txt"):
            if p.exists():
                os.chmod(p, 0o700)
        shutil.rmtree(base)


def test_recorded_root_identity_type(tree: Path):
    assert isinstance(observe(tree).root, RootId)


def test_fingerprint_cache_round_trips_through_the_journal(tree: Path, tmp_path: Path):
    from memfs.store.journal import FingerprintRow, Journal

    j = Journal(tmp_path / "store.db")
    first = observe(tree, clock=later)
    j.put_fingerprints("work", {p: FingerprintRow(*r) for p, r in first.hashed.items()})
    j.close()
    again = observe(tree, cache=Journal(tmp_path / "store.db").fingerprints("work"))
    assert not any(f.rehashed for f in again.files.values())
    assert {p: f.digest for p, f in again.files.items()} == {
        p: f.digest for p, f in first.files.items()}


def test_file_on_another_device_is_always_rehashed(tree: Path):
    """A filesystem mounted below the root may be anything: its fingerprints never vouch."""
    mnt = tree / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        require_tool(f"cannot mount a tmpfs here (needs root): {res.stderr.decode().strip()}")
    try:
        (mnt / "f.txt").write_text("on tmpfs\n")
        first = observe(tree, clock=later)
        again = observe(tree, cache=first.hashed)
        assert again.files["mnt/f.txt"].rehashed
        assert not again.files["a.txt"].rehashed
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_odd_symlinks_with_following_on(tree: Path):
    for name, target in (("self", "."), ("up", ".."), ("loop", "loop"), ("dangling", "nope"),
                         ("to-dir", "src"), ("chain", "self/a.txt")):
        (tree / name).symlink_to(target)
    o = observe(tree, follow_symlinks=True)
    for name in ("self", "up", "loop", "dangling", "to-dir", "chain"):
        assert isinstance(o.disk(name), DiskUnknown), name
    assert "a.txt" in o.files


def test_the_next_walk_takes_the_memos_a_walk_made(tree: Path):
    """The memos a walk made are the ones the next quiet walk takes (by identity, per
    directory), not memos it made again: before the path table this was `again.files[p] is
    built.files[p]`; comparing the taken memos with memo.dirs after the walk cannot tell."""
    cache = observe(tree, clock=later).hashed
    memo = WalkMemo()
    built = observe(tree, cache=cache, memo=memo)
    made = dict(memo.dirs)
    assert made.keys() == {"", "src", "src/deep"}
    again = observe(tree, cache=cache, memo=memo)
    assert isinstance(again.files, WalkFiles) and not again.files.own
    assert again.files.memos.keys() == made.keys()
    assert all(again.files.memos[d] is m for d, m in made.items())
    assert all(again.files[p] == built.files[p] for p in built.files)


def test_directory_memos_are_taken_only_while_unchanged(tree: Path):
    """A walk with the mount's memo (observe.DirMemo) takes a quiet directory's facts as they
    are, and a whole quiet walk hands out the very same files dict; a rewrite (same size,
    mtime put back), a new or removed name, and a cached row that changed are each seen."""
    cache = observe(tree, clock=later).hashed
    memo = WalkMemo()
    built = observe(tree, cache=cache, memo=memo)
    again = observe(tree, cache=cache, memo=memo)
    plain = observe(tree, cache=cache)
    assert again.files == plain.files and again.regions == plain.regions
    assert again.listed == plain.listed
    # Every directory taken from its memo: no fact decided again (the facts are the memos'
    # rows, built when read: equal to the first walk's).
    assert isinstance(again.files, WalkFiles) and not again.files.own
    assert again.files.memos == memo.dirs and all(
        again.files.memos[d] is m for d, m in memo.dirs.items())
    assert all(again.files[p] == built.files[p] for p in built.files)
    assert observe(tree, cache=cache, memo=memo).files is again.files  # a whole quiet walk

    # A rewrite at the same size with the mtime put back: ctime moved, so it is hashed again.
    st = os.stat(tree / "src" / "b.md")
    (tree / "src" / "b.md").write_text("# B\n")
    os.utime(tree / "src" / "b.md", ns=(st.st_atime_ns, st.st_mtime_ns))
    o = observe(tree, cache=cache, memo=memo)
    assert o.files["src/b.md"].rehashed
    assert o.files["src/b.md"].digest != built.files["src/b.md"].digest
    assert o.files == observe(tree, cache=cache).files

    # A name added and one removed in a quiet directory.
    (tree / "src" / "deep" / "new.txt").write_text("new\n")
    (tree / "a.txt").unlink()
    o = observe(tree, cache=cache, memo=memo)
    assert "src/deep/new.txt" in o.files and o.disk("a.txt") is ABSENT

    # The cache row that vouched changed (another digest for the same fingerprint): the
    # memo no longer stands, the row is what the fact says.
    cache = {**cache, **observe(tree, cache=cache, clock=later).hashed}
    observe(tree, cache=cache, memo=memo)
    assert observe(tree, cache=cache, memo=memo).files is observe(tree, cache=cache,
                                                                   memo=memo).files
    row = cache["src/deep/c.txt"]
    cache2 = dict(cache)
    cache2["src/deep/c.txt"] = row._replace(digest="f" * 32)
    o = observe(tree, cache=cache2, memo=memo)
    assert o.files["src/deep/c.txt"].digest == "f" * 32
    assert o.files == observe(tree, cache=cache2).files
