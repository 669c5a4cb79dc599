"""Plain `def` handlers run in a worker thread: a blocked one stalls nothing else, `ctx` works
from the thread through `ctx.call`, and cancellation is cooperative (`ctx.cancelled()`).

These run on the real clock (a thread's run is invisible to MockClock's autojump, which would
jump past it) and wait on events and counts only."""

from __future__ import annotations

import threading

import pytest
import trio

import trioq
from tests.support import running_worker
from trioq._memory import MemoryDriver
from trioq._seam.services import RenewalResult, RenewLeases


class RenewalCounting(MemoryDriver):
    """Sets `renewed_twice` once two renewals extended job 1's lease (the blocked one)."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals_of_first = 0
        self.renewed_twice = trio.Event()

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        result = await super().lease_renew_many(params)
        if any(row.id == 1 for row in result.leases):
            self.renewals_of_first += 1
            if self.renewals_of_first == 2:
                self.renewed_twice.set()
        return result


async def test_a_blocked_sync_handler_stalls_neither_claims_nor_renewals_nor_other_handlers() -> (
    None
):
    app = trioq.App(schema="threads")
    unblock = threading.Event()
    blocking = trio.Event()
    token = trio.lowlevel.current_trio_token()
    finished: list[int] = []
    all_finished = trio.Event()

    @app.task("blocking")
    def blocking_handler(ctx: trioq.Context, payload: object) -> str:
        token.run_sync_soon(blocking.set)
        # Blocks its thread: bounded, so a broken test cannot hang the suite.
        assert unblock.wait(timeout=30), "never unblocked"
        return threading.current_thread().name

    @app.task("quick")
    async def quick(ctx: trioq.Context, payload: dict[str, int]) -> None:
        finished.append(payload["n"])
        if len(finished) == 20:
            all_finished.set()

    async with (
        app.client(driver=(driver := RenewalCounting())) as client,
        running_worker(app, ["default"], concurrency=4, lease_seconds=0.6),
    ):
        job = await client.enqueue("blocking", {})
        with trio.fail_after(10):
            await blocking.wait()
        # Enqueued after the thread blocked: claimed and run by the loop meanwhile.
        await client.enqueue_many("quick", [{"n": n} for n in range(20)])
        with trio.fail_after(20):
            await all_finished.wait()
            await driver.renewed_twice.wait()
        assert not unblock.is_set()  # every quick job and two renewals ran while it was blocked
        unblock.set()
        thread_name = await client.wait_result(job.id, timeout=20)
    assert thread_name != threading.main_thread().name
    assert sorted(finished) == list(range(20))


async def test_ctx_methods_are_callable_from_the_handlers_thread() -> None:
    app = trioq.App(schema="threads")
    calls: list[str] = []

    def charge(amount: int) -> dict[str, int]:
        calls.append("charge")
        return {"charged": amount}

    @app.task("follow_up")
    async def follow_up(ctx: trioq.Context, payload: object) -> str:
        return "followed"

    @app.task("sync_workflow")
    def sync_workflow(ctx: trioq.Context, payload: dict[str, int]) -> dict[str, object]:
        assert not ctx.cancelled()
        charged = ctx.call(ctx.step, "charge", charge, payload["amount"])
        child = ctx.call(ctx.spawn, "follow_up", {})
        result = ctx.call(ctx.wait_result, child)  # suspends, then replays from the top
        return {"charged": charged, "child": result, "attempt": ctx.job.attempt}

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, ["default"]):
        job = await client.enqueue("sync_workflow", {"amount": 7})
        result = await client.wait_result(job.id, timeout=20)
    assert result == {"charged": {"charged": 7}, "child": "followed", "attempt": 1}
    assert calls == ["charge"]  # the replay took the stored step


async def test_a_sync_handler_past_its_timeout_sees_cancelled_and_the_attempt_fails() -> None:
    app = trioq.App(schema="threads")
    saw_cancel = 0

    @app.task("slow", timeout=0.2, max_attempts=2, retry=trioq.RetryPolicy(base_seconds=0))
    def slow(ctx: trioq.Context, payload: object) -> str:
        nonlocal saw_cancel
        stop = threading.Event()
        while not ctx.cancelled():  # cooperative: the handler's own unit of work, then a check
            assert not stop.wait(0.01)
        saw_cancel += 1
        return "finished anyway"  # the cancellation wins over the result

    async with app.client(driver=MemoryDriver()) as client, running_worker(app, ["default"]):
        job = await client.enqueue("slow", {})
        with pytest.raises(trioq.JobFailed):
            await client.wait_result(job.id, timeout=20)
        attempts = await client.driver.job_attempts(job.id)
    assert saw_cancel == 2
    assert [(a.outcome, a.error_type) for a in attempts] == [
        ("retried", "builtins.TimeoutError"),
        ("failed", "builtins.TimeoutError"),
    ]
    assert all(a.error_message == "task 'slow' exceeded its 0.2s timeout" for a in attempts)


def test_generators_are_refused_as_handlers() -> None:
    app = trioq.App(schema="threads")

    def gen(ctx: trioq.Context, payload: object):  # type: ignore[no-untyped-def]
        yield 1

    with pytest.raises(TypeError, match="an `async def` or a plain `def` function"):
        app.task("gen")(gen)
