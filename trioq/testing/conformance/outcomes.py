"""Outcomes: the lease fence, completion, failure and retry, release."""

from __future__ import annotations

import uuid

from ..._seam.driver import Driver, Settlement
from ..._seam.lease import Lease
from .harness import (
    DriverClock,
    claim,
    claim_due,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    ids,
    new_job,
    record,
    release,
    renew,
    settle,
)


@conformance_check
async def check_stale_lease_changes_nothing(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, new_job())
    [job] = await claim(driver)
    before = await record(driver, job.id)
    stale = [
        Lease(job.id, job.attempt + 1, job.lease_token),
        Lease(job.id, job.attempt - 1, job.lease_token),
        Lease(job.id, job.attempt, uuid.uuid4()),
    ]
    for lease in stale:
        expect(await complete(driver, lease), (), f"completion with {lease}")
        expect(await fail(driver, lease, retry_delay=None), [], f"failure with {lease}")
        expect(await release(driver, lease), [], f"release with {lease}")
        expect(await renew(driver, lease), set(), f"renewal with {lease}")
    expect(await record(driver, job.id), before, "job after stale writes")
    expect(await driver.job_attempts(job.id), [], "attempts after stale writes")
    expect(await complete(driver, job.lease), (job.id,), "completion with the real lease")


@conformance_check
async def check_completion_is_fenced_and_stores_the_result(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, new_job(), new_job())
    first, second = await claim(driver)
    done = await complete(driver, first.lease, second.lease, result={"ok": [1, 2]})
    expect(sorted(done), sorted([first.id, second.id]), "completed ids")
    row = await record(driver, first.id)
    expect((row.state, row.result, row.error), ("completed", {"ok": [1, 2]}, None), "job")
    assert row.finished_at is not None, row
    expect(await complete(driver, first.lease), (), "a second completion")
    expect(await fail(driver, first.lease, retry_delay=0), [], "a failure after completion")
    expect((await record(driver, first.id)).state, "completed", "state after late writes")


@conformance_check
async def check_failure_retries_after_its_delay_then_fails_with_history(
    driver: Driver, clock: DriverClock
) -> None:
    worker_id = uuid.uuid4()
    [job_id] = await enqueue(driver, new_job(max_attempts=2))
    [first] = await claim(driver, worker_id=worker_id)
    error = {"type": "Boom", "message": "first", "traceback": "tb"}
    expect(await fail(driver, first.lease, 60, error=error), [(job_id, "scheduled")], "retry")
    row = await record(driver, job_id)
    expect((row.state, row.attempt, row.error), ("scheduled", 1, error), "job after a retry")
    expect(await claim(driver), [], "claim before the retry delay passed")
    await clock.advance(61)
    [second] = await claim_due(driver, worker_id=worker_id)
    expect(second.attempt, 2, "attempt of the retry")
    final_error = {"type": "Boom", "message": "second"}
    expect(await fail(driver, second.lease, None, error=final_error), [(job_id, "failed")], "end")
    row = await record(driver, job_id)
    expect((row.state, row.error), ("failed", final_error), "job after the final failure")
    assert row.finished_at is not None, row
    history = [
        (a.attempt, a.outcome, a.error_type, a.error_message, a.traceback, a.worker_id)
        for a in await driver.job_attempts(job_id)
    ]
    expected = [
        (1, "retried", "Boom", "first", "tb", worker_id),
        (2, "failed", "Boom", "second", None, worker_id),
    ]
    expect(history, expected, "attempts history")


@conformance_check
async def check_failure_with_zero_delay_is_due_at_once(driver: Driver, clock: DriverClock) -> None:
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    await fail(driver, job.lease, retry_delay=0)
    expect(ids(await claim(driver)), [job_id], "claim right after a zero-delay retry")


@conformance_check
async def check_failure_can_end_cancelled(driver: Driver, clock: DriverClock) -> None:
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    await driver.job_cancel(job_id)  # stores the request (the job runs: its worker records it)
    outcome = await fail(driver, job.lease, None, final_state="cancelled")
    expect(outcome, [(job_id, "cancelled")], "failure outcome")
    [attempt] = await driver.job_attempts(job_id)
    expect((attempt.attempt, attempt.outcome), (1, "cancelled"), "attempts history")


@conformance_check
async def check_a_cancelled_outcome_without_a_stored_request_changes_nothing(
    driver: Driver, clock: DriverClock
) -> None:
    """A worker may be told to cancel by anyone (a notification is a hint): the outcome is
    recorded only when a cancel (or a passed deadline) stored the request."""
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    expect(await fail(driver, job.lease, None, final_state="cancelled"), [], "unasked cancel")
    expect((await record(driver, job_id)).state, "running", "the job after it")
    expect(await driver.job_attempts(job_id), [], "attempts history")


@conformance_check
async def check_release_returns_the_job_without_consuming_an_attempt(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job())
    [job] = await claim(driver)
    expect(await release(driver, job.lease), [job_id], "released ids")
    row = await record(driver, job_id)
    expect(
        (row.state, row.attempt, row.worker_id, row.started_at, row.error),
        ("ready", 0, None, None, None),
        "job after release",
    )
    expect(await driver.job_attempts(job_id), [], "attempts after release")
    [again] = await claim(driver)
    expect((again.id, again.attempt), (job_id, 1), "claim right after the release")
    expect(await complete(driver, job.lease), (), "completion with the released lease")


@conformance_check
async def check_released_job_keeps_its_place_in_its_partition(
    driver: Driver, clock: DriverClock
) -> None:
    first, _second = await enqueue(
        driver, new_job(1, partition_key="k"), new_job(2, partition_key="k")
    )
    [job] = await claim(driver)
    expect(job.id, first, "the key's head is claimed")
    await clock.advance(1)
    await release(driver, job.lease)
    expect(ids(await claim(driver, limit=1)), [first], "the key's head after a release")


@conformance_check
async def check_prefetched_batch_release_hands_every_job_back_in_place(
    driver: Driver, clock: DriverClock
) -> None:
    """A draining worker releases its prefetched jobs (claimed, never started) in one fenced
    statement: each is ready again with its attempt count unchanged and no owner, a keyed one
    frees its key and stays its key's head, and a stale lease in the same batch changes
    nothing."""
    head_a, _next_a, head_b, plain_1, plain_2 = await enqueue(
        driver,
        new_job(1, partition_key="a"),
        new_job(2, partition_key="a"),
        new_job(3, partition_key="b"),
        new_job(4),
        new_job(5),
    )
    claimed = await claim(driver)
    expect(sorted(ids(claimed)), sorted([head_a, head_b, plain_1, plain_2]), "prefetched ids")
    first = {job.id: job for job in claimed}
    # Nothing else is claimable: the key's next job waits while its head is prefetched.
    expect(await claim(driver, limit=1), [], "claim while the keys are held")
    released = await release(
        driver, *(job.lease for job in claimed), Lease(plain_1, 2, first[plain_1].lease_token)
    )
    expect(sorted(released), sorted(first), "released ids (the stale lease is not among them)")
    for job_id in first:
        row = await record(driver, job_id)
        expect(
            (row.state, row.attempt, row.worker_id, row.started_at),
            ("ready", 0, None, None),
            f"job {job_id} after the release",
        )
        expect(await driver.job_attempts(job_id), [], f"attempts of job {job_id}")
    again = await claim(driver)
    expect(
        sorted((job.id, job.attempt) for job in again),
        sorted((job_id, 1) for job_id in first),
        "the same heads claimed again, first attempt",
    )
    expect(
        await release(driver, *(job.lease for job in claimed)), [], "a second release, old leases"
    )


@conformance_check
async def check_a_completion_kept_nothing_of_deletes_the_job_fenced_and_frees_its_key(
    driver: Driver, clock: DriverClock
) -> None:
    """`keep=False` (job_complete_discard): the row goes instead of becoming completed, only
    for the lease that holds it, with its partition key; kept completions in the same batch
    are recorded as usual."""
    await enqueue(
        driver,
        new_job(1, partition_key="k"),
        new_job(2, partition_key="k"),
        new_job(3),
    )
    first, third = await claim(driver)
    stale = Lease(first.id, first.attempt, uuid.uuid4())
    expect(
        await settle(driver, Settlement(stale, "complete", result_json="1", keep=False)),
        [],
        "a stale lease's discard",
    )
    expect((await record(driver, first.id)).state, "running", "job after a stale discard")
    settled = await settle(
        driver,
        Settlement(first.lease, "complete", result_json="1", keep=False),
        Settlement(third.lease, "complete", result_json="3"),
    )
    expect(settled, sorted([(first.id, "completed"), (third.id, "completed")]), "settled")
    expect(await driver.job_get(first.id), None, "the discarded job")
    expect(await driver.job_attempts(first.id), [], "the discarded job's attempts")
    expect((await record(driver, third.id)).result, 3, "the kept job's result")
    [second] = await claim(driver)  # the key "k" is free again
    expect(second.payload, {"n": 2}, "the next job of the key")
