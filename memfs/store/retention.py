"""The retention policy: which history the store keeps, and the record of what it dropped.

History is kept by age, thinning as it gets older (every commit for a day, then one an hour
for a week, then one a day for a month, by default), plus, whatever their age: every branch
head, every checkpoint until it is deleted, and what the reflog names within its window
(the way back after an undo). Everything else may be dropped by `memfs gc`. Agent memory's
generations follow the same windows, plus what consolidation receipts name for `receipts`
(memfs.memory.retention).

Below a free-space floor (5% of the store's filesystem by default) GC also drops history the
windows keep, oldest first, until the floor is met again or only protected commits are left
(heads, checkpoints, what open files and shown views still use): a full disk must be
recoverable by deleting files, and their bytes live on in the history that holds them.
Checkpoint what must outlive that.

A dropped commit leaves a tombstone (`dropped_commits`): its id, parent, time and why, so
`memfs log` walks over the gap and `undo`/`restore` refuse it by name instead of "unknown
revision".

`kept()` is a pure function of the commit list, the refs and the clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace

from memfs.errors import MemfsError

# Its table, dropped_commits, is defined in memfs.store.schema.
META_KEY = "retention"
FOREVER = float("inf")
HOUR, DAY = 3600.0, 86400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": HOUR, "d": DAY, "w": 7 * DAY}
DURATIONS = ("keep_all", "hourly", "daily", "reflog", "receipts")  # fields kept as text
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


class PolicyError(MemfsError):
    """A setting that is not a valid policy value. Nothing was changed."""


def parse_duration(text: str) -> float:
    """'90m', '12h', '7d', '2w', '0' (none), 'forever' -> seconds."""
    t = text.strip().lower()
    if t in ("forever", "inf", "always"):
        return FOREVER
    if t in ("0", "none", "never"):
        return 0.0
    m = _DURATION.match(t)
    if not m:
        raise PolicyError(f"{text!r} is not a duration",
                          "write a number and a unit (s, m, h, d, w), e.g. 12h or 7d; "
                          "0 for none, forever for no limit")
    return float(m.group(1)) * _UNITS[m.group(2)]


def duration_text(seconds: float) -> str:
    if seconds == FOREVER:
        return "forever"
    if seconds == 0:
        return "0"
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Policy:
    """Windows are ages in seconds: a commit younger than `keep_all` is kept; younger than
    `hourly`, the newest of its branch's hour; younger than `daily`, of its day."""

    keep_all: float = DAY
    hourly: float = 7 * DAY
    daily: float = 30 * DAY
    reflog: float = 30 * DAY  # reflog entries (and the commits they name) younger than this
    receipts: float = 30 * DAY  # memory revisions a consolidation receipt names, this long
    space_floor: float = 5.0  # percent of the filesystem GC keeps free by thinning history
    gc_auto: bool = True  # the daemon collects by itself (past a threshold, or low space)

    # -- settings as users write them -------------------------------------------------------
    SETTINGS = {  # noqa: RUF012 - a class constant, not a field
        "keep-all": ("keep_all", "every commit is kept for this long"),
        "keep-hourly": ("hourly", "then one commit an hour, up to this age"),
        "keep-daily": ("daily", "then one commit a day, up to this age"),
        "keep-reflog": ("reflog", "undo/restore moves (and what they name) are kept this long"),
        "keep-receipts": ("receipts", "memory revisions a consolidation receipt names are "
                          "kept this long"),
        "space-floor": ("space_floor", "percent of the disk GC keeps free by dropping history"),
        "gc-auto": ("gc_auto", "on: the daemon collects garbage by itself"),
    }

    def with_setting(self, key: str, value: str) -> Policy:
        if key not in self.SETTINGS:
            raise PolicyError(f"no setting {key!r}",
                              f"the settings are: {', '.join(self.SETTINGS)}")
        attr = self.SETTINGS[key][0]
        if attr == "gc_auto":
            v = value.strip().lower()
            if v not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
                raise PolicyError(f"gc-auto {value!r} is neither on nor off", "write on or off")
            return replace(self, gc_auto=v in ("on", "true", "yes", "1"))
        if attr == "space_floor":
            try:
                pct = float(value.strip().rstrip("%"))
            except ValueError:
                pct = -1.0
            if not 0 <= pct <= 50:
                raise PolicyError(f"space-floor {value!r} is not a percent from 0 to 50",
                                  "e.g. 5% (0 turns thinning under low space off)")
            return replace(self, space_floor=pct)
        return replace(self, **{attr: parse_duration(value)})

    def setting_text(self, key: str) -> str:
        attr = self.SETTINGS[key][0]
        value = getattr(self, attr)
        if attr == "gc_auto":
            return "on" if value else "off"
        if attr == "space_floor":
            return f"{value:g}%"
        return duration_text(value)

    def summary(self, *, shared: bool = False) -> str:
        """In words; `shared`: of a store in PostgreSQL, where no free-space floor applies
        (the server's disk is not the host's to measure)."""
        parts = [f"every commit for {duration_text(self.keep_all)}"] if self.keep_all else []
        if self.hourly > self.keep_all:
            parts.append(f"one an hour to {duration_text(self.hourly)}")
        if self.daily > max(self.keep_all, self.hourly):
            parts.append(f"one a day to {duration_text(self.daily)}")
        if not parts:
            parts.append("no history by age")
        floor = ("no space floor on PostgreSQL" if shared else
                 f"below {self.space_floor:g}% free, older history goes first")
        return (", ".join(parts) + f"; reflog {duration_text(self.reflog)}; receipts' memory "
                f"revisions {duration_text(self.receipts)}; checkpoints and "
                f"branch heads until deleted; {floor}; gc "
                f"{'automatic' if self.gc_auto else 'manual only'}")

    # -- stored with the store (meta 'retention') --------------------------------------------
    def to_json(self) -> dict:
        doc = asdict(self)
        for k in DURATIONS:
            doc[k] = duration_text(doc[k])
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> Policy:
        known = {f.name for f in fields(cls)}
        values = {}
        for k, v in doc.items():
            if k not in known:
                continue
            values[k] = parse_duration(v) if k in DURATIONS else v
        return cls(**values)

    @classmethod
    def decode(cls, text: str | None) -> Policy:
        return cls() if not text else cls.from_json(json.loads(text))

    def encode(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# -- what the policy keeps -----------------------------------------------------------------
@dataclass(frozen=True)
class CommitInfo:
    id: str
    seq: int
    parent: str | None
    branch: str
    time_ns: int


@dataclass(frozen=True)
class Refs:
    """What names commits besides history: branch heads, checkpoints, reflog moves."""

    heads: dict[str, str]  # branch -> commit
    checkpoints: dict[str, str]  # name -> commit
    reflog: list[tuple[str | None, str, int]]  # (old, new, time_ns)


PROTECTED = ("branch head", "checkpoint")


def kept(commits: Iterable[CommitInfo], refs: Refs, policy: Policy, now_ns: int
         ) -> dict[str, str]:
    """commit id -> why it is kept; a commit not in the result may be dropped."""
    out: dict[str, str] = {}
    for name, cid in refs.checkpoints.items():
        out[cid] = f"checkpoint {name}"
    for branch, cid in refs.heads.items():
        out.setdefault(cid, f"branch head {branch}")
    for old, new, t in refs.reflog:
        if (now_ns - t) / 1e9 < policy.reflog:
            for cid in (old, new):
                if cid:
                    out.setdefault(cid, "reflog")
    newest: dict[tuple[str, str, int], CommitInfo] = {}
    for c in commits:
        age = (now_ns - c.time_ns) / 1e9
        if age < policy.keep_all:
            out.setdefault(c.id, "recent")
            continue
        for window, span, word in ((policy.hourly, HOUR, "hourly"), (policy.daily, DAY, "daily")):
            if age < window:
                key = (word, c.branch, int(c.time_ns // (span * 1e9)))
                best = newest.get(key)
                if best is None or c.seq > best.seq:
                    newest[key] = c
    for (word, _, _), c in newest.items():
        out.setdefault(c.id, word)
    return out


def is_protected(reason: str) -> bool:
    return reason.startswith(PROTECTED)
