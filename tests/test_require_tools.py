"""scripts/test's switch: a test that would skip for a missing tool fails instead, with why.

Runs pytest on a small test file in a subprocess, with this suite's conftest as a plugin, once
with MEMFS_REQUIRE_TOOLS=1 (as scripts/test runs) and once without it (a developer's machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.require import REQUIRE_ENV

TESTS = Path(__file__).resolve().parent

INNER = '''
import pytest
from helpers.require import require_tool

def test_missing_tool():
    require_tool("the frobnicator is missing (Debian package frob)")

def test_plain_skip():
    pytest.skip("some other reason")

def test_native_mode_skip():
    pytest.skip("MEMFS_TEST_NATIVE=1: needs a real memfs daemon")

@pytest.mark.xfail(strict=True, reason="a known bug")
def test_known_bug():
    assert False

def test_tool_present():
    require_tool(None)
'''


def _run(tmp_path: Path, required: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env[REQUIRE_ENV] = required
    env.pop("MEMFS_TEST_NATIVE", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "conftest",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("required", ["1", "0"])
def test_missing_tools_fail_under_the_switch_and_skip_without_it(tmp_path: Path, required: str):
    out = _run(tmp_path, required)
    summary = out.stdout.strip().splitlines()[-1]
    if required == "1":
        assert out.returncode == 1, out.stdout
        assert "2 failed, 1 passed, 1 skipped, 1 xfailed" in summary, out.stdout
        assert "the frobnicator is missing (Debian package frob)" in out.stdout
        assert f"{REQUIRE_ENV}=1" in out.stdout
        assert "FAILED test_inner.py::test_plain_skip" in out.stdout
        assert "SKIPPED" in out.stdout and "MEMFS_TEST_NATIVE=1" in out.stdout
    else:
        assert out.returncode == 0, out.stdout
        assert "1 passed, 3 skipped, 1 xfailed" in summary, out.stdout
        assert "the frobnicator is missing" in out.stdout
