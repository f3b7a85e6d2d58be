"""What a publish of this host's pins costs on a PostgreSQL store of many commits, with this
host's row live (only new views' commits are checked) and lapsed (every view's commit is:
memfs.store.pg.pins.publish_checked), for a few numbers of views.

Usage: .venv/bin/python -m benchmarks.pg_pins_cost [COMMITS] [VIEWS ...]
(default 100000 commits; 1, 100, 4096 and COMMITS views). It starts the tests' throwaway
server (tests/helpers/pg.py), makes the commits' rows in SQL (no trees behind them: the
check reads `commits` only), and times each publish whole (one transaction, in this thread,
as the daemon's worker thread runs it): the median and the slowest of 15.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers.pg import PgCluster  # noqa: E402

from memfs.store import open_store  # noqa: E402
from memfs.store.gc import Pins  # noqa: E402
from memfs.store.pg import pins  # noqa: E402

ROUNDS = 15


def _commits(store, n: int) -> list[tuple[str, str]]:
    """n commits' rows (id, tree: 40 hex digits, as memfs's ids), made in one statement."""
    store._query(
        "INSERT INTO commits SELECT left(encode(sha256(('c' || i)::bytea), 'hex'), 40), "
        "100000000 + i, NULL, left(encode(sha256(('t' || i)::bytea), 'hex'), 40), 'main', "
        "i, '', '' "
        "FROM generate_series(1, %s) AS i RETURNING 1", (n,))
    return [(r[0], r[1]) for r in store._query(
        "SELECT id, tree FROM commits WHERE seq > 100000000 ORDER BY seq")]


def _time(fn, before=None) -> tuple[float, float]:
    """Median and max ms of ROUNDS calls of `fn`, each after `before` (not timed)."""
    got = []
    for _ in range(ROUNDS):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        got.append((time.perf_counter() - t0) * 1000)
    return statistics.median(got), max(got)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    counts = [int(a) for a in sys.argv[2:]] or [1, 100, 4096, n]
    cluster = PgCluster()
    cluster.start()
    try:
        url = cluster.new_database()
        with tempfile.TemporaryDirectory() as root:
            store = open_store(Path(root), url=url)
            rows = _commits(store, n)
            print(f"{n} commits; ms per publish_checked, median / max of {ROUNDS}")
            print("| views | live | lapsed |")
            print("|---|---|---|")
            for k in counts:
                views = rows[:k]
                pinned = Pins(trees={t for _, t in views})
                shown = {c for c, _ in views}

                def publish(lapsed: bool, pinned: Pins = pinned, shown: set = shown) -> None:
                    got = pins.publish_checked(store, "bench", pinned, 60, set(), shown)
                    assert not got.gone and got.lapsed == lapsed

                def lapse() -> None:
                    store._query("UPDATE host_pins SET expires = 0 WHERE host = %s "
                                 "RETURNING 1", (store.host,))

                pins.publish_checked(store, "bench", pinned, 60, set(), shown)
                a = _time(lambda: publish(False))
                b = _time(lambda: publish(True), before=lapse)
                print(f"| {k} | {a[0]:.1f} / {a[1]:.1f} | {b[0]:.1f} / {b[1]:.1f} |",
                      flush=True)
            store.close()
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
