"""`memfs consolidate` as its tests run it: a session to consolidate, the CLI against the stub
model, and what memory and receipts hold after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.stub_server import StubServer
from memfs.memory.sessions import SessionStore
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir, sessions_dir

PUT_TABS = {"op": "put", "name": "indentation", "content": "# Indentation\nUse tabs.\n",
            "evidence": [{"from": 1, "to": 1}]}


def make_session(root: Path, workspace: str = "ws-alpha") -> str:
    sessions = SessionStore(sessions_dir(root))
    sid = sessions.new(workspace)
    sessions.append(sid, "user", "Please always indent with tabs, in every project of mine.")
    sessions.append(sid, "tool", "ls: a.py b.py")
    sessions.append(sid, "assistant", "Understood: tabs everywhere.")
    return sid


def consolidate(root: Path, stub: StubServer, provider: str, sid: str, *extra: str,
                env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    cmd = [sys.executable, "-m", "memfs", "--root", str(root), "consolidate", sid,
           "--provider", provider, "--base-url", stub.base_url(provider),
           "--model", "gpt-4o" if provider == "openai" else "claude-3-5-haiku-20241022",
           "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                         env={**os.environ, **(env or {})})
    payload = json.loads(out.stdout) if out.stdout.strip() else {}
    return out.returncode, payload, out.stderr


def memory_state(root: Path) -> tuple[str, str, list[str]]:
    memory = MemoryStore(memory_dir(root))
    receipts = sorted(p.name for p in (root / "receipts").glob("*")) if (root / "receipts").is_dir() else []
    return (memory.workspace_generation("ws-alpha").revision, memory.global_generation().revision,
            receipts)
