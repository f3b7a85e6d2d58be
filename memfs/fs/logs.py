"""Daemon logging: to stderr (the daemon log file when spawned by `memfs mount`)."""

from __future__ import annotations

import logging
from pathlib import Path


def setup_logging(root: Path, debug: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
