"""What a test needs from the machine, and one rule for when it is missing.

A test that cannot run here for a missing tool (FUSE, libfiu, a C compiler, root for a tmpfs
or another user) calls `require_tool(reason)` with the reason from one of the `*_missing`
functions below. On a developer's machine that is a skip that says why; under scripts/test
(MEMFS_REQUIRE_TOOLS=1) it is a failure with the same reason, so CI can never pass while
quietly running fewer tests. Skips about MEMFS_TEST_NATIVE (the plain-directory mode) are not
about tools and stay skips.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_ENV = "MEMFS_REQUIRE_TOOLS"
LIBFIU = ("/usr/lib/fiu/fiu_run_preload.so", "/usr/lib/fiu/fiu_posix_preload.so")


def tools_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def require_tool(reason: str | None) -> None:
    """Nothing when `reason` is None; else skip with it, or fail under MEMFS_REQUIRE_TOOLS=1."""
    if reason is None:
        return
    if tools_required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: scripts/test runs every test; install the "
                    f"tool with scripts/_setup.sh, or set {REQUIRE_ENV}=0 to allow the skip)",
                    pytrace=False)
    pytest.skip(reason)


def fuse_missing() -> str | None:
    """Why a real mount cannot run here, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel/container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (Debian package fuse3)"
    return None


def libfiu_missing() -> str | None:
    """The disk-fault tests inject EIO/ENOSPC with libfiu's LD_PRELOAD libraries."""
    if all(os.path.exists(p) for p in LIBFIU):
        return None
    return "libfiu is not installed (Debian packages libfiu0 and fiu-utils)"


def strace_missing() -> str | None:
    if shutil.which("strace"):
        return None
    return "strace is missing (Debian package strace; scripts/_setup.sh installs it)"


def cc_missing() -> str | None:
    if shutil.which("cc") or shutil.which("gcc"):
        return None
    return "no C compiler (cc/gcc; Debian package gcc) to build the crashlog LD_PRELOAD shim"


def root_missing(why: str) -> str | None:
    """None when running as root; else 'needs root to <why>'."""
    return None if os.geteuid() == 0 else f"needs root to {why}"


def setpriv_missing(why: str) -> str | None:
    """Acting as another user: root and util-linux's setpriv."""
    if os.geteuid() != 0:
        return f"needs root to {why}"
    if shutil.which("setpriv") is None:
        return f"needs setpriv (Debian package util-linux) to {why}"
    return None
