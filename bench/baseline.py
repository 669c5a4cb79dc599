"""The raw baseline: plain asyncio + asyncpg, no trio, no trioq, on trioq's own jobs table.

`python -m bench.baseline worker ...` is the fastest a Python worker can go here: ONE loop that
claims a batch with one statement (the same FOR UPDATE SKIP LOCKED claim, over the same
`jobs_ready_idx`), runs the batch's handlers as asyncio tasks, and completes the batch with one
statement. It prints `ready` once connected, stops claiming after `--expect` completions and
then waits to be stopped (SIGTERM), so its CPU and memory can still be read.

With `--listen` it waits for trioq's ready notification when idle (the pickup-latency baseline);
without, it polls every 2 ms (only ever idle while the harness commits the backlog).

The enqueue functions are the raw counterparts of `client.enqueue` / `client.enqueue_many`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time

import asyncpg

IDLE_POLL_SECONDS = 0.002  # only while waiting for the harness to commit the backlog

# The WHERE clause must imply the predicate of trioq's ready index (jobs_ready_unkeyed_idx:
# state = 'ready' AND partition_key IS NULL), or the planner falls back to a sequential scan and
# sort of the whole backlog (5 ms instead of 0.4 ms per claim at 20,000 rows, measured).
CLAIM_SQL = """
WITH candidates AS MATERIALIZED (
    SELECT id FROM {schema}.jobs
    WHERE queue = $1 AND state = 'ready' AND partition_key IS NULL AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j
SET state = 'running', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
    lease_expires_at = now() + interval '30 seconds', started_at = now()
FROM candidates c
WHERE j.id = c.id
RETURNING j.id, j.task, j.payload, j.lease_token
"""

COMPLETE_SQL = """
UPDATE {schema}.jobs j
SET state = 'completed', result = d.result::jsonb, finished_at = now(),
    lease_token = NULL, lease_expires_at = NULL
FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS d(id, lease_token, result)
WHERE j.id = d.id AND j.lease_token = d.lease_token AND j.state = 'running'
"""

INSERT_SQL = """
INSERT INTO {schema}.jobs (queue, task, payload, run_at, created_at)
VALUES ($1, $2, $3::jsonb, now(), now())
RETURNING id
"""

INSERT_MANY_SQL = """
INSERT INTO {schema}.jobs (queue, task, payload, run_at, created_at)
SELECT $1, $2, p::jsonb, now(), now() FROM unnest($3::text[]) AS p
RETURNING id
"""


async def noop(payload: object) -> None:
    return None


async def probe(payload: object) -> float:
    return time.time()


async def sleep_100ms(payload: object) -> dict[str, float]:
    start = time.time()
    await asyncio.sleep(0.1)
    return {"start": start, "end": time.time()}


HANDLERS = {"noop": noop, "probe": probe, "sleep_100ms": sleep_100ms}


async def run_worker(
    dsn: str, schema: str, queue: str, batch: int, expect: int, listen: bool
) -> None:
    conn = await asyncpg.connect(dsn)
    claim = await conn.prepare(CLAIM_SQL.format(schema=schema))
    complete = await conn.prepare(COMPLETE_SQL.format(schema=schema))
    woken = asyncio.Event()
    if listen:  # trioq's ready channel for the queue: the same notification trioq gets
        channel = await conn.fetchval(f"SELECT {schema}.ready_channel($1)", queue)
        await conn.add_listener(channel, lambda *_: woken.set())
    print("ready", flush=True)
    done = 0
    while done < expect:
        woken.clear()
        rows = await claim.fetch(queue, batch)
        if not rows:
            await wait_for_work(woken, listen)
            continue
        results = await asyncio.gather(
            *(HANDLERS[row["task"]](json.loads(row["payload"])) for row in rows)
        )
        await complete.fetch(
            [row["id"] for row in rows],
            [row["lease_token"] for row in rows],
            [json.dumps(result) for result in results],
        )
        done += len(rows)
    # Stay alive (and silent) so the harness can read this process's CPU and peak RSS.
    await asyncio.Event().wait()


async def wait_for_work(woken: asyncio.Event, listen: bool) -> None:
    """A notification (or, as trioq's poll, 1 s) when listening; else a short sleep."""
    if not listen:
        await asyncio.sleep(IDLE_POLL_SECONDS)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(woken.wait(), 1.0)


async def enqueue_singles(dsn: str, schema: str, seconds: float) -> float:
    """Sequential one-row inserts for `seconds`; returns rows per second."""
    conn = await asyncpg.connect(dsn)
    insert = await conn.prepare(INSERT_SQL.format(schema=schema))
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        await insert.fetch("default", "noop", "{}")
        count += 1
    await conn.close()
    return count / elapsed


async def enqueue_bulk(dsn: str, schema: str, rows: int) -> float:
    """One multi-row insert of `rows` jobs; returns rows per second."""
    conn = await asyncpg.connect(dsn)
    insert = await conn.prepare(INSERT_MANY_SQL.format(schema=schema))
    payloads = ["{}"] * rows
    start = time.perf_counter()
    await insert.fetch("default", "noop", payloads)
    elapsed = time.perf_counter() - start
    await conn.close()
    return rows / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline", description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--queue", default="default")
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument(
        "--expect", type=int, required=True, help="stop claiming after this many jobs"
    )
    parser.add_argument(
        "--listen",
        action="store_true",
        help="when idle, wait for the ready notification instead of polling",
    )
    args = parser.parse_args(argv)
    asyncio.run(run_worker(args.dsn, args.schema, args.queue, args.batch, args.expect, args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
