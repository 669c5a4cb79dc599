"""Four `trioq worker` processes race for three concurrency keys with a limit of 3 each (and
unkeyed jobs beside them): the peak per key, reconstructed from the stored start and finish
times and from the handlers' own log, and sampled live, never exceeds 3."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fault_app import build_app, create_exec_log
from tests.procs import fetch
from tests.races import Interval, peak, q, race

KEYS = ("tenant:a", "tenant:b", "tenant:c")
PER_KEY = 100
UNKEYED = 60
LIMIT = 3


def most_of_a_key(rows: list[tuple[Any, ...]]) -> int:
    """The most running jobs of any one key in a sample."""
    return max((int(n) for _, n in rows), default=0)


@pytest.mark.slow
async def test_four_worker_processes_never_run_more_than_3_of_a_key(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        await client.set_key_limit("tenant:*", LIMIT)
    total = len(KEYS) * PER_KEY + UNKEYED
    per_key = q(
        pg_schema,
        "SELECT concurrency_key, count(*) FROM {s}.jobs "
        "WHERE state = 'running' AND concurrency_key IS NOT NULL GROUP BY 1",
    )

    async def enqueue() -> None:
        async with app.client() as client:
            for key in KEYS:  # 20 ms to 110 ms each: the limit binds, slots are plentiful
                payloads = [{"seconds": 0.02 + 0.03 * (n % 4)} for n in range(PER_KEY)]
                await client.enqueue_many("quick", payloads, concurrency_key=key)
            await client.enqueue_many("quick", [{"seconds": 0.02}] * UNKEYED)

    # 4 processes with 10 slots each: 40 seats, 3 per key allowed.
    live = await race(pg_url, pg_schema, tmp_path, per_key, most_of_a_key, total, enqueue)
    stored: list[Any] = await fetch(
        pg_url,
        q(pg_schema, "SELECT concurrency_key, started_at, finished_at, attempt FROM {s}.jobs"),
    )
    assert {attempt for *_, attempt in stored} == {1}  # one run each: no lease was lost
    executions: list[Any] = await fetch(
        pg_url,
        q(
            pg_schema,
            "SELECT j.concurrency_key, min(l.db_ts) FILTER (WHERE l.event = 'start'), "
            "max(l.db_ts) FILTER (WHERE l.event = 'end') "
            "FROM {s}.exec_log l JOIN {s}.jobs j ON j.id = l.job_id "
            "GROUP BY j.id, j.concurrency_key, l.attempt",
        ),
    )
    stored_by_key: dict[str, list[Interval]] = collections.defaultdict(list)
    handler_by_key: dict[str, list[Interval]] = collections.defaultdict(list)
    for key, start, finish, _ in stored:
        stored_by_key[key or "-"].append((start, finish))
    for key, start, finish in executions:
        handler_by_key[key or "-"].append((start, finish))
    stored_peaks = {key: peak(stored_by_key[key]) for key in KEYS}
    handler_peaks = {key: peak(handler_by_key[key]) for key in KEYS}
    unkeyed_peak = peak(stored_by_key["-"])
    print(
        f"\nkey limit {LIMIT}, 4 processes x 10 slots: peak per key {stored_peaks} (stored "
        f"start/finish), {handler_peaks} (handler start/end), {max(live)} (sampled live, "
        f"{len(live)} samples); unkeyed peak {unkeyed_peak}"
    )
    assert len(executions) == total
    assert set(stored_peaks.values()) == {LIMIT}  # reached by every key, never exceeded
    assert max(handler_peaks.values()) <= LIMIT
    assert max(live) <= LIMIT and len(live) > 100
    assert unkeyed_peak > LIMIT  # unkeyed jobs are not held to any key's limit
