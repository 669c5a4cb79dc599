"""Deadlines (migration 0021): the maintenance pass cancels what has passed its deadline."""

from __future__ import annotations

import uuid

from ..._driver import Driver, MaintenancePass, RenewLeases
from .harness import (
    LEASE_SECONDS,
    DriverClock,
    claim,
    conformance_check,
    enqueue,
    expect,
    fail,
    new_job,
    record,
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
