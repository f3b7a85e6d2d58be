"""What backing operations answer, as typed values; `to_json` is called only at the edge
(the control socket, the daemon-less CLI, `.memfs/status`).

A pass or a materialize that could not decide (the root unavailable, the branch changing
throughout, a path sync asked on another branch) answers `NotDecided`; one that ran answers
`PassDone` / `MaterializeDone`. Their JSON keeps the shapes the CLI reads (`"unavailable" in
r`, `r["refused"]`, ...), unchanged from when these were dicts. Frozen values: any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

Json = dict[str, object]


@dataclass(frozen=True)
class NotDecided:
    """Nothing was decided for the mount, and why: `unavailable` (with `remedy`), or
    `incomplete`, or (a path sync asked on another branch) `refused`."""

    mount: str
    unavailable: str | None = None
    remedy: str | None = None
    incomplete: str | None = None
    refused: str | None = None

    def to_json(self) -> Json:
        if self.unavailable is not None:
            return {"mount": self.mount, "unavailable": self.unavailable, "remedy": self.remedy}
        if self.incomplete is not None:
            return {"mount": self.mount, "incomplete": self.incomplete}
        return {"mount": self.mount, "refused": self.refused}


@dataclass(frozen=True)
class PassError:
    """A mount's pass failed with an error (pass_all goes on with the others)."""

    mount: str
    error: str
    remedy: str

    def to_json(self) -> Json:
        return {"error": self.error, "remedy": self.remedy}


@dataclass(frozen=True)
class Discard:
    path: str
    was: str
    op: str
    over: str | None = None  # the workspace's symlink or special file disk's file replaced


@dataclass(frozen=True)
class RegionRow:
    path: str
    reason: str
    kind: str = ""  # memfs.reconcile.facts.Region.kind: "dir", "symlink", or "" (unknown)

    def to_json(self) -> Json:
        return {"path": self.path, "reason": self.reason, "kind": self.kind}


@dataclass(frozen=True)
class PassDone:
    """A pass that decided: what it took into the tree, removed, skipped and recorded."""

    mount: str
    scope: str
    branch: str
    taken: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    discarded: list[Discard] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    regions: list[RegionRow] = field(default_factory=list)
    incomplete: str | None = None
    bytes_read: int = 0  # file bytes the observation read (hashes, heads)
    # Takes the store had no room for (the workspace keeps what it had): why, and the remedy.
    error: str | None = None
    remedy: str | None = None

    def to_json(self) -> Json:
        full: Json = {} if self.error is None else {"error": self.error, "remedy": self.remedy}
        return {
            **full,
            "mount": self.mount, "scope": self.scope, "branch": self.branch,
            "taken": self.taken, "removed": self.removed, "skipped": self.skipped,
            "conflicts": self.conflicts,
            "discarded": [{"path": d.path, "was": d.was, "op": d.op,
                           **({"over": d.over} if d.over else {})} for d in self.discarded],
            "unverified": self.unverified,
            "regions": [r.to_json() for r in self.regions],
            "incomplete": self.incomplete, "bytes_read": self.bytes_read,
        }


PassOutcome = PassDone | NotDecided


@dataclass(frozen=True)
class MaterializeDone:
    mount: str
    branch: str
    pinned: str | None
    written: list[str]
    removed: list[str]
    skipped: list[dict[str, str]]
    deletions_left: list[str]
    failed: list[dict[str, str]]
    refused: str | None
    remedy: str | None
    interrupted: str | None
    removed_dirs: list[str] = field(default_factory=list)  # left empty by `removed`: rmdir'd

    def to_json(self) -> Json:
        return {"mount": self.mount, "branch": self.branch, "pinned": self.pinned,
                "written": self.written, "removed": self.removed,
                "removed_dirs": self.removed_dirs, "skipped": self.skipped,
                "deletions_left": self.deletions_left, "failed": self.failed,
                "refused": self.refused, "remedy": self.remedy,
                "interrupted": self.interrupted}


MaterializeOutcome = MaterializeDone | NotDecided


@dataclass(frozen=True)
class Materialized:
    mounts: dict[str, MaterializeOutcome]

    def to_json(self) -> Json:
        return {"mounts": {m: r.to_json() for m, r in self.mounts.items()}}


@dataclass(frozen=True)
class Attached:
    mount: str
    dir: str
    watch: str
    first_pass: PassOutcome

    def to_json(self) -> Json:
        return {"mount": self.mount, "dir": self.dir, "watch": self.watch,
                "pass": self.first_pass.to_json()}


@dataclass(frozen=True)
class Detached:
    mount: str

    def to_json(self) -> Json:
        return {"mount": self.mount, "detached": True}


@dataclass(frozen=True)
class Reopened:
    was_refusing: str | None

    def to_json(self) -> Json:
        return {"was_refusing": self.was_refusing}


@dataclass(frozen=True)
class Synced:
    mounts: dict[str, PassOutcome]
    reopened: Reopened | None = None

    def to_json(self) -> Json:
        out: Json = {"mounts": {m: r.to_json() for m, r in self.mounts.items()}}
        if self.reopened is not None:
            out["reopened"] = self.reopened.to_json()
        return out


@dataclass(frozen=True)
class Entry:
    """One listing entry; a disk-only file carries its size and MIME type (seed 002); `note`:
    why no materialize writes it (a hard link, a special file made in the workspace)."""

    path: str
    state: str
    conflict: str | None
    size: int | None = None
    mime: str | None = None
    note: str | None = None

    def to_json(self) -> Json:
        out: Json = {"path": self.path, "state": self.state, "conflict": self.conflict}
        if self.size is not None:
            out["size"], out["mime"] = self.size, self.mime
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Listing:
    """`memfs ls --states` of one mount's scope."""

    mount: str
    path: str
    unavailable: tuple[str, str] | None
    entries: Sequence[Entry]
    regions: Sequence[RegionRow]
    bytes_read: int | None = None

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def to_json(self) -> Json:
        out: Json = {
            "mount": self.mount, "path": self.path, "available": self.unavailable is None,
            "unavailable": None if self.unavailable is None else
            {"error": self.unavailable[0], "remedy": self.unavailable[1]},
            "entries": [e.to_json() for e in self.entries],
            "regions": [r.to_json() for r in self.regions],
        }
        if self.bytes_read is not None:
            out["bytes_read"] = self.bytes_read
        return out


@dataclass(frozen=True)
class Listings:
    mounts: list[Listing]

    def to_json(self) -> Json:
        return {"mounts": [m.to_json() for m in self.mounts]}


__all__ = ["Attached", "Detached", "Discard", "Entry", "Listing", "Listings", "MaterializeDone",
           "MaterializeOutcome", "Materialized", "NotDecided", "PassDone", "PassError",
           "PassOutcome", "RegionRow", "Reopened", "Synced"]
