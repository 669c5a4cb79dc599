"""Partition keys on PostgreSQL: one running job per key, in order, without head-of-line
blocking, at the claim-statement level (PgDriver) and through a real worker."""

from __future__ import annotations

import collections
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.support import (
    end_stall,
    hold_stall,
    make_app,
    running_worker,
    sql_rows,
    stall_db_now_once,
    wait_stalled,
)
from trioq._pg.driver import PgDriver, _claimed_job, claim_params, open_pg_driver, settle_params
from trioq._pg.replies import ClaimedRow
from trioq._seam.driver import Claim, ClaimedJob, NewJob, Settlement
from trioq._sql import queries

WORKER = uuid.uuid4()


async def scalar_rows(pg_url: str, query: str) -> list[tuple[object, ...]]:
    return await trio.to_thread.run_sync(sql_rows, pg_url, query)


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=6) as opened:
        await opened.migrate()
        yield opened


def keyed(key: str | None, n: int = 1, delay: float | None = None) -> list[NewJob]:
    return [NewJob("q", "t", "{}", partition_key=key, delay_seconds=delay)] * n


async def claim(
    driver: PgDriver,
    limit: int = 25,
    completions: Sequence[ClaimedJob] = (),
    key_cursor: str = "",
    key_window: int = 200,
) -> list[ClaimedJob]:
    """Write `completions` (the completer's statement), then claim."""
    if completions:
        await driver.job_settle_many(
            [Settlement(job.lease, "complete", result_json="null") for job in completions]
        )
    result = await driver.job_claim(
        Claim(
            queue="q",
            tasks=("t",),
            limit=limit,
            lease_seconds=30,
            worker_id=WORKER,
            key_cursor=key_cursor,
            key_window=key_window,
        )
    )
    return list(result.claimed)


async def test_second_job_of_a_key_waits_for_the_first_and_runs_in_order(
    driver: PgDriver,
) -> None:
    inserted = await driver.job_insert_many(keyed("k", 3))
    first = await claim(driver)
    assert [job.id for job in first] == [inserted[0].id]
    assert await claim(driver) == []
    # Once the key's running job's outcome is written, the next claim takes the key's next job.
    second = await claim(driver, completions=first)
    assert [job.id for job in second] == [inserted[1].id]
    third = await claim(driver, completions=second)
    assert [job.id for job in third] == [inserted[2].id]


async def test_delayed_job_does_not_hold_its_key(driver: PgDriver) -> None:
    await driver.job_insert_many(keyed("k", delay=3600))
    due = await driver.job_insert_many(keyed("k"))
    assert [job.id for job in await claim(driver)] == [due[0].id]


async def test_retrying_job_does_not_hold_its_key(driver: PgDriver) -> None:
    first, second = await driver.job_insert_many(keyed("k", 2))
    [running] = await claim(driver)
    assert running.id == first.id
    retry = Settlement(running.lease, "retry", error_json='{"type": "E"}', delay_seconds=3600)
    await driver.job_settle_many([retry])
    assert [job.id for job in await claim(driver)] == [second.id]


async def test_deep_backlog_behind_one_busy_key_does_not_block_other_keys(
    driver: PgDriver,
) -> None:
    await driver.job_insert_many(keyed("big", 20_000))
    others = await driver.job_insert_many(
        [NewJob("q", "t", "{}", partition_key=f"k{i}") for i in range(30)] + keyed(None, 5)
    )
    first = await claim(driver, limit=10)
    assert {job.partition_key for job in first} >= {"big"}
    # "big" is running now: the next claims fill every slot from the other keys.
    second = await claim(driver, limit=40)
    assert "big" not in {job.partition_key for job in second}
    assert {job.id for job in first + second} >= {row.id for row in others}


async def test_keys_beyond_the_window_are_visited_round_robin(driver: PgDriver) -> None:
    await driver.job_insert_many(
        [NewJob("q", "t", "{}", partition_key=f"k{i:02}") for i in range(10)]
    )
    seen: list[str | None] = []
    cursor = ""
    for _ in range(4):
        result = await driver.job_claim(
            Claim(
                queue="q",
                tasks=("t",),
                limit=3,
                lease_seconds=30,
                worker_id=WORKER,
                key_cursor=cursor,
                key_window=3,
            )
        )
        seen += [job.partition_key for job in result.claimed]
        cursor = result.key_cursor or ""
    assert sorted(seen) == [f"k{i:02}" for i in range(10)]


async def test_racing_claimers_never_run_two_jobs_of_one_key(pg_url: str, pg_schema: str) -> None:
    async with open_pg_driver(pg_url, pg_schema, pool_size=8) as driver:
        await driver.migrate()
        await driver.job_insert_many(
            [NewJob("q", "t", "{}", partition_key=f"k{i % 5}") for i in range(100)]
        )
        order: dict[str, list[int]] = collections.defaultdict(list)
        violations: list[object] = []
        done = 0
        # The database is the judge: after every claim, no key may have two running rows.
        doubled = (
            f"SELECT partition_key, count(*) FROM {pg_schema}.jobs WHERE state = 'running' "
            "GROUP BY partition_key HAVING count(*) > 1"
        )

        async def claimer() -> None:
            nonlocal done
            held: list[ClaimedJob] = []
            while done < 100:
                claimed = await claim(driver, limit=2, completions=held)
                done += len(held)
                held = claimed
                for job in claimed:
                    order[job.partition_key or ""].append(job.id)
                violations.extend(await scalar_rows(pg_url, doubled))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(claimer)
    assert violations == []
    assert all(ids == sorted(ids) for ids in order.values())
    assert sum(len(ids) for ids in order.values()) == 100


async def test_long_partition_does_not_delay_other_keys_in_a_worker(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    long_started = trio.Event()
    release_long = trio.Event()
    finished: list[str] = []

    @app.task("work")
    async def work(ctx: trioq.Context, payload: dict[str, str]) -> None:
        if payload["kind"] == "long":
            long_started.set()
            await release_long.wait()
        finished.append(ctx.job.partition_key or "")

    async with app.client(migrate=True) as client:
        big = await client.enqueue_many(
            "work", [{"kind": "long"}, {"kind": "short"}], partition_key="big"
        )
        others = [
            await client.enqueue("work", {"kind": "short"}, partition_key=f"k{i}")
            for i in range(20)
        ]
        async with running_worker(app, concurrency=4, poll_interval=30):
            with trio.fail_after(20):
                await long_started.wait()
                for job in others:
                    await client.wait_result(job.id)
            assert "big" not in finished  # the long job still runs; big's second job waits
            release_long.set()
            with trio.fail_after(20):  # the key's next job starts without waiting for the poll
                first, second = [await client.wait_final(job.id) for job in big]
    assert first.finished_at is not None and second.started_at is not None
    assert second.started_at >= first.finished_at


def test_stale_head_failed_into_a_retry_is_not_claimed_by_a_slower_claimer(
    pg_url: str, pg_schema: str
) -> None:
    """Worker B takes its snapshot (head K1 of key k due), then stalls; meanwhile worker A claims
    K1, fails it into a one-hour retry and claims K2. When B finally locks K1, the lock's
    re-check of attempt and due time on the newest row version must refuse it: otherwise two
    jobs of k would run at once and K1 would run an hour early."""
    trio.run(_enqueue_two_keyed, pg_url, pg_schema)
    statements = queries(pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as setup:
        # db_now() stalls once in a session that asks for it: B's stall between snapshot and lock.
        stall_db_now_once(setup, pg_schema)

    def raw_claim(conn: psycopg.Connection[tuple[Any, ...]]) -> list[ClaimedJob]:
        params = claim_params(Claim("q", ("t",), 1, 30, uuid.uuid4(), key_window=200))
        rows = conn.execute(statements["job_claim"], params).fetchall()
        return [_claimed_job(row) for row in rows if row[ClaimedRow.id] is not None]

    def raw_retry(conn: psycopg.Connection[tuple[Any, ...]], job: ClaimedJob) -> None:
        retry = Settlement(job.lease, "retry", error_json='{"type": "E"}', delay_seconds=3600)
        conn.execute(statements["job_settle_many"], settle_params([retry]))

    claimed_by_b: list[list[ClaimedJob]] = []
    b_pid: queue.Queue[int] = queue.Queue()

    def worker_b() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT set_config('test.stall', 'on', false)")
            b_pid.put(conn.info.backend_pid)
            claimed_by_b.append(raw_claim(conn))

    with psycopg.connect(pg_url, autocommit=True) as a:
        hold_stall(a, pg_schema)  # B stays stalled until A is done below
        b = threading.Thread(target=worker_b)
        b.start()
        # Wait until B is inside its stalled statement (its snapshot is taken).
        wait_stalled(a, b_pid.get(timeout=30))
        [k1] = raw_claim(a)
        raw_retry(a, k1)  # the key is free once the retry is written
        [k2] = raw_claim(a)
        end_stall(a, pg_schema)
        b.join(timeout=30)
        assert not b.is_alive(), "B's claim did not return"
        running = a.execute(
            f"SELECT id FROM {pg_schema}.jobs WHERE state = 'running' ORDER BY id"
        ).fetchall()
    assert claimed_by_b == [[]]
    assert running == [(k2.id,)]


async def _enqueue_two_keyed(pg_url: str, pg_schema: str) -> None:
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        await driver.job_insert_many(keyed("k", 2))


async def test_free_slots_reach_keys_beyond_a_window_of_busy_keys_without_waiting_for_poll(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("t", queue="q")
    async def t(ctx: trioq.Context, payload: object) -> str | None:
        return ctx.job.partition_key

    async with app.client(migrate=True) as client:
        driver = client.driver
        # 210 keys whose head another worker runs (a long lease), each with a job waiting behind.
        await driver.job_insert_many(
            [NewJob("q", "t", "{}", partition_key=f"a{i:03}") for i in range(210)] * 2
        )
        held = await driver.job_claim(
            Claim(
                queue="q",
                tasks=("t",),
                limit=210,
                lease_seconds=600,
                worker_id=WORKER,
                key_window=1000,
            )
        )
        assert len(held.claimed) == 210
        free = await driver.job_insert_many(
            [NewJob("q", "t", "{}", partition_key=f"z{i}") for i in range(5)]
        )
        async with running_worker(app, ["q"], concurrency=5, poll_interval=60):
            with trio.fail_after(10):  # the first window (200 busy keys) holds nothing claimable
                results = [await client.wait_result(row.id) for row in free]
    assert results == [f"z{i}" for i in range(5)]
