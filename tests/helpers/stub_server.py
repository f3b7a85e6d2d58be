"""A scripted model on loopback that speaks OpenAI chat completions and Anthropic Messages.

Tests and `scripts/demo-consolidate` run the real provider clients against it. It lives with the
tests, not in the installed package: nothing memfs ships talks to it. The script is a
list of protocol-neutral moves, each rendered in whichever protocol the request arrived in, so
one script drives both providers:

    {"propose": {"changes": [...], "final": true}}   call memory_review_propose
    {"call": {"name": "rm_rf", "arguments": {...} | "raw text"}}   any call, raw args allowed
    {"text": "..."}                  a plain answer with no tool call
    {"refuse": "..."}                a refusal
    {"truncate": "{\"chan"}          output cut at max_tokens
    {"http": {"status": 429, "headers": {...}, "body": {...}}}   a bare HTTP answer
    {"hang": 30}                     hold the request that long before failing it

Any move may add "usage": {"input": n, "output": m}. Every request is recorded (path, headers,
body) in memory only, for tests to assert on; nothing is written to disk.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL_NAME = "memory_review_propose"


@dataclass(frozen=True)
class RecordedRequest:
    protocol: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class StubServer:
    """Serve `script` on 127.0.0.1:<free port> from a background thread."""

    def __init__(self, script: list[dict[str, Any]] | None = None, require_key: str | None = None,
                 on_request: Callable[[RecordedRequest], None] | None = None):
        """`on_request` runs (in the server thread) before each answer: a test's way to change
        the world while the "model" is thinking."""
        self.script: list[dict[str, Any]] = list(script or [])
        self.on_request = on_request
        self.requests: list[RecordedRequest] = []
        self.require_key = require_key
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._ids = itertools.count(1)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def base_url(self, provider: str) -> str:
        """The --base-url each client expects (OpenAI's convention includes /v1)."""
        return self.url + "/v1" if provider == "openai" else self.url

    def push(self, *moves: dict[str, Any]) -> None:
        with self._lock:
            self.script.extend(moves)

    def start(self) -> StubServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self, request: RecordedRequest) -> dict[str, Any] | None:
        with self._lock:
            self.requests.append(request)
            move = self.script.pop(0) if self.script else None
        if self.on_request is not None:
            self.on_request(request)
        return move

    def _key_ok(self, protocol: str, headers: dict[str, str]) -> bool:
        if self.require_key is None:
            return True
        if protocol == "openai":
            return headers.get("authorization") == f"Bearer {self.require_key}"
        return headers.get("x-api-key") == self.require_key


def _handler_for(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if self.path.endswith("/chat/completions"):
                protocol = "openai"
            elif self.path.endswith("/messages"):
                protocol = "anthropic"
            else:
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(raw)
            except ValueError:
                return self._send(400, {"error": {"message": "body is not JSON"}})
            headers = {k.lower(): v for k, v in self.headers.items()}
            move = stub._next(RecordedRequest(protocol, self.path, headers, body))
            if not stub._key_ok(protocol, headers):
                return self._send(401, {"error": {"message": "invalid api key"}})
            if move is None:
                return self._send(400, {"error": {"message": "stub script exhausted"}})
            if "hang" in move:
                stub._closing.wait(float(move["hang"]))
                return self._send(504, {"error": {"message": "stub hang ended"}})
            if "http" in move:
                h = move["http"]
                return self._send(int(h["status"]), h.get("body", {}), h.get("headers", {}))
            render = _render_openai if protocol == "openai" else _render_anthropic
            self._send(200, render(move, next(stub._ids), body.get("model", "stub")))

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout); nothing to tell it

    return Handler


def _call_of(move: dict[str, Any]) -> tuple[str, Any] | None:
    if "propose" in move:
        return TOOL_NAME, move["propose"]
    if "call" in move:
        return move["call"]["name"], move["call"].get("arguments", {})
    return None


def _usage(move: dict[str, Any]) -> tuple[int, int]:
    u = move.get("usage") or {}
    return int(u.get("input", 100)), int(u.get("output", 20))


def _render_openai(move: dict[str, Any], n: int, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "tool_calls"
    call = _call_of(move)
    if call is not None:
        name, args = call
        arguments = args if isinstance(args, str) else json.dumps(args)
        message["tool_calls"] = [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": name, "arguments": arguments}}
        ]
    elif "text" in move:
        message["content"], finish = move["text"], "stop"
    elif "refuse" in move:
        message["refusal"], finish = move["refuse"], "stop"
    elif "truncate" in move:
        message["tool_calls"] = [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": TOOL_NAME, "arguments": move["truncate"]}}
        ]
        finish = "length"
    inp, out = _usage(move)
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out},
    }


def _render_anthropic(move: dict[str, Any], n: int, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    stop = "tool_use"
    call = _call_of(move)
    if call is not None:
        name, args = call
        content.append({"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": args})
    elif "text" in move:
        content.append({"type": "text", "text": move["text"]})
        stop = "end_turn"
    elif "refuse" in move:
        stop = "refusal"
    elif "truncate" in move:
        content.append({"type": "tool_use", "id": f"toolu_{n}", "name": TOOL_NAME, "input": {}})
        stop = "max_tokens"
    inp, out = _usage(move)
    return {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop,
        "usage": {"input_tokens": inp, "output_tokens": out},
    }


def main(argv: list[str]) -> int:
    """`python tests/helpers/stub_server.py SCRIPT.json`: print the base URL, then serve
    until SIGTERM or SIGINT (so a shell can run it in the background and kill its pid)."""
    script = json.loads(open(argv[0]).read()) if argv else []
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before the server thread inherits a mask
    with StubServer(script) as stub:
        print(stub.url, flush=True)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
