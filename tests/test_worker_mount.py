"""The consolidated record and its receipt, read through a real memfs mount."""

from __future__ import annotations

import pytest
from helpers.stub_server import StubServer
from helpers.worker import PUT_TABS, consolidate, make_session


@pytest.mark.mount
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_committed_record_is_readable_through_the_mount(tmp_path, mount_factory, provider):
    root = tmp_path / "root"
    m = mount_factory(root=root)
    m.require_real()
    sid = make_session(root)
    with StubServer([{"propose": {"changes": [PUT_TABS], "final": True}}]) as stub:
        code, out, err = consolidate(root, stub, provider, sid)
    assert code == 0, err
    receipt = (m.mnt / ".memfs" / "receipts" / f"{out['review_id']}.md").read_text()
    assert "committed" in receipt and out["worker_attempt"] in receipt
    memory = m.mnt / ".memfs" / "memory"
    record = memory / "workspaces" / "ws-alpha" / "indentation.md"
    assert record.read_text() == "# Indentation\nUse tabs.\n"
    assert "indentation.md" in (memory / "workspaces" / "ws-alpha" / "index.md").read_text()
