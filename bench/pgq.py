"""The peer: PgQueuer (the fastest Python queue on PostgreSQL we know of), same scenarios.

Every call runs in a subprocess of its own (`python -m bench.pgq COMMAND ...`) with
`PGQUEUER_SCHEMA` naming the scenario's schema, so PgQueuer's objects live next to trioq's in a
schema the harness drops afterwards, and its imports stay out of the harness.

- `install`: PgQueuer's own schema objects (`Queries.install`).
- `worker`: a QueueManager with batch size = slots, PgQueuer's defaults otherwise, except that
  the log aggregation task is off (so every completion stays countable in `pgqueuer_log`).
  `probe` handlers record (job id, time.time()) at start; they are written to `--record` when
  the process gets SIGTERM.
- `enqueue-committed`, `enqueue-singles`, `enqueue-bulk`, `enqueue-paced`: print one JSON value.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import asyncpg

COMPLETED_SQL = "SELECT count(*) FROM {schema}.pgqueuer_log WHERE status = 'successful'"
LAST_FINISHED_SQL = (
    "SELECT extract(epoch FROM max(created))::float8 FROM {schema}.pgqueuer_log"
    " WHERE status = 'successful'"
)


def _queries(conn: asyncpg.Connection):  # type: ignore[no-untyped-def]
    from pgqueuer import AsyncpgDriver, Queries

    return Queries(AsyncpgDriver(conn))


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    await _queries(conn).install(create_schema=False)
    await conn.close()


async def worker(dsn: str, batch: int, record: Path | None) -> None:
    from pgqueuer import Job, QueueManager

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(_queries(conn))
    starts: list[tuple[int, float]] = []

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @qm.entrypoint("sleep_1ms")
    async def sleep_1ms(job: Job) -> None:
        await asyncio.sleep(0.001)

    @qm.entrypoint("probe")
    async def probe(job: Job) -> None:
        starts.append((int(job.id), time.time()))

    def stop() -> None:
        if record is not None:
            record.write_text(json.dumps(starts))
        qm.shutdown.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    print("ready", flush=True)
    await qm.run(batch_size=batch, log_aggregation_interval=timedelta(0))


async def enqueue_committed(dsn: str, task: str, count: int) -> float:
    conn = await asyncpg.connect(dsn)
    queries = _queries(conn)
    await queries.enqueue([task] * count, [None] * count, [0] * count)
    committed = time.time()
    await conn.close()
    return committed


async def enqueue_singles(dsn: str, seconds: float) -> float:
    conn = await asyncpg.connect(dsn)
    queries = _queries(conn)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        await queries.enqueue("noop", None)
        count += 1
    await conn.close()
    return count / elapsed


async def enqueue_bulk(dsn: str, rows: int) -> float:
    conn = await asyncpg.connect(dsn)
    queries = _queries(conn)
    await queries.enqueue("noop", None)  # warm: PgQueuer prepares on first use
    start = time.perf_counter()
    await queries.enqueue(["noop"] * rows, [None] * rows, [0] * rows)
    elapsed = time.perf_counter() - start
    await conn.close()
    return rows / elapsed


async def enqueue_paced(dsn: str, seconds: float, every: float) -> dict[int, float]:
    conn = await asyncpg.connect(dsn)
    queries = _queries(conn)
    committed: dict[int, float] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    for tick in range(round(seconds / every)):
        await asyncio.sleep(max(0.0, start + tick * every - loop.time()))
        called = time.time()  # the enqueue call is part of the pickup latency
        ids = await queries.enqueue("probe", None)
        committed[int(ids[0])] = called
    await conn.close()
    return committed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pgq", description=__doc__)
    parser.add_argument("command")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--task", default="noop")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--every", type=float, default=0.02)
    parser.add_argument("--record", type=Path, default=None)
    args = parser.parse_args(argv)
    if not os.environ.get("PGQUEUER_SCHEMA"):
        parser.error("PGQUEUER_SCHEMA must name the schema")
    command = args.command
    if command == "install":
        asyncio.run(install(args.dsn))
        return 0
    if command == "worker":
        asyncio.run(worker(args.dsn, args.batch, args.record))
        return 0
    calls = {
        "enqueue-committed": lambda: enqueue_committed(args.dsn, args.task, args.count),
        "enqueue-singles": lambda: enqueue_singles(args.dsn, args.seconds),
        "enqueue-bulk": lambda: enqueue_bulk(args.dsn, args.count),
        "enqueue-paced": lambda: enqueue_paced(args.dsn, args.seconds, args.every),
    }
    if command not in calls:
        parser.error(f"unknown command {command!r}")
    print(json.dumps(asyncio.run(calls[command]())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
