"""Issue 4 wiring through a real mount: status counts what disk owes, after-batch scans of
`--watch on-agent-action` mounts (coalesced by one coordinator per daemon), and events."""

from __future__ import annotations

from test_backing_mount import backed  # noqa: F401 - the fixture is used by name


def _owed(m) -> dict:
    return m.status()["backing"]["work"]["owed"]


def test_status_counts_what_disk_owes(backed):  # noqa: F811
    m, disk = backed
    assert _owed(m) == {"changes": 0, "workspace_deletions": 0, "conflicts": 0}
    (m.work / "a.txt").write_text("a-draft\n")
    assert _owed(m)["changes"] == 1
    assert m.cli_json("status")["backing"]["work"]["owed"]["changes"] == 1
    assert "disk owes 1 change(s), 0 deletion(s), 0 conflict(s)" in m.cli("status").stdout
    m.cli("materialize")
    assert (disk / "a.txt").read_text() == "a-draft\n"
    assert _owed(m)["changes"] == 0
    assert "disk owes 0 change(s)" in m.cli("status").stdout
    (m.work / "b.txt").unlink()
    assert _owed(m) == {"changes": 0, "workspace_deletions": 1, "conflicts": 0}
    m.cli("materialize", "--apply-deletions")
    assert not (disk / "b.txt").exists() and _owed(m)["workspace_deletions"] == 0
