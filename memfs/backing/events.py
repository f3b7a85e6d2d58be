"""The daemon's event ring (`memfs events`): what the backing layer did on its own.

Owns the last EVENTS_KEPT events and their sequence numbers. Loop only: every recorder runs
on the trio loop (a worker thread returns what happened and the loop records it), so the ring
needs no lock. Events are records, not results: each is JSON-shaped from the start because
`memfs events` hands them out as they are, and a follower resumes by `seq`.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

EVENTS_KEPT = 1000  # the in-memory ring `memfs events` reads
EVENT_PATHS = 100  # paths an event lists (its counts say how many there were)


@dataclass(frozen=True)
class EventsPage:
    """Events after a sequence number, and the newest number so far (a follower passes it
    back; a gap at the front means the ring dropped some)."""

    events: list[dict[str, object]]
    last: int

    def to_json(self) -> dict[str, object]:
        return {"events": self.events, "last": self.last}


@dataclass
class Events:
    """A bounded ring of `{seq, time, event, ...}` records; the oldest fall off first."""

    ring: collections.deque[dict[str, object]] = field(
        default_factory=lambda: collections.deque(maxlen=EVENTS_KEPT))
    seq: int = 0

    def record(self, kind: str, /, **fields: object) -> None:
        self.seq += 1
        self.ring.append({"seq": self.seq, "time": time.time(), "event": kind, **fields})

    def after(self, after: int = 0) -> EventsPage:
        return EventsPage([e for e in self.ring if int(e["seq"]) > after], self.seq)  # type: ignore[call-overload]


__all__ = ["EVENTS_KEPT", "EVENT_PATHS", "Events", "EventsPage"]
