"""What a key rate that is never reached costs a drain of keyed jobs, interleaved.

    python -m bench.key_rate_cost --jobs 10000 --keys 50 --repeats 7

Each repeat drains the same backlog of no-op jobs spread over `--keys` concurrency keys (a key
limit of 30 set by pattern, so no key's limit binds) on one worker of 25 slots, twice, in
an order alternating per repeat: with no key rate (job_claim, as before key rates
existed), and with `trioq key rate 'k:*' 10000/s` (job_claim_rated, a rate no key
reaches). Prints per repeat and the medians of the per-repeat ratios (rated / unrated).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from bench.app import make_app
from bench.config import FULL
from bench.harness import HARNESS_ROLE, Database, Launcher, open_database
from bench.jobs import TRIOQ, System
from bench.scenarios import Context, Results
from bench.scenarios.throughput import Drain, drain
from bench.worker_cpu import line

RATE = "10000/s"  # far above what one worker starts per key
KEY_LIMIT = 30  # above the worker's 25 slots: no key's limit binds either


def keyed_system(keys: int) -> System:
    """trioq's system, its backlog spread over `keys` concurrency keys `k:0`, `k:1`, ..."""

    def enqueue(
        db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
    ) -> float:
        app = make_app(schema, db.conninfo(HARNESS_ROLE))

        async def run() -> float:
            async with app.client() as client, client.transaction() as tx:
                for key in range(keys):
                    share = count // keys + (1 if key < count % keys else 0)
                    await tx.enqueue_many(task, [{}] * share, concurrency_key=f"k:{key}")
                before_commit()
            return time.time()

        return trio.run(run)

    return System(f"{keys} keys", enqueue, TRIOQ.completed_sql, TRIOQ.last_finished_sql)


def limits(db: Database, rate: str | None) -> Callable[[str], None]:
    """Set the keys' limit (and `rate`) in a fresh schema, before its worker starts: the
    worker's first claims already know whether a key rate exists."""

    def prepare(schema: str) -> None:
        async def run() -> None:
            async with make_app(schema, db.conninfo(HARNESS_ROLE)).client() as client:
                await client.set_key_limit("k:*", KEY_LIMIT)
                if rate is not None:
                    await client.set_key_rate("k:*", rate)

        trio.run(run)

    return prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    system = keyed_system(args.keys)
    runs: dict[str, list[Drain]] = {"no rate": [], "rated": []}
    with tempfile.TemporaryDirectory() as logs, open_database() as db:
        launcher = Launcher(db, Path(logs))
        ctx = Context(db, launcher, FULL, Results())
        rates = {"no rate": None, "rated": RATE}
        for repeat in range(args.repeats):
            order = list(rates.items())
            if repeat % 2:
                order.reverse()
            print(f"repeat {repeat + 1}", flush=True)
            for name, rate in order:
                run = drain(
                    ctx,
                    lambda schema: [launcher.trioq_worker(schema, concurrency=25)],
                    "noop",
                    args.jobs,
                    system,
                    prepare=limits(db, rate),
                )
                runs[name].append(run)
                print(line(name, run), flush=True)
    pairs = list(zip(runs["rated"], runs["no rate"], strict=True))
    rate_ratio = statistics.median(r.jobs_per_s / n.jobs_per_s for r, n in pairs)
    cpu_ratio = statistics.median(r.cpu_seconds / n.cpu_seconds for r, n in pairs)
    db_ratio = statistics.median(r.db_ms / n.db_ms for r, n in pairs)
    print(
        f"medians of {args.repeats} per-repeat ratios, rated / no rate: rate {rate_ratio:.3f}x, "
        f"worker CPU {cpu_ratio:.3f}x, server execution {db_ratio:.3f}x"
    )
    for name in runs:
        print(
            f"{name:>10}: {statistics.median(r.jobs_per_s for r in runs[name]):8.0f} jobs/s, "
            f"{statistics.median(r.statements_per_job for r in runs[name]):.4f} stmt/job"
        )


if __name__ == "__main__":
    main()
