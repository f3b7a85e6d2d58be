"""How the programs a history operation (undo, restore, branch switch) leaves working on
a replaced tree read for people: the writers it cut off (memfs.workspace.cutoff), with the
path as the mount shows it, and the processes whose changes it took out that still run, one
line each, so the user knows which program to stop or restart. Pure, but for reading where
the daemon says it is mounted and which processes are alive (/proc)."""

from __future__ import annotations

import json
import os
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


def still_running_lines(res: dict, by: str) -> list[str]:
    """`still running: COMM (pid N)` for the answer's `procs` (the processes whose changes
    the operation `by` took out of the tree) that still run: what such a program writes next
    lands in the replaced tree, or nowhere."""
    running = still_running(res.get("procs") or [])
    if not running:
        return []
    return ["  still running: " + ", ".join(f"{comm} (pid {pid})" for pid, comm in running)
            + f": its writes through files the {by} replaced fail (ESTALE), and what it "
            "writes elsewhere is a new change; stop it, and run it again if it should go on"]


def still_running(procs: list[list]) -> list[tuple[int, str]]:
    """Of `procs` ([pid, comm]), those still alive as the same program (the kernel's comm;
    a reused pid runs something else, mostly), this command aside. An undo of a command that
    is still writing gave no word, and its next writes went to replaced files."""
    out = []
    for pid, comm in procs:
        try:
            with open(f"/proc/{int(pid)}/comm") as fh:
                now = fh.read().strip()
        except (OSError, ValueError):
            continue
        if now == comm and int(pid) != os.getpid():
            out.append((int(pid), comm))
    return out


__all__ = ["cut_off_lines", "mountpoint", "still_running_lines"]
