"""Found by the chaos soak (tests/soak, seed 2, jobs 279 and 731): `continue_as_new` commits,
the job is ready again, and the same worker's next claim round can take it before the old
execution has recorded its suspension. The claim loop then takes the old execution for a stale
attempt whose lease ran out: it logs "reclaimed ... while still running here" and cancels it as
lost, so the old handler unwinds with `trio.Cancelled` instead of the suspension. Nothing was lost
or run twice (the old execution's writes are fenced by its lease token), but the warning was
false and the handler's cleanup code saw a cancellation it did not get. Fixed: a run whose
ending statement is in flight (`Run.ending`) is left to its reply.

`wait_for_event` suspends in place the same way (its statement writes `waiting`), and an emit
right after it has the same window: the second test shows it."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import trio
import trio.testing

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver
from trioq._seam.workflow import ContinueAsNew, EventWaitOutcome, WaitEvent


class LateReplies(MemoryDriver):
    """The suspending statements commit at once and their replies arrive a second later: the
    worker's poll rounds run in between. `waiting` is set once a wait has committed."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = trio.Event()

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        state = await super().job_continue_as_new(params)
        await trio.sleep(1)
        return state

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome:
        outcome = await super().job_wait_event(params)
        self.waiting.set()
        await trio.sleep(1)
        return outcome


def reclaim_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "while still running" in r.getMessage()]


async def test_a_continued_execution_unwinds_as_suspended_when_its_worker_reclaims_the_job(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = trioq.App(schema="virtual")
    unwound: list[tuple[int, str]] = []

    @app.task("generations")
    async def generations(ctx: trioq.Context, payload: dict[str, int]) -> int:
        try:
            if payload["gen"] == 0:
                await ctx.continue_as_new({"gen": 1})
            return payload["gen"]
        except BaseException as exc:
            unwound.append((payload["gen"], type(exc).__name__))
            raise

    async with (
        app.client(driver=LateReplies()) as client,
        running_worker(app, poll_interval=0.1),
    ):
        job = await client.enqueue("generations", {"gen": 0})
        with trio.fail_after(60):
            assert await client.wait_result(job.id, timeout=None) == 1
    assert (unwound, reclaim_warnings(caplog)) == ([(0, "SuspendExecution")], [])


async def test_a_waiting_execution_unwinds_as_suspended_when_an_emit_wakes_it_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = trioq.App(schema="virtual")
    unwound: list[str] = []

    @app.task("waiter")
    async def waiter(ctx: trioq.Context, payload: Any) -> Any:
        try:
            return await ctx.wait_for_event("go", timeout=datetime.timedelta(minutes=5))
        except BaseException as exc:
            unwound.append(type(exc).__name__)
            raise

    driver = LateReplies()
    async with app.client(driver=driver) as client, running_worker(app, poll_interval=0.1):
        job = await client.enqueue("waiter", None)
        with trio.fail_after(60):
            await driver.waiting.wait()
            await client.emit_event("go", {"n": 1})  # within the wait's late reply
            assert await client.wait_result(job.id, timeout=None) == {"n": 1}
    assert (unwound, reclaim_warnings(caplog)) == (["SuspendExecution"], [])
