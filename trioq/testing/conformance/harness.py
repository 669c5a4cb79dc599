"""The conformance suite's harness: the registry, the clocks, the notification recorder and
the small driver steps every check is written in (enqueue, claim, complete, fail, ...)."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from ..._seam.driver import (
    Claim,
    ClaimedJob,
    ClaimResult,
    Driver,
    JobRecord,
    Listener,
    NewJob,
    Settlement,
)
from ..._seam.lease import Lease
from ..._seam.services import RenewLeases
from ..._sql import queries

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

    `install` creates `test_clock(offset_seconds, frozen_at)` in the driver's schema and
    redefines `db_now()` as the real (or `trioq.fake_now`, or `freeze`'s) time plus that offset;
    `advance` raises the offset in a committed transaction, so every connection of the pool sees
    it at once.
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

    async def freeze(self) -> None:
        """Stop `db_now()` where it is, so only `advance` moves it: a test comparing Postgres
        with a `ManualClock` then cannot depend on how fast the machine runs."""
        async with self.driver.transaction() as tx:
            await tx.execute(queries(self.driver.schema)["test_clock_freeze"])


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
    key_cursor: str = "",
    key_window: int = 200,
    task_versions: Sequence[str] | None = None,
    lookahead_seconds: float = 0.0,
    concurrency_cursor: str = "",
    traced: bool = False,
) -> ClaimResult:
    """One claim of the claim loop, with the claimed jobs sorted in claim order."""
    result = await driver.job_claim(
        Claim(
            queue=queue,
            tasks=tuple(tasks),
            limit=limit,
            lease_seconds=lease_seconds,
            worker_id=worker_id or uuid.uuid4(),
            key_cursor=key_cursor,
            key_window=key_window,
            task_versions=None if task_versions is None else tuple(task_versions),
            lookahead_seconds=lookahead_seconds,
            concurrency_cursor=concurrency_cursor,
            traced=traced,
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
    traced: bool = False,
) -> list[ClaimedJob]:
    """Claim up to `limit` jobs; the result is sorted in claim order."""
    result = await claim_round(
        driver,
        limit,
        queue=queue,
        tasks=tasks,
        lease_seconds=lease_seconds,
        worker_id=worker_id,
        traced=traced,
    )
    return list(result.claimed)


async def settle(driver: Driver, *settlements: Settlement) -> list[tuple[int, str]]:
    """Write outcomes (the completer's statement); returns (id, new state) of each settlement
    that held."""
    outcome = await driver.job_settle_many(settlements)
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
