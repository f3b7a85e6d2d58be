"""What /proc says of a process, for the tests that bound a daemon's (or their own) memory."""

from __future__ import annotations


def rss(pid: int) -> int:
    """The resident set of process `pid` in bytes (0 when its status names none)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
