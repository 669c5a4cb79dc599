"""Leases: renewal, expiry and recovery, the last attempt, the registered max_attempts."""

from __future__ import annotations

import uuid

from ..._seam.driver import Driver, Settlement
from ..._seam.lease import Lease
from ..._seam.services import MaintenancePass, WorkerRegistration
from ..._seam.workflow import CheckpointWrite
from .harness import (
    QUEUE,
    TASK,
    DriverClock,
    claim,
    complete,
    conformance_check,
    enqueue,
    expect,
    new_job,
    record,
    renew,
    settle,
)


@conformance_check
async def check_renewal_extends_owned_leases_and_drops_lost_ones(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, new_job(), new_job(), new_job())
    one, two, three = await claim(driver, lease_seconds=10)
    await complete(driver, three.lease)
    await clock.advance(6)
    kept = await renew(driver, one.lease, two.lease, three.lease, lease_seconds=10)
    expect(kept, {one.id, two.id}, "renewed ids (three is finished)")
    await clock.advance(6)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.recovered, (), "recovered 12 s after the claim, 6 s after the renewal")
    await clock.advance(5)
    expect(await renew(driver, one.lease, lease_seconds=10), {one.id}, "late renewal")
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.recovered, ((two.id, "ready"),), "recovered: only the lease not renewed")
    expect(await renew(driver, two.lease), set(), "renewal of a recovered lease")


@conformance_check
async def check_expired_lease_is_recovered_and_its_holder_fenced(
    driver: Driver, clock: DriverClock
) -> None:
    worker_id = uuid.uuid4()
    [job_id] = await enqueue(driver, new_job())
    [old] = await claim(driver, lease_seconds=10, worker_id=worker_id)
    await clock.advance(9)
    expect((await driver.maintenance_pass(MaintenancePass())).recovered, (), "before expiry")
    await clock.advance(2)
    report = await driver.maintenance_pass(MaintenancePass())
    expect((report.leader, report.recovered), (True, ((job_id, "ready"),)), "after expiry")
    row = await record(driver, job_id)
    expect((row.state, row.attempt), ("ready", 1), "recovered job")
    expect(row.error and row.error.get("type"), "LeaseExpired", "recovered job error type")
    [lost] = await driver.job_attempts(job_id)
    expect((lost.attempt, lost.outcome, lost.worker_id), (1, "lost", worker_id), "history")
    expect(await complete(driver, old.lease), (), "completion by the old holder")
    [new] = await claim(driver)
    expect(new.attempt, 2, "attempt of the re-claim")
    expect(await renew(driver, old.lease), set(), "renewal by the old holder")
    expect(await complete(driver, old.lease), (), "completion by the old holder")
    expect(await complete(driver, new.lease), (job_id,), "completion by the new holder")


async def _lost_and_current(driver: Driver, clock: DriverClock) -> tuple[int, Lease, Lease]:
    """A job whose first run's lease expired and was recovered, claimed again: (its id, the
    lost run's lease, the current run's)."""
    [job_id] = await enqueue(driver, new_job(max_attempts=5))
    [old] = await claim(driver, lease_seconds=10)
    await clock.advance(11)
    recovered = (await driver.maintenance_pass(MaintenancePass())).recovered
    expect(recovered, ((job_id, "ready"),), "the old run recovered")
    [new] = await claim(driver)
    return job_id, old.lease, new.lease


@conformance_check
async def check_one_batch_with_a_jobs_lost_and_current_leases_applies_the_current_one(
    driver: Driver, clock: DriverClock
) -> None:
    """A worker's completer may still hold the outcome of a run it lost (its writes failed while
    the database was away, and its lease expired, the run recovered) when it claims and
    finishes the same job again: one batch then names the job twice. Only the lease that holds
    is applied, once, with its own outcome; the lost one's is not (matched by the job's id
    alone: a second outcome, or the lost run's retry)."""

    async def case(plain: bool, lost_kind: str, lost_first: bool) -> None:
        job_id, old, new = await _lost_and_current(driver, clock)
        if lost_kind == "complete":
            lost = Settlement(old, "complete", result_json='"lost"', plain=plain)
        else:
            lost = Settlement(old, "retry", error_json='{"type": "Boom"}', delay_seconds=60)
        current = Settlement(new, "complete", result_json='"current"', plain=plain)
        batch = (lost, current) if lost_first else (current, lost)
        what = f"plain={plain}, the lost run's {lost_kind}, named first: {lost_first}"
        expect(await settle(driver, *batch), [(job_id, "completed")], f"settled ({what})")
        row = await record(driver, job_id)
        expect((row.state, row.attempt, row.result), ("completed", 2, "current"), what)

    for plain in (True, False):
        for lost_kind in ("complete", "retry"):
            for lost_first in (True, False):
                await case(plain, lost_kind, lost_first)


@conformance_check
async def check_one_batch_of_checkpoints_with_a_jobs_lost_and_current_leases_writes_the_current(
    driver: Driver, clock: DriverClock
) -> None:
    """As the outcomes: checkpoint writes of a lost run and of the job's current run in one
    batch (a worker's batched writes, the lost run's handler not yet cancelled). Only the
    current run's are stored and answered."""
    job_id, old, new = await _lost_and_current(driver, clock)
    written = await driver.checkpoint_insert_many(
        [
            CheckpointWrite(old, 0, "step", "a", '"lost"'),
            CheckpointWrite(new, 0, "step", "a", '"current"'),
            CheckpointWrite(old, 1, "step", "b", '"lost"'),
        ]
    )
    expect(
        [(w.job_id, w.position, w.value) for w in written],
        [(job_id, 0, "current")],
        "the writes that held",
    )
    stored = [(c.position, c.value) for c in await driver.checkpoint_list(job_id)]
    expect(stored, [(0, "current")], "the history")


@conformance_check
async def check_a_lost_attempt_carries_its_traced_executions_trace_id(
    driver: Driver, clock: DriverClock
) -> None:
    # A tracing worker's span has the lease token as its trace id (trioq/_seam/tracing.py); the
    # recovery that writes the lost attempt knows only the row.
    [job_id] = await enqueue(driver, new_job(max_attempts=3))
    [traced] = await claim(driver, lease_seconds=10, traced=True)
    await clock.advance(11)
    await driver.maintenance_pass(MaintenancePass())
    [untraced] = await claim(driver, lease_seconds=10)
    await clock.advance(11)
    await driver.maintenance_pass(MaintenancePass())
    [last] = await claim(driver, lease_seconds=10, traced=True)
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.recovered, ((job_id, "failed"),), "the last attempt lost")
    attempts = await driver.job_attempts(job_id)
    expect(
        [(a.attempt, a.outcome, a.trace_id) for a in attempts],
        [(1, "lost", traced.lease_token.hex), (2, "lost", None), (3, "lost", last.lease_token.hex)],
        "lost attempts: the traced ones name the token, the untraced one nothing",
    )
    expect(untraced.attempt, 2, "the untraced claim")


@conformance_check
async def check_lease_lost_on_the_last_attempt_fails_the_job(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job(max_attempts=1))
    await claim(driver, lease_seconds=10)
    await clock.advance(11)
    report = await driver.maintenance_pass(MaintenancePass())
    expect(report.recovered, ((job_id, "failed"),), "recovered")
    row = await record(driver, job_id)
    expect(row.state, "failed", "state")
    assert row.finished_at is not None, row
    expect([a.outcome for a in await driver.job_attempts(job_id)], ["lost"], "history")
    expect(await claim(driver), [], "claim after the final loss")


@conformance_check
async def check_a_row_without_max_attempts_takes_its_tasks_registered_declaration(
    driver: Driver, clock: DriverClock
) -> None:
    """Lease recovery and the readers count the attempts of a row that carries none by the
    declaration a worker registered for its (task, version), else 5."""
    [declared, undeclared, own] = await enqueue(
        driver, new_job(1), new_job(2, task="other"), new_job(3, max_attempts=1)
    )
    expect((await record(driver, undeclared)).max_attempts, 5, "no declaration: 5")
    registration = WorkerRegistration(
        uuid.uuid4(), "host-a", 11, (QUEUE,), 4, (f"{TASK}@1",), ((TASK, 1, 2, None),)
    )
    await driver.worker_register(registration)
    expect((await record(driver, declared)).max_attempts, 2, "the registered declaration")
    expect((await record(driver, own)).max_attempts, 1, "the row's own")
    for attempt in (1, 2):
        await claim(driver, lease_seconds=10, tasks=(TASK, "other"))
        await clock.advance(11)
        report = await driver.maintenance_pass(MaintenancePass())
        if attempt == 1:
            expect(
                sorted(report.recovered),
                sorted([(declared, "ready"), (undeclared, "ready"), (own, "failed")]),
                "first loss",
            )
    # Second loss: the declaration's 2 attempts are used up, the default's 5 are not.
    second = sorted([(declared, "failed"), (undeclared, "ready")])
    expect(sorted(report.recovered), second, "second loss")


@conformance_check
async def check_recovery_is_bounded_by_its_limit(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, *(new_job(n) for n in range(3)))
    await claim(driver, lease_seconds=10)
    await clock.advance(11)
    first = await driver.maintenance_pass(MaintenancePass(recover_limit=2))
    second = await driver.maintenance_pass(MaintenancePass(recover_limit=2))
    expect((len(first.recovered), len(second.recovered)), (2, 1), "recovered per pass")
