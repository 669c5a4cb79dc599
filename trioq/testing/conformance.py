"""The driver conformance suite: behaviour every `Driver` must show, whatever stores the jobs.

Each check is a plain `async def check_*(driver, clock)` registered in `CHECKS`; it takes a
freshly migrated, empty driver and a `DriverClock` that moves that driver's notion of "now"
forward. A check raises `AssertionError` (with the facts in its message) when the driver
misbehaves. `tests/test_conformance.py` runs all of them against `MemoryDriver` and `PgDriver`.

Clocks: `ManualClock` drives `MemoryDriver(clock=...)`; `SqlClock` moves a Postgres schema's
`db_now()` (the one function all of trioq's SQL takes time from) by an offset kept in a table of
that schema, so it works across every pooled connection. Neither clock is for production use.

Notification checks never wait for something *not* to happen: they commit a sentinel enqueue
after the action and wait for its notification; a listener receives notifications in commit
order, so anything the action sent has arrived by then.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from .._core.channels import control_channel, result_channel
from .._core.explain import explain, when
from .._driver import (
    CancelOutcome,
    CheckpointWrite,
    ClaimedJob,
    Driver,
    JobFilter,
    JobPurge,
    JobRecord,
    Lease,
    Listener,
    MaintenancePass,
    NewJob,
    QueueAdmission,
    RenewLeases,
    SettleAndClaim,
    SettleAndClaimResult,
    Settlement,
    WorkerRegistration,
)
from .._sql import queries, query_names

QUEUE = "default"
TASK = "echo"
LEASE_SECONDS = 30.0
WAIT_SECONDS = 10.0


class DriverClock(Protocol):
    """Moves a driver's "now" forward (never backward)."""

    async def advance(self, seconds: float) -> None: ...


ConformanceCheck = Callable[[Driver, DriverClock], Awaitable[None]]
CHECKS: dict[str, ConformanceCheck] = {}


def conformance_check(check: ConformanceCheck) -> ConformanceCheck:
    """Register `check` in `CHECKS` under its function name."""
    CHECKS[check.__name__] = check
    return check


@attrs.define(eq=False)
class ManualClock:
    """A clock for `MemoryDriver(clock=...)`: `now` seconds, moved only by `advance`."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        await trio.lowlevel.checkpoint()
        self.now += seconds


@attrs.define(eq=False)
class SqlClock:
    """Time travel for a Postgres driver's schema (test-only: it replaces `db_now()`).

    `install` creates `test_clock(offset_seconds)` in the driver's schema and redefines
    `db_now()` as the real (or `trioq.fake_now`) time plus that offset; `advance` raises the
    offset in a committed transaction, so every connection of the pool sees it at once.
    """

    driver: Driver

    @classmethod
    async def install(cls, driver: Driver) -> SqlClock:
        async with driver.transaction() as tx:
            await tx.execute(queries(driver.schema)["test_clock_install"])
        return cls(driver)

    async def advance(self, seconds: float) -> None:
        async with self.driver.transaction() as tx:
            await tx.execute(
                queries(self.driver.schema)["test_clock_advance"], {"seconds": seconds}
            )


@attrs.define(eq=False)
class NotificationRecorder:
    """Callbacks for `open_listener` that keep every notification, in arrival order."""

    received: list[tuple[str, str]] = attrs.field(factory=list)
    reconnects: int = 0
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    def on_notify(self, channel: str, payload: str) -> None:
        self.received.append((channel, payload))
        self._arrived.set()
        self._arrived = trio.Event()

    def on_reconnect(self) -> None:
        self.reconnects += 1

    def ids_on(self, channel: str) -> set[int]:
        """Job ids announced on a result channel (payloads are comma-joined ids)."""
        return {
            int(part)
            for received_channel, payload in self.received
            if received_channel == channel
            for part in payload.split(",")
        }

    async def wait_for(self, channel: str, payload: str) -> None:
        with trio.fail_after(WAIT_SECONDS):
            while (channel, payload) not in self.received:
                await self._arrived.wait()

    async def wait_for_ids(self, channel: str, ids: set[int]) -> None:
        with trio.fail_after(WAIT_SECONDS):
            while not ids <= self.ids_on(channel):
                await self._arrived.wait()


async def flush_notifications(
    driver: Driver, listener: Listener, recorder: NotificationRecorder
) -> None:
    """Return once every notification committed before this call has reached `recorder`."""
    queue = f"sentinel-{uuid.uuid4().hex[:16]}"
    [channel] = await driver.ready_channels([queue])
    await listener.listen(channel)
    await driver.job_insert_many([NewJob(queue=queue, task="sentinel", payload_json="{}")])
    await recorder.wait_for(channel, queue)


# --- helpers --------------------------------------------------------------------------------


def new_job(n: int = 0, **fields: Any) -> NewJob:
    """A job of task `echo` on queue `default` with payload {"n": n}; `fields` override."""
    defaults: dict[str, Any] = {"queue": QUEUE, "task": TASK, "payload_json": json.dumps({"n": n})}
    return NewJob(**{**defaults, **fields})


async def enqueue(driver: Driver, *jobs: NewJob) -> list[int]:
    return [inserted.id for inserted in await driver.job_insert_many(jobs)]


async def claim_round(
    driver: Driver,
    limit: int = 10,
    *,
    queue: str = QUEUE,
    tasks: Sequence[str] = (TASK,),
    lease_seconds: float = LEASE_SECONDS,
    worker_id: uuid.UUID | None = None,
    settlements: Sequence[Settlement] = (),
    key_cursor: str = "",
    key_window: int = 200,
    task_versions: Sequence[str] | None = None,
    lookahead_seconds: float = 0.0,
) -> SettleAndClaimResult:
    """One claim loop round trip, with the claimed jobs sorted in claim order."""
    result = await driver.job_settle_and_claim(
        SettleAndClaim(
            queue=queue,
            tasks=tuple(tasks),
            limit=limit,
            lease_seconds=lease_seconds,
            worker_id=worker_id or uuid.uuid4(),
            settlements=tuple(settlements),
            key_cursor=key_cursor,
            key_window=key_window,
            task_versions=None if task_versions is None else tuple(task_versions),
            lookahead_seconds=lookahead_seconds,
        )
    )
    claimed = sorted(result.claimed, key=lambda job: (job.priority, job.run_at, job.id))
    return attrs.evolve(result, claimed=tuple(claimed))


async def claim(
    driver: Driver,
    limit: int = 10,
    *,
    queue: str = QUEUE,
    tasks: Sequence[str] = (TASK,),
    lease_seconds: float = LEASE_SECONDS,
    worker_id: uuid.UUID | None = None,
    settlements: Sequence[Settlement] = (),
) -> list[ClaimedJob]:
    """Claim up to `limit` jobs; the result is sorted in claim order."""
    result = await claim_round(
        driver,
        limit,
        queue=queue,
        tasks=tasks,
        lease_seconds=lease_seconds,
        worker_id=worker_id,
        settlements=settlements,
    )
    return list(result.claimed)


async def settle(
    driver: Driver, *settlements: Settlement, queue: str = QUEUE
) -> list[tuple[int, str]]:
    """Settle without claiming; returns (id, new state) of each settlement that held."""
    outcome = await driver.job_settle_and_claim(
        SettleAndClaim(queue, (TASK,), 0, LEASE_SECONDS, uuid.uuid4(), tuple(settlements))
    )
    return sorted(outcome.settled)


async def claim_due(driver: Driver, limit: int = 10, **options: Any) -> list[ClaimedJob]:
    """Claim work that became due since the last statement: the first round promotes it (the
    claim's snapshot does not see the promotion), the next one claims it."""
    first = await claim_round(driver, limit, **options)
    if not first.promoted:
        return list(first.claimed)
    second = await claim_round(driver, limit - len(first.claimed), **options)
    return sorted(
        [*first.claimed, *second.claimed], key=lambda job: (job.priority, job.run_at, job.id)
    )


async def complete(driver: Driver, *leases: Lease, result: Any = None) -> tuple[int, ...]:
    """Complete `leases` without claiming; returns the ids whose completion was accepted."""
    settled = await settle(
        driver, *(Settlement(lease, "complete", result_json=json.dumps(result)) for lease in leases)
    )
    return tuple(job_id for job_id, _ in settled)


async def release(driver: Driver, *leases: Lease) -> list[int]:
    """Drain-release `leases`; returns the ids released."""
    settled = await settle(driver, *(Settlement(lease, "release") for lease in leases))
    return [job_id for job_id, _ in settled]


async def renew(driver: Driver, *leases: Lease, lease_seconds: float = LEASE_SECONDS) -> set[int]:
    renewed = await driver.lease_renew_many(
        RenewLeases(uuid.uuid4(), "running", lease_seconds, tuple(leases))
    )
    expect(all(lease.confirmed for lease in renewed.leases), True, "no row locks: all confirmed")
    return {lease.id for lease in renewed.leases}


async def fail(
    driver: Driver,
    lease: Lease,
    retry_delay: float | None,
    *,
    final_state: str = "failed",
    error: dict[str, Any] | None = None,
) -> list[tuple[int, str]]:
    error = error or {"type": "Boom", "message": "it broke"}
    kind = "retry" if retry_delay is not None else {"failed": "fail"}.get(final_state, "cancel")
    return await settle(
        driver, Settlement(lease, kind, error_json=json.dumps(error), delay_seconds=retry_delay)
    )


async def record(driver: Driver, job_id: int) -> JobRecord:
    found = await driver.job_get(job_id)
    assert found is not None, f"job {job_id} does not exist"
    return found


async def database_now(driver: Driver) -> datetime.datetime:
    """The driver's current time (the created_at of a probe job that is never due)."""
    far = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)
    [probe] = await enqueue(driver, NewJob("clock-probe", "probe", "{}", run_at=far))
    return (await record(driver, probe)).created_at


def expect(actual: object, expected: object, what: str) -> None:
    """assert actual == expected, with both in the message (suite modules are not rewritten)."""
    if actual != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def ids(jobs: Sequence[ClaimedJob]) -> list[int]:
    return [job.id for job in jobs]


# --- claim ----------------------------------------------------------------------------------


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


# --- dedup ----------------------------------------------------------------------------------


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


# --- fencing, completion, failure, release --------------------------------------------------


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
    outcome = await fail(driver, job.lease, None, final_state="cancelled")
    expect(outcome, [(job_id, "cancelled")], "failure outcome")
    [attempt] = await driver.job_attempts(job_id)
    expect((attempt.attempt, attempt.outcome), (1, "cancelled"), "attempts history")


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


# --- leases ---------------------------------------------------------------------------------


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
        uuid.uuid4(), "host-a", 11, (QUEUE,), 4, (f"{TASK}@1",), ((TASK, 1, 2),)
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


# --- cancel ---------------------------------------------------------------------------------


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
async def check_key_freed_by_a_completion_is_claimable_from_the_next_round(
    driver: Driver, clock: DriverClock
) -> None:
    first, second = await enqueue(
        driver, new_job(1, partition_key="k"), new_job(2, partition_key="k")
    )
    [job] = await claim(driver)
    done = await claim(driver, settlements=[Settlement(job.lease, "complete", result_json="null")])
    expect(done, [], "claim in the round that completed the key's running job")
    expect((await record(driver, first)).state, "completed", "first job")
    expect(ids(await claim(driver)), [second], "claim in the next round")


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


# --- transactions and notifications ---------------------------------------------------------


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
            expect(await tx.job_settle_many([done]), [(job_id, "completed")], "inside, rolled back")
            raise _Rollback
    except _Rollback:
        pass
    expect((await record(driver, job_id)).state, "running", "after the rollback")
    async with driver.transaction() as tx:
        expect(await tx.job_settle_many([done]), [(job_id, "completed")], "inside, committed")
    finished = await record(driver, job_id)
    expect((finished.state, finished.result), ("completed", {"ok": True}), "after the commit")
    async with driver.transaction() as tx:
        expect(await tx.job_settle_many([done]), [], "the same lease again (fenced)")
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
        new_job(1, delay_seconds=30),
        new_job(2, delay_seconds=5, partition_key="k"),
    )
    await clock.advance(6)
    first = await claim_round(driver, 10)
    expect([job.id for job in first.claimed], [soon], "claimed the round it was found due")
    expect(first.promoted, 1, "the keyed due job promoted, not claimed")
    early = await claim_round(driver, 10, lookahead_seconds=0.5)
    expect([job.id for job in early.claimed], [keyed], "the promoted keyed job, in the next round")
    # `later` is due in 2 s: a margin for the real time that passes on PostgreSQL meanwhile
    await clock.advance(22.0)
    none = await claim_round(driver, 10)
    expect(none.claimed, (), "nothing due without a lookahead")
    ahead = await claim_round(driver, 10, lookahead_seconds=3.0)
    expect([job.id for job in ahead.claimed], [later], "claimed within the lookahead")
    record = await driver.job_get(later)
    assert record is not None and record.run_at is not None
    expect(record.started_at, record.run_at, "an early claim starts at its run_at")


@conformance_check
async def check_final_states_are_announced_on_result_channels(
    driver: Driver, clock: DriverClock
) -> None:
    recorder = NotificationRecorder()
    job_ids = await enqueue(driver, *(new_job(n) for n in range(5)))
    channels = {result_channel(driver.schema, job_id) for job_id in job_ids}
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        for channel in channels:
            await listener.listen(channel)
        expect(await driver.job_cancel(job_ids[4]) is not None, True, "cancel")
        one, two, three, four = await claim(driver)
        await complete(driver, one.lease, two.lease)
        await fail(driver, three.lease, retry_delay=None)
        await fail(driver, four.lease, retry_delay=None, final_state="cancelled")
        for job_id in job_ids:
            await recorder.wait_for_ids(result_channel(driver.schema, job_id), {job_id})


@conformance_check
async def check_retry_is_not_announced_as_a_result(driver: Driver, clock: DriverClock) -> None:
    recorder = NotificationRecorder()
    [job_id] = await enqueue(driver, new_job())
    channel = result_channel(driver.schema, job_id)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
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
    [job_id] = await enqueue(driver, new_job(max_attempts=1))
    channel = result_channel(driver.schema, job_id)
    await claim(driver, lease_seconds=10)
    async with driver.open_listener(recorder.on_notify, recorder.on_reconnect) as listener:
        await listener.listen(channel)
        await clock.advance(11)
        await driver.maintenance_pass(MaintenancePass())
        await flush_notifications(driver, listener, recorder)
    expect(recorder.ids_on(channel), {job_id}, "ids announced after the final lease loss")


@conformance_check
async def check_ready_channels_are_stable_per_queue(driver: Driver, clock: DriverClock) -> None:
    channels = await driver.ready_channels(["a", "b", "a"])
    expect(len(channels), 3, "one channel per queue asked")
    expect(channels[0], channels[2], "the same queue's channel")
    expect(await driver.ready_channels(["b"]), [channels[1]], "asked again")
    expect(await driver.ready_channels([]), [], "no queues")


# --- status, workers, retention, statistics -------------------------------------------------


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
        ["due", "wait", "lease", "paused", "partition_key", "workers", "version", "draining",
         "admission"],
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
    await clock.advance(99)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=100))
    expect(report.pruned_jobs, 0, "pruned before the retention period")
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
    for name in ("job_insert_many", "job_settle_and_claim", "maintenance_pass"):
        expect(after.get(name, 0) - before.get(name, 0), 1, f"calls of {name}")
    unknown = set(after) - query_names()
    expect(unknown, set(), "counted names that are not statements of queries.sql")
