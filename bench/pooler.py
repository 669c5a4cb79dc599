"""What a transaction pooler costs: direct vs `prepared_statements="off"` vs PgBouncer.

Run once (not part of the test suite): `python -m bench.pooler [--repeats 5]`. It needs
Debian's `pgbouncer` (.ci/run installs it). On the durable embedded cluster of
`python -m bench`, with a PgBouncer 1.18 in transaction mode in front of it (tests/pgbouncer.py),
three setups run the same two measurements in interleaved order, `--repeats` times:
- direct: the cluster's own socket, `prepared_statements="auto"` (trioq's default);
- off: the same socket, `prepared_statements="off"` (unnamed statements, no session SET);
- pooled: through PgBouncer, `"off"`, LISTEN on the direct socket (`listen_url`).

Measured: `enqueue` (single `client.enqueue` calls in sequence, calls per second: one round
trip each) and `drain` (one worker with 25 slots runs `--jobs` no-op jobs enqueued beforehand,
handler starts per second of the worker's clock). Reported: the median rate of each setup, and
the median over rounds of its ratio to the same round's direct run. The machine is shared and
noisy: read the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import trio

import trioq
from bench.harness import open_database
from tests.pgbouncer import running_pgbouncer

SETUPS = ("direct", "off", "pooled")
CONCURRENCY = 25


async def one_run(target: tuple[str, str | None, str], schema: str, args: Any) -> dict[str, float]:
    conninfo, listen_url, mode = target
    app = trioq.App(
        conninfo, schema=schema, pool_size=4, prepared_statements=mode, listen_url=listen_url
    )
    started = 0
    done = trio.Event()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        nonlocal started
        started += 1
        if started == args.jobs:
            done.set()

    async with app.client(migrate=True) as client:
        begin = time.monotonic()
        for _ in range(args.enqueues):
            await client.enqueue("noop", None, queue="enqueued")
        enqueue_rate = args.enqueues / (time.monotonic() - begin)
        for first in range(0, args.jobs, 5000):
            await client.enqueue_many("noop", [None] * min(5000, args.jobs - first))
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(
                lambda task_status: app.run_worker(
                    ["default"], CONCURRENCY, grace_seconds=0, task_status=task_status
                )
            )
            begin = time.monotonic()
            with trio.fail_after(600):
                await done.wait()
            drain_rate = args.jobs / (time.monotonic() - begin)
            worker.request_drain()
    return {"enqueue": round(enqueue_rate), "drain": round(drain_rate)}


async def run(direct: str, pooled: str, args: Any) -> dict[str, Any]:
    targets: dict[str, tuple[str, str | None, str]] = {
        "direct": (direct, None, "auto"),
        "off": (direct, None, "off"),
        "pooled": (pooled, direct, "off"),
    }
    rounds: list[dict[str, dict[str, float]]] = []
    for repeat in range(args.repeats):
        order = SETUPS[repeat % 3 :] + SETUPS[: repeat % 3]  # each setup first once in three
        results = {}
        for setup in order:
            schema = f"bench_pooler_{repeat}_{setup}"
            results[setup] = await one_run(targets[setup], schema, args)
        rounds.append(results)
        print(json.dumps(results), flush=True)
    medians = {
        setup: {
            metric: statistics.median(r[setup][metric] for r in rounds)
            for metric in ("enqueue", "drain")
        }
        for setup in SETUPS
    }
    # Each round's ratio to its own direct run, then the median: the rounds are minutes apart
    # on a shared machine, and a pair measured back to back drifts less than the medians do.
    ratios = {
        setup: {
            metric: round(
                statistics.median(r[setup][metric] / r["direct"][metric] for r in rounds), 3
            )
            for metric in ("enqueue", "drain")
        }
        for setup in SETUPS
    }
    return {"jobs": args.jobs, "enqueues": args.enqueues, "medians": medians,
            "ratios_to_direct": ratios, "rounds": rounds}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=5000, help="no-op jobs per drain")
    parser.add_argument("--enqueues", type=int, default=1500, help="single enqueues per run")
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args()
    if args.repeats < 1 or args.jobs < 100 or args.enqueues < 100:
        parser.error("--repeats must be at least 1, --jobs and --enqueues at least 100")
    with open_database() as db:
        databases = {"postgres": "dbname=postgres"}
        with running_pgbouncer(db.cluster.conninfo, databases) as bouncer:
            result = trio.run(run, db.cluster.conninfo, bouncer.conninfo(), args)
    print(json.dumps({"medians": result["medians"], "ratios": result["ratios_to_direct"]}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
