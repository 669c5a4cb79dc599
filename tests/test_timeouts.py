"""`@app.task(timeout=...)`: the handler is cancelled at the limit, the attempt fails with an
error naming it, and the retry policy applies (virtual time on the memory driver, then once on
PostgreSQL)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver


def timed_app(schema: str, database_url: str | None = None) -> tuple[trioq.App, list[str]]:
    app = trioq.App(database_url=database_url, schema=schema)
    seen: list[str] = []

    @app.task("slow", timeout=5, max_attempts=3, retry=trioq.RetryPolicy(base_seconds=2, jitter=0))
    async def slow(ctx: trioq.Context, payload: object) -> str:
        seen.append(f"start {ctx.job.attempt}")
        try:
            if ctx.job.attempt < 3:
                await trio.sleep(3600)
            return "third time"
        except trio.Cancelled:
            seen.append(f"cancelled {ctx.job.attempt}")
            raise

    return app, seen


async def test_a_handler_past_its_timeout_is_cancelled_and_retried_under_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, seen = timed_app("timeouts")
    async with app.client(driver=MemoryDriver()) as client, running_worker(app, ["default"]):
        job = await client.enqueue("slow", {})
        started = trio.current_time()
        assert await client.wait_result(job.id, timeout=600) == "third time"
        elapsed = trio.current_time() - started
        attempts = await client.driver.job_attempts(job.id)
    assert seen == ["start 1", "cancelled 1", "start 2", "cancelled 2", "start 3"]
    assert [(a.outcome, a.error_type) for a in attempts] == [
        ("retried", "builtins.TimeoutError"),
        ("retried", "builtins.TimeoutError"),
    ]  # the third attempt completed (a completion writes no attempts row)
    assert attempts[0].error_message == "task 'slow' exceeded its 5s timeout"
    # Two 5 s timeouts and the retry policy's 2 s and 4 s backoffs, never the hour-long sleep.
    assert 15 <= elapsed < 60  # (less the claim's small lookahead)


async def test_the_timeout_starts_with_the_handler_not_with_an_early_claim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job due within the claim's lookahead is claimed early and held until its run_at: the
    hold is not the handler's time. A handler that ends 0.1 s inside its timeout completes,
    however long its job was held (before, a retried attempt of `timeout=3` held for 0.13 s
    failed after running 2.87 s)."""
    app = trioq.App(schema="timeouts")

    @app.task("tight", timeout=3, max_attempts=1)
    async def tight(ctx: trioq.Context, payload: object) -> str:
        await trio.sleep(2.9)
        return "in time"

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, ["default"]):
        job = await client.enqueue("tight", {}, delay=0.2)
        assert await client.wait_result(job.id, timeout=60) == "in time"
        record = await client.get_job(job.id)
    assert record.started_at is not None and record.started_at == record.run_at  # it was held


async def test_a_timeout_fails_the_attempt_on_postgres(pg_url: str, pg_schema: str) -> None:
    app = trioq.App(database_url=pg_url, schema=pg_schema)

    @app.task("slow", timeout=0.2, max_attempts=1)
    async def slow(ctx: trioq.Context, payload: object) -> None:
        await trio.sleep(3600)

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("slow", {})
        with pytest.raises(trioq.JobFailed) as failed:
            await client.wait_result(job.id, timeout=30)
        [attempt] = await client.driver.job_attempts(job.id)
    assert (attempt.outcome, attempt.error_type) == ("failed", "builtins.TimeoutError")
    assert attempt.error_message == "task 'slow' exceeded its 0.2s timeout"
    assert "exceeded its 0.2s timeout" in str(failed.value)
