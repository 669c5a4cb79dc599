"""Shared leadership on PostgreSQL: one elected worker per schema runs maintenance (and the
scheduler); the others only stand for election. Each worker here has a driver (pools,
statement counts) of its own, like a separate process."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import trioq
from tests.support import force_running, in_thread, make_app, scalar
from trioq._pg.driver import open_pg_driver
from trioq._runtime.services.worker import Worker, WorkerConfig
from trioq._seam.services import MaintenanceReport

FAST = {"poll_interval": 0.1, "lease_seconds": 1.5, "maintenance_interval": 0.1}


@asynccontextmanager
async def pg_worker(app: trioq.App, pg_url: str, **config: Any) -> AsyncIterator[Worker]:
    """A worker on a driver of its own; drained (grace 0) when the block ends."""
    async with (
        open_pg_driver(pg_url, app.schema, pool_size=3) as driver,
        trio.open_nursery() as nursery,
    ):
        worker = Worker(
            driver=driver,
            tasks=dict(app.tasks),
            config=WorkerConfig(grace_seconds=0, write_timeout=10, **{**FAST, **config}),
        )
        await nursery.start(worker.run)
        try:
            yield worker
        finally:
            worker.request_drain()


class Passes:
    """Counts a worker's maintenance passes; `wait(n)` until it has made `n` more."""

    def __init__(self, worker: Worker) -> None:
        self.count = 0
        self._changed = trio.Event()
        worker.maintenance.on_pass = self._on_pass

    def _on_pass(self, report: MaintenanceReport) -> None:
        self.count += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, more: int) -> None:
        target = self.count + more
        while self.count < target:
            await self._changed.wait()


def calls(worker: Worker, name: str) -> int:
    driver = worker.driver
    return driver.statistics().calls.get(name, 0)


async def seat_holder(pg_url: str, schema: str) -> uuid.UUID | None:
    holder: uuid.UUID | None = await scalar(pg_url, f"SELECT leader_id FROM {schema}.leader")
    return holder


async def test_only_the_elected_leader_sends_maintenance_statements(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True), pg_worker(app, pg_url) as leader:
        passes = Passes(leader)
        with trio.fail_after(10):
            await passes.wait(1)  # the first worker took the free seat
        async with pg_worker(app, pg_url) as follower:
            with trio.fail_after(10):
                await passes.wait(10)  # ten maintenance intervals with both standing
            assert follower.leadership.statistics().elections >= 3
            assert calls(follower, "maintenance_pass") == 0
            for scheduler_statement in ("schedule_next_due", "scheduler_lead"):
                assert calls(follower, scheduler_statement) == 0
            assert (leader.statistics().leader, follower.statistics().leader) == (True, False)
            assert calls(leader, "leader_elect") == 1  # its first; its passes keep the seat
            assert await seat_holder(pg_url, pg_schema) == leader.worker_id


async def run_pg_worker(
    app: trioq.App,
    pg_url: str,
    finished: trio.Event,
    *,
    task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a worker on a driver of its own until drained; `finished` is set once it is gone."""
    try:
        async with open_pg_driver(pg_url, app.schema, pool_size=3) as driver:
            worker = Worker(
                driver=driver,
                tasks=dict(app.tasks),
                config=WorkerConfig(grace_seconds=0, write_timeout=10, **FAST),
            )
            await worker.run(task_status=task_status)
    finally:
        finished.set()


async def test_drained_leader_hands_over_and_the_new_leader_recovers_an_expired_lease(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("orphan")
    async def orphan(ctx: trioq.Context, payload: object) -> int:
        return ctx.job.attempt

    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        first_gone = trio.Event()
        first: Worker = await nursery.start(run_pg_worker, app, pg_url, first_gone)
        with trio.fail_after(10):
            await Passes(first).wait(1)  # the first worker took the free seat
        second: Worker = await nursery.start(run_pg_worker, app, pg_url, trio.Event())
        second_passes = Passes(second)
        first.request_drain()
        with trio.fail_after(10):
            await first_gone.wait()
            await second_passes.wait(1)  # the second worker leads: its maintenance runs
        assert await seat_holder(pg_url, pg_schema) == second.worker_id
        # Due in an hour, so the running worker cannot claim (or finish) it before it is put
        # in the crash state below; that state makes it due now.
        job = await client.enqueue("orphan", {}, delay=3600)
        # The crash state: running under a dead worker, its lease expired.
        await in_thread(
            force_running,
            pg_url,
            pg_schema,
            [job.id],
            expires_in=datetime.timedelta(seconds=-1),
            worker_id=uuid.uuid4(),
            started_ago=datetime.timedelta(0),
            due_now=True,
        )
        with trio.fail_after(10):
            record = await client.wait_final(job.id)
        attempts = await client.attempts(job.id)
        second.request_drain()
    assert (record.state, record.result, record.worker_id) == ("completed", 2, second.worker_id)
    assert [a.outcome for a in attempts] == ["lost"]
    assert second_passes.count >= 1 and first.leadership.statistics().terms == 1


async def test_seat_of_a_dead_leader_is_taken_after_its_ttl_and_its_expired_leases_recovered(
    pg_url: str, pg_schema: str
) -> None:
    """The crash state, built in SQL: the seat held by a worker that died (no resignation),
    expiring in 1 s, and a job running under it whose lease has expired. A new worker sweeps
    nothing until the seat's TTL has run out, then takes it and recovers the job."""
    app = make_app(pg_url, pg_schema)

    @app.task("orphan")
    async def orphan(ctx: trioq.Context, payload: object) -> int:
        return ctx.job.attempt

    async with app.client(migrate=True) as client:
        job = await client.enqueue("orphan", {})
        dead = uuid.uuid4()
        expires_at = await scalar(
            pg_url,
            f"INSERT INTO {pg_schema}.leader (leader_id, scheduler, elected_at, expires_at) "
            "VALUES (%s, true, now(), now() + interval '1 second') RETURNING expires_at",
            (dead,),
        )
        await in_thread(
            force_running,
            pg_url,
            pg_schema,
            [job.id],
            expires_in=datetime.timedelta(seconds=-1),
            worker_id=dead,
            started_ago=datetime.timedelta(0),
        )
        async with pg_worker(app, pg_url) as worker:
            with trio.fail_after(10):
                record = await client.wait_final(job.id)
            assert worker.leadership.is_leader
        [lost] = await client.attempts(job.id)
    assert (record.state, record.result) == ("completed", 2)
    assert lost.outcome == "lost" and lost.finished_at >= expires_at


async def test_worker_running_the_scheduler_takes_the_seat_from_one_that_does_not(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True), pg_worker(app, pg_url, run_scheduler=False) as plain:
        passes = Passes(plain)
        with trio.fail_after(10):
            await passes.wait(1)  # alone, it leads (maintenance) without the scheduler
        assert plain.leadership.is_leader
        taken, lost = trio.Event(), trio.Event()
        plain.leadership.on_change = lambda leader: None if leader else lost.set()
        async with pg_worker(app, pg_url) as scheduling:
            scheduling.leadership.on_change = lambda leader: taken.set() if leader else None
            with trio.fail_after(10):
                await taken.wait()
                await lost.wait()  # the displaced leader's next pass found the seat taken
            assert await seat_holder(pg_url, pg_schema) == scheduling.worker_id
            assert not plain.leadership.is_leader
            assert calls(plain, "scheduler_lead") == calls(plain, "schedule_next_due") == 0
