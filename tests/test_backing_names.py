"""File names that are not UTF-8 (issue 15, item 3), through a real mount and a real directory.

Linux names are bytes. One file named b"bad-\\xe9.txt" on disk used to make sync, ls --states
and materialize fail for every path with "UnicodeEncodeError ... surrogates not allowed" (the
journal could not store the name), and once removed it stayed listed as
disk-missing-provenance-unknown. Now the name travels as its bytes: through the journal (as
the same bytes), the control socket and --json (as the PEP 383 escape \\udcXX, which
os.fsencode turns back into the byte), and plain output (the bytes themselves). Every command
takes the name back as its bytes (a shell passes $'\\xe9' as the byte).
"""

from __future__ import annotations

import json
import os
import subprocess

from helpers.backing_mount import states, xattr
from helpers.mount import REPO, memfs_cmd

RAW = b"bad-\xe9.txt"  # Latin-1 e-acute: not UTF-8
NAME = os.fsdecode(RAW)  # 'bad-\udce9.txt', the form the store and the walk keep names in
DIR_RAW = b"d\xff"


def cli_raw(m, *args: bytes | str) -> subprocess.CompletedProcess[bytes]:
    """The CLI with argv as bytes and stdout as bytes, as a shell would run it, with stdio as
    strict as in a UTF-8 desktop locale (where Python's stdout refuses surrogates; the test
    machine's C.UTF-8 locale would hide that)."""
    argv = [os.fsencode(a) if isinstance(a, str) else a for a in memfs_cmd(m.root, *args)]
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
    return subprocess.run(argv, capture_output=True, cwd=REPO, timeout=60, env=env)


def test_a_name_that_is_not_utf8_travels_as_its_bytes(backed):  # noqa: F811
    m, disk = backed
    (disk / NAME).write_bytes(b"latin-1 named\n")
    os.mkdir(os.path.join(os.fsencode(disk), DIR_RAW))
    (disk / os.fsdecode(DIR_RAW) / "inner.txt").write_bytes(b"inner\n")

    # sync takes it in; --json names it by the PEP 383 escape, plain output by its bytes.
    out = cli_raw(m, "sync", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)["mounts"]["work"]
    assert sorted(res["taken"]) == sorted([NAME, os.fsdecode(DIR_RAW) + "/inner.txt"])
    assert b"\\udce9" in out.stdout and b"\\udcff" in out.stdout  # the JSON text is ASCII
    assert (m.work / NAME).read_bytes() == b"latin-1 named\n"
    assert RAW in os.listdir(os.fsencode(m.work))

    out = cli_raw(m, "ls", "--states")
    assert out.returncode == 0, out.stderr
    assert b"synced" in out.stdout and b"work/" + RAW in out.stdout
    assert b"work/" + DIR_RAW + b"/inner.txt" in out.stdout
    assert states(m)[f"work/{NAME}"] == ("synced", None)
    assert xattr(m.work / NAME) == "synced"

    # A draft of it: materialize writes it by its bytes, named or not.
    (m.work / NAME).write_bytes(b"draft\n")
    out = cli_raw(m, "materialize", b"work/" + RAW, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["mounts"]["work"]["written"] == [NAME]
    assert (disk / NAME).read_bytes() == b"draft\n"
    (m.work / NAME).write_bytes(b"draft 2\n")
    out = cli_raw(m, "materialize")
    assert out.returncode == 0, out.stderr
    assert b"wrote    work/" + RAW in out.stdout
    assert (disk / NAME).read_bytes() == b"draft 2\n"

    # A path sync by its bytes, through the mountpoint too.
    (disk / NAME).write_bytes(b"disk edit\n")
    out = cli_raw(m, "sync", os.fsencode(m.work) + b"/" + RAW)
    assert out.returncode == 0, out.stderr
    assert (m.work / NAME).read_bytes() == b"disk edit\n"

    # status and events name it too (plain and --json).
    for args in (("status",), ("status", "--json"), ("events",), ("events", "--json")):
        out = cli_raw(m, *args)
        assert out.returncode == 0, (args, out.stderr)

    # Removed on disk: adopted as a deletion (its evidence was recorded), not "provenance
    # unknown".
    (disk / NAME).unlink()
    res = json.loads(cli_raw(m, "sync", "--json").stdout)["mounts"]["work"]
    assert res["removed"] == [NAME]
    assert f"work/{NAME}" not in states(m)
    assert RAW not in os.listdir(os.fsencode(m.work))


def test_other_paths_are_unaffected_by_one_bad_name(backed):  # noqa: F811
    """The failure was global: one such name broke the reconciler for every path."""
    m, disk = backed
    (disk / NAME).write_bytes(b"x\n")
    (m.work / "a.txt").write_text("a-draft\n")
    res = json.loads(cli_raw(m, "materialize", "--json").stdout)["mounts"]["work"]
    assert res["written"] == ["a.txt"] and res["failed"] == []
    assert (disk / "a.txt").read_text() == "a-draft\n"
    assert states(m)["work/a.txt"] == ("synced", None)


def test_a_backing_directory_whose_own_name_is_not_utf8(mounted, tmp_path):
    """The bound directory's path may be any bytes too; a mount's own name must be text (it
    keys every MOUNT/PATH), and saying so is a clear refusal, not a crash."""
    if mounted.native:
        return
    m = mounted
    disk = os.path.join(os.fsencode(tmp_path), b"disk-\xff")
    os.mkdir(disk)
    with open(os.path.join(disk, RAW), "wb") as f:
        f.write(b"x\n")
    out = cli_raw(m, "attach", "work", disk, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pass"]["taken"] == [NAME]
    assert (m.work / NAME).read_bytes() == b"x\n"
    out = cli_raw(m, "status")
    assert out.returncode == 0 and b"disk-\xff" in out.stdout
    out = cli_raw(m, "attach", b"w\xff", disk)
    assert out.returncode == 1 and b"is not UTF-8" in out.stderr
