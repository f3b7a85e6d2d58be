"""Packed lstat records of one directory's names, from the native helper when it is built.

`records(dir_fd, names)` stats each name through the held directory fd without following a
link, and returns the results packed as `RECORD` structs (mode, size, mtime and ctime as
seconds and nanoseconds, ino, dev; a failed call: mode 0 and the errno as size). Two records are equal as bytes exactly when
every field the walk's trust rule compares is equal, so a quiet directory is checked with one
`==` (see observe.DirMemo). The native helper (`_lstat.c`, built by the editable install) does
the calls without building an os.stat_result per name; the Python fallback gives the same
bytes, slower, where the extension is not built (a source tree used through PYTHONPATH).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

RECORD = struct.Struct("=qqqqqqQQ")
_NS = 1_000_000_000

try:
    from memfs.reconcile._lstat import records as _native_records
except ImportError:  # not built: the fallback below gives the same records
    _native_records = None

NATIVE = _native_records is not None


class LStat(NamedTuple):
    """The fields of os.stat_result a walk reads, under the same names (duck-typed)."""

    st_mode: int
    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_ino: int
    st_dev: int


def python_records(dir_fd: int, names: list[str]) -> bytes:
    """The fallback: the same bytes through os.stat."""
    out = bytearray()
    for name in names:
        if not name or "/" in name or "\0" in name:
            raise ValueError("records: a name must be one path component")
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            out += RECORD.pack(0, exc.errno or 0, 0, 0, 0, 0, 0, 0)
            continue
        out += RECORD.pack(st.st_mode, st.st_size, *divmod(st.st_mtime_ns, _NS),
                           *divmod(st.st_ctime_ns, _NS), st.st_ino, st.st_dev)
    return bytes(out)


records = _native_records if _native_records is not None else python_records


def unpack(buf: bytes) -> Iterator[LStat | int]:
    """Each record as an LStat, or the errno of a failed call."""
    for mode, size, msec, mnsec, csec, cnsec, ino, dev in RECORD.iter_unpack(buf):
        if mode:
            yield LStat(mode, size, msec * _NS + mnsec, csec * _NS + cnsec, ino, dev)
        else:
            yield size
