"""What the race tests (several `trioq worker` processes against one limit) share: the race
itself (four workers, a live sampler, every job completed), peaks of stored or logged
intervals, and the busiest window of starts."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

from tests.procs import wait_until, worker_group

SAMPLE_EVERY = 0.005  # the live sampler's cadence (it observes; nothing waits on it)

Interval = tuple[datetime.datetime, datetime.datetime]


def q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


def peak(intervals: list[Interval]) -> int:
    """The most intervals [start, finish) open at once (a finish at t closes before a start
    at t opens)."""
    events = sorted([(f, -1) for _, f in intervals] + [(s, 1) for s, _ in intervals])
    running = highest = 0
    for _, change in events:
        running += change
        highest = max(highest, running)
    return highest


def sample(
    pg_url: str,
    query: sql.Composed,
    stop: threading.Event,
    reduce: Callable[[list[tuple[Any, ...]]], int],
) -> list[int]:
    """`reduce(rows)` of `query`, one consistent snapshot per sample, until `stop` is set (run
    in a thread)."""
    samples = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while not stop.is_set():
            samples.append(reduce(conn.execute(query).fetchall()))
            time.sleep(SAMPLE_EVERY)
    return samples


def busiest_window(starts: list[datetime.datetime], window: datetime.timedelta) -> int:
    """The most starts in any window [t, t + window), t a start (where the maximum is)."""
    starts = sorted(starts)
    highest, first = 0, 0
    for last, at in enumerate(starts):
        while starts[first] <= at - window:
            first += 1
        highest = max(highest, last - first + 1)
    return highest


async def race(
    pg_url: str,
    pg_schema: str,
    tmp_path: Path,
    sampled: sql.Composed,
    reduce: Callable[[list[tuple[Any, ...]]], int],
    total: int,
    enqueue: Callable[[], Awaitable[None]] | None = None,
    within: float = 180,
) -> list[int]:
    """Four `trioq worker` processes of 10 slots each race until `total` jobs completed;
    `enqueue` (if given) runs once all four run, so they all race for every job. Returns the
    live samples: `reduce` of `sampled`, taken throughout."""
    stop = threading.Event()
    live: list[int] = []

    async def sample_live() -> None:
        live.extend(await trio.to_thread.run_sync(sample, pg_url, sampled, stop, reduce))

    async with worker_group(pg_url, pg_schema, tmp_path) as group, trio.open_nursery() as nursery:
        for n in range(4):
            await group.start(f"W{n}", concurrency=10, lease=10.0, poll=0.2)
        nursery.start_soon(sample_live)
        if enqueue is not None:
            await enqueue()
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'completed'"),
            None,
            lambda rows: rows[0][0] == total,
            within=within,
            what="every job completed",
        )
        stop.set()
    return live
