# Shared set-up for scripts/demo and scripts/test: Debian's FUSE packages, a venv, memfs in it.
# Sourced, not run. Idempotent: a second run installs nothing new.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

need_pkgs=()
command -v fusermount3 >/dev/null 2>&1 || need_pkgs+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_pkgs+=(libfuse3-dev pkg-config)
if [ "${MEMFS_WANT_TEST_TOOLS:-0}" = 1 ]; then
    command -v getfattr >/dev/null 2>&1 || need_pkgs+=(attr)
    command -v git >/dev/null 2>&1 || need_pkgs+=(git)
    command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    echo "memfs: installing Debian packages: ${need_pkgs[*]}" >&2
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "memfs: creating .venv" >&2
    "$python" -m venv .venv
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
    .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
    .venv/bin/pip install -q -e ".${extras:+[$extras]}"
    touch "$stamp"
fi
