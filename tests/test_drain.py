"""`trioq.testing.drain` finishes workflows: sleeps that came due, events, children, gathers.

Each scenario runs on the in-memory driver under `autojump_clock` (a durable hour passes with
`trio.sleep`) and on PostgreSQL (the hour passes with `SqlClock`, the database's own time).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker
from trioq.testing import MemoryDriver, SqlClock, drain, enqueued_jobs

HOUR = datetime.timedelta(hours=1)


def build_app(schema: str, url: str | None = None) -> trioq.App:
    app = trioq.App(url, schema=schema)

    @app.task("nap_then_fan_out")
    async def nap_then_fan_out(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        await ctx.sleep("nap", HOUR)
        children = [await ctx.spawn("square", {"n": n}) for n in range(1, 4)]
        return sum(await ctx.gather(*children))

    @app.task("square", queue="kids")
    async def square(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        return int(payload["n"]) ** 2

    @app.task("parent_of_one")
    async def parent_of_one(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        child = await ctx.spawn("square", {"n": 7})
        return int(await ctx.wait_result(child)) + 1

    @app.task("await_approval")
    async def await_approval(ctx: trioq.Context, payload: dict[str, Any]) -> Any:
        return await ctx.wait_for_event(
            f"approval:{payload['id']}", timeout=datetime.timedelta(days=1)
        )

    @app.task("approve", queue="kids")
    async def approve(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        await ctx.emit_event(f"approval:{payload['id']}", {"by": "ann"})

    return app


@attrs.frozen
class Backend:
    app: trioq.App
    client: trioq.Client
    advance: Callable[[float], Awaitable[None]]  # moves the driver's "now" forward


@contextlib.asynccontextmanager
async def on_memory() -> AsyncIterator[Backend]:
    app = build_app("drained")
    async with app.client(driver=MemoryDriver(schema="drained")) as client:
        yield Backend(app, client, trio.sleep)


@contextlib.asynccontextmanager
async def on_postgres(url: str, schema: str) -> AsyncIterator[Backend]:
    app = build_app(schema, url)
    async with app.client(migrate=True) as client:
        clock = await SqlClock.install(client.driver)
        yield Backend(app, client, clock.advance)


async def states(client: trioq.Client) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in await enqueued_jobs(client, states=None):
        found.setdefault(record.task, []).append(record.state)
    return found


async def leaves_a_sleep_alone_until_due_then_finishes_the_fan_out(
    backend: Backend,
) -> None:
    job = await backend.client.enqueue("nap_then_fan_out", {})
    first = await drain(backend.app)
    assert first.completed == ()
    assert await states(backend.client) == {"nap_then_fan_out": ["sleeping"]}

    await backend.advance(HOUR.total_seconds() + 1)
    second = await drain(backend.app)
    assert await states(backend.client) == {
        "nap_then_fan_out": ["completed"],
        "square": ["completed"] * 3,
    }
    assert len(second.completed) == 4 and job.id in second.completed
    assert await backend.client.wait_result(job.id, timeout=1) == 1 + 4 + 9


async def runs_a_child_on_another_queue_and_resumes_its_parent(
    backend: Backend,
) -> None:
    job = await backend.client.enqueue("parent_of_one", {})
    result = await drain(backend.app)
    assert await states(backend.client) == {
        "parent_of_one": ["completed"],
        "square": ["completed"],
    }
    assert job.id in result.completed
    assert await backend.client.wait_result(job.id, timeout=1) == 50


async def resumes_a_wait_whose_event_a_drained_job_emits(backend: Backend) -> None:
    waiter = await backend.client.enqueue("await_approval", {"id": 1})
    await backend.client.enqueue("approve", {"id": 1})
    await drain(backend.app)
    assert await states(backend.client) == {
        "await_approval": ["completed"],
        "approve": ["completed"],
    }
    assert await backend.client.wait_result(waiter.id, timeout=1) == {"by": "ann"}


async def leaves_a_wait_for_an_event_nobody_emitted_then_resumes_it(
    backend: Backend,
) -> None:
    waiter = await backend.client.enqueue("await_approval", {"id": 2})
    await drain(backend.app)
    assert await states(backend.client) == {"await_approval": ["waiting"]}

    outcome = await backend.client.emit_event("approval:2", {"by": "bob"})
    assert outcome.first and outcome.woken == 1
    result = await drain(backend.app)
    assert result.completed == (waiter.id,)
    assert await backend.client.wait_result(waiter.id, timeout=1) == {"by": "bob"}


async def leaves_a_parent_waiting_on_a_queue_it_does_not_drain(backend: Backend) -> None:
    job = await backend.client.enqueue("parent_of_one", {})
    first = await drain(backend.app, "default")  # returns: the child's queue is not drained
    assert first.completed == ()
    assert await states(backend.client) == {"parent_of_one": ["waiting"], "square": ["ready"]}
    second = await drain(backend.app, ["default", "kids"])
    assert len(second.completed) == 2
    assert await backend.client.wait_result(job.id, timeout=1) == 50


SCENARIOS: dict[str, Callable[[Backend], Awaitable[None]]] = {
    "sleep_then_gather": leaves_a_sleep_alone_until_due_then_finishes_the_fan_out,
    "child_on_another_queue": runs_a_child_on_another_queue_and_resumes_its_parent,
    "event_a_drained_job_emits": resumes_a_wait_whose_event_a_drained_job_emits,
    "event_emitted_between_drains": leaves_a_wait_for_an_event_nobody_emitted_then_resumes_it,
    "child_on_an_undrained_queue": leaves_a_parent_waiting_on_a_queue_it_does_not_drain,
}


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_drain_finishes_workflows_on_the_memory_driver(
    autojump_clock: trio.testing.MockClock, scenario: str
) -> None:
    async with on_memory() as backend:
        await SCENARIOS[scenario](backend)


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_drain_finishes_workflows_on_postgres(
    pg_url: str, pg_schema: str, scenario: str
) -> None:
    async with on_postgres(pg_url, pg_schema) as backend:
        await SCENARIOS[scenario](backend)


def periodic_app() -> trioq.App:
    app = trioq.App(schema="ticks")

    @app.periodic("every-minute", cron="* * * * *")
    @app.task("tick")
    async def tick(ctx: trioq.Context, payload: Any) -> None:
        return None

    @app.task("slow")
    async def slow(ctx: trioq.Context, payload: Any) -> None:
        await trio.sleep(90)  # virtual time: a minute boundary passes while it runs

    return app


@pytest.mark.parametrize("schedules", [False, True])
async def test_drain_fires_schedules_only_when_asked(
    autojump_clock: trio.testing.MockClock, schedules: bool
) -> None:
    app = periodic_app()
    async with app.client(driver=MemoryDriver(schema="ticks")) as client:
        await client.enqueue("slow", None)
        await drain(app, timeout=600, schedules=schedules)
        ticks = await enqueued_jobs(client, "tick", states=None)
        stored = await client.schedules()
    assert bool(ticks) is schedules
    assert [s.name for s in stored] == (["every-minute"] if schedules else [])


async def test_a_drain_names_the_jobs_it_releases_after_the_grace(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = trioq.App(schema="drain_names")
    started = trio.Event()

    @app.task("stuck")
    async def stuck(ctx: trioq.Context, payload: object) -> None:
        started.set()
        await trio.sleep_forever()

    async with app.client(driver=MemoryDriver()) as client:
        async with running_worker(app, ["default"], grace_seconds=5):
            job = await client.enqueue("stuck", {})
            with trio.fail_after(10):
                await started.wait()
        record = await client.get_job(job.id)
    assert record.state == "ready"  # released, its attempt given back
    [line] = [r.getMessage() for r in caplog.records if "drain grace" in r.getMessage()]
    assert f"job {job.id} (stuck)" in line and "5.0s drain grace are released" in line, line
