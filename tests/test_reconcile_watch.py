"""inotify: real shell changes mark the right paths; overflow and a moved root ask for a full pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

from memfs.reconcile.observe import observe
from memfs.reconcile.rule import ABSENT
from memfs.reconcile.watch import Watcher, narrow

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def sh(cmd: str, cwd: Path) -> None:
    subprocess.run(cmd, shell=True, check=True, cwd=cwd)


def test_shell_changes_choose_paths_to_observe(tmp_path: Path):
    root = tmp_path / "root"
    (root / "logs").mkdir(parents=True)
    (root / ".git").mkdir()
    for i in range(3):
        (root / "logs" / f"{i}.log").write_text("x\n")
    (tmp_path / "shot.png").write_bytes(PNG)
    with Watcher(root) as w:
        assert w.read().paths == set()
        sh(f"cp {tmp_path / 'shot.png'} shot.png && rm logs/0.log logs/1.log && "
           "mkdir -p new/deep && echo hi > new/deep/x.txt && echo g > .git/HEAD", root)
        dirty = w.read(timeout=1)
        assert not dirty.full
        assert {"shot.png", "logs/0.log", "logs/1.log", "new"} <= dirty.paths
        assert not any(p.startswith(".git") for p in dirty.paths)
        # Observing just those scopes finds the truth.
        for scope in narrow(dirty.paths):
            obs = observe(root, scope=scope)
            if scope.startswith("logs/"):
                assert obs.disk(scope) is ABSENT
        assert observe(root, scope="new").files["new/deep/x.txt"].kind == "text"
        # The new directories are watched too.
        sh("echo more > new/deep/y.txt", root)
        assert "new/deep/y.txt" in w.read(timeout=1).paths


def test_overflow_and_moved_root_ask_for_a_full_pass(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    max_events = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with Watcher(root) as w:
        for i in range(max_events + 100):
            (root / f"f{i}").touch()
        dirty = w.read()
        assert dirty.full and "overflow" in " ".join(dirty.why)
        root.rename(tmp_path / "moved")
        dirty = w.read(timeout=1)
        assert dirty.full and "root" in " ".join(dirty.why)


def test_narrow():
    assert narrow({"a", "a/b", "c/d", "c/de", "c/d/e"}) == ["a", "c/d", "c/de"]
    assert narrow({"", "x"}) == [""]
