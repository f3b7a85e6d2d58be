"""A throwaway PostgreSQL cluster for the tests: Debian's postgresql (15 here), on loopback, in a
temporary directory, run as an unprivileged user (`postgres` or `nobody`; PostgreSQL refuses
to run as root), with the default durability (fsync on, synchronous_commit on).

One cluster per test session (`pg_cluster` in tests/conftest.py); each store gets a database
of its own (`new_database`). `kill()` SIGKILLs the server and every backend (a crash: no
shutdown checkpoint), `start()` brings it back on the same port (WAL recovery).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BIN_ENV = "MEMFS_PG_BIN"  # the server's binaries (initdb, pg_ctl), if not Debian's
ADMIN = "memfs"


def _bin() -> Path:
    """$MEMFS_PG_BIN, else the newest Debian server (/usr/lib/postgresql/N/bin: 15 on
    bookworm, whatever `postgresql` brings on another release)."""
    if os.environ.get(BIN_ENV):
        return Path(os.environ[BIN_ENV])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


BIN = _bin()


def pg_missing() -> str | None:
    """Why a PostgreSQL test cannot run here, or None."""
    if not (BIN / "initdb").exists():
        return (f"the PostgreSQL server is not installed ({BIN}/initdb missing; Debian "
                f"package postgresql, installed by scripts/_setup.sh; or set {BIN_ENV})")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]' brings it)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "needs setpriv (Debian package util-linux) to run PostgreSQL as a non-root user"
    return None


def _run_as() -> tuple[list[str], int, int]:
    """The command prefix that drops root, and that user's uid and gid."""
    if os.geteuid() != 0:
        return [], os.getuid(), os.getgid()
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return (["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"],
                pw.pw_uid, pw.pw_gid)
    raise RuntimeError("no unprivileged user (postgres, nobody) to run PostgreSQL as")


def _free_port() -> int:
    """A port free now, below Linux's ephemeral range (32768-60999): no client connection's
    own port takes it while a test has the server stopped (the suite runs two workers, each
    with its own server and clients)."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for a PostgreSQL server in 20000-32000")


class PgCluster:
    def __init__(self) -> None:
        self.prefix, uid, gid = _run_as()
        base = os.environ.get("TMPDIR") or "/tmp"
        self.dir = Path(tempfile.mkdtemp(prefix="memfs-pg-", dir=base))
        os.chmod(self.dir, 0o755)
        os.chown(self.dir, uid, gid)
        self.data = self.dir / "data"
        self.logfile = self.dir / "server.log"
        self.port = _free_port()
        self._n = 0
        self._cmd([str(BIN / "initdb"), "-D", str(self.data), "-U", ADMIN, "--auth=trust",
                   "-E", "UTF8", "--no-sync", "--locale=C.UTF-8"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("listen_addresses = '127.0.0.1'\n"
                    "unix_socket_directories = ''\nmax_connections = 300\n"
                    "fsync = on\nsynchronous_commit = on\nshared_buffers = 32MB\n")
        self._set_port()
        self._started = False

    def _set_port(self) -> None:
        """The port, in a file of its own that postgresql.conf includes last."""
        (self.data / "port.conf").write_text(f"port = {self.port}\n")
        conf = self.data / "postgresql.conf"
        if "include_if_exists = 'port.conf'" not in conf.read_text():
            with open(conf, "a") as f:
                f.write("include_if_exists = 'port.conf'\n")

    def _cmd(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(self.prefix + args, capture_output=True, text=True, cwd=self.dir,
                             timeout=120)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {res.stdout}{res.stderr}")
        return res

    def start(self) -> None:
        """Start the server; its first start moves to another port if another process took
        this one meanwhile (a restart keeps it: the databases' URLs name it)."""
        for attempt in range(3):
            res = self._cmd([str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
                             "-w", "-t", "60", "start"], check=False)
            if res.returncode == 0:
                self._started = True
                return
            log = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
            if self._started or "could not bind" not in log or attempt == 2:
                raise RuntimeError(f"pg_ctl start: {res.stdout}{res.stderr}{log[-2000:]}")
            self.port = _free_port()
            self._set_port()

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{ADMIN}@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        self._n += 1
        name = f"t{os.getpid()}_{self._n}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def clone_database(self, url: str) -> str:
        """A new database copied from the one at `url` (CREATE DATABASE ... TEMPLATE: no
        session may be connected to it); its URL."""
        import psycopg

        self._n += 1
        name = f"t{os.getpid()}_{self._n}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{url.rsplit("/", 1)[1]}"')
        return self.url(name)

    def pids(self) -> list[int]:
        """The postmaster and every process it started."""
        try:
            master = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        out = [master]
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == master:
                    out.append(int(d))
        return out

    def kill(self) -> None:
        """A crash: SIGKILL to the server and its backends, no checkpoint, no goodbye."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        # A killed postmaster whose parent never reaps it (a container's init) stays a
        # zombie, which the next start takes for a live server: the lock file goes with it.
        if pids and not any(_alive(p) for p in pids):
            (self.data / "postmaster.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        self._cmd([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                  check=False)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def host_root(tmp_path: Path, name: str, url: str) -> Path:
    """A new root for host `name` (host id `host-NAME`) whose store is the database `url`."""
    from memfs.store.backend import Location, record_location

    root = tmp_path / f"root-{name}"
    root.mkdir()
    record_location(root, Location("postgresql", url, f"host-{name}"))
    return root
