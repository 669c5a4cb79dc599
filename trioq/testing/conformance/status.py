"""Status, workers, retention and statement statistics."""

from __future__ import annotations

import uuid

import attrs
import trio

from ..._core.explain import explain, when
from ..._core.retention import seconds_to_day_end
from ..._seam.driver import Driver
from ..._seam.services import MaintenancePass, QueueAdmission, RenewLeases, WorkerRegistration
from ..._sql import query_names
from .harness import (
    QUEUE,
    TASK,
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
async def check_queue_status_counts_jobs_by_state(driver: Driver, clock: DriverClock) -> None:
    await enqueue(driver, new_job(priority=-2))
    await claim(driver, limit=1, lease_seconds=10)
    await clock.advance(11)  # that lease has now expired, unrecovered
    await enqueue(driver, new_job(priority=-1), new_job(priority=-1), new_job(priority=-1))
    done, failed, _running = await claim(driver, limit=3)
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    [cancelled] = await enqueue(driver, new_job(priority=5))
    await driver.job_cancel(cancelled)
    await enqueue(driver, new_job(), new_job(), new_job(delay_seconds=3600))
    await enqueue(driver, new_job(queue="another"))
    statuses = await driver.queue_status()
    expect([row.queue for row in statuses], ["another", QUEUE], "queues, in name order")
    other, status = statuses
    counts = (status.ready, status.scheduled, status.running, status.expired_leases)
    expect(counts, (2, 1, 2, 1), "ready, scheduled, running, expired leases")
    finished = (status.completed, status.failed, status.cancelled)
    expect(finished, (1, 1, 1), "completed, failed, cancelled")
    oldest = status.oldest_ready_seconds
    assert oldest is not None and 0 <= oldest < 60, oldest
    expect((other.ready, other.running, other.oldest_ready_seconds is None), (1, 0, False), "q2")


@conformance_check
async def check_queue_demand_counts_unfinished_work_per_queue(
    driver: Driver, clock: DriverClock
) -> None:
    await enqueue(driver, new_job(priority=-1), new_job(priority=-1))
    done, _running = await claim(driver, limit=2)
    await complete(driver, done.lease)
    await enqueue(driver, new_job(), new_job(), new_job(delay_seconds=60))
    await enqueue(driver, new_job(queue="another", delay_seconds=60))
    await clock.advance(5)
    rows = {row.queue: row for row in await driver.queue_demand()}
    expect(sorted(rows), ["another", QUEUE], "queues with unfinished work")
    mine = rows[QUEUE]
    counts = (mine.ready, mine.running, mine.scheduled, mine.sleeping, mine.waiting)
    expect(counts, (2, 1, 1, 0, 0), "ready, running, scheduled, sleeping, waiting")
    expect(mine.due_now, 2, "due now")
    oldest = mine.oldest_ready_seconds
    assert oldest is not None and 5 <= oldest < 60, oldest
    other = rows["another"]
    expect((other.ready, other.scheduled, other.due_now), (0, 1, 0), "a queue of future work")
    expect(other.oldest_ready_seconds, None, "no ready work, no age")


@conformance_check
async def check_trace_context_is_stored_with_the_job(driver: Driver, clock: DriverClock) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced, plain = await enqueue(driver, new_job(trace_context=parent), new_job())
    expect(await driver.job_trace_context(traced), parent, "the stored traceparent")
    expect(await driver.job_trace_context(plain), None, "no trace context")
    expect(await driver.job_trace_context(10**12), None, "a missing job")


@conformance_check
async def check_notify_send_reaches_a_listener(driver: Driver, clock: DriverClock) -> None:
    received: list[tuple[str, str]] = []
    arrived = trio.Event()

    def on_notify(channel: str, payload: str) -> None:
        received.append((channel, payload))
        arrived.set()

    async with driver.open_listener(on_notify, lambda: None) as listener:
        await listener.listen(f"{driver.schema}_probe")
        await driver.notify_send(f"{driver.schema}_probe", "probe:1")
        with trio.fail_after(10):
            await arrived.wait()
    expect(received, [(f"{driver.schema}_probe", "probe:1")], "the notification")


@conformance_check
async def check_status_health_counts_the_incident_list(driver: Driver, clock: DriverClock) -> None:
    live = uuid.uuid4()
    await driver.worker_register(WorkerRegistration(live, "host-a", 11, (QUEUE,), 4))
    await enqueue(driver, new_job(priority=-2), new_job(priority=-1))
    await claim(driver, limit=1, lease_seconds=10, worker_id=uuid.uuid4())  # no such worker
    await claim(driver, limit=1, lease_seconds=60, worker_id=live)
    await enqueue(driver, new_job(), new_job(), new_job(delay_seconds=3600))
    await clock.advance(11)  # the first lease has expired, unrecovered
    report = await driver.status_health()
    counts = (
        report.ready_backlog,
        report.expired_ownership,
        report.stale_running,
        report.sleeping_due,
        report.active_waits,
        report.due_wait_timeouts,
    )
    expect(counts, (2, 1, 1, 0, 0, 0), "ready, expired, stale, sleeping due, waits, timeouts")


@conformance_check
async def check_workers_register_heartbeat_and_are_pruned_when_stale(
    driver: Driver, clock: DriverClock
) -> None:
    worker_id, leaving = uuid.uuid4(), uuid.uuid4()
    await driver.worker_register(WorkerRegistration(worker_id, "host-a", 11, (QUEUE, "b"), 4))
    await driver.worker_register(WorkerRegistration(leaving, "host-b", 12, (QUEUE,), 1))
    await driver.worker_unregister(leaving)
    await enqueue(driver, new_job())
    [job] = await claim(driver, worker_id=worker_id)
    [info] = await driver.worker_list()
    expect(
        (info.id, info.hostname, info.pid, info.queues, info.concurrency, info.state),
        (worker_id, "host-a", 11, (QUEUE, "b"), 4, "running"),
        "registered worker",
    )
    expect(info.running, 1, "running jobs of the worker")
    await clock.advance(5)
    renewal = await driver.lease_renew_many(RenewLeases(worker_id, "draining", 30, (job.lease,)))
    expect(renewal.registered, True, "heartbeat of a registered worker")
    [beat] = await driver.worker_list()
    expect(beat.state, "draining", "state after a heartbeat")
    assert beat.heartbeat_at > info.heartbeat_at, (beat, info)
    await clock.advance(301)
    report = await driver.maintenance_pass(MaintenancePass(worker_stale_seconds=300))
    expect(report.pruned_workers, 1, "pruned workers")
    expect(await driver.worker_list(), [], "workers after pruning")
    # A live worker that was pruned (paused past the stale limit) learns it from its renewal.
    renewal = await driver.lease_renew_many(RenewLeases(worker_id, "running", 30, ()))
    expect((renewal.registered, renewal.leases), (False, ()), "heartbeat of a pruned worker")


@conformance_check
async def check_workers_report_their_heartbeat_interval_and_age(
    driver: Driver, clock: DriverClock
) -> None:
    worker_id = uuid.uuid4()
    registration = WorkerRegistration(
        worker_id, "host-a", 11, (QUEUE,), 4, (f"{TASK}@1",), heartbeat_seconds=14
    )
    await driver.worker_register(registration)
    [job_id] = await enqueue(driver, new_job())
    expect(await driver.job_unroutable(), [], "unroutable while the worker beats")
    await clock.advance(40)  # silent for more than two of its 14 s intervals
    [info] = await driver.worker_list()
    expect(info.heartbeat_seconds, 14.0, "registered heartbeat interval")
    assert info.heartbeat_age_seconds is not None and info.heartbeat_age_seconds >= 40, info
    [unroutable] = await driver.job_unroutable()
    expect((unroutable.task, unroutable.jobs), (TASK, 1), "unroutable once it is silent")
    facts = await driver.job_explain(job_id)
    assert facts is not None
    expect([w["heartbeat_seconds"] for w in facts.workers], [14.0], "explain's worker rows")


@conformance_check
async def check_a_job_counts_its_executions(driver: Driver, clock: DriverClock) -> None:
    [job_id] = await enqueue(driver, new_job())
    expect((await record(driver, job_id)).executions, 0, "executions before a claim")
    [job] = await claim(driver)
    await fail(driver, job.lease, retry_delay=0)
    await claim(driver)
    expect((await record(driver, job_id)).executions, 2, "executions after two claims")


@conformance_check
async def check_heartbeat_stores_the_admission_snapshot_explain_reads(
    driver: Driver, clock: DriverClock
) -> None:
    worker_id = uuid.uuid4()
    await driver.worker_register(
        WorkerRegistration(worker_id, "host-a", 11, (QUEUE,), 4, (f"{TASK}@1",))
    )
    [job_id] = await enqueue(driver, new_job())
    cut = QueueAdmission(QUEUE, 1, 4, "recovering", "db_errors", reduced_for_seconds=30.0)
    await driver.lease_renew_many(RenewLeases(worker_id, "running", 30, (), (cut,)))
    facts = await driver.job_explain(job_id)
    assert facts is not None
    [row] = facts.workers
    entry = row["admission"][QUEUE]
    expect(
        (entry["limit"], entry["concurrency"], entry["reason"], entry["cause"]),
        (1, 4, "recovering", "db_errors"),
        "stored admission snapshot",
    )
    since = when(entry["since"])
    assert since is not None and abs((facts.now - since).total_seconds() - 30) < 1, entry
    why = explain(facts)
    expect(why.blocked_by, "admission", "gate of a job whose only worker is reduced")
    expect(
        [gate.name for gate in why.gates],
        ["due", "wait", "lease", "paused", "limits", "partition_key", "workers", "version",
         "draining", "admission"],
        "gates of a ready job",
    )  # fmt: skip
    assert why.verdict.startswith("admission reduced to 1 of 4 because it is recovering from "
                                  "database errors (worker "), why.verdict  # fmt: skip
    [info] = await driver.worker_list()
    [listed] = info.admission
    unaged = attrs.evolve(listed, reduced_for_seconds=cut.reduced_for_seconds)
    expect(unaged, cut, "worker_list admission")
    assert abs(listed.reduced_for_seconds - 30) < 1, listed
    # Back at full concurrency: the next heartbeat clears the snapshot.
    await driver.lease_renew_many(RenewLeases(worker_id, "running", 30, ()))
    facts = await driver.job_explain(job_id)
    assert facts is not None
    expect(facts.workers[0]["admission"], None, "snapshot at full concurrency")
    expect((await driver.worker_list())[0].admission, (), "worker_list admission at full")
    expect((explain(facts).blocked_by, facts.pause), (None, None), "gate and pause at full")
    await driver.queue_pause(QUEUE)
    facts = await driver.job_explain(job_id)
    assert facts is not None and facts.pause is not None
    expect((explain(facts).blocked_by, facts.pause["queue"]), ("paused", QUEUE), "paused queue")


@conformance_check
async def check_finished_jobs_are_pruned_after_retention(
    driver: Driver, clock: DriverClock
) -> None:
    done_id, failed_id = await enqueue(driver, new_job(1, dedup_key="d"), new_job(2))
    done, failed = await claim(driver)
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    [waiting] = await enqueue(driver, new_job(3, delay_seconds=10_000))
    # Retention removes a day of finished jobs whole, once the UTC day they finished on ended
    # more than the retention period ago (the database's clock stands still in these checks).
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=100))
    expect(report.pruned_jobs, 0, "pruned on the day they finished")
    await clock.advance(seconds_to_day_end(finished_at) + 99)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=100))
    expect(report.pruned_jobs, 0, "pruned before the retention period after their day")
    await clock.advance(2)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=100))
    expect(report.pruned_jobs, 2, "pruned after the retention period")
    expect((await driver.job_get(done_id), await driver.job_get(failed_id)), (None, None), "gone")
    expect(await driver.job_attempts(failed_id), [], "attempts of a pruned job")
    expect((await record(driver, waiting)).state, "scheduled", "a job not finished is kept")
    [again] = await driver.job_insert_many([new_job(dedup_key="d")])
    expect(again.created, True, "the dedup key of a pruned job is free")


@conformance_check
async def check_statistics_count_statements_by_name(driver: Driver, clock: DriverClock) -> None:
    before = dict(driver.statistics().calls)
    await enqueue(driver, new_job())
    await claim(driver)
    await driver.maintenance_pass(MaintenancePass())
    after = driver.statistics().calls
    for name in ("job_insert_many", "job_claim", "maintenance_pass"):
        expect(after.get(name, 0) - before.get(name, 0), 1, f"calls of {name}")
    unknown = set(after) - query_names()
    expect(unknown, set(), "counted names that are not statements of queries.sql")
