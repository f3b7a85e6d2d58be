"""Status and listings, rendered from what the passes found (memfs.backing.states), the
bindings, the background tasks' outcomes and what disk owes (memfs.backing.owed).

Rendering only: nothing here observes disk or decides a path. Loop only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from memfs.backing.binding import Binding, Bindings
from memfs.backing.owed import Owed
from memfs.backing.paths import under
from memfs.backing.results import Entry, Listing, RegionRow
from memfs.backing.states import MountState, States
from memfs.store.journal import Journal

Json = dict[str, object]
WATCH_REMEDY = ("raise fs.inotify.max_user_instances (sysctl), or attach with --watch "
                "on-access; memfs tries again every 5 s")


def listing(states: States, mount: str, scope: str = "") -> Listing:
    """`memfs ls --states`: every path under scope with its state, and the regions."""
    st = states.get(mount) or MountState()
    entries = []
    for p, (s, c) in sorted(st.states.items()):
        if not under(p, scope):
            continue
        info = st.disk_only.get(p) if s == "disk-only" else None
        entries.append(Entry(p, s, c) if info is None else Entry(p, s, c, info[0], info[1]))
    return Listing(mount, scope, st.unavailable, entries,
                   [RegionRow(p, r.reason, r.kind) for p, r in sorted(st.regions.items())
                    if under(p, scope) or under(scope, p)])


def render(bindings: Bindings, states: States, journal: Journal,
           owed: Callable[[str], Owed | None], scans: Callable[[Binding], Json | None],
           auto: Callable[[str], Json]) -> Json:
    """Per mount; `journal` is None, or the refusal every evidence read answers after a
    failed journal write, with its remedy (`memfs sync --reopen`)."""
    refusal = journal.refusal()
    refusing = None if refusal is None else {"error": refusal.message,
                                             "remedy": refusal.remedy}
    out: Json = {}
    for mount, b in sorted(bindings.bindings.items()):
        st = states.get(mount) or MountState()
        out[mount] = {
            "dir": b.dir, "watch": b.watch, "pinned": bindings.pins.get(mount),
            "journal": refusing,
            "available": st.unavailable is None,
            "unavailable": None if st.unavailable is None else
            {"error": st.unavailable[0], "remedy": st.unavailable[1]},
            "last_pass": st.last_pass, "last_error": st.last_error,
            "watch_error": None if st.watch_error is None else
            {"error": st.watch_error, "remedy": WATCH_REMEDY},
            "incomplete": st.incomplete,
            "states": _counts(st.states),
            "conflicts": sorted(p for p, (s, _) in st.states.items() if s == "conflict"),
            "workspace_deleted": sorted(p for p, (s, _) in st.states.items()
                                        if s == "workspace-deleted"),
            "regions": [{"path": p, "reason": r.reason, "kind": r.kind}
                        for p, r in sorted(st.regions.items())],
            # The last count (memfs.backing.owed, refreshed before status is answered).
            "owed": None if refusing or (o := owed(mount)) is None else o.to_json(),
            # Changes no materialize writes (hard links), apart from what disk owes.
            "not_carried": None if refusing or o is None else o.not_carried,
            "scans": scans(b),
            "auto_materialize": auto(mount) if b.auto_materialize else None,
            "running": None if st.running is None else st.running.to_json(),
        }
    return out


def _counts(states: Mapping[str, tuple[str, str | None]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state, _ in states.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


__all__ = ["WATCH_REMEDY", "listing", "render"]
