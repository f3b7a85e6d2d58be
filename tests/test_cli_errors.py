"""Every error names what happened and the remedy that fits the case; options go where people
put them. Each case below was met by trying memfs as a new user would, and said the wrong
thing before (a remedy for another case, a raw fusermount3 message, `unrecognized arguments`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.mount import REPO, is_mounted, memfs_cmd
from helpers.require import require_tool, root_missing, setpriv_missing


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memfs", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def memfs(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(memfs_cmd(root, *args), capture_output=True, text=True, cwd=REPO,
                          timeout=60)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    assert memfs(root, "init").returncode == 0
    return root


# -- mount and umount: the remedy fits the case -----------------------------------------------

def test_mount_on_a_regular_file_says_it_is_a_file(store: Path, tmp_path: Path):
    f = tmp_path / "notes.txt"
    f.write_text("x\n")
    out = memfs(store, "mount", str(f))
    assert out.returncode == 1
    assert f"mountpoint {f} is a file, not a directory — mount on a directory" in out.stderr
    assert "mkdir -p" not in out.stderr
    assert f.read_text() == "x\n"


def test_mount_on_a_missing_directory_says_create_it(store: Path, tmp_path: Path):
    out = memfs(store, "mount", str(tmp_path / "nope"))
    assert out.returncode == 1
    assert (f"mountpoint {tmp_path / 'nope'} does not exist — create it: "
            f"mkdir -p {tmp_path / 'nope'}") in out.stderr


@pytest.mark.mount
def test_mount_of_a_served_store_names_where_and_the_missing_directory(mounted, tmp_path: Path):
    mounted.require_real()
    out = mounted.cli("mount", str(tmp_path / "nope"), check=False)
    assert out.returncode == 1
    assert (f"already served by memfs (pid {mounted.proc.pid}) at {mounted.mnt} — use "
            f"{mounted.mnt}, or `memfs umount {mounted.mnt}` first") in out.stderr
    assert f"also, mountpoint {tmp_path / 'nope'} does not exist" in out.stderr
    again = mounted.cli("mount", str(mounted.mnt), check=False)
    assert f"{mounted.mnt} is already mounted: memfs (pid {mounted.proc.pid})" in again.stderr


@pytest.mark.mount
def test_umount_of_a_plain_directory_says_it_is_not_a_mount(mounted, tmp_path: Path):
    mounted.require_real()
    plain = tmp_path / "plain"
    plain.mkdir()
    out = mounted.cli("umount", str(plain), check=False)
    assert out.returncode == 1
    assert f"{plain} is not a mount point: nothing to unmount" in out.stderr
    assert f"`memfs umount {mounted.mnt}`" in out.stderr
    assert "Invalid argument" not in out.stderr and "fuser" not in out.stderr
    missing = mounted.cli("umount", str(tmp_path / "gone"), check=False)
    assert f"{tmp_path / 'gone'} does not exist" in missing.stderr
    assert is_mounted(mounted.mnt)


def test_umount_of_another_filesystem_names_it(store: Path, tmp_path: Path):
    require_tool(root_missing("mount a tmpfs"))
    t = tmp_path / "t"
    t.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(t)], check=True)
    try:
        out = memfs(store, "umount", str(t))
        assert out.returncode == 1
        assert f"{t} is a tmpfs mount, not memfs — unmount it with its own tool" in out.stderr
        assert is_mounted(t)
    finally:
        subprocess.run(["umount", str(t)])


@pytest.mark.mount
def test_umount_of_a_busy_mount_says_who_to_close_and_keeps_serving(mounted):
    mounted.require_real()
    sleeper = subprocess.Popen(["sleep", "60"], cwd=mounted.work)
    try:
        out = mounted.cli("umount", str(mounted.mnt), check=False)
        assert out.returncode == 1
        assert f"{mounted.mnt} is busy" in out.stderr
        assert f"`fuser -vm {mounted.mnt}` lists them" in out.stderr
        assert "nothing was unmounted" in out.stderr
        (mounted.work / "after.txt").write_text("still served\n")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (mounted.work / "after.txt").read_text() == "still served\n"


def test_no_store_names_init_and_the_root_options(tmp_path: Path):
    out = memfs(tmp_path / "typo", "log")
    assert out.returncode == 1
    assert f"no memfs store at {tmp_path / 'typo'} — `memfs init` creates it there; if the " \
        "store is elsewhere, give --root DIR (or set MEMFS_ROOT)" in out.stderr
    assert not (tmp_path / "typo").exists()


# -- options where people put them ------------------------------------------------------------

def test_global_options_before_or_after_the_command(store: Path):
    before = run("--root", str(store), "--json", "status")
    after = run("status", "--root", str(store), "--json")
    mixed = run("--json", "status", "--root", str(store))
    for out in (before, after, mixed):
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["root"] == str(store)
    log = run("log", "-n", "1", "--root", str(store))
    assert log.returncode == 0 and "init" in log.stdout
    nested = run("session", "list", "--root", str(store), "--json")
    assert json.loads(nested.stdout) == {"sessions": []}
    inner_wins = run("--root", "/nonexistent-memfs-root", "status", "--root", str(store))
    assert inner_wins.returncode == 0, inner_wins.stderr


@pytest.mark.mount
def test_mount_with_root_after_the_command(store: Path, tmp_path: Path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = run("mount", str(mnt), "--root", str(store))
    try:
        assert out.returncode == 0, out.stderr
        assert f"memfs mounted at {mnt}" in out.stdout and f"store {store}" in out.stdout
    finally:
        down = run("umount", str(mnt), "--root", str(store))
    assert down.returncode == 0, down.stderr
    assert "everything was committed" in down.stdout


@pytest.mark.mount
def test_o_options_pass_through_to_fuse(store: Path, tmp_path: Path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = run("mount", str(mnt), "-o", "ro,noatime", "--root", str(store))
    try:
        assert out.returncode == 0, out.stderr
        with open("/proc/self/mounts") as f:
            opts = next(ln.split()[3] for ln in f if ln.split()[1] == str(mnt)).split(",")
        assert opts[0] == "ro" and "noatime" in opts
        with pytest.raises(OSError) as exc:
            (mnt / "x").write_text("no\n")
        assert exc.value.errno == 30  # EROFS
    finally:
        down = run("umount", str(mnt), "--root", str(store))
    assert down.returncode == 0, down.stderr


@pytest.mark.mount
def test_bad_o_options_get_a_clear_error(store: Path, tmp_path: Path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = memfs(store, "mount", str(mnt), "-o", "nosuchopt")
    assert out.returncode == 1
    assert "fuse: unknown option(s): `-o nosuchopt'" in out.stderr
    assert "check the -o options given" in out.stderr
    assert not is_mounted(mnt)
    own = memfs(store, "mount", str(mnt), "-o", "fsname=x")
    assert own.returncode == 1 and "memfs sets fsname and subtype itself" in own.stderr


@pytest.mark.mount  # starts a real daemon
def test_allow_other_for_a_non_root_user_follows_fuse_conf(tmp_path: Path):
    """fusermount3 lets a non-root user allow others only with user_allow_other in
    /etc/fuse.conf: without it, memfs says so (and which line to add) before any daemon."""
    require_tool(setpriv_missing("act as a non-root user"))
    base = Path("/tmp") / f"memfs-allow-other-{os.getpid()}"
    (base / "mnt").mkdir(parents=True, exist_ok=True)
    for d in (base, base / "mnt"):
        os.chmod(d, 0o777)
    try:
        res = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
             "-m", "memfs", "--root", str(base / "root"), "mount", str(base / "mnt"),
             "--allow-other", "--foreground"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
            env=dict(os.environ, HOME=str(base)))
        conf = Path("/etc/fuse.conf")
        lines = conf.read_text().splitlines() if conf.exists() else []
        if "user_allow_other" not in (ln.strip() for ln in lines):
            assert res.returncode == 1
            assert ("--allow-other is not allowed for a non-root user: /etc/fuse.conf has no "
                    "`user_allow_other` line — ask root to add") in res.stderr
            assert not (base / "root").exists()  # refused before anything was created
        else:
            assert "not allowed for a non-root user" not in res.stderr
    finally:
        if is_mounted(base / "mnt"):
            subprocess.run(["fusermount3", "-uz", str(base / "mnt")])
        subprocess.run(["rm", "-rf", str(base)])


# -- sessions ----------------------------------------------------------------------------------

def test_unknown_session_points_at_session_list(store: Path):
    for args in (("consolidate", "nosuch"), ("session", "show", "nosuch")):
        out = memfs(store, *args)
        assert out.returncode == 1
        assert "no session 'nosuch'" in out.stderr
        assert "`memfs session list` shows the sessions there" in out.stderr
    sid = memfs(store, "session", "new", "--workspace", "ws").stdout.strip()
    listed = memfs(store, "session", "list").stdout
    assert sid in listed and "workspace ws" in listed and "0 turns" in listed


# -- the root itself --------------------------------------------------------------------------

@pytest.mark.parametrize("command", [("status",), ("init",), ("branch", "list"), ("undo",),
                                     ("show", "HEAD"), ("recover",), ("log",)])
def test_a_root_that_is_a_file_is_refused_by_every_command(tmp_path: Path, command):
    """`--root notes.txt` crashed `status`, `undo`, `show` with a NotADirectoryError traceback
    from the control socket, `recover` with FileExistsError, and `init` said to 'restore
    store.json'."""
    f = tmp_path / "notes.txt"
    f.write_text("x\n")
    out = memfs(f, *command)
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr
    assert (f"memfs: the store root {f} (--root) is a file, not a directory — give --root the "
            "directory `memfs init` made") in out.stderr
    assert f.read_text() == "x\n"


def test_init_where_no_store_can_be_made_names_why_and_where(tmp_path: Path):
    """`memfs init --root` on a read-only filesystem, under /proc or /sys printed an OSError
    traceback (Errno 30, 2, 1) with no remedy; each is a refusal naming the root and why."""
    for where, why in [(Path("/proc/memfs-nope"), "No such file or directory"),
                       (Path("/sys/memfs-nope"), "")]:
        out = memfs(where, "init")
        assert out.returncode == 1, out
        assert "Traceback" not in out.stderr
        assert f"memfs: cannot create the store at {where}: {why}" in out.stderr
        assert ("choose a directory on a writable filesystem you own: memfs init --root DIR "
                "(or set MEMFS_ROOT)") in out.stderr
        assert not where.exists()
    require_tool(root_missing("mount a read-only tmpfs"))
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        out = memfs(ro / "store", "init")
        assert out.returncode == 1, out
        assert f"memfs: cannot create the store at {ro / 'store'}: Read-only file system — " \
               in out.stderr
        assert os.listdir(ro) == []
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.mount
def test_a_command_run_inside_a_mount_acts_on_that_mounts_store(mount_factory, tmp_path: Path):
    """Found by a user trial: with the default store mounted and a second store mounted
    elsewhere, `memfs status` and `memfs undo` run in the second mount (no --root, no
    MEMFS_ROOT) showed and undid the default store's commits. The mount the current
    directory is in names its store now, as git finds its repository; --root and MEMFS_ROOT
    still come first."""
    home = tmp_path / "home"
    default = mount_factory(root=home / ".local" / "share" / "memfs", name="default")
    other = mount_factory(root=tmp_path / "other-store", name="other")
    other.require_real()
    for m in (default, other):
        (m.mnt / "work").mkdir(exist_ok=True)
    (default.mnt / "work" / "mine.txt").write_text("default\n")
    (other.mnt / "work" / "theirs.txt").write_text("other\n")
    default.cli("sync")
    other.cli("sync")
    env = {k: v for k, v in os.environ.items() if k not in ("MEMFS_ROOT", "XDG_DATA_HOME")}
    env["HOME"] = str(home)

    def here(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memfs", *args], capture_output=True,
                              text=True, cwd=cwd, env=env, timeout=60)

    got = json.loads(here("status", "--json", cwd=other.mnt / "work").stdout)
    assert got["root"] == str(other.root), got
    got = json.loads(here("status", "--json", cwd=tmp_path).stdout)
    assert got["root"] == str(default.root), got  # outside any mount: the default store
    out = here("undo", cwd=other.mnt / "work")
    assert out.returncode == 0, out.stderr
    assert not (other.mnt / "work" / "theirs.txt").exists()  # the test's own writes: one op
    assert (default.mnt / "work" / "mine.txt").read_text() == "default\n"
    env["MEMFS_ROOT"] = str(default.root)  # named: it wins over the directory
    got = json.loads(here("status", "--json", cwd=other.mnt).stdout)
    assert got["root"] == str(default.root), got


@pytest.mark.mount
def test_a_root_deeper_than_a_socket_path_holds_is_served(mount_factory, tmp_path: Path):
    """CI ran with TMPDIR one directory deeper and `memfs mount` died with a traceback,
    `OSError: AF_UNIX path too long`: a Unix socket's path holds 107 bytes, and a root deep in
    a long HOME or TMPDIR puts control.sock past that. The daemon binds it, and the CLI
    reaches it, through the root's directory descriptor instead."""
    root = tmp_path / ("a-long-directory-name-" * 5) / "memfs"
    assert len(os.fsencode(str(root / "control.sock"))) > 107
    m = mount_factory(root=root, name="deep")
    (m.work / "f").write_text("one\n")
    out = memfs(m.root, "sync")
    assert out.returncode == 0, out.stdout + out.stderr
    st = json.loads(memfs(m.root, "status", "--json").stdout)
    assert st.get("pending") == 0, st  # the daemon's own answer: only it knows pending
    subprocess.run(["sh", "-c", f"echo two > '{m.work / 'f'}'"], check=True,
                   start_new_session=True)  # a process group of its own: an operation
    assert memfs(m.root, "undo").returncode == 0
    assert (m.work / "f").read_text() == "one\n"  # seen through the mount at once: the daemon's
