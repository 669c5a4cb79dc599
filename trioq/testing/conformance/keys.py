"""Keys: dedup keys (uniqueness, states, periods) and partition keys (one job at a time, in
order, round-robin)."""

from __future__ import annotations

from ..._core.errors import DedupKeyConflict
from ..._seam.admin import CancelOutcome, JobPurge
from ..._seam.driver import Driver, Settlement
from ..._seam.services import MaintenancePass
from .harness import (
    TASK,
    DriverClock,
    claim,
    claim_round,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    ids,
    new_job,
    record,
    settle,
)


@conformance_check
async def check_dedup_key_returns_the_existing_job(driver: Driver, clock: DriverClock) -> None:
    [first] = await driver.job_insert_many([new_job(1, dedup_key="once")])
    batch = await driver.job_insert_many([new_job(2), new_job(3, dedup_key="once")])
    expect(first.created, True, "first insert of the key")
    expect((batch[1].id, batch[1].created), (first.id, False), "second insert of the key")
    expect(batch[0].created, True, "the other job of the batch")
    await claim(driver, limit=1)
    [running] = await driver.job_insert_many([new_job(4, dedup_key="once")])
    expect((running.id, running.created), (first.id, False), "the key of a running job")
    expect((await record(driver, first.id)).payload, {"n": 1}, "payload of the deduped job")


@conformance_check
async def check_dedup_key_held_by_another_task_refuses_the_whole_insert(
    driver: Driver, clock: DriverClock
) -> None:
    """Dedup keys are global: an insert whose key a job of another task holds is refused
    with DedupKeyConflict (not given that job), and nothing of its batch is written."""
    [held] = await driver.job_insert_many([new_job(1, dedup_key="shared")])
    for batch in (
        [new_job(2, task="other", dedup_key="shared")],
        [new_job(3, task="other", dedup_key="fresh"), new_job(4, task="other", dedup_key="shared")],
        [new_job(5, dedup_key="in-batch"), new_job(6, task="other", dedup_key="in-batch")],
    ):
        try:
            await driver.job_insert_many(batch)
        except DedupKeyConflict as exc:
            expect("is held by job" in str(exc) and "of task" in str(exc), True, str(exc))
        else:
            raise AssertionError(f"a key held by another task's job was not refused: {batch}")
    # Nothing of a refused batch was written: its other keys are still free.
    fresh = await driver.job_insert_many([new_job(8, task="other", dedup_key="fresh")])
    in_batch = await driver.job_insert_many([new_job(9, dedup_key="in-batch")])
    expect([fresh[0].created, in_batch[0].created], [True, True], "keys of the refused batches")
    [same] = await driver.job_insert_many([new_job(7, dedup_key="shared")])
    expect((same.id, same.created), (held.id, False), "the same task still gets its job")


@conformance_check
async def check_dedup_key_is_free_again_once_its_job_finished(
    driver: Driver, clock: DriverClock
) -> None:
    """By default a key is unique among unfinished jobs only: completed, failed or cancelled,
    the next enqueue of the key creates a job (and the old job gives the key up)."""
    [done] = await driver.job_insert_many([new_job(1, dedup_key="done")])
    [failed] = await driver.job_insert_many([new_job(2, dedup_key="failed", max_attempts=1)])
    [cancelled] = await driver.job_insert_many([new_job(3, dedup_key="cancelled")])
    await driver.job_cancel(cancelled.id)
    claimed = {job.id: job for job in await claim(driver, limit=2)}
    await complete(driver, claimed[done.id].lease)
    await fail(driver, claimed[failed.id].lease, None)
    again = await driver.job_insert_many(
        [new_job(4, dedup_key=key) for key in ("done", "failed", "cancelled")]
    )
    expect([row.created for row in again], [True] * 3, "created after the holder finished")
    expect((await record(driver, done.id)).dedup_key, None, "the finished job's key")
    expect((await record(driver, again[0].id)).dedup_key, "done", "the new job's key")
    [repeat] = await driver.job_insert_many([new_job(5, dedup_key="done")])
    expect((repeat.id, repeat.created), (again[0].id, False), "the new job holds the key")


@conformance_check
async def check_unique_states_keep_the_key_held_after_finishing(
    driver: Driver, clock: DriverClock
) -> None:
    keep = {"unique_states": ("completed",)}
    [first] = await driver.job_insert_many([new_job(1, dedup_key="k", **keep)])
    [job] = await claim(driver, limit=1)
    await complete(driver, job.lease)
    await clock.advance(10 * 86400)
    [after] = await driver.job_insert_many([new_job(2, dedup_key="k", **keep)])
    expect((after.id, after.created), (first.id, False), "a completed job named in the states")


@conformance_check
async def check_unique_for_holds_the_key_for_the_period_then_frees_it(
    driver: Driver, clock: DriverClock
) -> None:
    period = {"unique_for_seconds": 3600.0, "unique_states": ("completed",)}
    [first] = await driver.job_insert_many([new_job(1, dedup_key="hourly", **period)])
    [job] = await claim(driver, limit=1)
    await complete(driver, job.lease)
    await clock.advance(3500)
    [within] = await driver.job_insert_many([new_job(2, dedup_key="hourly", **period)])
    expect((within.id, within.created), (first.id, False), "within the period")
    await clock.advance(101)
    [after] = await driver.job_insert_many([new_job(3, dedup_key="hourly", **period)])
    expect(after.created, True, "after the period")
    [failed] = await driver.job_insert_many([new_job(4, dedup_key="f", max_attempts=1, **period)])
    claimed = {job.id: job for job in await claim(driver, limit=2)}
    await fail(driver, claimed[failed.id].lease, None)
    [again] = await driver.job_insert_many([new_job(5, dedup_key="f", **period)])
    expect(again.created, True, "a failed job does not hold a completed-only key")


@conformance_check
async def check_repeated_dedup_key_in_one_batch_returns_one_job(
    driver: Driver, clock: DriverClock
) -> None:
    inserted = await driver.job_insert_many([new_job(1, dedup_key="k"), new_job(2, dedup_key="k")])
    expect([row.created for row in inserted], [True, False], "created flags")
    expect(inserted[0].id, inserted[1].id, "both rows name the same job")


@conformance_check
async def check_retried_job_keeps_its_key_only_while_no_newer_job_took_it(
    driver: Driver, clock: DriverClock
) -> None:
    """`trioq retry` of a failed job: it holds its key again if nobody took it meanwhile;
    if a newer job did, the retried job runs without a key and the newer job keeps it."""
    [taken] = await driver.job_insert_many([new_job(1, dedup_key="taken", max_attempts=1)])
    [kept] = await driver.job_insert_many([new_job(2, dedup_key="kept", max_attempts=1)])
    for job in await claim(driver, limit=2):
        await fail(driver, job.lease, None)
    [newer] = await driver.job_insert_many([new_job(3, dedup_key="taken")])
    expect(newer.created, True, "a new job takes the failed job's key")
    for job_id in (taken.id, kept.id):
        expect(await driver.job_retry(job_id), CancelOutcome("failed", "ready"), "the retry")
    expect((await record(driver, taken.id)).dedup_key, None, "the retried job's taken key")
    expect((await record(driver, newer.id)).dedup_key, "taken", "the newer job's key")
    expect((await record(driver, kept.id)).dedup_key, "kept", "the retried job's own key")
    again = await driver.job_insert_many(
        [new_job(4, dedup_key="taken"), new_job(5, dedup_key="kept")]
    )
    expect(
        [(row.id, row.created) for row in again],
        [(newer.id, False), (kept.id, False)],
        "the holders after the retries",
    )


@conformance_check
async def check_a_deleted_holder_frees_its_key_at_once(driver: Driver, clock: DriverClock) -> None:
    """A job that still holds its key gives it up when it is deleted: purged (a completed job
    its unique_states keep holding) or discarded by a completion (`keep=False`). The next
    enqueue of the key creates a job."""
    held = {"unique_states": ("completed",)}
    [purged] = await driver.job_insert_many([new_job(1, dedup_key="purged", **held)])
    [discarded] = await driver.job_insert_many([new_job(2, dedup_key="discarded")])
    claimed = {job.id: job for job in await claim(driver, limit=2)}
    await complete(driver, claimed[purged.id].lease)
    await settle(
        driver, Settlement(claimed[discarded.id].lease, "complete", result_json="1", keep=False)
    )
    [still] = await driver.job_insert_many([new_job(3, dedup_key="purged", **held)])
    expect((still.id, still.created), (purged.id, False), "the completed holder, kept")
    await clock.advance(100)
    expect(await driver.job_purge(JobPurge(("completed",), 50)), 1, "the purge")
    again = await driver.job_insert_many(
        [new_job(4, dedup_key="purged", **held), new_job(5, dedup_key="discarded")]
    )
    expect([row.created for row in again], [True, True], "enqueues after the deletes")
    expect(
        [(await record(driver, row.id)).dedup_key for row in again],
        ["purged", "discarded"],
        "the new jobs' keys",
    )


# --- partition keys -------------------------------------------------------------------------


@conformance_check
async def check_partition_key_runs_one_job_at_a_time_in_order(
    driver: Driver, clock: DriverClock
) -> None:
    a1, a2, b1, free = await enqueue(
        driver,
        new_job(1, partition_key="a"),
        new_job(2, partition_key="a"),
        new_job(3, partition_key="b"),
        new_job(4),
    )
    claimed = await claim(driver)
    expect(sorted(ids(claimed)), sorted([a1, b1, free]), "first claim")
    expect(await claim(driver), [], "claim while every key runs")
    await complete(driver, claimed[0].lease)
    expect(ids(await claim(driver)), [a2], "claim after the key's first job completed")


@conformance_check
async def check_delayed_or_retrying_job_does_not_hold_its_key(
    driver: Driver, clock: DriverClock
) -> None:
    [_delayed] = await enqueue(driver, new_job(1, partition_key="k", delay_seconds=3600))
    [due] = await enqueue(driver, new_job(2, partition_key="k"))
    [job] = await claim(driver)
    expect(job.id, due, "a delayed job does not hold its key")
    await fail(driver, job.lease, retry_delay=3600)
    [later] = await enqueue(driver, new_job(3, partition_key="k"))
    expect(ids(await claim(driver)), [later], "a retrying job does not hold its key")


@conformance_check
async def check_partition_head_of_another_task_holds_the_key(
    driver: Driver, clock: DriverClock
) -> None:
    head, _second = await enqueue(
        driver, new_job(1, task="other", partition_key="k"), new_job(2, partition_key="k")
    )
    expect(await claim(driver, tasks=(TASK,)), [], "claim of a task queued behind its head")
    expect(ids(await claim(driver, tasks=("other", TASK))), [head], "claim of the head")


@conformance_check
async def check_key_freed_by_a_completion_is_claimable_by_the_next_claim(
    driver: Driver, clock: DriverClock
) -> None:
    first, second = await enqueue(
        driver, new_job(1, partition_key="k"), new_job(2, partition_key="k")
    )
    [job] = await claim(driver)
    expect(await claim(driver), [], "claim while the key's job runs")
    await settle(driver, Settlement(job.lease, "complete", result_json="null"))
    expect((await record(driver, first)).state, "completed", "first job")
    expect(ids(await claim(driver)), [second], "claim after the completion was written")


@conformance_check
async def check_recovered_job_keeps_its_place_in_its_partition(
    driver: Driver, clock: DriverClock
) -> None:
    first, _second = await enqueue(
        driver, new_job(1, partition_key="k"), new_job(2, partition_key="k")
    )
    await claim(driver, lease_seconds=10)
    await clock.advance(11)
    await driver.maintenance_pass(MaintenancePass())
    expect(ids(await claim(driver, limit=1)), [first], "the key's head after a recovery")


@conformance_check
async def check_claim_visits_keys_round_robin_within_its_window(
    driver: Driver, clock: DriverClock
) -> None:
    a1, b1, c1, a2, b2, c2 = await enqueue(
        driver, *(new_job(n, partition_key=key) for n, key in enumerate("abcabc"))
    )
    rounds = []
    cursor = ""
    for _ in range(4):
        result = await claim_round(driver, key_cursor=cursor, key_window=2)
        await complete(driver, *(job.lease for job in result.claimed))
        rounds.append((ids(result.claimed), result.key_cursor))
        cursor = result.key_cursor or ""
    expected = [([a1, b1], "b"), ([c1, a2], "a"), ([b2, c2], "c"), ([], None)]
    expect(rounds, expected, "claimed ids and returned cursor of each round")


@conformance_check
async def check_claim_visits_the_cursor_key_after_wrapping_around(
    driver: Driver, clock: DriverClock
) -> None:
    a, b = await enqueue(driver, new_job(1, partition_key="a"), new_job(2, partition_key="b"))
    result = await claim_round(driver, key_cursor="b")
    expect(sorted(ids(result.claimed)), [a, b], "claim from cursor 'b' with a wide window")
