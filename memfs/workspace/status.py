"""The mount's status document: what `memfs status`, the control socket's status request
and `.memfs/status` show about one workspace.

Runs on the trio loop (it reads the live tree's counters); the one read that may reach a
server, the retention policy of a store in PostgreSQL, is made beforehand in a worker
thread by `refresh_policy`, so building the document never waits on the network.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from memfs.errors import MemfsError
from memfs.store.store import Store as EmbeddedStore
from memfs.store.trees import name_to_str

if TYPE_CHECKING:
    from memfs.workspace.workspace import Workspace


async def refresh_policy(ws: Workspace) -> None:
    """Before a status on a store in PostgreSQL (the control request, `.memfs/status`):
    the retention policy read in a worker thread, so status reads no server on the loop.
    Out of reach, the last one read stands."""
    if ws.store.remote:
        try:
            ws.policy_seen = await trio.to_thread.run_sync(ws.store.policy)
        except MemfsError:
            pass


def retention(ws: Workspace) -> dict:
    """The retention policy and its one-line summary (None while a server was never
    reached)."""
    shared = not isinstance(ws.store, EmbeddedStore)  # in PostgreSQL: no space floor
    if not ws.store.remote:  # a short local read, as every status made it
        ws.policy_seen = ws.store.policy()
    policy = ws.policy_seen
    if policy is None:  # a server out of reach since the start
        return {"policy": None, "summary": "the policy could not be read (the store "
                "is out of reach)"}
    return {**policy.to_json(), "summary": policy.summary(shared=shared)}


def status(ws: Workspace) -> dict:
    """The status document (JSON-ready)."""
    mounts = sorted(name_to_str(n) for n in ws.children(ws.root))
    return {
        "root": str(ws.store.root),
        "branch": ws.branch,
        "head": ws.head,
        "pending": ws.mutation_seq - ws.durable_seq,
        "pending_bytes": ws.pending_bytes,
        "nodes": len(ws.nodes),
        "durable": ws.mutation_seq == ws.durable_seq,
        "commit_interval_ms": int(ws.commit_interval * 1000),
        "last_commit_error": ws.last_error,
        "commit_failure": ws.health.failure.to_json() if ws.health.failure else None,
        "changes_held": ws.hold.status(),  # a history operation finishing: writes wait
        "cut_off": ws.writers.status(),  # writers an undo/restore/switch cut off, still open
        **({"pins": ws.pin_gate.status()} if ws.pin_gate is not None else {}),
        # whose filesystem the figures are: the store's, or on PostgreSQL this host's root
        # (its caches and host.db; the store's bytes are on the server's disk)
        "space": {**ws.room.status(), "of": "host" if ws.store.remote else "store"},
        "retention": retention(ws),
        **({"gc": ws.lifecycle.status()} if ws.lifecycle is not None else {}),
        "mounts": mounts,
        "daemon": ws.served_by.identity() if ws.served_by else None,
        "read_only": ws.read_only,
        **({"hosts": ws.hosts.status()} if ws.hosts is not None else {}),
        "lost_changes": ws.hosts.dropped if ws.hosts is not None else None,
        **({"backing": backing} if (backing := ws.backing.status_json()) is not None
           else {}),
    }
