"""How far a running pass has got: its phase and counts, for `memfs status` and for the
progress lines a long control request sends (an attach of 1M files takes minutes).

One `PassProgress` per running pass, kept in its mount's MountState (`running`) from the
pass's start to its end. Written on the trio loop (the phase, the take's counts), except
`listed`, which the pass's walk thread alone adds to (one int per directory walked); readers
on the loop see a count at most one directory behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

WALKING = "walking disk"
PLANNING = "planning"
TAKING = "taking in"
RECORDING = "committing"


@dataclass
class PassProgress:
    mount: str
    scope: str
    started: float = field(default_factory=time.time)
    phase: str = WALKING
    listed: int = 0  # entries the walk has looked at (the walk thread adds to it)
    to_take: int = 0  # files and removals the plan takes into the tree
    taken: int = 0  # of those, applied so far

    def walked(self, entries: int) -> None:
        """The walk thread: one directory's entries looked at."""
        self.listed += entries

    def to_json(self) -> dict[str, object]:
        return {"mount": self.mount, "scope": self.scope, "phase": self.phase,
                "listed": self.listed, "to_take": self.to_take, "taken": self.taken,
                "seconds": round(time.time() - self.started, 1)}

    def text(self) -> str:
        where = self.mount + (f"/{self.scope}" if self.scope else "")
        counts = f"{self.listed:,} entries looked at"
        if self.phase in (TAKING, RECORDING):
            counts = f"{self.taken:,} of {self.to_take:,} taken in, " + counts
        return f"{where}: {self.phase} ({counts})"


__all__ = ["PLANNING", "RECORDING", "TAKING", "WALKING", "PassProgress"]
