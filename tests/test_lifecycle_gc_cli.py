"""`memfs gc` as a user meets it (from a user trial): a dry run says what a run would give back."""

from __future__ import annotations

import os

import pytest

from memfs.store.space import size_text

pytestmark = pytest.mark.mount


def test_a_dry_run_says_how_much_it_would_give_back(mounted) -> None:
    """`memfs gc --dry-run` is how a user asks what a run would give back: it says the bytes
    (what `memfs du` calls reclaimable), in the conditional, and claims nothing was freed."""
    mounted.require_real()
    (mounted.work / "gone").write_bytes(os.urandom(3 << 20))
    mounted.cli("mark", "written")
    (mounted.work / "gone").unlink()
    mounted.cli("mark", "removed")
    for key in ("keep-all", "keep-hourly", "keep-daily", "keep-reflog"):
        mounted.cli("config", key, "0")
    reclaimable = mounted.cli_json("du")["reclaimable"]
    assert reclaimable >= 3 << 20
    text = mounted.cli("gc", "--dry-run").stdout
    assert f"would give back {size_text(reclaimable)}" in text, text
    assert "freed" not in text and "gave back" not in text and "punched" not in text, text
    assert mounted.cli_json("du")["reclaimable"] == reclaimable, "the dry run changed the store"
