"""Claims: order, limits, task filters, delays, the job list, redrive, purge and pause."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from ..._seam.admin import CancelOutcome, JobFilter, JobPurge
from ..._seam.driver import Driver
from .harness import (
    QUEUE,
    TASK,
    DriverClock,
    claim,
    claim_due,
    claim_round,
    complete,
    conformance_check,
    database_now,
    enqueue,
    expect,
    fail,
    ids,
    new_job,
    record,
)


@conformance_check
async def check_claim_follows_priority_then_run_at_then_id(
    driver: Driver, clock: DriverClock
) -> None:
    now = await database_now(driver)
    ago = [now - datetime.timedelta(seconds=s) for s in (10, 20, 5, 20, 30)]
    a, b, c, d, e = await enqueue(
        driver,
        new_job(run_at=ago[0]),
        new_job(run_at=ago[1]),
        new_job(run_at=ago[2], priority=-1),
        new_job(run_at=ago[3]),
        new_job(run_at=ago[4], priority=1),
    )
    order = [ids(await claim(driver, limit=1)) for _ in range(6)]
    expect(order, [[c], [b], [d], [a], [e], []], "claims one at a time")


@conformance_check
async def check_claim_takes_at_most_limit_jobs(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, *(new_job(n) for n in range(5)))
    expect(len(await claim(driver, limit=0)), 0, "claimed with limit 0")
    expect(len(await claim(driver, limit=2)), 2, "claimed with limit 2")
    expect(len(await claim(driver, limit=10)), 3, "claimed the rest with limit 10")


@conformance_check
async def check_claim_takes_only_its_queue_and_known_tasks(
    driver: Driver, clock: DriverClock
) -> None:
    [other_task] = await enqueue(driver, new_job(task="unknown"))
    [other_queue] = await enqueue(driver, new_job(queue="elsewhere"))
    expect(await claim(driver), [], "claim with neither the queue nor the task")
    unknown = await record(driver, other_task)
    expect((unknown.state, unknown.attempt), ("ready", 0), "unroutable job state and attempt")
    expect(ids(await claim(driver, tasks=("unknown", TASK))), [other_task], "claim of the task")
    expect(ids(await claim(driver, queue="elsewhere")), [other_queue], "claim of the queue")


@conformance_check
async def check_claim_records_attempt_lease_and_worker(driver: Driver, clock: DriverClock) -> None:
    worker_id = uuid.uuid4()
    [job_id] = await enqueue(driver, new_job(7, partition_key="k", max_attempts=3, priority=2))
    [job] = await claim(driver, worker_id=worker_id)
    row = await record(driver, job_id)
    expect(
        (job.id, job.queue, job.task, job.payload, job.attempt, job.max_attempts),
        (job_id, QUEUE, TASK, {"n": 7}, 1, 3),
        "claimed job",
    )
    expect((job.partition_key, job.priority, job.cancel_requested), ("k", 2, False), "claimed")
    expect((job.run_at, job.created_at), (row.run_at, row.created_at), "claimed job times")
    expect((row.state, row.attempt, row.worker_id), ("running", 1, worker_id), "job row")
    assert row.started_at is not None and row.finished_at is None, row
    await fail(driver, job.lease, retry_delay=0)
    [again] = await claim(driver)
    expect(again.attempt, 2, "attempt after a retry")
    assert again.lease_token != job.lease_token, "a new claim must draw a new lease token"


@conformance_check
async def check_delayed_job_is_claimed_only_once_due(driver: Driver, clock: DriverClock) -> None:
    now = await database_now(driver)
    [delayed] = await enqueue(driver, new_job(delay_seconds=60))
    [future] = await enqueue(driver, new_job(run_at=now + datetime.timedelta(hours=1)))
    [past] = await enqueue(driver, new_job(run_at=now - datetime.timedelta(hours=1)))
    expect(ids(await claim(driver)), [past], "claim before anything else is due")
    await clock.advance(30)
    first = await claim_round(driver)
    expect((first.claimed, first.promoted), ((), 0), "claim 30 s before the delayed job is due")
    await clock.advance(31)
    expect(ids(await claim_due(driver)), [delayed], "claim once the delayed job is due")
    await clock.advance(3600)
    expect(ids(await claim_due(driver)), [future], "claim once run_at has passed")


@conformance_check
async def check_enqueue_batch_returns_one_result_per_job_in_order(
    driver: Driver, clock: DriverClock
) -> None:
    inserted = await driver.job_insert_many([new_job(n) for n in range(4)])
    expect([row.created for row in inserted], [True] * 4, "created flags")
    expect(len({row.id for row in inserted}), 4, "distinct ids")
    payloads = [(await record(driver, row.id)).payload for row in inserted]
    expect(payloads, [{"n": n} for n in range(4)], "payloads by returned id")
    expect(await driver.job_insert_many([]), [], "an empty batch")


@conformance_check
async def check_job_list_filters_and_pages_newest_first(driver: Driver, clock: DriverClock) -> None:
    old = await enqueue(driver, new_job(0), new_job(1, task="other", partition_key="p"))
    await clock.advance(120)
    new = await enqueue(driver, new_job(2, queue="mail"), new_job(3))
    await driver.job_cancel(new[1])

    async def listed(**fields: Any) -> list[int]:
        return [job.id for job in await driver.job_list(JobFilter(**fields))]

    expect(await listed(), [new[1], new[0], old[1], old[0]], "everything, newest first")
    expect(await listed(limit=2), [new[1], new[0]], "the first page")
    expect(await listed(limit=2, before_id=new[0]), [old[1], old[0]], "the next page")
    expect(await listed(states=("cancelled",)), [new[1]], "by state")
    expect(await listed(tasks=("other",)), [old[1]], "by task")
    expect(await listed(queues=("mail",)), [new[0]], "by queue")
    expect(await listed(partition_key="p"), [old[1]], "by partition key")
    expect(await listed(older_than_seconds=60), [old[1], old[0]], "by age")
    [first] = await driver.job_list(JobFilter(limit=1, before_id=old[1]))
    expect((first.id, first.payload, first.state), (old[0], {"n": 0}, "ready"), "the record")


@conformance_check
async def check_retry_redrives_failed_and_cancelled_jobs_keeping_history(
    driver: Driver, clock: DriverClock
) -> None:
    failed, cancelled, ready = await enqueue(
        driver, new_job(1, max_attempts=1), new_job(2), new_job(3)
    )
    await driver.job_cancel(cancelled)
    [job] = await claim(driver, limit=1)
    await fail(driver, job.lease, None)
    expect(await driver.job_retry(ready), CancelOutcome("ready", "ready"), "a ready job")
    expect(await driver.job_retry(failed), CancelOutcome("failed", "ready"), "a failed job")
    expect(await driver.job_retry(cancelled), CancelOutcome("cancelled", "ready"), "cancelled")
    expect(await driver.job_retry(999_999), None, "a missing job")
    again = await record(driver, failed)
    expect((again.state, again.max_attempts, again.error), ("ready", 2, None), "redriven row")
    expect(len(await driver.job_attempts(failed)), 1, "the attempts history is kept")
    claimed = {job.id: job for job in await claim(driver, limit=3)}
    expect(sorted(claimed), sorted([failed, cancelled, ready]), "all three claimable")
    expect(claimed[failed].attempt, 2, "the redriven job's next attempt")


@conformance_check
async def check_purge_deletes_finished_jobs_older_than_the_age(
    driver: Driver, clock: DriverClock
) -> None:
    _done, cancelled, other, kept = await enqueue(
        driver, new_job(1), new_job(2), new_job(3, task="other"), new_job(4)
    )
    [job] = await claim(driver, limit=1)
    await complete(driver, job.lease)
    await driver.job_cancel(cancelled)
    await driver.job_cancel(other)
    await clock.advance(100)

    def purge(*states: str, age: float = 50, **fields: Any) -> JobPurge:
        return JobPurge(states=states, older_than_seconds=age, **fields)

    expect(await driver.job_purge(purge("cancelled", age=200)), 0, "nothing that old")
    expect(await driver.job_purge(purge("ready", "cancelled", tasks=(TASK,))), 1, "by task")
    expect(await driver.job_get(cancelled), None, "the purged job")
    expect(await driver.job_purge(purge("completed", "cancelled", limit=1)), 1, "a batch of 1")
    expect(await driver.job_purge(purge("completed", "cancelled")), 1, "the rest")
    expect((await record(driver, kept)).state, "ready", "an unfinished job is never purged")
    expect(await driver.job_attempts(cancelled), [], "attempts go with their job")


@conformance_check
async def check_paused_queue_claims_nothing_until_resumed(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job(1))
    expect(await driver.queue_pause(QUEUE), True, "pause")
    expect(await driver.queue_pause(QUEUE), False, "pause again")
    expect([p.queue for p in await driver.queue_pause_list()], [QUEUE], "paused queues")
    expect(await claim(driver), [], "claim while paused")
    expect(await driver.queue_resume(QUEUE), True, "resume")
    expect(await driver.queue_resume(QUEUE), False, "resume again")
    expect(await driver.queue_pause_list(), [], "paused queues after resume")
    expect(ids(await claim(driver)), [job_id], "claim after resume")
