"""The crash model's fixtures (tests/crashmodel): the syscall-logging shim, built once per
module, and a tmpfs scratch directory to open crash images in. conftest.py registers them."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.require import cc_missing, require_tool

MODEL = Path(__file__).resolve().parents[1] / "crashmodel"


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool(cc_missing())
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None
    out = tmp_path_factory.mktemp("shim") / "crashlog.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out),
                    str(MODEL / "shim.c"), "-ldl"], check=True, capture_output=True)
    return out


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Where crash images are opened: tmpfs if there is one (the Store fsyncs on close)."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="memfs-crashmodel-", dir=base))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
