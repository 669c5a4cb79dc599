"""Result notifications only for jobs somebody waits for (queries.sql, job_result_watch).

The forced interleavings hold one side's transaction open at the point that matters, prove the
other side blocked on the job's run (migration 0049: a completion writes the run and the
outcome, never the record; the registration's second statement writes the run), then let it
go: whichever of the registration and the fenced completion takes the run first, the waiter is
told (a notification) or sees the final state (its read). Then every waiter path, with its poll
pushed out of reach, so that only a notification can wake it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import trioq
import trioq.client
import trioq.producer.shared
from tests.support import Gate, blocked_on_a_lock, make_app, running_worker, scalar, wait_until
from trioq._core.channels import result_channel
from trioq._pg import Connection, connect
from trioq._pg.driver import complete_plain_params, open_pg_driver
from trioq._seam.driver import Driver, Settlement
from trioq._seam.lease import Lease
from trioq._sql import queries
from trioq.producer import AsyncProducer, SyncProducer
from trioq.testing.conformance import NotificationRecorder, claim, enqueue, new_job, record
from trioq.testing.conformance.harness import QUEUE


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[Driver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as pg_driver:
        await pg_driver.migrate()
        yield pg_driver


@pytest.fixture
async def session(pg_url: str) -> AsyncIterator[Connection]:
    """A second session whose transaction the test holds open."""
    conn = await connect(pg_url, application_name="trioq-test-result-watch")
    try:
        yield conn
    finally:
        await conn.close()


async def watched(pg_url: str, pg_schema: str, job_id: int) -> bool:
    query = f"SELECT result_watched FROM {pg_schema}.jobs WHERE id = %s"
    return bool(await scalar(pg_url, query, (job_id,)))


@pytest.mark.parametrize("plain", [True, False], ids=["job_complete_plain", "full_settle"])
async def test_a_watch_that_holds_the_run_first_is_notified_by_the_blocked_completion(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str, plain: bool
) -> None:
    """The registration has flagged the record, and its second statement holds the running
    job's run; the completer's flush (either statement) blocks on it and, once the
    registration commits, ends the run with the flag set and notifies."""
    await enqueue(driver, new_job())
    [job] = await claim(driver, 1)
    recorder = NotificationRecorder()
    channel = result_channel(pg_schema, job.id)
    completed: list[Any] = []
    with trio.fail_after(20):
        async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
            await listener.listen(channel)
            await session.fetch(queries(pg_schema)["job_result_watch"], {"id": job.id})
            async with trio.open_nursery() as nursery, session.transaction():
                await session.fetch(queries(pg_schema)["job_result_watch_run"], {"id": job.id})

                async def flush() -> None:
                    completed.append(await driver.job_settle_many(flush_of(job.lease, plain)))

                nursery.start_soon(flush)
                await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
                assert not completed
                # committed here: the flush goes on
            await recorder.wait_for_ids(channel, {job.id})
    assert (await record(driver, job.id)).state == "completed"
    assert driver.statistics().calls.get("job_complete_plain", 0) == int(plain)


async def test_a_completion_that_holds_the_run_first_is_seen_by_the_blocked_watch(
    driver: Driver, session: Connection, observer: Connection, pg_url: str, pg_schema: str
) -> None:
    """The flush (inside a transaction held open) has ended the run and appended the outcome;
    the registration flags the record (the completion never locks it), then blocks on the run,
    then finds it gone and writes nothing more: the waiter's read that follows sees the final
    state, so no notification is needed."""
    await enqueue(driver, new_job())
    [job] = await claim(driver, 1)
    registered = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, session.transaction():
            params = complete_plain_params([Settlement(job.lease, "complete", result_json="7")])
            [row] = await session.fetch(queries(pg_schema)["job_complete_plain"], params)
            assert (list(row[0]), row[2]) == ([job.id], 0)  # not watched: no NOTIFY

            async def register() -> None:
                await driver.job_result_watch(job.id)
                registered.set()

            nursery.start_soon(register)
            await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
            assert not registered.is_set()
        await registered.wait()
    finished = await record(driver, job.id)
    assert (finished.state, finished.result) == ("completed", 7)
    runs = f"SELECT count(*) FROM {pg_schema}.job_runs WHERE job_id = %s"
    assert await scalar(pg_url, runs, (job.id,)) == 0


async def test_a_claim_that_skipped_a_row_a_watch_held_is_woken_again(
    driver: Driver, session: Connection, pg_schema: str
) -> None:
    """A job enqueued and waited for at once: the claim (SKIP LOCKED) passes over the row the
    registration holds, and the registration's commit wakes the queue for the next claim."""
    [job_id] = await enqueue(driver, new_job())
    [channel] = await driver.ready_channels([QUEUE])
    recorder = NotificationRecorder()
    with trio.fail_after(20):
        async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
            await listener.listen(channel)
            async with session.transaction():
                await session.fetch(queries(pg_schema)["job_result_watch"], {"id": job_id})
                assert await claim(driver, 1) == []  # skipped, not waited for
            await recorder.wait_for(channel, QUEUE)
    assert [job.id for job in await claim(driver, 1)] == [job_id]


def flush_of(lease: Lease, plain: bool) -> list[Settlement]:
    """The completer's flush completing `lease`: `plain` sends it as job_complete_plain,
    else as job_settle_many."""
    return [Settlement(lease, "complete", result_json=json.dumps(7), plain=plain)]


# --- every waiter path, woken by the notification alone --------------------------------------


@pytest.fixture
def no_result_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trioq.client, "RESULT_POLL_SECONDS", 600.0)
    monkeypatch.setattr(trioq.producer.shared, "RESULT_POLL_SECONDS", 600.0)


def gated_app(pg_url: str, pg_schema: str, gate: Gate) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task("gated")
    async def gated(ctx: trioq.Context, payload: Any) -> Any:
        gate.enter()
        await gate.release.wait()
        return payload

    return app


async def finish_once_watched(pg_url: str, pg_schema: str, job_id: int, gate: Gate) -> None:
    """Let the running handler return once a waiter has registered for its job."""
    await gate.wait_entered(1)
    await wait_until(lambda: watched(pg_url, pg_schema, job_id))
    gate.release.set()


async def test_client_wait_result_is_woken_by_the_notification_of_the_job_it_registered_for(
    pg_url: str, pg_schema: str, no_result_polls: None
) -> None:
    gate = Gate()
    app = gated_app(pg_url, pg_schema, gate)
    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("gated", {"n": 1})
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_once_watched, pg_url, pg_schema, job.id, gate)
                assert await client.wait_result(job.id, timeout=None) == {"n": 1}


async def test_get_value_wait_gives_up_when_the_job_it_registered_for_ends_without_the_key(
    pg_url: str, pg_schema: str, no_result_polls: None
) -> None:
    gate = Gate()
    app = gated_app(pg_url, pg_schema, gate)
    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("gated", None)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_once_watched, pg_url, pg_schema, job.id, gate)
                with pytest.raises(trioq.ValueNotSet, match="completed"):
                    await client.get_value(job.id, "progress", wait=600)


async def test_sync_producer_wait_result_is_woken_by_the_notification(
    pg_url: str, pg_schema: str, no_result_polls: None
) -> None:
    gate = Gate()
    app = gated_app(pg_url, pg_schema, gate)

    def wait(job_id: int) -> Any:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            return producer.wait_result(job_id, timeout=None)

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("gated", {"n": 2})
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_once_watched, pg_url, pg_schema, job.id, gate)
                assert await trio.to_thread.run_sync(wait, job.id) == {"n": 2}


async def test_async_producer_wait_result_is_woken_by_the_notification(
    pg_url: str, pg_schema: str, no_result_polls: None
) -> None:
    gate = Gate()
    app = gated_app(pg_url, pg_schema, gate)

    async def wait(job_id: int) -> Any:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            return await producer.wait_result(job_id, timeout=None)

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("gated", {"n": 3})
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_once_watched, pg_url, pg_schema, job.id, gate)
                result = await trio.to_thread.run_sync(asyncio.run, wait(job.id))
                assert result == {"n": 3}
