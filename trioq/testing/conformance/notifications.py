"""Transactions (commit or nothing) and the notifications a commit sends."""

from __future__ import annotations

from ..._core.channels import control_channel, result_channel
from ..._core.states import TERMINAL_STATES
from ..._seam.driver import Driver, Settlement
from ..._seam.services import MaintenancePass
from ..._seam.workflow import CheckpointWrite
from .harness import (
    QUEUE,
    DriverClock,
    NotificationRecorder,
    claim,
    claim_round,
    complete,
    conformance_check,
    enqueue,
    expect,
    fail,
    flush_notifications,
    ids,
    new_job,
    record,
    release,
)


class _Rollback(Exception):
    pass


@conformance_check
async def check_checkpoint_list_returns_a_jobs_history_in_order(
    driver: Driver, clock: DriverClock
) -> None:
    [job_id] = await enqueue(driver, new_job(1))
    expect(await driver.checkpoint_list(job_id), [], "a job without history")
    [job] = await claim(driver, limit=1)
    await driver.checkpoint_insert_many(
        [
            CheckpointWrite(job.lease, 0, "step", "first", "[1]"),
            CheckpointWrite(job.lease, 1, "step", "second", '{"b": 2}'),
        ]
    )
    listed = [(c.position, c.kind, c.name, c.value) for c in await driver.checkpoint_list(job_id)]
    expect(listed, [(0, "step", "first", [1]), (1, "step", "second", {"b": 2})], "history")


@conformance_check
async def check_settle_in_a_transaction_commits_with_it_or_not_at_all(
    driver: Driver, clock: DriverClock
) -> None:
    """A handler's transactional completion: the settle statement inside the caller's
    transaction, fenced; rolled back it leaves the job running, committed it completes it."""
    [job_id] = await enqueue(driver, new_job(1))
    [job] = await claim(driver, limit=1)
    done = Settlement(job.lease, "complete", result_json='{"ok": true}')
    try:
        async with driver.transaction() as tx:
            expect(
                list((await tx.job_settle_many([done])).settled),
                [(job_id, "completed")],
                "inside, rolled back",
            )
            raise _Rollback
    except _Rollback:
        pass
    expect((await record(driver, job_id)).state, "running", "after the rollback")
    async with driver.transaction() as tx:
        expect(
            list((await tx.job_settle_many([done])).settled),
            [(job_id, "completed")],
            "inside, committed",
        )
    finished = await record(driver, job_id)
    expect((finished.state, finished.result), ("completed", {"ok": True}), "after the commit")
    async with driver.transaction() as tx:
        expect(
            list((await tx.job_settle_many([done])).settled), [], "the same lease again (fenced)"
        )
    expect(await claim(driver), [], "a completed job is never claimed again")


@conformance_check
async def check_rolled_back_transaction_inserts_nothing(driver: Driver, clock: DriverClock) -> None:
    inserted: list[int] = []
    try:
        async with driver.transaction() as tx:
            inserted = [j.id for j in await tx.job_insert_many([new_job(dedup_key="tx")])]
            raise _Rollback
    except _Rollback:
        pass
    expect(await driver.job_get(inserted[0]), None, "the rolled-back job")
    expect(await claim(driver), [], "claim after the rollback")
    [again] = await driver.job_insert_many([new_job(dedup_key="tx")])
    expect(again.created, True, "the dedup key of a rolled-back enqueue is free")


@conformance_check
async def check_transaction_jobs_are_invisible_until_commit(
    driver: Driver, clock: DriverClock
) -> None:
    async with driver.transaction() as tx:
        [inserted] = await tx.job_insert_many([new_job()])
        expect(await driver.job_get(inserted.id), None, "job seen from outside before commit")
        expect(await claim(driver), [], "claim before commit")
    expect(ids(await claim(driver)), [inserted.id], "claim after commit")


@conformance_check
async def check_notifications_are_delivered_on_commit_only(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    kept, dropped = "kept-queue", "dropped-queue"
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in await driver.ready_channels([kept, dropped]):
            await listener.listen(channel)
        [kept_channel, dropped_channel] = await driver.ready_channels([kept, dropped])
        try:
            async with driver.transaction() as tx:
                await tx.job_insert_many([new_job(queue=dropped)])
                raise _Rollback
        except _Rollback:
            pass
        async with driver.transaction() as tx:
            await tx.job_insert_many([new_job(queue=kept)])
            await flush_notifications(driver, listener, recorder)
            expect((kept_channel, kept) in recorder.received, False, "notified before commit")
        await recorder.wait_for(kept_channel, kept)
        await flush_notifications(driver, listener, recorder)
        expect((dropped_channel, dropped) in recorder.received, False, "notified on rollback")


@conformance_check
async def check_enqueue_notifies_the_ready_channel_once_per_queue_and_statement(
    driver: Driver, clock: DriverClock
) -> None:
    """Due jobs and delayed ones alike wake their queue: a delayed job's notification lets an
    idle claim loop learn its due time (the round finds it not due and sets its timer), instead
    of finding it at the next poll."""
    recorder = NotificationRecorder()
    due, delayed = "due-queue", "delayed-queue"
    [due_channel, delayed_channel] = await driver.ready_channels([due, delayed])
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(due_channel)
        await listener.listen(delayed_channel)
        await enqueue(driver, new_job(queue=delayed, delay_seconds=3600))
        await enqueue(driver, new_job(queue=due), new_job(queue=due))
        await recorder.wait_for(due_channel, due)
        await recorder.wait_for(delayed_channel, delayed)
        await flush_notifications(driver, listener, recorder)
    expect(recorder.received.count((due_channel, due)), 1, "notifications for one due batch")
    expect(recorder.received.count((delayed_channel, delayed)), 1, "notifications for a delay")


@conformance_check
async def check_due_work_is_claimed_by_the_statement_that_finds_it_due(
    driver: Driver, clock: DriverClock
) -> None:
    """A delayed job whose run_at passed is claimed in one round (no promote-then-claim); one
    due within the lookahead is claimed early with started_at = run_at; a keyed one is only
    promoted."""
    [soon, later, keyed] = await enqueue(
        driver,
        new_job(0, delay_seconds=5),
        new_job(1, delay_seconds=60),
        new_job(2, delay_seconds=5, partition_key="k"),
    )
    await clock.advance(6)
    first = await claim_round(driver, 10)
    expect([job.id for job in first.claimed], [soon], "claimed the round it was found due")
    expect(first.promoted, 1, "the keyed due job promoted, not claimed")
    early = await claim_round(driver, 10, lookahead_seconds=0.5)
    expect([job.id for job in early.claimed], [keyed], "the promoted keyed job, in the next round")
    # `later` is due in 2 s: on PostgreSQL the clock also runs in real time, so the margin is
    # what a loaded machine may spend between the two statements.
    await clock.advance(52)
    none = await claim_round(driver, 10)
    expect(none.claimed, (), "nothing due without a lookahead")
    ahead = await claim_round(driver, 10, lookahead_seconds=5)
    expect([job.id for job in ahead.claimed], [later], "claimed within the lookahead")
    record = await driver.job_get(later)
    assert record is not None and record.run_at is not None
    expect(record.started_at, record.run_at, "an early claim starts at its run_at")


@conformance_check
async def check_final_states_of_watched_jobs_are_announced_on_result_channels(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    job_ids = await enqueue(driver, *(new_job(n) for n in range(5)))
    channels = {result_channel(driver.schema, job_id) for job_id in job_ids}
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in channels:
            await listener.listen(channel)
        for job_id in job_ids:
            await driver.job_result_watch(job_id)
        expect(await driver.job_cancel(job_ids[4]) is not None, True, "cancel")
        one, two, three, four = await claim(driver)
        await driver.job_cancel(four.id)  # running: the request its worker's outcome records
        await complete(driver, one.lease, two.lease)
        await fail(driver, three.lease, retry_delay=None)
        await fail(driver, four.lease, retry_delay=None, final_state="cancelled")
        for job_id in job_ids:
            await recorder.wait_for_ids(result_channel(driver.schema, job_id), {job_id})


@conformance_check
async def check_final_states_nobody_waits_for_are_not_announced(
    driver: Driver, clock: DriverClock
) -> None:
    """The statements that finish jobs (the plain completion, the full settle with a key
    released, a failure, a cancelled attempt) send no result notification for a job no waiter
    registered for: a commit that notifies takes a database-wide lock."""
    recorder = NotificationRecorder()
    job_ids = await enqueue(
        driver, new_job(0), new_job(1, partition_key="k"), new_job(2), new_job(3)
    )
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in {result_channel(driver.schema, job_id) for job_id in job_ids}:
            await listener.listen(channel)
        plain, keyed, failed, cancelled = sorted(await claim(driver), key=lambda job: job.id)
        expect(await complete(driver, plain.lease), (plain.id,), "a plain completion")
        expect(await complete(driver, keyed.lease), (keyed.id,), "a keyed completion")
        await fail(driver, failed.lease, retry_delay=None)
        await driver.job_cancel(cancelled.id)  # the request its worker's outcome records
        await fail(driver, cancelled.lease, retry_delay=None, final_state="cancelled")
        await flush_notifications(driver, listener, recorder)
    for job_id in job_ids:
        expect((await record(driver, job_id)).state in TERMINAL_STATES, True, "finished")
        expect(recorder.ids_on(result_channel(driver.schema, job_id)), set(), "ids announced")


@conformance_check
async def check_watching_a_ready_or_due_job_wakes_its_queue_once(
    driver: Driver, clock: DriverClock
) -> None:
    """A claim skips a row a registration holds (SKIP LOCKED on PostgreSQL), so registering
    for a ready or due job sends its queue's ready notification once the registration commits.
    Registering for a running, finished or unknown job, or again, sends nothing."""
    recorder = NotificationRecorder()
    [queue_channel] = await driver.ready_channels([QUEUE])
    wake = (queue_channel, QUEUE)
    running, done, ready, due = await enqueue(
        driver, new_job(0), new_job(1), new_job(2), new_job(3, delay_seconds=5)
    )
    claimed = {job.id: job for job in await claim(driver, 2)}
    expect(sorted(claimed), [running, done], "the first two by id")
    await complete(driver, claimed[done].lease)
    await clock.advance(6)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(queue_channel)
        for job_id in (running, done, 10**9):
            await driver.job_result_watch(job_id)
        await flush_notifications(driver, listener, recorder)
        expect(recorder.received.count(wake), 0, "wake-ups for running, finished, unknown")
        await driver.job_result_watch(ready)
        await recorder.wait_for(*wake)
        await driver.job_result_watch(ready)
        await driver.job_result_watch(due)
        await flush_notifications(driver, listener, recorder)
        expect(recorder.received.count(wake), 2, "wake-ups for ready, ready again, due")
    expect((await record(driver, ready)).state, "ready", "a registration changes no state")


@conformance_check
async def check_retry_is_not_announced_as_a_result(driver: Driver, clock: DriverClock) -> None:
    recorder = NotificationRecorder()
    [job_id] = await enqueue(driver, new_job())
    channel = result_channel(driver.schema, job_id)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
        await driver.job_result_watch(job_id)
        [job] = await claim(driver)
        await fail(driver, job.lease, retry_delay=60)
        await flush_notifications(driver, listener, recorder)
    expect(recorder.ids_on(channel), set(), "ids announced after a retry")


@conformance_check
async def check_cancel_of_a_running_job_is_sent_on_the_control_channel(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    channel = control_channel(driver.schema)
    [job_id] = await enqueue(driver, new_job())
    await claim(driver)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
        await driver.job_cancel(job_id)
        await recorder.wait_for(channel, str(job_id))


@conformance_check
async def check_release_and_recovery_notify_the_ready_channel(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    released_queue, recovered_queue = "released-queue", "recovered-queue"
    channels = await driver.ready_channels([released_queue, recovered_queue])
    await enqueue(driver, new_job(queue=released_queue), new_job(queue=recovered_queue))
    [released] = await claim(driver, queue=released_queue)
    await claim(driver, queue=recovered_queue, lease_seconds=10)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in channels:
            await listener.listen(channel)
        await release(driver, released.lease)
        await recorder.wait_for(channels[0], released_queue)
        await clock.advance(11)
        await driver.maintenance_pass(MaintenancePass())
        await recorder.wait_for(channels[1], recovered_queue)


@conformance_check
async def check_job_failed_by_recovery_is_announced_on_its_result_channel(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    job_id, unwatched = await enqueue(
        driver, new_job(0, max_attempts=1), new_job(1, max_attempts=1)
    )
    channels = {result_channel(driver.schema, n) for n in (job_id, unwatched)}
    await claim(driver, lease_seconds=10)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in channels:
            await listener.listen(channel)
        await driver.job_result_watch(job_id)
        await clock.advance(11)
        await driver.maintenance_pass(MaintenancePass())
        await flush_notifications(driver, listener, recorder)
    announced = set().union(*(recorder.ids_on(channel) for channel in channels))
    expect(announced, {job_id}, "ids announced after the final lease loss (only the watched)")
    expect((await record(driver, unwatched)).state, "failed", "the unwatched job failed too")


@conformance_check
async def check_ready_channels_are_stable_per_queue(driver: Driver, clock: DriverClock) -> None:
    channels = await driver.ready_channels(["a", "b", "a"])
    expect(len(channels), 3, "one channel per queue asked")
    expect(channels[0], channels[2], "the same queue's channel")
    expect(await driver.ready_channels(["b"]), [channels[1]], "asked again")
    expect(await driver.ready_channels([]), [], "no queues")
