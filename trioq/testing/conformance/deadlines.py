"""Deadlines (migrations 0021, 0029): the maintenance pass cancels what has passed its deadline;
a job without one of its own takes the deadline its task's workers registered, and a spawned
child the earlier of its own and its workflow's."""

from __future__ import annotations

import datetime
import uuid

from ..._seam.admin import QueueLimitSet
from ..._seam.driver import Driver
from ..._seam.services import MaintenancePass, RenewLeases, WorkerRegistration
from ..._seam.workflow import Spawn
from .harness import (
    LEASE_SECONDS,
    QUEUE,
    TASK,
    DriverClock,
    claim,
    conformance_check,
    enqueue,
    expect,
    fail,
    ids,
    new_job,
    record,
)


async def register(driver: Driver, *deadlines: tuple[str, float | None]) -> None:
    """A worker that serves each (task, deadline seconds) at version 1, with 5 attempts."""
    tasks = tuple(sorted(task for task, _ in deadlines))
    await driver.worker_register(
        WorkerRegistration(
            uuid.uuid4(),
            "host",
            1,
            (QUEUE,),
            4,
            tuple(f"{task}@1" for task in tasks),
            tuple(sorted((task, 1, 5, seconds) for task, seconds in deadlines)),
        )
    )


async def left_and_source(driver: Driver, job_id: int) -> tuple[float | None, str | None]:
    """A job's deadline as seconds after its enqueue, and who set it."""
    row = await record(driver, job_id)
    if row.deadline_at is None:
        return None, row.deadline_source
    return (row.deadline_at - row.created_at).total_seconds(), row.deadline_source


@conformance_check
async def check_job_without_a_deadline_takes_the_one_its_tasks_workers_registered(
    driver: Driver, clock: DriverClock
) -> None:
    """Applied at insert: from the enqueue, for jobs enqueued after the registration; a job's
    own deadline wins; a declaration without one (or a later one removing it) gives none."""
    [before] = await enqueue(driver, new_job(0))
    await register(driver, (TASK, 60.0), ("other", None))
    await clock.advance(5)
    [by_name, own, other] = await enqueue(
        driver,
        new_job(1),
        new_job(2, deadline_seconds=10.0, deadline_source="set at enqueue"),
        new_job(3, task="other"),
    )
    expect(await left_and_source(driver, by_name), (60.0, f"set by task {TASK}"), "by name")
    expect(await left_and_source(driver, own), (10.0, "set at enqueue"), "its own")
    expect(await left_and_source(driver, other), (None, None), "a task without a deadline")
    expect(await left_and_source(driver, before), (None, None), "enqueued before registration")
    await register(driver, (TASK, None))
    [after] = await enqueue(driver, new_job(4))
    expect(await left_and_source(driver, after), (None, None), "after the deadline was removed")
    expect(await left_and_source(driver, by_name), (60.0, f"set by task {TASK}"), "kept")


@conformance_check
async def check_spawned_child_takes_the_earlier_of_its_own_and_its_workflows_deadline(
    driver: Driver, clock: DriverClock
) -> None:
    """Its own: the spawn's `deadline`, else its task's registered one; the stored source says
    which won (on a tie, the workflow's)."""
    await register(driver, (TASK, None), ("kid", None), ("short", 50.0), ("long", 500.0))
    [parent_id] = await enqueue(
        driver, new_job(0, deadline_seconds=100.0, deadline_source="set at enqueue")
    )
    [parent] = await claim(driver)
    workflow = (await record(driver, parent_id)).deadline_at
    assert workflow is not None
    children = [
        new_job(1, task="short"),
        new_job(2, task="long"),
        new_job(3, task="kid", deadline_seconds=10.0, deadline_source="set at enqueue"),
        new_job(4, task="kid"),
        new_job(5, task="kid", deadline_at=workflow, deadline_source="set at enqueue"),
    ]
    spawned = await driver.job_spawn_many(
        [Spawn(parent.lease, position, child) for position, child in enumerate(children)]
    )
    rows = [await record(driver, s.child_id) for s in spawned if s.child_id is not None]
    inherited = (workflow, f"inherited from job {parent_id}")
    expect(
        [(row.deadline_at, row.deadline_source) for row in rows],
        [
            (rows[0].created_at + datetime.timedelta(seconds=50), "set by task short"),
            inherited,
            (rows[2].created_at + datetime.timedelta(seconds=10), "set at enqueue"),
            inherited,
            inherited,  # a tie: the workflow's
        ],
        "each child's deadline and its source",
    )
    [unbounded_id] = await enqueue(driver, new_job(6))
    [unbounded] = await claim(driver)
    expect(unbounded.id, unbounded_id, "the parent without a deadline")
    [child] = await driver.job_spawn_many([Spawn(unbounded.lease, 0, new_job(7, task="short"))])
    assert child.child_id is not None
    expect(
        await left_and_source(driver, child.child_id),
        (50.0, "set by task short"),
        "a child of a workflow without a deadline",
    )


@conformance_check
async def check_queued_job_past_its_deadline_is_cancelled_with_the_reason(
    driver: Driver, clock: DriverClock
) -> None:
    [bounded, later, unbounded] = await enqueue(
        driver,
        new_job(1, deadline_seconds=10, deadline_source="set at enqueue"),
        new_job(2, deadline_seconds=100, deadline_source="set by task echo"),
        new_job(3),
    )
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.deadlines_passed, 0, "deadlines passed before any is due")
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.deadlines_passed, 1, "deadlines passed at 11 s")
    row = await record(driver, bounded)
    expect(row.state, "cancelled", "state past the deadline")
    assert row.error is not None and row.error["type"] == "DeadlineExceeded", row.error
    assert row.error["message"].startswith("deadline passed at "), row.error
    assert row.error["message"].endswith(" (set at enqueue)"), row.error
    expect((await record(driver, later)).state, "ready", "a job whose deadline is ahead")
    expect((await record(driver, unbounded)).state, "ready", "a job without a deadline")


@conformance_check
async def check_running_job_past_its_deadline_is_flagged_and_settles_with_the_reason(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job(deadline_seconds=10, deadline_source="set by task t"))
    [job] = await claim(driver)
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.deadlines_passed, 1, "deadlines passed")
    expect((await record(driver, job_id)).state, "running", "a running job until its worker")
    renewed = await driver.lease_renew_many(
        RenewLeases(uuid.uuid4(), "running", LEASE_SECONDS, (job.lease,))
    )
    expect([(r.id, r.cancel_requested) for r in renewed.leases], [(job_id, True)], "renewal")
    await fail(driver, job.lease, None, final_state="cancelled")
    row = await record(driver, job_id)
    expect(row.state, "cancelled", "state")
    assert row.error is not None and row.error["message"].endswith(" (set by task t)"), row.error
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.deadlines_passed, 0, "a finished job is not passed again")


@conformance_check
async def check_deadline_frees_the_queue_limit_and_key_slots_of_the_job_it_cancels(
    driver: Driver, clock: DriverClock
) -> None:
    """A running job that holds its queue's only global slot and its key's only slot is
    cancelled by its deadline; its worker's cancelled settle frees both, and the next job of
    the key starts; a queued job past its deadline never takes one."""
    await driver.queue_limit_set(QueueLimitSet(QUEUE, set_limit=True, global_limit=1))
    [bounded, queued, follower] = await enqueue(
        driver,
        new_job(1, concurrency_key="k", deadline_seconds=10.0, deadline_source="set at enqueue"),
        new_job(2, concurrency_key="k", deadline_seconds=10.0, deadline_source="set at enqueue"),
        new_job(3, concurrency_key="k"),
    )
    [job] = await claim(driver)
    expect(job.id, bounded, "the first job takes both slots")
    expect(await claim(driver), [], "the queue and the key are full")
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.deadlines_passed, 2, "the running job and the queued one")
    expect((await record(driver, queued)).state, "cancelled", "the queued job, at once")
    await fail(driver, job.lease, None, final_state="cancelled")  # its worker's settle
    row = await record(driver, bounded)
    expect(row.state, "cancelled", "the running job")
    assert row.error is not None and row.error["type"] == "DeadlineExceeded", row.error
    [status] = await driver.queue_limit_list()
    expect(status.running, 0, "the queue's running count")
    expect(await driver.concurrency_key_status(["k"]), [], "the key's holds")
    expect(ids(await claim(driver)), [follower], "the next job of the key starts")
