"""The control channel: one JSON request and one JSON reply per line over a Unix socket.

A running daemon serves `<root>/control.sock`; the CLI tries it first and opens the store
directly only when no daemon answers, so an undo typed in a shell is seen through the
mount at once.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from memfs.errors import MemfsError
from memfs.rootdir import control_socket

MAX_LINE = 64 << 20


class NoDaemon(Exception):
    """Nobody serves this root's control socket."""


def call(root: Path, op: str, timeout: float = 600.0, **args) -> object:
    """Send one request to the daemon; raise NoDaemon if none runs, MemfsError on refusal."""
    path = control_socket(root)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NoDaemon(str(path)) from exc
        sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        raise MemfsError(f"the memfs daemon of {root} did not answer {op!r} within {timeout:g} s",
                         f"it may be stuck: see {root / 'daemon.log'}; `memfs status` shows its "
                         "pid") from None
    finally:
        sock.close()
    if not buf:
        raise MemfsError(f"the memfs daemon of {root} closed the connection without answering "
                         f"{op!r} (it may have just died)",
                         f"`memfs status` says whether it runs; see {root / 'daemon.log'}")
    reply = json.loads(buf)
    if not reply.get("ok"):
        raise MemfsError(reply.get("error", "request failed"), reply.get("remedy", ""))
    return reply.get("result")


def encode_reply(result: object = None, error: BaseException | None = None) -> bytes:
    if error is None:
        body = {"ok": True, "result": result}
    elif isinstance(error, MemfsError):
        body = {"ok": False, "error": error.message, "remedy": error.remedy}
    else:
        body = {"ok": False, "error": f"{type(error).__name__}: {error}", "remedy": ""}
    return json.dumps(body, default=str).encode() + b"\n"
