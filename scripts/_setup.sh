# Shared set-up for scripts/demo and scripts/test: Debian's FUSE packages, a venv, memfs in it.
# Sourced, not run. Idempotent: a second run installs nothing new.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

# Run a set-up step with its chatter (apt's, pip's, setuptools' warnings) kept in a log that
# is shown only if the step fails: the scripts print memfs's own lines.
setup_log="$(mktemp "${TMPDIR:-/tmp}/memfs-setup.XXXXXX")"
quietly() {
    if ! "$@" >"$setup_log" 2>&1; then
        echo "memfs: set-up step failed: $*" >&2
        cat "$setup_log" >&2
        return 1
    fi
}

need_pkgs=()
command -v fusermount3 >/dev/null 2>&1 || need_pkgs+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_pkgs+=(libfuse3-dev pkg-config)
if [ "${MEMFS_WANT_TEST_TOOLS:-0}" = 1 ]; then
    command -v getfattr >/dev/null 2>&1 || need_pkgs+=(attr)
    command -v git >/dev/null 2>&1 || need_pkgs+=(git)
    # The disk-fault tests inject EIO/ENOSPC with libfiu's preload libraries; the crash model
    # builds its LD_PRELOAD shim with a C compiler; another user is played with setpriv; the
    # conflict-copy fsync test watches the daemon with strace.
    [ -e /usr/lib/fiu/fiu_posix_preload.so ] || need_pkgs+=(libfiu0)
    command -v fiu-run >/dev/null 2>&1 || need_pkgs+=(fiu-utils)
    command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
    command -v setpriv >/dev/null 2>&1 || need_pkgs+=(util-linux)
    command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
    command -v vim >/dev/null 2>&1 || need_pkgs+=(vim)  # an editor's save, as users make it
fi
# The PostgreSQL backend's tests (and `scripts/demo --store postgresql`) start a throwaway server
# of their own (tests/helpers/pg.py). Debian's `postgresql` brings its release's server (15 on
# bookworm) under /usr/lib/postgresql/N/bin; the newest there is used (or $MEMFS_PG_BIN).
if [ "${MEMFS_WANT_TEST_TOOLS:-0}" = 1 ] || [ "${MEMFS_WANT_PG:-0}" = 1 ]; then
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || [ -n "${MEMFS_PG_BIN:-}" ] \
        || need_pkgs+=(postgresql)
    command -v setpriv >/dev/null 2>&1 || need_pkgs+=(util-linux)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "memfs: installing Debian packages: ${need_pkgs[*]}" >&2
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    quietly $sudo_cmd apt-get update -qq
    quietly $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}"
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "memfs: creating .venv" >&2
    quietly "$python" -m venv .venv
fi
extras="${MEMFS_EXTRAS:-}"
stamp=".venv/.memfs-installed${extras:+-$extras}"
# pyproject.toml, setup.py or the C source changed since: install again (the editable install
# builds memfs/reconcile/_lstat.c in place).
stale=0
for f in pyproject.toml setup.py memfs/reconcile/_lstat.c; do
    [ -f "$stamp" ] && [ ! "$f" -nt "$stamp" ] || stale=1
done
if [ "$stale" = 1 ]; then
    echo "memfs: installing memfs into .venv" >&2
    quietly .venv/bin/pip install -q --upgrade pip || true
    quietly .venv/bin/pip install -q -e ".${extras:+[$extras]}"
    touch "$stamp"
fi
rm -f "$setup_log"
