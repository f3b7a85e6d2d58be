"""Extended attributes as the FUSE layer answers them: which names may be set, and the value
of a `user.` name (a node's stored xattr, or a backed file's state, observed first).

memfs keeps only `user.` attributes; `user.memfs.*` are memfs's own and read-only. A value
holds at most 4 KiB and a node's names and values together at most 64 KiB (docs/guarantees.md,
"Extended attributes"). No state of its own. Loop thread only.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import pyfuse3

from memfs.workspace.nodes import Node
from memfs.workspace.workspace import Workspace

STATE_XATTRS = (b"user.memfs.state", b"user.memfs.conflict")  # backed mounts (memfs.backing)

# A node's xattrs live in its directory's tree object (memfs.store.trees), rewritten by every
# commit that touches the directory, and in memory while the tree is loaded: values are held
# to what one ext4 block takes (ext4 itself refuses a value above about 4 KiB with ENOSPC),
# and a node's whole set to what listxattr's 64 KiB buffer (XATTR_LIST_MAX) can always list.
# The kernel itself refuses names above 255 bytes (ERANGE) and values above 64 KiB (E2BIG).
VALUE_MAX = 4096
NODE_TOTAL_MAX = 65536


def check_settable(name: bytes) -> None:
    """setxattr's refusals: another namespace is ENOTSUP, memfs's own names EPERM."""
    if not name.startswith(b"user."):
        raise pyfuse3.FUSEError(errno.ENOTSUP)
    if name.startswith(b"user.memfs."):
        raise pyfuse3.FUSEError(errno.EPERM)


def check_fits(xattrs: dict[bytes, bytes], name: bytes, value: bytes) -> None:
    """E2BIG, before anything changes, for a value above VALUE_MAX or a set that would make
    the node's names and values together exceed NODE_TOTAL_MAX (the value `name` replaces not
    counted). E2BIG, not ENOSPC: the store has room, and deleting files would not help."""
    if len(value) > VALUE_MAX:
        raise pyfuse3.FUSEError(errno.E2BIG)
    total = sum(len(n) + len(v) for n, v in xattrs.items() if n != name)
    if total + len(name) + len(value) > NODE_TOTAL_MAX:
        raise pyfuse3.FUSEError(errno.E2BIG)


async def user_value(ws: Workspace, node: object, name: bytes,
                     after_pass: Callable[[], None]) -> bytes:
    """The value of `user.` attribute `name` of `node` (ENODATA if it has none). A backed
    file's state is observed first; `after_pass` is called when that ran a pass (its
    invalidations are the caller's to drain). The state xattrs are answered by name only,
    never listed: `cp -a` and `rsync -X` copy every listed xattr, and would stamp a user's own
    files with memfs's states."""
    if name in STATE_XATTRS and isinstance(node, Node):
        state, ran = await ws.backing.state_now(node)  # observes the path first
        if ran:
            after_pass()
        value = None if state is None else state[name == STATE_XATTRS[1]]
        if value is None:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return value.encode()
    if not isinstance(node, Node) or name not in node.xattrs:
        raise pyfuse3.FUSEError(errno.ENODATA)
    return node.xattrs[name]
