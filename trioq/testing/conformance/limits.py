"""Cluster-wide queue limits: the global concurrency limit and the rate limit (migration 0023),
as every claim of the queue sees them, whichever worker claims."""

from __future__ import annotations

import datetime
import uuid

from ..._core.limits import Rate
from ..._seam.admin import QueueLimitSet
from ..._seam.driver import Driver
from .harness import (
    QUEUE,
    DriverClock,
    claim,
    claim_round,
    complete,
    conformance_check,
    database_now,
    enqueue,
    expect,
    new_job,
)


async def _limit(driver: Driver, limit: int | None, queue: str = QUEUE) -> None:
    await driver.queue_limit_set(QueueLimitSet(queue, set_limit=True, global_limit=limit))


async def _rate(driver: Driver, rate: Rate | None, queue: str = QUEUE) -> None:
    await driver.queue_limit_set(QueueLimitSet(queue, set_rate=True, rate=rate))


@conformance_check
async def check_global_limit_caps_the_running_jobs_of_every_worker(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *(new_job(n) for n in range(10)), new_job(queue="other"))
    await _limit(driver, 3)
    first = await claim_round(driver, 10, worker_id=uuid.uuid4())
    expect(len(first.claimed), 3, "the first worker's claim under a global limit of 3")
    expect(first.at_global_limit, True, "the claim that filled the limit says so")
    second = await claim_round(driver, 10, worker_id=uuid.uuid4())
    expect(len(second.claimed), 0, "another worker's claim while 3 of 3 run")
    expect(second.at_global_limit, True, "the claim held back by the limit says so")
    expect(len(await claim(driver, 10, queue="other")), 1, "another queue is not limited")
    await complete(driver, *(job.lease for job in first.claimed[:2]))
    expect(len(await claim(driver, 10)), 2, "two slots freed by two completions")
    expect(len(await claim(driver, 10)), 0, "the limit is full again")


@conformance_check
async def check_global_limit_counts_jobs_that_were_running_before_it_was_set(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *(new_job(n) for n in range(6)))
    running = await claim(driver, 4)
    await _limit(driver, 2)
    expect(len(await claim(driver, 10)), 0, "4 already running over a new limit of 2")
    [status] = await driver.queue_limit_list()
    expect((status.queue, status.global_limit, status.running), (QUEUE, 2, 4), "listed")
    await complete(driver, *(job.lease for job in running[:3]))
    expect(len(await claim(driver, 10)), 1, "1 running left: one slot of 2")


@conformance_check
async def check_rate_limit_allows_n_starts_per_window_and_names_the_next(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *(new_job(n) for n in range(10)))
    await _rate(driver, Rate(3, 60.0))
    before = await database_now(driver)
    first = await claim_round(driver, 10)
    expect(len(first.claimed), 3, "starts allowed by a rate of 3/m")
    until = first.rate_limited_until
    assert until is not None, "a full window names when the next start is allowed"
    after = await database_now(driver)
    window = datetime.timedelta(seconds=60)
    assert before + window <= until <= after + window, (before, until, after)
    await complete(driver, *(job.lease for job in first.claimed))
    held = await claim_round(driver, 10)
    expect(len(held.claimed), 0, "completions do not give starts back")
    expect(held.rate_limited_until, until, "the held claim names the same time")
    [status] = await driver.queue_limit_list()
    expect((status.rate, status.recent_starts), (Rate(3, 60.0), 3), "the rate and its window")
    expect(status.rate_limited_until, until, "listed: rate limited until")
    await clock.advance(61)
    expect(len(await claim(driver, 10)), 3, "the next window's starts")


@conformance_check
async def check_rate_limit_window_slides_start_by_start(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, *(new_job(n) for n in range(10)))
    await _rate(driver, Rate(2, 10.0))
    expect(len(await claim(driver, 1)), 1, "the first start")
    await clock.advance(5)
    expect(len(await claim(driver, 10)), 1, "the second start, 5 s later")
    await clock.advance(5.5)
    expect(len(await claim(driver, 10)), 1, "the first start left the window: one more")
    expect(len(await claim(driver, 10)), 0, "the second is still in it")


@conformance_check
async def check_both_limits_apply_and_removing_them_frees_the_queue(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, *(new_job(n) for n in range(12)))
    await _limit(driver, 4)
    await _rate(driver, Rate(2, 3600.0))
    expect(len(await claim(driver, 10)), 2, "the rate is the tighter limit")
    await _rate(driver, None)
    expect(len(await claim(driver, 10)), 2, "without the rate, the global limit of 4")
    expect([s.rate for s in await driver.queue_limit_list()], [None], "only the limit is left")
    await _limit(driver, None)
    expect(await driver.queue_limit_list(), [], "a queue with no limits has no row")
    expect(len(await claim(driver, 10)), 8, "no limit: the claim takes what it asks for")
