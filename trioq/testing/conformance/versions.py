"""Conformance checks of handler versions: the claim's (task, version) filter, the versions a
worker advertises, and the jobs no live worker can run (registered in `CHECKS`)."""

from __future__ import annotations

import uuid

from ..._seam.driver import Driver
from ..._seam.services import WorkerRegistration
from .harness import (
    QUEUE,
    TASK,
    DriverClock,
    claim_round,
    conformance_check,
    enqueue,
    expect,
    new_job,
)


def registration(*pairs: str, queues: tuple[str, ...] = (QUEUE,)) -> WorkerRegistration:
    return WorkerRegistration(uuid.uuid4(), "host", 1, queues, 4, task_versions=pairs)


@conformance_check
async def check_claim_takes_only_the_task_versions_it_serves(
    driver: Driver, clock: DriverClock
) -> None:
    v1, v2 = await enqueue(driver, new_job(1, version=1), new_job(2, version=2))
    keyed_v1, _ = await enqueue(
        driver, new_job(3, version=1, partition_key="k"), new_job(4, version=2, partition_key="k")
    )
    only_v2 = await claim_round(driver, task_versions=(f"{TASK}@2",))
    expect([(job.id, job.version) for job in only_v2.claimed], [(v2, 2)], "claimed by a v2 worker")
    both = await claim_round(driver, task_versions=(f"{TASK}@1", f"{TASK}@2"))
    expect([job.id for job in both.claimed], [v1, keyed_v1], "claimed by a worker serving both")
    expect([job.version for job in both.claimed], [1, 1], "claimed versions")


@conformance_check
async def check_workers_advertise_the_task_versions_they_serve(
    driver: Driver, clock: DriverClock
) -> None:
    await driver.worker_register(registration(f"{TASK}@1", f"{TASK}@2"))
    [worker] = await driver.worker_list()
    expect(worker.task_versions, (f"{TASK}@1", f"{TASK}@2"), "advertised pairs")


@conformance_check
async def check_unroutable_jobs_are_those_no_live_worker_serves(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, new_job(1, version=1), new_job(2, version=1), new_job(3, version=2))
    await enqueue(driver, new_job(4, version=1, queue="elsewhere"))
    expect(len(await driver.job_unroutable()), 3, "no worker at all: every group")
    await driver.worker_register(registration(f"{TASK}@2"))
    unroutable = [
        (u.queue, u.task, u.version, u.jobs, u.states) for u in await driver.job_unroutable()
    ]
    expect(
        unroutable,
        [(QUEUE, TASK, 1, 2, ("ready",)), ("elsewhere", TASK, 1, 1, ("ready",))],
        "v1 jobs while only v2 is served",
    )
    await driver.worker_register(registration(f"{TASK}@1", queues=(QUEUE, "elsewhere")))
    expect(await driver.job_unroutable(), [], "every version served")
    await clock.advance(600)
    expect(len(await driver.job_unroutable()), 3, "workers that stopped heartbeating")
