"""Forced interleavings of the event and child-wait statements on real Postgres sessions.

Each test holds one side's transaction open at the exact point that matters, proves the other
side is blocked on a row lock (pg_stat_activity.wait_event_type = 'Lock'), then lets it go and
checks that no wake-up was lost, whichever side took the lock first (docs/workflows.md, "Lock
order").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import trio
from support import wait_until

from tests.support import blocked_on_a_lock
from trioq._pg import Connection, connect
from trioq._pg.driver import open_pg_driver
from trioq._seam.driver import Driver, EmitEvent
from trioq._seam.lease import Lease
from trioq._seam.workflow import Spawn, WaitChildren, WaitEvent
from trioq._sql import queries
from trioq.testing.conformance import claim, enqueue, new_job, record


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[Driver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as pg_driver:
        await pg_driver.migrate()
        yield pg_driver


@pytest.fixture
async def session(pg_url: str) -> AsyncIterator[Connection]:
    """A second session whose transaction the test holds open."""
    conn = await connect(pg_url, application_name="trioq-test-interleaving")
    try:
        yield conn
    finally:
        await conn.close()


async def running_job(driver: Driver) -> Lease:
    await enqueue(driver, new_job())
    [job] = await claim(driver, 1)
    return job.lease


def wait_params(lease: Lease, key: str) -> dict[str, object]:
    return {
        "id": lease.id,
        "attempt": lease.attempt,
        "lease_token": lease.lease_token,
        "position": 0,
        "key": key,
        "timeout_seconds": 3600.0,
        "deadline": None,
    }


async def test_wait_that_locks_the_event_first_is_woken_by_the_blocked_emit(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str
) -> None:
    """The waiter's registration holds the event row; the emit blocks on it, and once the
    waiter commits `waiting`, the emit's later statement wakes it."""
    lease = await running_job(driver)
    emitted: list[object] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, session.transaction():
            rows = await session.fetch(
                queries(pg_schema)["job_wait_event"], wait_params(lease, "approval:1")
            )
            assert rows[0][0] == "waiting"

            async def emit() -> None:
                emitted.append(await driver.event_emit(EmitEvent("approval:1", '{"ok":1}')))

            nursery.start_soon(emit)
            await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
            assert not emitted
            # committed: the emitter goes on
    [outcome] = emitted
    assert (outcome.first, outcome.woken) == (True, 1)  # type: ignore[attr-defined]
    job = await record(driver, lease.id)
    assert job.state == "ready"


async def test_emit_that_locks_the_event_first_is_seen_by_the_blocked_wait(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str
) -> None:
    """The emit (inside a caller's transaction) holds the event row; the wait blocks on it and,
    once the emit commits, returns the payload instead of suspending."""
    lease = await running_job(driver)
    outcomes: list[object] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, session.transaction():
            rows = await session.fetch(
                queries(pg_schema)["event_emit"],
                {"key": "approval:2", "payload": json.dumps({"ok": 2})},
            )
            assert tuple(rows[0]) == (True, 0)

            async def wait() -> None:
                outcomes.append(
                    await driver.job_wait_event(WaitEvent(lease, 0, "approval:2", 3600.0))
                )

            nursery.start_soon(wait)
            await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
            assert not outcomes
    [outcome] = outcomes
    assert (outcome.state, outcome.payload) == ("received", {"ok": 2})  # type: ignore[attr-defined]
    job = await record(driver, lease.id)
    assert job.state == "running"


async def test_child_finishing_during_the_parents_suspension_is_never_missed(
    driver: Driver, session: Connection, observer: Connection, pg_schema: str
) -> None:
    """The child's completion holds the parent row (counting it) while the parent's wait
    statement, whose snapshot still saw the child running, tries to suspend: the parent does
    not suspend ('changed'), and asking again returns the child's result."""
    parent = await running_job(driver)
    spawned = (await driver.job_spawn_many([Spawn(parent, 0, new_job(7))]))[0]
    assert spawned.child_id is not None
    [child] = await claim(driver, 1)
    assert child.id == spawned.child_id
    # Hold the parent row the way a child's final statement does, then complete the child in
    # that same transaction.
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            outcomes: list[object] = []
            async with session.transaction():
                # The child's run ends and its outcome is appended (migrations 0047, 0049).
                await session.execute(
                    f'DELETE FROM "{pg_schema}".job_runs WHERE job_id = %s', [child.id]
                )
                await session.execute(
                    f'INSERT INTO "{pg_schema}".job_outcomes (job_id, state, result, attempt,'
                    " executions, finished_at, queue)"
                    " SELECT id, 'completed', '7', 1, 1, now(), queue"
                    f' FROM "{pg_schema}".job_rows WHERE id = %s',
                    [child.id],
                )
                await session.execute(
                    f'UPDATE "{pg_schema}".job_rows '
                    "SET children_settled = children_settled + 1 WHERE id = %s",
                    [parent.id],
                )

                async def wait() -> None:
                    outcomes.append(
                        await driver.job_wait_children(WaitChildren(parent, 1, (child.id,)))
                    )

                nursery.start_soon(wait)
                await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
    [outcome] = outcomes
    assert outcome.state == "changed"  # type: ignore[attr-defined]
    again = await driver.job_wait_children(WaitChildren(parent, 1, (child.id,)))
    assert again.state == "done"
    assert [(c.id, c.state, c.result) for c in again.children] == [(child.id, "completed", 7)]
    assert (await record(driver, parent.id)).state == "running"
