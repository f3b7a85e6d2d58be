"""Control requests while they run: progress lines to the client, and what status shows.

A request whose client asked for progress (memfs.control.call does) and that is not answered
within PROGRESS_EVERY gets a progress line that often until its reply: what it is doing and
how far it has got (an attach of 1M files takes minutes). The client waits as long as lines
come, so only a daemon that stops answering (stopped, stuck, its loop blocked) times it out.
The request runs to its end whether or not its client stays: a client that goes away (Ctrl-C)
only stops the lines, and the outcome is logged and kept for `memfs status`.

Owns the running requests and the last long ones finished (`Requests`); loop only.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from memfs.control import PROGRESS_EVERY, describe, encode_reply

log = logging.getLogger("memfs.daemon")
FINISHED_KEPT = 5
@dataclass
class Running:
    what: str
    started: float = field(default_factory=time.time)
    client_left: bool = False

    def to_json(self) -> dict[str, object]:
        return {"request": self.what, "started": self.started,
                "seconds": round(time.time() - self.started, 1),
                "client_left": self.client_left}


@dataclass(frozen=True)
class Finished:
    what: str
    started: float
    seconds: float
    error: str | None
    client_left: bool

    def to_json(self) -> dict[str, object]:
        return {"request": self.what, "started": self.started, "seconds": self.seconds,
                "ok": self.error is None, "error": self.error, "client_left": self.client_left}


class Requests:
    """The requests running now; the last FINISHED_KEPT that ran past one progress line."""

    def __init__(self, progress: Callable[[], list[str]]) -> None:
        self.progress = progress  # what the daemon's long work is doing, one line per piece
        self.running: dict[int, Running] = {}
        self.finished: deque[Finished] = deque(maxlen=FINISHED_KEPT)
        self._next = 0

    def status_json(self) -> dict[str, object]:
        return {"running": [r.to_json() for r in self.running.values()],
                "finished": [f.to_json() for f in reversed(self.finished)]}

    async def answer(self, stream: trio.SocketStream, op: str, args: dict, want_progress: bool,
                     run: Callable[[], Awaitable[object]]) -> None:
        """Run the request to its end; progress lines meanwhile (if asked); then the reply."""
        self._next += 1
        key, req = self._next, Running(describe(op, args))
        self.running[key] = req
        reply: list[bytes] = []
        done = trio.Event()
        long = False

        async def work() -> None:
            try:
                reply.append(encode_reply(await run()))
            except Exception as exc:  # noqa: BLE001 - every failure is answered
                log.warning("control request failed: %s", exc)
                reply.append(encode_reply(error=exc))
            finally:
                done.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(work)
                while True:
                    with trio.move_on_after(PROGRESS_EVERY):
                        await done.wait()
                    if done.is_set():
                        break
                    long = True
                    if want_progress and not req.client_left:
                        await self._send(stream, req, self._line(req))
            if reply:
                await self._send(stream, req, reply[0])
        finally:
            del self.running[key]
            if long:
                self._finished(req, reply[0] if reply else None)

    def _line(self, req: Running) -> bytes:
        body = {"request": req.what, "seconds": round(time.time() - req.started, 1),
                "doing": self.progress()}
        return json.dumps({"progress": body}).encode() + b"\n"

    @staticmethod
    async def _send(stream: trio.SocketStream, req: Running, data: bytes) -> None:
        if req.client_left:
            return
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            req.client_left = True
            log.info("the client of %r went away (%s); it runs on", req.what, exc)

    def _finished(self, req: Running, reply: bytes | None) -> None:
        seconds = round(time.time() - req.started, 1)
        error = "cancelled (the daemon stopped)" if reply is None else (
            None if (body := json.loads(reply)).get("ok") else str(body.get("error")))
        self.finished.append(Finished(req.what, req.started, seconds, error, req.client_left))
        log.info("%s finished after %.1f s: %s%s", req.what, seconds, error or "ok",
                 " (its client had left)" if req.client_left else "")


__all__ = ["Requests"]
