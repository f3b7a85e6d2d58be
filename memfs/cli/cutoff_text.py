"""How the writers a history operation cut off read for people (memfs.workspace.cutoff):
one line each, with the path as the mount shows it, so the user knows which program to
restart. Pure, but for reading where the daemon says it is mounted."""

from __future__ import annotations

import json
from pathlib import Path

from memfs.workspace.cutoff import CutOff


def mountpoint(root: Path) -> Path | None:
    """Where the daemon serving `root` is mounted (its lock says), or None."""
    try:
        doc = json.loads((root / "daemon.lock").read_text() or "{}")
    except (OSError, ValueError):
        return None
    return Path(doc["mountpoint"]) if doc.get("mountpoint") else None


def cut_off_lines(res: dict, root: Path) -> list[str]:
    """`cut off: PATH, open for writing by COMM (pid N)` for each in the answer's `cut_off`."""
    cut = [CutOff.from_json(d) for d in res.get("cut_off") or []]
    if not cut:
        return []
    mnt = mountpoint(root)
    return [f"  cut off: {mnt / c.path if mnt else c.path}, open for writing by {c.comm} "
            f"(pid {c.pid}): its writes, fsync and truncate now fail (ESTALE); what it "
            "wrote before is in history" for c in cut]


__all__ = ["cut_off_lines", "mountpoint"]
