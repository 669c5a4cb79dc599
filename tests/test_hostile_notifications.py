"""Notifications are hints from anyone: PostgreSQL puts no privilege on NOTIFY, so any login
(the read-only dashboard role included) can send any payload on trioq's channels. Nothing sent
there may cancel a job nobody asked to cancel, or stop a worker or a client."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.support import Gate, make_app, running_worker, scalar
from trioq._core.channels import (
    CHANNEL_SHARDS,
    control_channel,
    job_id_of,
    job_ids_of,
    result_channel,
    schedules_channel,
)

GARBAGE = ("²", "١٢", "-1", "1e9", "", " 7", "9" * 40, "limits:?", "leader;", "a,²,3")


def notify_all(pg_url: str, pairs: list[tuple[str, str]]) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for channel, payload in pairs:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def test_a_notification_names_a_job_only_in_ascii_digits() -> None:
    assert [job_id_of(text) for text in ("12", "²", "١٢", "-1", "", "9" * 40)] == [
        12,
        None,
        None,
        None,
        None,
        None,
    ]
    assert job_ids_of("3,²,x,4") == [3, 4]


async def test_bare_ids_and_garbage_on_every_channel_cancel_nothing_and_stop_nothing(
    pg_url: str, pg_schema: str
) -> None:
    """Ten running jobs; their bare ids on the control channel and garbage on every channel
    (control, ready, result, schedules). Then one real cancel: only that job ends cancelled
    (its request is stored), the other nine finish, the worker and the client run on."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: Any) -> str:
        gate.enter()
        await gate.release.wait()
        return "done"

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("hold", [{}] * 10)
        async with running_worker(app, concurrency=10):
            with trio.fail_after(30):
                await gate.wait_entered(10)
                schema = pg_schema
                pairs = [(control_channel(schema), str(job.id)) for job in jobs]
                for payload in GARBAGE:
                    pairs.append((control_channel(schema), payload))
                    pairs.append((schedules_channel(schema), payload))
                    pairs += [(f"{schema}_ready_{n}", payload) for n in range(CHANNEL_SHARDS)]
                    pairs += [(result_channel(schema, job.id), payload) for job in jobs]
                async with trio.open_nursery() as nursery:
                    # Waiters on the result channels, so the client's listener gets them too.
                    for job in jobs[1:]:
                        nursery.start_soon(client.wait_result, job.id, 60)
                    await trio.to_thread.run_sync(notify_all, pg_url, pairs)
                    # The real cancel, after the hints on the same channel.
                    assert await client.cancel(jobs[0].id) == "running"
                    assert (await client.wait_final(jobs[0].id, 30)).state == "cancelled"
                    states = [(await client.get_job(job.id)).state for job in jobs[1:]]
                    assert states == ["running"] * 9, states
                    nursery.cancel_scope.cancel()
                gate.release.set()
                results = [await client.wait_result(job.id, 30) for job in jobs[1:]]
    assert results == ["done"] * 9


async def test_a_client_waiting_for_a_result_survives_garbage_on_its_result_channel(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    started, finish = trio.Event(), trio.Event()

    @app.task("slow")
    async def slow(ctx: trioq.Context, payload: Any) -> int:
        started.set()
        await finish.wait()
        return 7

    async with app.client(migrate=True) as client:
        job = await client.enqueue("slow", {})
        async with running_worker(app, concurrency=1):
            with trio.fail_after(30):
                await started.wait()
                async with trio.open_nursery() as nursery:
                    results: list[int] = []

                    async def wait() -> None:
                        results.append(await client.wait_result(job.id, 30))

                    nursery.start_soon(wait)
                    await trio.testing.wait_all_tasks_blocked()
                    channel = result_channel(pg_schema, job.id)
                    pairs = [(channel, payload) for payload in GARBAGE]
                    await trio.to_thread.run_sync(notify_all, pg_url, pairs)
                    finish.set()
    assert results == [7]


async def test_a_payload_too_deep_to_decode_fails_its_job_and_the_worker_goes_on(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop", max_attempts=1)
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "done"

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("noop", [None] * 20)
        deep = jobs[3].id
        # Written by SQL, past every Python-side check (as a SQL producer could).
        await scalar(
            pg_url,
            f"UPDATE {pg_schema}.job_rows_legacy"
            " SET payload = (repeat('[', 3000) || repeat(']', 3000))::jsonb"
            " WHERE id = %s RETURNING id",
            (deep,),
        )
        async with running_worker(app, concurrency=4):
            with trio.fail_after(30):
                with pytest.raises(trioq.JobFailed) as failed:
                    await client.wait_result(deep)
                for job in jobs:
                    if job.id != deep:
                        assert await client.wait_result(job.id) == "done"
    record = failed.value.job
    assert "PayloadError" in str(record.error) and "cannot be decoded" in str(record.error)
