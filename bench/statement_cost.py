"""What a statement costs the server before it touches a row: backend CPU per call of the hot
statements on an empty queue, beside `SELECT 1` and the raw loop's claim.

    python -m bench.statement_cost --calls 2000 --rounds 3

One session on a fresh schema with this checkout's migrations; each statement prepared and
called `--calls` times in a row (after 50 calls to settle its plan), its backend's CPU read
from /proc/PID/schedstat; the statements rotate each round, and the median over rounds is
printed with the last round's figure. What it measures is a statement's fixed cost (bind,
executor start-up and end, commit, reply), which a drain pays once per 25 jobs.
`ready_ring_take` is called with empty arrays (an idle queue's claim, before the claims
skipped the call) and with 25 addresses that match no entry (its cost in a drain, without the
rows). bench/RESULTS.md, "The wide record written once, drained live", reads its figures.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import psycopg

from bench import baseline
from bench.harness import HARNESS_ROLE, open_database
from bench.hot_path_cost import BATCH, claim_params, schedstat_ns
from bench.stats import rotated
from trioq._sql import queries


def statements(schema: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The measured statements by name: (SQL with psycopg placeholders, parameters)."""
    named = queries(schema)
    addresses = "{" + ",".join(f'"(999999,{k})"' for k in range(1, BATCH + 1)) + "}"
    ids = "{" + ",".join(str(k) for k in range(1, BATCH + 1)) + "}"
    take = f"SELECT {schema}.ready_ring_take(%(rows)s::tid[], %(ids)s::bigint[])"
    raw_claim = baseline.CLAIM_SQL.format(schema=schema)
    return {
        "SELECT 1": ("SELECT 1", {}),
        "raw loop's claim": (
            raw_claim.replace("$1", "%(queue)s").replace("$2", "%(limit)s"),
            {"queue": "default", "limit": BATCH},
        ),
        "job_claim_plain": (named["job_claim_plain"], claim_params()),
        "job_complete_plain, no ids": (
            named["job_complete_plain"],
            {"ids": [], "attempts": [], "lease_tokens": [], "results": []},
        ),
        "ready_ring_take, empty arrays": (take, {"rows": "{}", "ids": "{}"}),
        "ready_ring_take, 25 addresses": (take, {"rows": addresses, "ids": ids}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    with open_database() as db:
        schema = db.fresh_schema()
        db.install_raw(schema)
        with psycopg.connect(db.conninfo(HARNESS_ROLE), autocommit=True) as conn:
            pid = conn.info.backend_pid
            measured = list(statements(schema).items())
            for round_ in range(args.rounds):
                for name, (sql, params) in rotated(measured, round_):
                    for _ in range(50):
                        conn.execute(sql, params, prepare=True)
                    before = schedstat_ns(pid)
                    for _ in range(args.calls):
                        conn.execute(sql, params, prepare=True)
                    us = (schedstat_ns(pid) - before) / args.calls / 1e3
                    figures.setdefault(name, []).append(us)
    for name, values in figures.items():
        print(f"{name:>32}: {statistics.median(values):7.1f} us a call (last {values[-1]:.1f})")


if __name__ == "__main__":
    main()
