"""Control requests while they run: progress lines to the client, and what status shows.

A request whose client asked for progress (memfs.control.call does) and that is not answered
within PROGRESS_EVERY gets a progress line that often until its reply: what it is doing and
how far it has got (an attach of 1M files takes minutes). The client waits as long as lines
come, so only a daemon that stops answering (stopped, stuck, its loop blocked) times it out.
The request runs to its end whether or not its client stays: a client that goes away (Ctrl-C)
only stops the lines, and the outcome is logged and kept for `memfs status`.

Owns the running requests and the last long ones finished (`Requests`, with the one ticker
task that sends the lines); loop only.
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
    stream: trio.SocketStream | None  # None: its client asked for no progress lines
    started: float = field(default_factory=time.time)
    client_left: bool = False
    done: bool = False  # its reply is going out: no more progress lines
    beating: bool = False  # a progress line was sent (or is going out): the reply takes the lock
    lock: trio.Lock = field(default_factory=trio.Lock)  # one line at a time on the stream

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
    """The requests running now; the last FINISHED_KEPT that ran past PROGRESS_EVERY. One
    ticker (`run`) sends every long request's progress lines, so a short request costs a
    dict entry, not a task of its own."""

    def __init__(self, progress: Callable[[], list[str]]) -> None:
        self.progress = progress  # what the daemon's long work is doing, one line per piece
        self.running: dict[int, Running] = {}
        self.finished: deque[Finished] = deque(maxlen=FINISHED_KEPT)
        self._next = 0

    def status_json(self) -> dict[str, object]:
        return {"running": [r.to_json() for r in self.running.values()],
                "finished": [f.to_json() for f in reversed(self.finished)]}

    async def run(self) -> None:
        """The ticker: a progress line every PROGRESS_EVERY to each request running longer."""
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(PROGRESS_EVERY)
                now = time.time()
                for req in list(self.running.values()):
                    if req.stream is not None and not req.done and not req.client_left \
                            and now - req.started >= PROGRESS_EVERY and not req.lock.locked():
                        req.beating = True
                        nursery.start_soon(self._send, req, self._line(req))

    async def answer(self, stream: trio.SocketStream, op: str, args: dict, want_progress: bool,
                     run: Callable[[], Awaitable[object]]) -> None:
        """Run the request to its end, whether or not its client stays; then the reply."""
        self._next += 1
        key, req = self._next, Running(describe(op, args), stream if want_progress else None)
        self.running[key] = req
        reply = None
        try:
            try:
                reply = encode_reply(await run())
            except Exception as exc:  # noqa: BLE001 - every failure is answered
                log.warning("control request failed: %s", exc)
                reply = encode_reply(error=exc)
            req.done = True  # no line starts from here: without one so far, no lock is needed
            if not req.beating:
                await stream.send_all(reply)
            else:
                await self._send(req, reply)
        finally:
            del self.running[key]
            if time.time() - req.started >= PROGRESS_EVERY:
                self._finished(req, reply)

    def _line(self, req: Running) -> bytes:
        body = {"request": req.what, "seconds": round(time.time() - req.started, 1),
                "doing": self.progress()}
        return json.dumps({"progress": body}).encode() + b"\n"

    @staticmethod
    async def _send(req: Running, data: bytes) -> None:
        async with req.lock:
            if req.client_left or req.stream is None:
                return
            try:
                await req.stream.send_all(data)
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
