"""Forced interleavings of a send and a receive on real Postgres sessions: one side's
transaction is held open after it took the job row lock, the other is proven blocked on that
lock (pg_stat_activity.wait_event_type = 'Lock'), and no message or wake-up is lost whichever
side locked first (docs/workflows.md, "Messages", lock order)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from tests.support import blocked_on_a_lock, wait_until
from trioq._pg import Connection, connect
from trioq._pg.driver import open_pg_driver
from trioq._seam.driver import Driver, MessageSend
from trioq._seam.lease import Lease
from trioq._seam.workflow import Receive
from trioq._sql import queries
from trioq.testing.conformance import claim, enqueue, new_job, record


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[Driver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as pg_driver:
        await pg_driver.migrate()
        yield pg_driver


@pytest.fixture
async def session(pg_url: str) -> AsyncIterator[Connection]:
    conn = await connect(pg_url, application_name="trioq-test-interleaving")
    try:
        yield conn
    finally:
        await conn.close()


async def running_job(driver: Driver) -> Lease:
    await enqueue(driver, new_job())
    [job] = await claim(driver, 1)
    return job.lease


async def test_receive_that_locks_first_and_suspends_is_woken_by_the_blocked_send(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str
) -> None:
    lease = await running_job(driver)
    sent: list[object] = []
    params = {
        "id": lease.id,
        "attempt": lease.attempt,
        "lease_token": lease.lease_token,
        "position": 0,
        "topic": "go",
        "timeout_seconds": 3600.0,
        "deadline": None,
        "limit": 1000,
        "value_keys": [],
        "value_values": [],
    }
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, session.transaction():
            rows = await session.fetch(queries(pg_schema)["job_receive"], params)
            assert rows[0][0] == "waiting"

            async def send() -> None:
                sent.append(await driver.message_send(MessageSend(lease.id, "go", '"now"')))

            nursery.start_soon(send)
            await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
            assert not sent
            # committed: the sender goes on, sees the job waiting and wakes it
    assert (await record(driver, lease.id)).state == "ready"
    [woken] = await claim(driver, 1)
    outcome = await driver.job_receive(Receive(woken.lease, 0, "go", 3600.0))
    assert (outcome.state, outcome.messages) == ("received", ("now",))


async def test_send_that_locks_first_is_seen_by_the_blocked_receive(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str
) -> None:
    lease = await running_job(driver)
    outcomes: list[object] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, session.transaction():
            rows = await session.fetch(
                queries(pg_schema)["message_send"],
                {"id": lease.id, "topic": "go", "payload": '"early"'},
            )
            assert rows[0][0] == "running" and rows[0][1] is not None

            async def receive() -> None:
                outcomes.append(await driver.job_receive(Receive(lease, 0, "go", 3600.0)))

            nursery.start_soon(receive)
            await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
            assert not outcomes
    [outcome] = outcomes
    assert (outcome.state, outcome.messages) == ("received", ("early",))  # type: ignore[attr-defined]
    assert (await record(driver, lease.id)).state == "running"  # never suspended
