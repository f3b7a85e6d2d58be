"""The control plane: the daemon's `backing_*` requests (also run on a daemon-less
workspace by the CLI), one table from op to handler. Results turn into JSON here, at the edge.

Stateless; loop only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from memfs.backing.binding import Binding
from memfs.errors import MemfsError

if TYPE_CHECKING:
    from memfs.backing.facade import Backing

Json = dict[str, object]
Args = Mapping[str, object]


class ToJson(Protocol):
    def to_json(self) -> Json: ...


Handler = Callable[["Backing", Args], Awaitable[ToJson | Json]]


async def _attach(b: Backing, args: Args) -> ToJson:
    return await b.attach(Binding.from_request(args))


async def _after_batch(b: Backing, args: Args) -> Json:
    agent = args.get("agent")
    return await b.after_batch(None if agent is None else str(agent))


async def _events(b: Backing, args: Args) -> ToJson:
    return b.events.after(int(args.get("after") or 0))  # type: ignore[call-overload]


async def _detach(b: Backing, args: Args) -> ToJson:
    return await b.detach(str(args["mount"]))


async def _sync(b: Backing, args: Args) -> ToJson:
    path = args.get("path")
    return await b.sync(None if path is None else str(path),
                        accept_root=bool(args.get("accept_root")),
                        reopen=bool(args.get("reopen")))


async def _materialize(b: Backing, args: Args) -> ToJson:
    paths = args.get("paths") or None
    return await b.materialize([str(p) for p in paths] if paths else None,  # type: ignore[attr-defined]
                               force=bool(args.get("force")),
                               apply_deletions=bool(args.get("apply_deletions")))


async def _states(b: Backing, args: Args) -> ToJson:
    path = args.get("path")
    return await b.states_of(None if path is None else str(path))


OPS: dict[str, Handler] = {
    "backing_attach": _attach,
    "backing_after_batch": _after_batch,
    "backing_events": _events,
    "backing_detach": _detach,
    "backing_sync": _sync,
    "backing_materialize": _materialize,
    "backing_states": _states,
}


async def dispatch(backing: Backing, op: str, args: Args) -> Json:
    handler = OPS.get(op)
    if handler is None:
        raise MemfsError(f"unknown control request {op!r}", "upgrade the CLI and daemon together")
    result = await handler(backing, args)
    return result if isinstance(result, dict) else result.to_json()


__all__ = ["OPS", "dispatch"]
