"""What the kernel may remember, and that memfs makes it forget what changed behind it.

A missing name is answered as a negative entry the kernel keeps (git and shells look up many
names that do not exist): asking twice costs one FUSE lookup, not two. A name that appears
without the kernel seeing it created (undo, a branch switch) must be visible at once all the
same. Request counts come from the daemon (`MemfsOperations.requests`).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.files import gone as missing
from helpers.files import write_durably

from memfs.control import call

pytestmark = pytest.mark.mount


def lookups(m) -> int:
    counts = call(m.root, "requests")
    assert isinstance(counts, dict)
    return int(counts.get("lookup", 0))


def test_a_missing_name_is_asked_once(mounted) -> None:
    mounted.require_real()
    probe = mounted.work / "no-such-file"
    assert missing(probe)
    before = lookups(mounted)
    for _ in range(5):
        assert missing(probe)
    assert lookups(mounted) == before, "the kernel asked again for a name it was told is missing"
    probe.write_bytes(b"made through the mount\n")  # the kernel replaces its negative entry
    assert probe.read_bytes() == b"made through the mount\n"


def test_undo_brings_back_a_name_the_kernel_remembers_as_missing(mounted) -> None:
    mounted.require_real()
    doc = mounted.work / "doc.txt"
    write_durably(doc, b"kept\n")
    subprocess.run(["rm", str(doc)], check=True)
    call(mounted.root, "sync")  # the removal is a commit of its own: undo that one
    for _ in range(3):
        assert missing(doc)  # now a negative entry in the kernel's cache
    mounted.cli("undo", "--commits", "1")
    assert not missing(doc), "undo restored doc.txt but the kernel still says it is missing"
    assert doc.read_bytes() == b"kept\n"
    assert "doc.txt" in os.listdir(mounted.work)


def test_branch_switch_shows_a_name_the_kernel_remembers_as_missing(mounted) -> None:
    mounted.require_real()
    main = mounted.status()["branch"]
    mounted.cli("branch", "create", "side")
    mounted.cli("branch", "switch", "side")
    write_durably(mounted.work / "only-on-side.txt", b"side\n")
    (mounted.work / "sub").mkdir()
    write_durably(mounted.work / "sub" / "deep.txt", b"deep\n")
    mounted.cli("branch", "switch", main)
    for p in (mounted.work / "only-on-side.txt", mounted.work / "sub"):
        assert missing(p)
        assert missing(p)
    mounted.cli("branch", "switch", "side")
    assert (mounted.work / "only-on-side.txt").read_bytes() == b"side\n"
    assert (mounted.work / "sub" / "deep.txt").read_bytes() == b"deep\n"

