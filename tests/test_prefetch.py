"""Bounded prefetch: claimed jobs wait in the claim loop's buffer, their leases renewed; a drain
hands them back without using an attempt; per-key order holds and no worker starves with
several workers on one backlog; an empty claim while work is ready is retried at once."""

from __future__ import annotations

import collections
import threading
import uuid
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trioq
from tests.support import Gate, make_app, running_worker, sql_rows, wait_until
from trioq._memory import MemoryDriver
from trioq._seam.driver import Claim, ClaimResult


async def test_drain_releases_prefetched_jobs_without_using_an_attempt(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await gate.release.wait()

    async with app.client(migrate=True) as client:
        jobs = [await client.enqueue("hold", {"n": n}) for n in range(10)]
        async with running_worker(app, concurrency=2, prefetch=3, grace_seconds=30) as worker:
            [loop] = worker.loops.values()
            with trio.fail_after(10):
                await gate.wait_entered(2)

                async def buffered() -> bool:
                    return len(loop.prefetched()) == 3

                await wait_until(buffered)
            waiting = sorted(entry.job.id for entry in loop.prefetched())
            owned = sql_rows(
                pg_url,
                f"SELECT id FROM {pg_schema}.jobs WHERE state = 'running' AND worker_id = %s"
                " ORDER BY id",
                (worker.worker_id,),
            )
            # Claim order is id order here: the buffer holds the three after the running two.
            assert waiting == [job.id for job in jobs[2:5]]
            assert [row[0] for row in owned] == [job.id for job in jobs[:5]]
            worker.request_drain()

            async def handed_back() -> bool:
                return not loop.prefetched()

            with trio.fail_after(10):
                await wait_until(handed_back)  # while the running two still run
            gate.release.set()  # they finish within the grace period
        rows = sql_rows(
            pg_url,
            f"SELECT id, state, attempt, worker_id, lease_token, started_at FROM {pg_schema}.jobs"
            " WHERE id = ANY(%s) ORDER BY id",
            (waiting,),
        )
        assert rows == [(job_id, "ready", 0, None, None, None) for job_id in waiting]
        attempts = sql_rows(
            pg_url, f"SELECT count(*) FROM {pg_schema}.attempts WHERE job_id = ANY(%s)", (waiting,)
        )
        assert attempts == [(0,)]
        assert gate.entered == 2  # the buffered jobs never started here


async def test_a_prefetched_jobs_lease_is_renewed_while_it_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="prefetch")
    gate = Gate()
    attempts: dict[str, int] = {}

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: dict[str, str]) -> None:
        attempts[payload["name"]] = ctx.job.attempt
        if payload["name"] == "first":
            gate.enter()
            await gate.release.wait()

    driver = MemoryDriver()
    async with app.client(driver=driver) as client:
        first = await client.enqueue("hold", {"name": "first"})
        second = await client.enqueue("hold", {"name": "second"})
        async with running_worker(app, concurrency=1, prefetch=1, lease_seconds=3) as worker:
            [loop] = worker.loops.values()
            with trio.fail_after(5):
                await gate.wait_entered(1)
            assert [entry.job.id for entry in loop.prefetched()] == [second.id]
            await trio.sleep(30)  # ten leases of virtual time pass while it waits
            assert [entry.job.id for entry in loop.prefetched()] == [second.id]
            gate.release.set()
            with trio.fail_after(5):
                await client.wait_result(second.id)
        assert attempts == {"first": 1, "second": 1}  # never recovered by maintenance
        record = await driver.job_get(first.id)
        assert record is not None and record.state == "completed"


@attrs.define(eq=False)
class EmptyOnce:
    """The memory driver, whose second claim round returns nothing (rows another statement
    held for a moment, passed over by SKIP LOCKED) while work is ready."""

    inner: MemoryDriver
    claims: list[tuple[float, int, int]] = attrs.field(factory=list)  # (time, asked, claimed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def job_claim(self, params: Claim) -> ClaimResult:
        empty = len(self.claims) == 1 and params.limit > 0
        result = await self.inner.job_claim(attrs.evolve(params, limit=0) if empty else params)
        if params.limit:
            self.claims.append((trio.current_time(), params.limit, len(result.claimed)))
        return result


@pytest.mark.parametrize("prefetch", [0, 4])
async def test_an_empty_claim_while_work_is_ready_is_retried_at_once(
    autojump_clock: trio.testing.MockClock, prefetch: int
) -> None:
    app = trioq.App(schema="prefetch")
    done = trio.Event()
    finished = 0

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        nonlocal finished
        finished += 1
        if finished == 10:
            done.set()

    driver = EmptyOnce(MemoryDriver())
    async with app.client(driver=driver) as client:  # type: ignore[arg-type]
        await client.enqueue_many("noop", [{} for _ in range(10)])
        async with running_worker(app, concurrency=2, prefetch=prefetch, poll_interval=10.0):
            with trio.fail_after(60):
                await done.wait()
    (_, asked, first), (empty_at, _, second) = driver.claims[:2]
    assert first == asked and second == 0, driver.claims
    # Retried at once: a claim that takes work follows within a second, not after the 10 s poll
    # interval. (With refills in flight, the round answered right after the empty one may be
    # another refill that also found nothing, depending on trio's scheduling order.)
    retry_at = next(at for at, _, claimed in driver.claims[2:] if claimed > 0)
    assert retry_at - empty_at < 1.0, driver.claims


@pytest.mark.parametrize("workers", [2, 4])
async def test_competing_prefetching_workers_keep_key_order_and_none_starves(
    pg_url: str, pg_schema: str, workers: int
) -> None:
    app = make_app(pg_url, pg_schema)
    runs: list[tuple[str, int, uuid.UUID]] = []  # (key, seq, worker) in start order
    ends: dict[tuple[str, int], int] = {}
    early: list[tuple[str, int]] = []
    keys, per_key, plain = 8, 10, 160
    finished = trio.Event()
    total = keys * per_key + plain

    @app.task("step")
    async def step(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        key, seq = payload["key"], payload["seq"]
        runs.append((key, seq, ctx.worker_id))
        if key != "-" and seq > 0 and (key, seq - 1) not in ends:
            early.append((key, seq))  # started before the key's previous job ended
        await trio.sleep(0.002)  # the workload: a short handler, so the workers overlap
        ends[(key, seq)] = len(ends)
        if len(ends) == total:
            finished.set()

    async with app.client(migrate=True) as client, trio.open_nursery() as nursery:
        pool = []
        for _ in range(workers):
            pool.append(
                await nursery.start(
                    lambda task_status: app.run_worker(
                        ["default"],
                        5,
                        prefetch=5,
                        grace_seconds=0,
                        task_status=task_status,
                    )
                )
            )
        for k in range(keys):
            await client.enqueue_many(
                "step",
                [{"key": f"k{k}", "seq": seq} for seq in range(per_key)],
                partition_key=f"k{k}",
            )
        await client.enqueue_many("step", [{"key": "-", "seq": n} for n in range(plain)])
        with trio.fail_after(60):
            await finished.wait()
        for worker in pool:
            worker.request_drain()
    assert early == []
    for k in range(keys):
        order = [seq for key, seq, _ in runs if key == f"k{k}"]
        assert order == list(range(per_key)), (k, order)
    spread = collections.Counter(worker_id for _, _, worker_id in runs)
    assert len(runs) == total
    fair = total / workers
    # No worker starves: each runs at least a quarter of its fair share of the backlog.
    assert len(spread) == workers and min(spread.values()) >= fair / 4, spread


@attrs.define(eq=False)
class SecondClaimHangs:
    """The memory driver, whose second claim round hangs until `release` (a slow statement, or
    one backing off from a lost connection) while the loop's next due time passes."""

    inner: MemoryDriver
    sent: trio.Event = attrs.field(factory=trio.Event)
    release: trio.Event = attrs.field(factory=trio.Event)
    rounds: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def job_claim(self, params: Claim) -> ClaimResult:
        self.rounds += 1
        if self.rounds == 2:
            self.sent.set()
            await self.release.wait()
        return await self.inner.job_claim(params)


def test_a_due_time_passing_while_a_refill_is_out_does_not_spin_the_claim_loop() -> None:
    """A prefetching loop whose round is out holds its room; a due time that passes meanwhile
    must not wake it again and again (under the mock clock, which moves only when every task
    waits, a loop that spins never lets the clock move: the run never ends)."""
    finished: list[float] = []

    async def scenario() -> None:
        app = trioq.App(schema="spin")

        @app.task("noop")
        async def noop(ctx: trioq.Context, payload: object) -> None:
            finished.append(trio.current_time())

        driver = SecondClaimHangs(MemoryDriver())
        async with app.client(driver=driver) as client:  # type: ignore[arg-type]
            job = await client.enqueue("noop", {}, delay=5.0)
            async with running_worker(app, concurrency=1, prefetch=2, poll_interval=60.0):
                await driver.sent.wait()  # the round sent for the due time is out
                await trio.sleep(10)  # ... and stays out past that due time
                driver.release.set()
                with trio.fail_after(60):
                    await client.wait_result(job.id)

    # A thread with a real-time bound: a spinning loop blocks the mock clock and every
    # trio-side timeout with it.
    thread = threading.Thread(
        target=trio.run,
        args=(scenario,),
        kwargs={"clock": trio.testing.MockClock(autojump_threshold=0)},
        daemon=True,
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the claim loop spun while its round was out"
    assert finished and finished[0] >= 10
