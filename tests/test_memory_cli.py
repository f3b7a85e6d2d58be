"""`memfs session …` and `memfs memory …` as a user runs them: real processes, real root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.memory import REPO

from memfs.memory.store import MemoryStore


def memfs(root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MEMFS_ROOT", None)
    return subprocess.run([sys.executable, "-m", "memfs", "--root", str(root), *args],
                          capture_output=True, text=True, input=stdin, env=env, timeout=60)


def test_session_commands(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sid = memfs(root, "session", "new", "--workspace", "work").stdout.strip()
    as_json = json.loads(memfs(root, "session", "new", "--json").stdout)
    assert set(as_json) == {"id"} and as_json["id"] != sid
    assert memfs(root, "session", "append", sid, "--role", "user", "--text", "use tabs"
                 ).stdout.strip() == "1"
    note = tmp_path / "note.txt"
    note.write_text("tool output\n")
    assert memfs(root, "session", "append", sid, "--role", "tool", "--file", str(note)
                 ).stdout.strip() == "2"
    assert json.loads(memfs(root, "session", "append", sid, "--role", "assistant", "--file", "-",
                            "--json", stdin="ok").stdout) == {"id": sid, "turn": 3}
    shown = json.loads(memfs(root, "session", "show", sid, "--json").stdout)
    assert shown["turn_count"] == 3 and shown["workspace"] == "work"
    assert [t["visible"] for t in shown["turns"]] == [True, False, True]
    text = memfs(root, "session", "show", sid).stdout
    assert "-   2 tool" in text and "    1 user      use tabs" in text
    bad = memfs(root, "session", "append", sid, "--role", "user")
    assert bad.returncode == 2  # argparse: one of --text/--file is required
    missing = memfs(root, "session", "append", "nosuch", "--role", "user", "--text", "x")
    assert missing.returncode == 1 and "no session 'nosuch'" in missing.stderr


def test_import_and_preview_then_show_and_log(tmp_path: Path) -> None:
    root = tmp_path / "root"
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": [
        {"role": "user", "content": "Always use tabs, width 4."},
        {"role": "assistant", "content": "Will do."}]}))
    sid = json.loads(memfs(root, "session", "import", str(chat), "--workspace", "work",
                           "--json").stdout)["id"]
    proposal = tmp_path / "p.json"
    proposal.write_text(json.dumps({"changes": [
        {"op": "put", "name": "editor", "content": "# Editor\n- Tabs, width 4.\n",
         "evidence": [{"from": 1, "to": 2}]},
        {"op": "replace-global", "content": "# Global\n", "evidence": [{"from": 1, "to": 1}]}],
        "final": True}))
    out = memfs(root, "memory", "preview", str(proposal), "--session", sid, "--json")
    plan = json.loads(out.stdout)
    assert plan["workspace"]["diff"][0]["name"] == "editor"
    assert plan["workspace"]["before_revision"] != plan["workspace"]["after_revision"]
    assert plan["global"]["no_change"] is False and not plan["no_change"]
    text = memfs(root, "memory", "preview", str(proposal), "--session", sid).stdout
    assert "added    editor" in text and "workspace work:" in text
    assert not (root / "memory").exists()  # preview never writes

    store = MemoryStore(root / "memory")
    store.put_record("work", "editor", "# Editor\n- Tabs, width 4.\n")
    store.replace_global("# Global\n")
    again = json.loads(memfs(root, "memory", "preview", str(proposal), "--session", sid,
                             "--json").stdout)
    assert again["no_change"] is True
    assert again["workspace"]["after_revision"] == store.workspace_generation("work").revision

    shown = json.loads(memfs(root, "memory", "show", "--json").stdout)
    assert shown["workspaces"][0]["records"] == ["editor"]
    ws = json.loads(memfs(root, "memory", "show", "--workspace", "work", "--json").stdout)
    assert ws["records"] == {"editor": "# Editor\n- Tabs, width 4.\n"}
    assert "# Global" in memfs(root, "memory", "show", "--global").stdout
    log = json.loads(memfs(root, "memory", "log", "--json").stdout)["generations"]
    assert [(g["workspace"], g["seq"], g["current"]) for g in log] == [
        (None, 1, True), ("work", 1, True)]

    proposal.write_text(json.dumps({"changes": [{"op": "put", "name": "x", "content": "x",
                                                 "evidence": [{"from": 3, "to": 3}]}],
                                    "final": True}))
    bad = memfs(root, "memory", "preview", str(proposal), "--session", sid, "--json")
    assert bad.returncode == 1
    assert "range 3-3 is outside" in json.loads(bad.stdout)["error"]


def test_typos_in_a_workspace_or_a_receipt_state_are_told_apart_from_empty(tmp_path: Path) -> None:
    """Found in a user trial: `memfs receipts --state comitted` printed "no receipts" (exit 0),
    and `memfs memory show --workspace wrok` an empty index, as if both were merely empty."""
    root = tmp_path / "root"
    sid = memfs(root, "session", "new", "--workspace", "work").stdout.strip()
    assert sid
    bad = memfs(root, "receipts", "--state", "comitted")
    assert bad.returncode == 2 and "invalid choice: 'comitted'" in bad.stderr, bad.stderr
    assert "'committed'" in bad.stderr
    assert memfs(root, "receipts", "--state", "committed").stdout.strip() == "no receipts"
    MemoryStore(root / "memory").put_record("work", "editor", "# Editor\n")
    typo = memfs(root, "memory", "show", "--workspace", "wrok")
    assert typo.returncode == 0
    assert ("(no memory was ever committed for workspace 'wrok'; workspaces with memory: work)"
            ) in typo.stdout, typo.stdout
    real = memfs(root, "memory", "show", "--workspace", "work").stdout
    assert "editor.md" in real and "no memory was ever committed" not in real, real
