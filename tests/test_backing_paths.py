"""How commands name backed paths (issue 15, items 5 and 6), through a real mount and disk.

One spelling per path: every command that takes MOUNT/PATH (sync, materialize, ls --states),
in either form (MOUNT/PATH or a path through the mountpoint), refuses the same aliases ('//',
'.', '..') with the same error and changes nothing. Before, `sync work//a.txt` took disk over
the draft at a.txt (a path sync), while `materialize --force work/./a.txt` named nothing and
answered "nothing owed".
"""

from __future__ import annotations

import json

import pytest
from helpers.backing_mount import states

ALIASES = ["work//a.txt", "work/./a.txt", "work/sub/../a.txt", "work/a.txt/.", "/work/a.txt",
           "work/../work/a.txt"]
COMMANDS = [("sync",), ("materialize",), ("materialize", "--force"), ("ls", "--states")]


@pytest.mark.parametrize("alias", ALIASES)
def test_an_alias_is_refused_by_every_command_and_changes_nothing(backed, alias):  # noqa: F811
    m, disk = backed
    (m.work / "a.txt").write_text("a-draft\n")
    forms = [alias]
    if not alias.startswith("/"):
        forms.append(f"{m.mnt}/{alias}")  # the same spelling through the mountpoint
    for form in forms:
        for cmd in COMMANDS:
            out = m.cli(*cmd, form, check=False)
            assert out.returncode == 1, (cmd, form, out.stdout, out.stderr)
            assert "not a plain MOUNT/PATH" in out.stderr or "is not under" in out.stderr, \
                (cmd, form, out.stderr)
            res = json.loads(m.cli(*cmd, form, "--json", check=False).stdout)
            assert res["error"] and res["remedy"], (cmd, form, res)
    assert (m.work / "a.txt").read_text() == "a-draft\n"  # the draft is kept ...
    assert (disk / "a.txt").read_text() == "a1\n"  # ... and disk untouched
    assert states(m)["work/a.txt"] == ("workspace-draft", None)


def test_the_canonical_spellings_still_work(backed):  # noqa: F811
    m, disk = backed
    (m.work / "sub" / "c.txt").write_text("c-draft\n")
    assert states(m, "work/sub/")["work/sub/c.txt"] == ("workspace-draft", None)  # one '/'
    assert states(m, f"{m.mnt}/work/sub")["work/sub/c.txt"] == ("workspace-draft", None)
    res = m.cli_json("materialize", f"{m.mnt}/work/sub/c.txt")["mounts"]["work"]
    assert res["written"] == ["sub/c.txt"] and (disk / "sub" / "c.txt").read_text() == "c-draft\n"
    out = m.cli("ls", "--states", str(m.mnt), check=False)
    assert out.returncode == 1 and "mountpoint itself" in out.stderr


def test_accept_root_refuses_a_path(backed, tmp_path):  # noqa: F811
    """Seed 002: accepting a root refuses a path. Before, `sync --accept-root work/a.txt` took
    the whole replaced root (every evidence record set aside) and answered rc 0."""
    m, disk = backed
    (m.work / "a.txt").write_text("a-draft\n")
    disk.rename(tmp_path / "disk-away")
    disk.mkdir()
    (disk / "a.txt").write_text("a-new-root\n")
    out = m.cli("sync", "--accept-root", "work/a.txt", check=False)
    assert out.returncode == 1 and "accept-root" in out.stderr and "path" in out.stderr
    res = json.loads(m.cli("sync", "--json", check=False).stdout)["mounts"]["work"]
    assert "unavailable" in res  # the root was not taken
    assert (m.work / "a.txt").read_text() == "a-draft\n"
    res = m.cli_json("sync", "--accept-root")["mounts"]["work"]  # the whole root, on purpose
    assert "unavailable" not in res
    assert m.status()["backing"]["work"]["available"]
