"""Storage lifecycle commands: space and commit health in `memfs status`.

(`memfs gc`, `memfs du` and `memfs config` join here.)
"""

from __future__ import annotations

import argparse
from datetime import datetime

from memfs.store.space import size_text


def register(sub: argparse._SubParsersAction) -> None:
    """No commands of its own yet."""


def status_lines(st: dict) -> list[str]:
    """What `memfs status` says about commits failing and space."""
    lines = []
    failure = st.get("commit_failure")
    if failure:
        since = datetime.fromtimestamp(failure["since"]).strftime("%H:%M:%S")
        lines.append(f"commits  FAILING since {since} ({failure['attempts']} attempt(s)): "
                     f"{failure['reason']}")
        lines.append(f"         what to do: {failure['remedy']}")
    sp = st.get("space")
    if sp:
        used = sp["size"] - sp["free"]
        lines.append(f"space    {size_text(sp['writable'])} writable; the store's filesystem: "
                     f"{size_text(used)} used of {size_text(sp['size'])}, "
                     f"{size_text(sp['pending_bytes'])} waiting in memory")
    return lines
