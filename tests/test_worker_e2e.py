"""`memfs consolidate` end to end: a real CLI process, real HTTP on loopback, real files.

A session where the user states a preference → the scripted model puts a record citing that
turn → a committed receipt → the record readable from the memory store's files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfs.consolidate.receipts import read_receipt
from memfs.consolidate.stub_server import StubServer
from memfs.memory.sessions import SessionStore
from memfs.memory.store import MemoryStore
from memfs.rootdir import memory_dir, sessions_dir

PROVIDERS = ["openai", "anthropic"]
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


@pytest.fixture
def stub():
    with StubServer() as s:
        yield s


@pytest.mark.parametrize("provider", PROVIDERS)
def test_preference_becomes_a_committed_record(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [PUT_TABS], "final": True},
               "usage": {"input": 321, "output": 45}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    assert out["state"] == "committed"
    assert out["usage"] == {"input_tokens": 321, "output_tokens": 45}
    assert "step 1/8" in err and "final accepted" in err  # progress while the model works
    assert out["diff"][0]["name"] == "indentation" and "+Use tabs." in out["diff"][0]["unified"]
    receipt = read_receipt(root, out["review_id"])
    assert receipt is not None and receipt.state == "committed"
    assert receipt.worker_attempt == out["worker_attempt"]
    assert receipt.consolidator_version == "memfs-consolidator/2"
    assert out["revisions"]["workspace"]["after"] == receipt.scopes["workspace"].planned_after
    memory = MemoryStore(memory_dir(root))
    assert memory.read_record("ws-alpha", "indentation") == "# Indentation\nUse tabs.\n"
    assert memory.workspace_generation("ws-alpha").revision == receipt.scopes["workspace"].planned_after
    # the model saw turns by number, never a path, revision or workspace name
    sent = json.dumps(stub.requests[0].body)
    assert "Turn 1 (user)" in sent and "ls: a.py" not in sent
    for secret in (str(root), receipt.scopes["workspace"].before, "ws-alpha"):
        assert secret not in sent


@pytest.mark.parametrize("provider", PROVIDERS)
def test_global_and_workspace_in_one_receipt(tmp_path, stub, provider):
    root = tmp_path / "root"
    sid = make_session(root)
    stub.push({"propose": {"changes": [
        PUT_TABS,
        {"op": "replace-global", "content": "- Indent with tabs.\n",
         "evidence": [{"from": 1, "to": 1}]},
    ], "final": True}})
    code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    receipt = read_receipt(root, out["review_id"])
    assert receipt.state == "committed" and set(receipt.touched_scopes) == {"workspace", "global"}
    memory = MemoryStore(memory_dir(root))
    assert memory.global_generation().content == "- Indent with tabs.\n"
    assert memory.global_generation().revision == receipt.scopes["global"].planned_after
    assert "indentation" in memory.workspace_generation("ws-alpha").records
