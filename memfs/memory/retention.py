"""Which memory generations the store's retention policy keeps, and the record of what it
dropped. Pure: a function of the generations, what receipts name, the policy and the clock.

A scope's generations (Global, or one workspace) are thinned like a branch's commits
(memfs.store.retention: every one younger than `keep-all`, then the newest of each hour and
of each day up to `keep-hourly` and `keep-daily`), plus, whatever their age:

- the current generation;
- what a live receipt names (one still `committing`: recovery is not done with it);
- what any other receipt names, for `keep-receipts` after the receipt was last written.

A receipt names revisions (content hashes), not generations; every generation of the scope
with a named revision is kept. A dropped generation leaves a `Dropped` tombstone, so a read
of its revision is refused by name ("dropped by the retention policy on ...") rather than
as unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from memfs.errors import MemfsError
from memfs.store.retention import CommitInfo, Policy, Refs, duration_text, kept


@dataclass(frozen=True)
class GenRow:
    """One generation of a scope, as retention sees it."""

    seq: int
    revision: str
    created: str  # ISO 8601, UTC (the manifest's or the row's)

    @property
    def created_ns(self) -> int:
        return iso_ns(self.created)


@dataclass(frozen=True)
class Naming:
    """A receipt's claim on one revision of one scope."""

    revision: str
    review_id: str
    live: bool  # the receipt is still `committing`
    at_ns: int  # when the receipt was last written


@dataclass(frozen=True)
class Dropped:
    """The tombstone of a generation retention dropped."""

    seq: int
    revision: str
    created: str
    dropped_at: str
    why: str

    def to_json(self) -> dict:
        return {"seq": self.seq, "revision": self.revision, "created": self.created,
                "dropped_at": self.dropped_at, "why": self.why}

    @classmethod
    def from_json(cls, doc: dict) -> Dropped:
        return cls(int(doc["seq"]), str(doc["revision"]), str(doc["created"]),
                   str(doc["dropped_at"]), str(doc["why"]))


class RevisionDropped(MemfsError):
    """A memory revision whose generations the retention policy dropped."""


class NoSuchRevision(MemfsError):
    """A memory revision the scope never had (or a prefix that names none, or several)."""


def iso_ns(text: str) -> int:
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1e9)


def now_iso(now_ns: int) -> str:
    return datetime.fromtimestamp(now_ns / 1e9, UTC).isoformat(timespec="seconds")


def kept_generations(gens: Sequence[GenRow], current_seq: int, namings: Iterable[Naming],
                     policy: Policy, now_ns: int) -> dict[int, str]:
    """seq -> why it is kept; a generation not in the result may be dropped."""
    out: dict[int, str] = {current_seq: "current"}
    by_rev: dict[str, list[int]] = {}
    for g in gens:
        by_rev.setdefault(g.revision, []).append(g.seq)
    for n in namings:
        if n.live:
            why = f"receipt {n.review_id} (committing)"
        elif (now_ns - n.at_ns) / 1e9 < policy.receipts:
            why = f"receipt {n.review_id}"
        else:
            continue
        for seq in by_rev.get(n.revision, ()):
            out.setdefault(seq, why)
    commits = [CommitInfo(id=str(g.seq), seq=g.seq, parent=None, branch="memory",
                          time_ns=g.created_ns) for g in gens]
    for cid, why in kept(commits, Refs({}, {}, []), policy, now_ns).items():
        out.setdefault(int(cid), why)
    return out


def drop_reason(policy: Policy) -> str:
    """Why a generation went, in words for its tombstone."""
    return (f"older than the windows: every generation {duration_text(policy.keep_all)}, "
            f"hourly {duration_text(policy.hourly)}, daily {duration_text(policy.daily)}; "
            f"named by no receipt younger than {duration_text(policy.receipts)}")


def dropped_refusal(scope: str, d: Dropped) -> RevisionDropped:
    return RevisionDropped(
        f"{scope} memory revision {d.revision[:16]} (generation {d.seq}, made {d.created}) "
        f"was dropped by the retention policy on {d.dropped_at} ({d.why})",
        "read a kept generation (`memfs memory log` lists them); to keep a receipt's "
        "revisions longer, raise keep-receipts (`memfs config keep-receipts 90d`) before "
        "the next `memfs gc`")
