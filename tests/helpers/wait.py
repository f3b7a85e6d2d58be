"""Waiting on a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], object], timeout: float = 10.0, every: float = 0.1) -> bool:
    """True as soon as `cond()` is; False if it still is not after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return bool(cond())
