"""What the last passes found, per mount: the listing states, regions, availability.

Owns `MountState` records (one per bound mount), written on the trio loop only: by a pass
when it applies its plans (`record_states`: the only writer of `states`, `disk_only` and
`regions`), by the gather (`unavailable`, `incomplete`), by on-access (`observed`, its once-a-
second windows, cleared when the tree is replaced or the journal reopened) and by the
fs-events watcher (`watch_error`), and by the running pass (`running`, its progress). Status and listings render these facts; nothing here
computes them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from memfs.backing.paths import keys_under
from memfs.backing.progress import PassProgress
from memfs.reconcile.facts import Region
from memfs.reconcile.observe import Observation
from memfs.reconcile.plan import PassPlan, SyncPlan
from memfs.reconcile.rule import ABSENT

StateRow = tuple[str, str | None]  # (state, conflict kind)


@dataclass
class MountState:
    """What the last passes found for one mount."""

    # Kept in path order (sortedcontainers: a dict with its keys sorted), so a pass over one
    # path or directory finds what it replaces by range, not by reading every path of the
    # mount: with plain dicts each lookup of a new name in a bound mount of 57,000 files
    # cost ~20 ms here. Well kept (hypothesis depends on it), pure Python, ~9 B a key.
    states: SortedDict[str, StateRow] = field(default_factory=SortedDict)
    disk_only: SortedDict[str, tuple[int, str]] = field(
        default_factory=SortedDict)  # path -> (size, MIME)
    regions: SortedDict[str, Region] = field(default_factory=SortedDict)
    unavailable: tuple[str, str] | None = None  # (what happened, remedy)
    last_pass: float | None = None
    last_error: str | None = None
    incomplete: str | None = None
    observed: dict[str, float] = field(default_factory=dict)  # scope -> monotonic time
    watch_error: str | None = None  # fs-events: why no watcher runs now
    # (scope, plan, sync plan, nothing skipped) the states were last written from
    applied: tuple[str, PassPlan, SyncPlan, bool] | None = None
    running: PassProgress | None = None  # the pass running now (memfs.backing.progress)


class States:
    """Every mount's MountState."""

    def __init__(self) -> None:
        self.mounts: dict[str, MountState] = {}

    def of(self, mount: str) -> MountState:
        return self.mounts.setdefault(mount, MountState())

    def get(self, mount: str) -> MountState | None:
        return self.mounts.get(mount)

    def forget(self, mount: str) -> None:
        self.mounts.pop(mount, None)

    def reset_windows(self) -> None:
        """The on-access windows: observe afresh (a replaced tree, a reopened journal)."""
        for st in self.mounts.values():
            st.observed.clear()


def record_states(st: MountState, scope: str, obs: Observation, plan: PassPlan,
                  sp: SyncPlan, skipped: set[str]) -> None:
    """Write a pass's listing over its scope. The same plans (memfs.backing.passes' memo)
    applied over the same scope, nothing skipped either time: the states already hold what
    this would write."""
    applied = (scope, plan, sp, not skipped)
    if st.applied is not None and st.applied[0] == scope and st.applied[1] is plan and \
            st.applied[2] is sp and st.applied[3] and not skipped:
        return
    st.applied = applied
    for table in (st.states, st.disk_only, st.regions):
        _drop_under(table, scope)
    listing = plan.listing()
    for path, take in sp.take.items():
        if path in skipped:
            # Not taken (changed in the workspace since, open for writing, disk changed
            # since): the next pass decides it; until then it is not known synced.
            listing[path] = ("unverified", None)
            continue
        if path not in listing:
            continue
        fact = obs.files.get(path)
        if take is ABSENT and fact is None:
            listing.pop(path, None)
        elif take is ABSENT:
            listing[path] = ("disk-only", None)
        else:
            listing[path] = ("synced", None)
    st.states.update(listing)
    for path, (state, _) in listing.items():
        if state == "disk-only" and (fact := obs.files.get(path)) is not None:
            st.disk_only[path] = (fact.size, fact.mime)
    for r in obs.regions:
        st.regions[r.path] = r


def _drop_under(table: SortedDict, scope: str) -> None:
    """Every path of `table` at or below `scope` ('' is the whole mount) goes, found by
    range (memfs.backing.paths.keys_under)."""
    if not scope:
        table.clear()
        return
    for p in keys_under(table, scope):
        del table[p]


__all__ = ["MountState", "StateRow", "States", "record_states"]
