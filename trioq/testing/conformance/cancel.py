"""Cancellation of ready, running, recovered and finished jobs."""

from __future__ import annotations

import uuid

from ..._seam.driver import Driver
from ..._seam.services import MaintenancePass, RenewLeases
from .harness import (
    LEASE_SECONDS,
    DriverClock,
    claim,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    new_job,
    record,
)


@conformance_check
async def check_cancelled_ready_job_is_final(driver: Driver, clock: DriverClock) -> None:
    [job_id] = await enqueue(driver, new_job())
    outcome = await driver.job_cancel(job_id)
    expect(outcome and (outcome.previous_state, outcome.state), ("ready", "cancelled"), "cancel")
    row = await record(driver, job_id)
    expect(row.state, "cancelled", "state")
    assert row.finished_at is not None, row
    expect(await claim(driver), [], "claim after the cancel")


@conformance_check
async def check_cancelled_running_job_is_flagged_for_its_worker(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    outcome = await driver.job_cancel(job_id)
    expect(outcome and (outcome.previous_state, outcome.state), ("running", "running"), "cancel")
    renewed = await driver.lease_renew_many(
        RenewLeases(uuid.uuid4(), "running", LEASE_SECONDS, (job.lease,))
    )
    expect([(r.id, r.cancel_requested) for r in renewed.leases], [(job_id, True)], "renewal")
    outcome_rows = await fail(driver, job.lease, None, final_state="cancelled")
    expect(outcome_rows, [(job_id, "cancelled")], "the worker records the cancellation")


@conformance_check
async def check_cancel_requested_job_whose_lease_expired_is_recovered_as_cancelled(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job())
    await claim(driver, lease_seconds=10)
    await driver.job_cancel(job_id)
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.recovered, ((job_id, "cancelled"),), "recovered as cancelled, not retried")
    expect(await claim(driver), [], "nothing left to claim")
    row = await driver.job_get(job_id)
    expect(row and (row.state, row.attempt), ("cancelled", 1), "the recovered job")
    expect(
        [(a.attempt, a.outcome) for a in await driver.job_attempts(job_id)],
        [(1, "lost")],
        "its history keeps the lost attempt",
    )


@conformance_check
async def check_cancel_leaves_finished_and_missing_jobs_alone(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    await complete(driver, job.lease)
    outcome = await driver.job_cancel(job_id)
    expect(outcome and (outcome.previous_state, outcome.state), ("completed",) * 2, "cancel")
    expect((await record(driver, job_id)).state, "completed", "state")
    expect(await driver.job_cancel(job_id + 1_000_000), None, "cancel of a missing job")
