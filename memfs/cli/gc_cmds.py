"""Storage lifecycle commands: `memfs config` (the retention policy), and what `memfs status`
says about commits failing, space and the policy.

The policy is kept in the store (memfs.store.retention), so `memfs config` writes it there
directly, beside a running daemon too: the daemon reads it at each status and GC.
"""

from __future__ import annotations

import argparse
from datetime import datetime

from memfs.cli.main import add_json_flag, emit
from memfs.rootdir import resolve_root
from memfs.store import Store
from memfs.store.retention import Policy, PolicyError
from memfs.store.space import size_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show or set the retention policy (what history is kept)",
                       description="Settings: " + "; ".join(
                           f"{k}: {why}" for k, (_, why) in Policy.SETTINGS.items()))
    p.add_argument("key", nargs="?", help="a setting, e.g. keep-all")
    p.add_argument("value", nargs="?", help="its new value, e.g. 2d, forever, 0, 10%%, off")
    add_json_flag(p)
    p.set_defaults(func=cmd_config)


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    """`memfs init --keep-all 2d ...`: the same settings as `memfs config`."""
    for key, (_, why) in Policy.SETTINGS.items():
        p.add_argument(f"--{key}", metavar="VALUE", help=why)


def policy_from_flags(args: argparse.Namespace, policy: Policy) -> Policy | None:
    """The policy with the flags given applied (None if none was given); PolicyError if a
    value is bad, before anything is written."""
    changed = False
    for key in Policy.SETTINGS:
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            policy, changed = policy.with_setting(key, value), True
    return policy if changed else None


def cmd_config(args) -> int:
    store = Store.open(resolve_root(args.root), create=False)
    try:
        policy = store.policy()
        if args.key is not None and args.key not in Policy.SETTINGS:
            raise PolicyError(f"no setting {args.key!r}",
                              f"the settings are: {', '.join(Policy.SETTINGS)}")
        if args.value is not None:
            policy = policy.with_setting(args.key, args.value)
            store.set_policy(policy)
    finally:
        store.close()
    doc = {k: policy.setting_text(k) for k in Policy.SETTINGS}
    if args.key is not None:
        emit(args, {args.key: doc[args.key]}, doc[args.key])
        return 0
    width = max(map(len, doc))
    lines = [f"{k:<{width}}  {v:<8}  {Policy.SETTINGS[k][1]}" for k, v in doc.items()]
    emit(args, doc, "\n".join(lines + ["", policy.summary()]))
    return 0


def status_lines(st: dict) -> list[str]:
    """What `memfs status` says about commits failing, space and the retention policy."""
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
    if st.get("retention"):
        lines.append(f"history  {st['retention']['summary']}")
    return lines
