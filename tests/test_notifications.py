"""Poll-only mode (`notifications=False`) and the listener self-probe's fallback to polling."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app
from trioq._runtime.services.health import readiness
from trioq._runtime.services.worker import Worker, WorkerConfig


class DeafListenerDriver:
    """The real driver, but its listener's notifications never reach the worker: a LISTEN
    connection that is up and subscribed yet receives nothing (as behind a transaction pooler)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @contextlib.asynccontextmanager
    async def open_listener(
        self, on_notify: Callable[[str, str], None], on_reconnect: Callable[[], None]
    ) -> AsyncIterator[Any]:
        async with self._inner.open_listener(lambda channel, payload: None, on_reconnect) as lst:
            yield lst


def make(pg_url: str, pg_schema: str) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "done"

    return app


async def run_jobs(client: trioq.Client, n: int) -> list[Any]:
    jobs = await client.enqueue_many("noop", [None] * n)
    return [await client.wait_result(job.id) for job in jobs]


async def test_a_listener_that_receives_nothing_falls_back_to_polling_with_one_warning(
    pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make(pg_url, pg_schema)
    caplog.set_level(logging.WARNING, logger="trioq.worker")
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        config = WorkerConfig(poll_interval=0.2, grace_seconds=0, probe_timeout=0.5)
        worker = Worker(DeafListenerDriver(client.driver), dict(app.tasks), config)  # type: ignore[arg-type]
        await nursery.start(worker.run)
        with trio.fail_after(20):
            await worker._probe_done.wait()
            assert worker.statistics().listener_state == "polling"
            assert await run_jobs(client, 5) == ["done"] * 5  # picked up by the poll timer
        ready, body = readiness(worker)
        worker.request_drain()
    assert ready is True  # polling is a working pickup path: a note, not a failure
    assert body["checks"]["listener"] == "polling"  # type: ignore[index]
    warnings = [r for r in caplog.records if "received no notification" in r.getMessage()]
    assert len(warnings) == 1


async def test_a_working_listener_passes_its_self_probe(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        config = WorkerConfig(grace_seconds=0, probe_timeout=30)
        worker = Worker(client.driver, dict(app.tasks), config)
        await nursery.start(worker.run)
        with trio.fail_after(20):
            await worker._probe_done.wait()
        assert worker.statistics().listener_state == "ok"
        worker.request_drain()


async def test_poll_only_mode_opens_no_listener_and_still_runs_jobs(
    pg_url: str, pg_schema: str
) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        config = WorkerConfig(poll_interval=0.1, grace_seconds=0, notifications=False)
        worker = Worker(client.driver, dict(app.tasks), config)
        await nursery.start(worker.run)
        with trio.fail_after(20):
            assert await run_jobs(client, 5) == ["done"] * 5
        assert worker._listener is None
        assert worker.statistics().listener_state == "off"
        ready, body = readiness(worker)
        assert ready and body["checks"]["listener"] == "off"  # type: ignore[index]
        worker.request_drain()
