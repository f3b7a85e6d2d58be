"""Sessions: append-only turns, frozen snapshots, the evidence projection, imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.memory import REPO

from memfs.memory.errors import SessionError
from memfs.memory.sessions import SessionStore


@pytest.fixture
def sessions(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def test_turns_are_numbered_from_one_and_projection_hides_non_visible(
        sessions: SessionStore) -> None:
    sid = sessions.new("work")
    roles = [("user", "hi"), ("assistant", "hello"), ("tool", "ls output"), ("assistant", "  "),
             ("user", "use tabs")]
    assert [sessions.append(sid, r, t) for r, t in roles] == [1, 2, 3, 4, 5]
    frozen = sessions.freeze(sid)
    assert (frozen.turn_count, frozen.workspace) == (5, "work")
    assert frozen.visible_turns == {1, 2, 5}
    assert [(p.index, p.role, p.text) for p in sessions.projection(frozen)] == [
        (1, "user", "hi"), (2, "assistant", "hello"), (5, "user", "use tabs")]


def test_a_frozen_snapshot_survives_later_appends(sessions: SessionStore) -> None:
    sid = sessions.new()
    sessions.append(sid, "user", "one")
    frozen = sessions.freeze(sid)
    sessions.append(sid, "assistant", "two")
    assert [p.text for p in sessions.projection(frozen)] == ["one"]
    later = sessions.freeze(sid)
    assert later != frozen and later.turn_count == 2
    assert sessions.freeze(sid) == later and hash(sessions.freeze(sid)) == hash(later)


def test_a_changed_prefix_is_detected(sessions: SessionStore, tmp_path: Path) -> None:
    sid = sessions.new()
    sessions.append(sid, "user", "original")
    frozen = sessions.freeze(sid)
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    path.write_text(path.read_text().replace("original", "tampered"))
    with pytest.raises(SessionError, match="no longer matches"):
        sessions.projection(frozen)


def test_a_torn_append_is_dropped_and_numbering_continues(sessions: SessionStore,
                                                         tmp_path: Path) -> None:
    sid = sessions.new()
    sessions.append(sid, "user", "one")
    with open(tmp_path / "sessions" / f"{sid}.jsonl", "ab") as f:
        f.write(b'{"role": "user", "te')  # a crash in the middle of an append
    assert len(sessions.turns(sid)) == 1
    assert sessions.append(sid, "assistant", "two") == 2
    assert [t.text for t in sessions.turns(sid)] == ["one", "two"]


def test_bad_ids_roles_and_text_are_refused(sessions: SessionStore) -> None:
    sid = sessions.new()
    for bad in ("../x", "", "a/b", ".hidden", "x" * 80):
        with pytest.raises(SessionError):
            sessions.append(bad, "user", "x")
    with pytest.raises(SessionError, match="no session"):
        sessions.append("nosuch", "user", "x")
    with pytest.raises(SessionError, match="role"):
        sessions.append(sid, "system", "x")
    with pytest.raises(SessionError):
        sessions.append(sid, "user", 3)  # type: ignore[arg-type]
    with pytest.raises(SessionError):
        sessions.new("../escape")
    assert sessions.turns(sid) == []


def test_import_memfs_jsonl(sessions: SessionStore, tmp_path: Path) -> None:
    f = tmp_path / "turns.jsonl"
    f.write_text('{"role": "user", "text": "a"}\n\n{"role": "tool", "text": "b"}\n'
                 '{"role": "assistant", "text": "c"}\n')
    sid = sessions.import_jsonl(f, workspace="work")
    assert [(t.index, t.role, t.text) for t in sessions.turns(sid)] == [
        (1, "user", "a"), (2, "tool", "b"), (3, "assistant", "c")]
    assert sessions.freeze(sid).visible_turns == {1, 3}


@pytest.mark.parametrize("wrap", ["list", "messages", "jsonl"])
def test_import_openai_messages(sessions: SessionStore, tmp_path: Path, wrap: str) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "Use tabs."},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function",
                         "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "a.txt"},
        {"role": "assistant", "content": "Noted."},
    ]
    f = tmp_path / "chat.json"
    if wrap == "list":
        f.write_text(json.dumps(messages))
    elif wrap == "messages":
        f.write_text(json.dumps({"model": "m", "messages": messages}))
    else:
        f.write_text("\n".join(json.dumps(m) for m in messages))
    sid = sessions.import_jsonl(f)
    turns = sessions.turns(sid)
    assert [(t.role, t.text) for t in turns] == [
        ("system", "You are helpful."), ("user", "Use tabs."), ("assistant", ""),
        ("tool", "a.txt"), ("assistant", "Noted.")]
    assert sessions.freeze(sid).visible_turns == {2, 5}


def test_a_bad_import_creates_nothing(sessions: SessionStore, tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"role": "user", "text": "ok"}\n{"role": "wizard", "text": "x"}\n')
    with pytest.raises(SessionError, match=r"bad.jsonl:2: role 'wizard'"):
        sessions.import_jsonl(f)
    f.write_text('{"role": "user", "text": "ok"}\nnot json\n')
    with pytest.raises(SessionError, match=r":2: not JSON"):
        sessions.import_jsonl(f)
    assert not (tmp_path / "sessions").exists() or not os.listdir(tmp_path / "sessions")


def test_concurrent_appends_from_processes_get_distinct_numbers(sessions: SessionStore) -> None:
    sid = sessions.new()
    code = ("import sys; from pathlib import Path; from memfs.memory.sessions import SessionStore;"
            "s = SessionStore(Path(sys.argv[1]));"
            "print(*[s.append(sys.argv[2], 'user', f'{sys.argv[3]}-{i}') for i in range(25)])")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sessions.root), sid, tag],
                              stdout=subprocess.PIPE, text=True, env=env) for tag in "ab"]
    numbers = [int(n) for p in procs for n in p.communicate(timeout=60)[0].split()]
    assert sorted(numbers) == list(range(1, 51))
    assert len({t.text for t in sessions.turns(sid)}) == 50
