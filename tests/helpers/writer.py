"""Write-heavy crash workload, run as a child process: `python writer.py DIR LOG SEED`.

Writes files under DIR forever (until killed), in three patterns, and appends to LOG (outside
the mount) one line per promise the filesystem made:

    durable PATH SHA256            fsync(file) returned: PATH must hold exactly these bytes
    pending PATH SHA256            about to replace PATH by rename: new content may appear
    prefix  PATH LENGTH SHA256     fsync after an append returned: PATH starts with these bytes

Lines are written only after the syscall returned, and flushed, so a line in LOG is a promise.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys


def main(root: str, log_path: str, seed: int) -> None:
    rnd = random.Random(seed)
    log = open(log_path, "a", buffering=1)
    appended = hashlib.sha256()
    app_len = 0
    app_path = os.path.join(root, "journal.log")
    app_fd = os.open(app_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(10**9):
        kind = i % 6
        size = rnd.choice([0, 1, 100, 4096, 65536, rnd.randint(1, 400_000)])
        payload = rnd.randbytes(size)
        digest = hashlib.sha256(payload).hexdigest()
        if kind in (0, 1, 2):  # a new file, fsynced two times out of three
            path = os.path.join(root, f"file{i}.bin")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, payload)
            if kind != 2:
                os.fsync(fd)
                log.write(f"durable {path} {digest}\n")
            os.close(fd)
        elif kind == 3:  # an editor's save: temp file, fsync, rename over, fsync the directory
            path = os.path.join(root, f"doc{rnd.randint(0, 4)}.txt")
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, payload)
            os.fsync(fd)
            os.close(fd)
            log.write(f"pending {path} {digest}\n")
            os.rename(tmp, path)
            os.fsync(dir_fd)
            log.write(f"durable {path} {digest}\n")
        elif kind == 4:  # a log-style append, fdatasync'd
            chunk = payload[:2000] or b"\n"
            os.write(app_fd, chunk)
            appended.update(chunk)
            app_len += len(chunk)
            os.fdatasync(app_fd)
            log.write(f"prefix {app_path} {app_len} {appended.hexdigest()}\n")
        else:  # overwrite in place without fsync: no promise, just churn
            path = os.path.join(root, f"scratch{rnd.randint(0, 9)}.bin")
            with open(path, "wb") as f:
                f.write(payload)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
