"""Model-based test of the job lifecycle: Hypothesis drives rules against a driver and a model.

Rules: enqueue (direct, committed or rolled-back transaction, with dedup keys), claim by one of
three simulated workers (limit = its open slots, optionally flushing completions in the same
call), renew, fail (retry or final), release (drain), cancel, move time (a tick shorter than a
lease, or past every lease) and recover (maintenance pass). After every step the driver's rows
must equal the model's, and the safety invariants must hold. At teardown everything is
recovered and completed, and every acknowledged job must end completed, failed or cancelled.

The driver lives in one `trio.run` on a background thread (`DriverHost`) for the whole example;
rules call into it with `trio.from_thread.run`. The memory driver runs under `MockClock`; the
Postgres driver moves its database time with `SqlClock`. Time steps are chosen so that no
lease expiry or run_at lands within several seconds of "now", so Postgres's real clock moving
a little during an example never changes an outcome.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trioq._core.identifiers import quote_ident
from trioq._driver import (
    CancelOutcome,
    CompleteAndClaim,
    Completion,
    Driver,
    Failure,
    InsertedJob,
    JobRecord,
    Lease,
    MaintenancePass,
    NewJob,
    RenewLeases,
)
from trioq._memory import MemoryDriver
from trioq._pg.driver import open_pg_driver
from trioq.testing import SqlClock

QUEUE = "q"
LEASE = 60.0
TICK = 17.0  # 17a + 100b never comes within 6 s of LEASE or DELAY
PAST_EVERY_LEASE = 100.0
DELAY = 40.0
FINISHED = frozenset({"completed", "failed", "cancelled"})
ERROR_JSON = '{"type": "Boom", "message": "handler failed"}'
WORKERS = {"A": (2, ("a", "b")), "B": (3, ("a",)), "C": (1, ("b",))}

Advance = Callable[[float], Awaitable[None]]
OpenBackend = Callable[[], AbstractAsyncContextManager[tuple[Driver, Advance]]]


# --- the driver's home: one trio.run per example ---------------------------------------------


class DriverHost:
    """Runs `open_backend()` inside `trio.run` on a thread until `close()`; `call` runs there."""

    def __init__(self, open_backend: OpenBackend, clock: trio.abc.Clock | None) -> None:
        self._open_backend = open_backend
        self._clock = clock
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="driver-host", daemon=True)
        self._thread.start()
        if not self._started.wait(60):
            raise TimeoutError("the driver host did not start")
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            trio.run(self._serve, clock=self._clock)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        async with self._open_backend() as (driver, advance):
            self.driver, self.advance = driver, advance
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._started.set()
            await self._stop.wait()

    def call(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(function, *args, trio_token=self._token)

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)
        if self._failure is not None:
            raise self._failure


@asynccontextmanager
async def open_memory_backend() -> AsyncIterator[tuple[Driver, Advance]]:
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock)

    async def advance(seconds: float) -> None:
        clock.jump(seconds)
        await trio.lowlevel.checkpoint()

    yield MemoryDriver(), advance


def pg_backend(conninfo: str, base_schema: str) -> OpenBackend:
    """A fresh, migrated schema per example (dropped afterwards), with SqlClock time travel."""
    numbers = itertools.count()

    @asynccontextmanager
    async def open_backend() -> AsyncIterator[tuple[Driver, Advance]]:
        schema = f"{base_schema}_{next(numbers)}"
        async with open_pg_driver(conninfo, schema, pool_size=2) as driver:
            await driver.migrate()
            clock = await SqlClock.install(driver)
            try:
                yield driver, clock.advance
            finally:
                with trio.CancelScope(shield=True):
                    async with driver.transaction() as tx:
                        await tx.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE")

    return open_backend


# --- the model --------------------------------------------------------------------------------


@attrs.define
class ModelJob:
    id: int
    task: str
    priority: int
    partition_key: str | None
    max_attempts: int
    run_at: float  # model seconds: decides whether the job is due
    order_run_at: datetime.datetime | None = None  # the driver's value: decides claim order
    state: str = "ready"
    attempt: int = 0
    attempt_before_claim: int = 0
    lease: Lease | None = None
    lease_expires: float = 0.0
    owner: str | None = None
    cancel_requested: bool = False
    history: int = 0  # attempts entries

    def holds(self, lease: Lease) -> bool:
        return self.state == "running" and self.lease == lease

    def claim_order(self) -> tuple[int, datetime.datetime, int]:
        assert self.order_run_at is not None
        return (self.priority, self.order_run_at, self.id)

    def end_lease(self, state: str) -> None:
        self.state, self.lease, self.owner = state, None, None


@attrs.define
class ModelWorker:
    name: str
    slots: int
    tasks: tuple[str, ...]
    worker_id: uuid.UUID = attrs.field(factory=uuid.uuid4)
    held: list[Lease] = attrs.field(factory=list)  # what it believes it runs (maybe stale)
    key_cursor: str = ""  # where its next claim continues the partition-key round-robin


class _Rollback(Exception):
    pass


async def _insert(driver: Driver, jobs: Sequence[NewJob], mode: str) -> list[InsertedJob]:
    if mode == "direct":
        return await driver.job_insert_many(jobs)
    inserted: list[InsertedJob] = []
    try:
        async with driver.transaction() as tx:
            inserted = await tx.job_insert_many(jobs)
            if mode == "rollback":
                raise _Rollback
    except _Rollback:
        pass
    return inserted


async def _records(driver: Driver, job_ids: Sequence[int]) -> dict[int, JobRecord | None]:
    return {job_id: await driver.job_get(job_id) for job_id in job_ids}


async def _history_lengths(driver: Driver, job_ids: Sequence[int]) -> dict[int, int]:
    return {job_id: len(await driver.job_attempts(job_id)) for job_id in job_ids}


async def _finish_everything(
    driver: Driver, advance: Advance, job_ids: Sequence[int]
) -> dict[int, str | None]:
    """Recover every lease, then claim and complete until nothing is claimable."""
    await advance(1000)
    await driver.maintenance_pass(MaintenancePass())
    finisher = uuid.uuid4()
    for _ in range(len(job_ids) + 2):
        claim = CompleteAndClaim(QUEUE, ("a", "b"), 1000, LEASE, finisher)
        claimed = (await driver.job_complete_and_claim(claim)).claimed
        if not claimed:
            break
        done = tuple(Completion(job.lease, "null") for job in claimed)
        await driver.job_complete_and_claim(attrs.evolve(claim, limit=0, completions=done))
    records = await _records(driver, job_ids)
    return {job_id: None if r is None else r.state for job_id, r in records.items()}


job_specs = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(0, 1),
        st.sampled_from([None, "k1", "k2", "k3"]),
        st.booleans(),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=3,
)
worker_names = st.sampled_from(sorted(WORKERS))


class QueueMachine(RuleBasedStateMachine):
    open_backend: ClassVar[OpenBackend]
    clock_factory: ClassVar[Callable[[], trio.abc.Clock | None]]

    def __init__(self) -> None:
        super().__init__()
        self.host = DriverHost(type(self).open_backend, type(self).clock_factory())
        self.driver: Driver = self.host.driver
        self.now = 0.0
        self.jobs: dict[int, ModelJob] = {}
        self.dedup: dict[str, int] = {}
        self.workers = {
            name: ModelWorker(name, slots, tasks) for name, (slots, tasks) in WORKERS.items()
        }
        self.previous: dict[int, JobRecord] = {}
        self.released: set[int] = set()
        self.issued: list[Lease] = []  # every lease ever claimed, for zombie writes

    def call(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return self.host.call(function, *args)

    def expected_claim(
        self, worker: ModelWorker, limit: int, window: int
    ) -> tuple[list[ModelJob], str | None]:
        """The model of the claim: due jobs of known tasks; a keyed one only if it heads its
        key, nothing of its key runs and its key is among the `window` keys visited
        round-robin after the worker's cursor (keys with ready jobs only). Also returns the
        last key visited."""
        if limit == 0:
            return [], None
        ready = [job for job in self.jobs.values() if job.state == "ready"]
        keys = sorted({job.partition_key for job in ready if job.partition_key is not None})
        after = [key for key in keys if key > worker.key_cursor]
        visited = (after + [key for key in keys if key <= worker.key_cursor])[: max(window, 1)]
        running = {job.partition_key for job in self.jobs.values() if job.state == "running"}
        due = [job for job in ready if job.run_at <= self.now]
        heads: dict[str, ModelJob] = {}
        for job in sorted(due, key=ModelJob.claim_order):
            if job.partition_key is not None:
                heads.setdefault(job.partition_key, job)
        keyed = [
            heads[key]
            for key in visited
            if key in heads and key not in running and heads[key].task in worker.tasks
        ]
        unkeyed = [job for job in due if job.partition_key is None and job.task in worker.tasks]
        claimed = sorted(keyed + unkeyed, key=ModelJob.claim_order)[:limit]
        return claimed, visited[-1] if visited else None

    def only_the_token_differs(self, lease: Lease) -> bool:
        job = self.jobs[lease.id]
        return job.state == "running" and job.attempt == lease.attempt

    def busy_worker(self, choice: int) -> ModelWorker:
        busy = [worker for name, worker in sorted(self.workers.items()) if worker.held]
        return busy[choice % len(busy)]

    def add_job(self, job_id: int, spec: NewJob) -> None:
        delay = spec.delay_seconds or 0.0
        self.jobs[job_id] = ModelJob(
            job_id,
            spec.task,
            spec.priority,
            spec.partition_key,
            spec.max_attempts,
            self.now + delay,
        )

    # --- rules ----------------------------------------------------------------------------

    @rule(specs=job_specs, mode=st.sampled_from(["direct", "commit", "rollback"]))
    def enqueue(self, specs: list[tuple[str, int, str | None, bool, int]], mode: str) -> None:
        jobs = [
            NewJob(QUEUE, task, "{}", priority, None, DELAY if delayed else None, key, None, tries)
            for task, priority, key, delayed, tries in specs
        ]
        inserted = self.call(_insert, self.driver, jobs, mode)
        assert [row.created for row in inserted] == [True] * len(jobs)
        if mode == "rollback":
            records = self.call(_records, self.driver, [row.id for row in inserted])
            assert set(records.values()) == {None}, records
            return
        for row, job in zip(inserted, jobs, strict=True):
            self.add_job(row.id, job)

    @rule(key=st.sampled_from(["d1", "d2"]), mode=st.sampled_from(["direct", "commit"]))
    def enqueue_deduplicated(self, key: str, mode: str) -> None:
        job = NewJob(QUEUE, "a", "{}", dedup_key=key)
        [row] = self.call(_insert, self.driver, [job], mode)
        holder = self.jobs.get(self.dedup.get(key, -1))
        if holder is not None and holder.state in ("completed", "failed", "cancelled"):
            del self.dedup[key]  # a finished job no longer holds its key (by default)
        if key in self.dedup:
            assert (row.id, row.created) == (self.dedup[key], False)
        else:
            assert row.created
            self.dedup[key] = row.id
            self.add_job(row.id, job)

    @rule(name=worker_names, window=st.sampled_from([1, 2, 200]))
    def claim(self, name: str, window: int) -> None:
        self.complete_and_claim(name, 0, window)

    @precondition(lambda self: any(worker.held for worker in self.workers.values()))
    @rule(choice=st.integers(0, 100), finish=st.integers(1, 3), window=st.sampled_from([1, 200]))
    def complete_then_claim(self, choice: int, finish: int, window: int) -> None:
        """The claim loop's round trip: flush finished jobs and refill the freed slots."""
        self.complete_and_claim(self.busy_worker(choice).name, finish, window)

    def complete_and_claim(self, name: str, finish: int, window: int) -> None:
        worker = self.workers[name]
        completing = sorted(worker.held, key=lambda lease: lease.id)[:finish]
        limit = max(0, worker.slots - len(worker.held) + len(completing))
        expected_claim, expected_cursor = self.expected_claim(worker, limit, window)
        expected_done = {lease.id for lease in completing if self.jobs[lease.id].holds(lease)}
        params = CompleteAndClaim(
            QUEUE,
            worker.tasks,
            limit,
            LEASE,
            worker.worker_id,
            tuple(Completion(lease, "null") for lease in completing),
            key_cursor=worker.key_cursor,
            key_window=window,
        )
        result = self.call(self.driver.job_complete_and_claim, params)
        assert set(result.completed_ids) == expected_done
        assert {job.id for job in result.claimed} == {job.id for job in expected_claim}
        assert result.key_cursor == expected_cursor
        worker.key_cursor = result.key_cursor or ""
        worker.held = [lease for lease in worker.held if lease not in completing]
        for job_id in expected_done:
            self.jobs[job_id].end_lease("completed")
        for claimed in result.claimed:
            job = self.jobs[claimed.id]
            assert (claimed.attempt, claimed.cancel_requested) == (
                job.attempt + 1,
                job.cancel_requested,
            )
            job.attempt_before_claim, job.attempt = job.attempt, claimed.attempt
            job.state, job.lease, job.owner = "running", claimed.lease, name
            job.lease_expires = self.now + LEASE
            worker.held.append(claimed.lease)
            self.issued.append(claimed.lease)

    @rule(name=worker_names)
    def renew(self, name: str) -> None:
        worker = self.workers[name]
        owned = [lease for lease in worker.held if self.jobs[lease.id].holds(lease)]
        params = RenewLeases(worker.worker_id, "running", LEASE, tuple(worker.held))
        renewed = self.call(self.driver.lease_renew_many, params)
        expected = {lease.id: self.jobs[lease.id].cancel_requested for lease in owned}
        assert {row.id: row.cancel_requested for row in renewed} == expected
        for lease in owned:
            self.jobs[lease.id].lease_expires = self.now + LEASE
        worker.held = owned

    @precondition(lambda self: any(worker.held for worker in self.workers.values()))
    @rule(
        choice=st.integers(0, 100),
        pick=st.integers(0, 5),
        retry=st.sampled_from([None, 0.0, DELAY]),
        final=st.sampled_from(["failed", "cancelled"]),
    )
    def fail(self, choice: int, pick: int, retry: float | None, final: str) -> None:
        worker = self.busy_worker(choice)
        lease = worker.held.pop(pick % len(worker.held))
        job = self.jobs[lease.id]
        retry_delay = retry if job.attempt < job.max_attempts else None
        outcome = self.call(
            self.driver.job_fail_many, [Failure(lease, ERROR_JSON, retry_delay, final)]
        )
        if not job.holds(lease):
            assert outcome == []
            return
        state = final if retry_delay is None else "ready"
        assert outcome == [(job.id, state)]
        job.end_lease(state)
        job.run_at = self.now + (retry_delay or 0.0)
        job.history += 1

    @precondition(lambda self: any(worker.held for worker in self.workers.values()))
    @rule(choice=st.integers(0, 100))
    def release(self, choice: int) -> None:
        """Drain: hand back everything; no attempt consumed, nothing added to the history."""
        worker = self.busy_worker(choice)
        owned = [lease.id for lease in worker.held if self.jobs[lease.id].holds(lease)]
        before = self.call(_history_lengths, self.driver, owned)
        released = self.call(self.driver.job_release_many, list(worker.held))
        assert sorted(released) == sorted(owned)
        assert self.call(_history_lengths, self.driver, owned) == before
        for job_id in owned:
            job = self.jobs[job_id]
            job.end_lease("ready")
            job.attempt = job.attempt_before_claim
            job.run_at = min(job.run_at, self.now)
        self.released.update(owned)
        worker.held = []

    @precondition(lambda self: any(not self.jobs[lease.id].holds(lease) for lease in self.issued))
    @rule(
        pick=st.integers(0, 1000), write=st.sampled_from(["complete", "fail", "release", "renew"])
    )
    def write_with_a_stale_lease(self, pick: int, write: str) -> None:
        """A zombie (paused, then resumed) writes with a lease it lost: nothing changes."""
        stale = [lease for lease in self.issued if not self.jobs[lease.id].holds(lease)]
        if not stale:
            return
        # Hardest first: a lease of a running job whose attempt matches the current one
        # (released, then claimed again): only the token tells them apart. Then recent ones.
        stale.sort(key=self.only_the_token_differs)
        lease = stale[-1 - pick % min(3, len(stale))]
        if write == "complete":
            params = CompleteAndClaim(QUEUE, (), 0, LEASE, uuid.uuid4(), (Completion(lease, "1"),))
            outcome = self.call(self.driver.job_complete_and_claim, params).completed_ids
        elif write == "fail":
            failure = Failure(lease, ERROR_JSON, None, "failed")
            outcome = self.call(self.driver.job_fail_many, [failure])
        elif write == "release":
            outcome = self.call(self.driver.job_release_many, [lease])
        else:
            renewal = RenewLeases(uuid.uuid4(), "running", LEASE, (lease,))
            outcome = self.call(self.driver.lease_renew_many, renewal)
        assert not outcome, (write, lease, outcome)

    @rule(seconds=st.sampled_from([TICK, PAST_EVERY_LEASE]))
    def let_time_pass(self, seconds: float) -> None:
        self.call(self.host.advance, seconds)
        self.now += seconds

    @rule()
    def recover(self) -> None:
        expected = {
            job.id: "failed" if job.attempt >= job.max_attempts else "ready"
            for job in self.jobs.values()
            if job.state == "running" and job.lease_expires < self.now
        }
        report = self.call(self.driver.maintenance_pass, MaintenancePass())
        assert report.leader
        assert dict(report.recovered) == expected
        assert len(report.recovered) == len(expected)
        for job_id, state in expected.items():
            job = self.jobs[job_id]
            job.end_lease(state)
            job.history += 1

    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        if not self.jobs:
            assert self.call(self.driver.job_cancel, 10**12) is None
            return
        job = self.jobs[sorted(self.jobs)[pick % len(self.jobs)]]
        outcome = self.call(self.driver.job_cancel, job.id)
        new_state = "cancelled" if job.state == "ready" else job.state
        assert outcome == CancelOutcome(job.state, new_state)
        if job.state in ("ready", "running"):
            job.cancel_requested = True
        job.state = new_state

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def driver_rows_match_the_model_and_stay_safe(self) -> None:
        records = self.call(_records, self.driver, sorted(self.jobs))
        running_per_worker: collections.Counter[uuid.UUID | None] = collections.Counter()
        running_per_key: collections.Counter[str] = collections.Counter()
        for job_id, record in records.items():
            job = self.jobs[job_id]
            assert record is not None, f"acknowledged job {job_id} is missing"
            assert (record.state, record.attempt) == (job.state, job.attempt), (record, job)
            job.order_run_at = record.run_at
            if record.state == "running":
                assert job.owner is not None
                assert record.worker_id == self.workers[job.owner].worker_id
                running_per_worker[record.worker_id] += 1
                if record.partition_key is not None:
                    running_per_key[record.partition_key] += 1
            if job_id in self.released:
                assert record.worker_id is None
            self.check_transition(self.previous.get(job_id), record, job)
        for worker in self.workers.values():
            assert running_per_worker[worker.worker_id] <= worker.slots, worker
        assert all(count <= 1 for count in running_per_key.values()), running_per_key
        valid = collections.Counter(
            lease.id
            for worker in self.workers.values()
            for lease in worker.held
            if self.jobs[lease.id].holds(lease)
        )
        assert all(count <= 1 for count in valid.values()), valid
        self.previous = {job_id: r for job_id, r in records.items() if r is not None}
        self.released = set()

    def check_transition(self, before: JobRecord | None, after: JobRecord, job: ModelJob) -> None:
        if before is None:
            return
        if before.state in FINISHED:
            assert (after.state, after.attempt) == (before.state, before.attempt), (before, after)
        if job.id in self.released:
            assert after.attempt == before.attempt - 1 == job.attempt_before_claim
        else:
            assert after.attempt >= before.attempt, (before, after)

    def teardown(self) -> None:
        try:
            ids = sorted(self.jobs)
            histories = self.call(_history_lengths, self.driver, ids)
            assert histories == {job_id: self.jobs[job_id].history for job_id in ids}
            states = self.call(_finish_everything, self.driver, self.host.advance, ids)
            unfinished = {job_id: s for job_id, s in states.items() if s not in FINISHED}
            assert not unfinished, unfinished
        finally:
            self.host.close()


def _run_machine(
    open_backend: OpenBackend,
    clock_factory: Callable[[], trio.abc.Clock | None],
    *,
    max_examples: int,
    steps: int,
) -> None:
    machine = type(
        "Machine",
        (QueueMachine,),
        {
            "open_backend": staticmethod(open_backend),
            "clock_factory": staticmethod(clock_factory),
        },
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


def test_memory_driver_keeps_every_lifecycle_invariant() -> None:
    _run_machine(
        open_memory_backend,
        trio.testing.MockClock,
        max_examples=300,
        steps=50,
    )


def test_pg_driver_keeps_every_lifecycle_invariant(pg_url: str, pg_schema: str) -> None:
    _run_machine(
        pg_backend(pg_url, pg_schema),
        lambda: None,
        max_examples=25,
        steps=50,
    )
