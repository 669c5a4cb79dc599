"""The second peer: awa (`awa-pg`, its Python worker on its Rust runtime), same drains.

awa keeps its objects in its own schema, `awa` (not configurable): `reset` drops it and
migrates a fresh one with awa's queue storage active (its segmented ready rings, append-only
claims and receipts: the layout trioq's storage work measures itself against). Every call runs
in a subprocess of its own (`python -m bench.awa_peer COMMAND --dsn DSN ...`), so awa's imports
stay out of the harness.

- `reset`: drop the `awa` schema, migrate it, install and activate queue storage.
- `worker`: an `AsyncClient` serving the `noop` kind on queue `default` with `--concurrency`
  slots (awa's defaults otherwise); prints `ready` once started, drains on SIGTERM.
- `enqueue-committed`: `--count` noop jobs in one `enqueue_many_copy` (committed when it
  returns); prints the time it returned.

Completions: awa records a completion in a receipt batch (`receipt_completion_batches`,
`completed_count` jobs each) and later folds pruned batches into `queue_terminal_rollups`
(`pruned_completed_count`); the count is the two together. Neither keeps a per-job finish time
once rotated, so a drain's end is when the harness saw the last completion (its 50 ms poll at
most late, as for trioq's `keep=False` task).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import time

COMPLETED_SQL = (
    "SELECT coalesce((SELECT sum(completed_count) FROM awa.receipt_completion_batches), 0)"
    " + coalesce((SELECT sum(pruned_completed_count) FROM awa.queue_terminal_rollups), 0)"
)
LAST_FINISHED_SQL = "SELECT extract(epoch FROM clock_timestamp())::float8"
QUEUE = "default"


@dataclasses.dataclass
class Noop:
    n: int


async def reset(dsn: str) -> None:
    import awa
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS awa CASCADE")
    client = awa.AsyncClient(dsn)
    try:
        await client.migrate()
        await client.install_queue_storage()
    finally:
        await client.close()


async def worker(dsn: str, concurrency: int) -> None:
    import awa

    client = awa.AsyncClient(dsn, max_connections=concurrency + 5)

    @client.task(Noop, kind="noop", queue=QUEUE)
    async def noop(job: object) -> None:
        return None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await client.start([(QUEUE, concurrency)])
    print("ready", flush=True)
    await stop.wait()
    await client.shutdown(timeout_ms=10_000)
    await client.close()


async def enqueue_committed(dsn: str, count: int) -> float:
    import awa

    client = awa.AsyncClient(dsn)
    try:
        await client.enqueue_many_copy([Noop(i) for i in range(count)], kind="noop", queue=QUEUE)
        return time.time()
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("reset", "worker", "enqueue-committed"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--count", type=int, default=0)
    args = parser.parse_args()
    if args.command == "reset":
        asyncio.run(reset(args.dsn))
    elif args.command == "worker":
        asyncio.run(worker(args.dsn, args.concurrency))
    else:
        print(asyncio.run(enqueue_committed(args.dsn, args.count)), flush=True)


if __name__ == "__main__":
    main()
