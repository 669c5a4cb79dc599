"""Four `trioq worker` processes race for one queue with a global limit of 5 and a rate limit
of 50/s: the peak concurrency, from the stored start and finish times and sampled live, never
exceeds 5, and no window of 1 s holds more than 50 stored starts."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fault_app import QUEUE, build_app, create_exec_log
from tests.procs import fetch
from tests.races import busiest_window, peak, q, race

JOBS = 400
GLOBAL_LIMIT = 5
RATE = 50  # starts per second


def count(rows: list[tuple[Any, ...]]) -> int:
    return int(rows[0][0])


@pytest.mark.slow
async def test_four_worker_processes_never_exceed_a_global_limit_of_5_or_a_rate_of_50_per_s(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    # One job in four holds its slot 0.3 s (the global limit binds), the others 10 ms (the
    # rate binds): 400 jobs take at least 8 s at 50/s.
    payloads = [{"seconds": 0.3 if n % 4 == 0 else 0.01} for n in range(JOBS)]
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        await client.set_queue_limit(QUEUE, GLOBAL_LIMIT)
        await client.set_queue_rate(QUEUE, f"{RATE}/s")
        await client.enqueue_many("quick", payloads)
    running = q(pg_schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'running'")
    # 4 processes with 10 slots each: 40 seats race for 5.
    live = await race(pg_url, pg_schema, tmp_path, running, count, JOBS, within=120)
    stored: list[Any] = await fetch(
        pg_url, q(pg_schema, "SELECT started_at, finished_at, attempt FROM {s}.jobs")
    )
    assert {attempt for _, _, attempt in stored} == {1}  # one run each: no lease was lost
    executions = await fetch(
        pg_url,
        q(
            pg_schema,
            "SELECT min(db_ts) FILTER (WHERE event = 'start'), "
            "max(db_ts) FILTER (WHERE event = 'end') FROM {s}.exec_log GROUP BY job_id, attempt",
        ),
    )
    stored_peak = peak([(start, finish) for start, finish, _ in stored])
    handler_peak = peak(executions)
    window = busiest_window([start for start, _, _ in stored], datetime.timedelta(seconds=1))
    print(
        f"\nglobal limit {GLOBAL_LIMIT}, rate {RATE}/s, 4 processes: peak running {stored_peak} "
        f"(stored start/finish), {handler_peak} (handler start/end), {max(live)} (sampled "
        f"live, {len(live)} samples); most starts in a 1 s window {window}"
    )
    assert len(executions) == JOBS
    assert stored_peak == GLOBAL_LIMIT  # reached, never exceeded
    assert handler_peak <= GLOBAL_LIMIT
    assert max(live) <= GLOBAL_LIMIT and len(live) > 100
    assert RATE * 0.8 <= window <= RATE  # the rate binds and holds
