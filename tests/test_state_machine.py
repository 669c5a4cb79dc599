"""Differential model test of the job semantics: every Hypothesis rule is applied to BOTH
drivers, the in-memory one (the executable model, `trioq/_memory/`) and PostgreSQL (the SQL),
and their answers and rows must agree. There is no third copy of the claim algorithm here:
the two implementations check each other, and the safety invariants are checked on the rows.

Rules: enqueue (optionally delayed, keyed, deduplicated), settle-and-claim by one of three
simulated workers (settling some held jobs as complete / retry / fail / cancel / release /
sleep / wait, then claiming its open slots), checkpoint writes, renew, stale writes with lost
leases, cancel, redrive (`job_retry`), moving time, and maintenance (lease recovery).

Both drivers live in one `trio.run` on a background thread (`DriverHost`) for the whole test,
reset between examples to the state a freshly migrated schema has.
The memory driver's clock is a `ManualClock`; Postgres's `db_now()` is frozen with `SqlClock` and
both move only together, by the same steps, so "due" means the same instant on both sides however
fast the machine runs (a real-time Postgres clock let a row come due on one side only on a
loaded machine). Ids
differ between the drivers (a Postgres sequence also draws for deduplicated rows), so the test
keeps a map from each Postgres id to its memory id.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar

import attrs
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.hypothesis_profiles import MACHINE_EXAMPLES
from trioq._core.errors import DedupKeyConflict
from trioq._core.identifiers import quote_ident
from trioq._memory import MemoryDriver
from trioq._pg.driver import open_pg_driver
from trioq._seam.driver import Claim, ClaimResult, Driver, JobRecord, NewJob, Settlement
from trioq._seam.lease import Lease
from trioq._seam.services import MaintenancePass, RenewLeases
from trioq._seam.workflow import Checkpoint, CheckpointWrite
from trioq.testing import ManualClock, SqlClock
from trioq.testing.transitions import CheckedDriver

QUEUE = "q"
LEASE = 60.0
TICK = 17.0  # multiples of 17 and 100 never come within 6 s of LEASE, DELAY or SLEEP
PAST_EVERY_LEASE = 100.0
DELAY = 40.0
STEP = 0.001
SLEEP = 25.0
KEY_HOLDING = frozenset({"running", "sleeping", "waiting"})
ERROR_JSON = '{"type": "Boom", "message": "handler failed"}'
WORKERS = {"A": (2, ("a", "b")), "B": (3, ("a",)), "C": (1, ("b",))}
KINDS = ("complete", "retry", "fail", "cancel", "release", "sleep", "wait")


@attrs.define(eq=False)
class Pair:
    """The two drivers and their clocks, inside the host's trio.run."""

    memory: MemoryDriver
    pg: Driver
    memory_clock: ManualClock
    pg_clock: SqlClock

    async def advance(self, seconds: float) -> None:
        await self.memory_clock.advance(seconds)
        await self.pg_clock.advance(seconds)


class DriverHost:
    """Runs the pair inside `trio.run` on a thread until `close()`; `call` runs there.

    One host serves every example of a test (`shared`): opening the pools and migrating a
    schema cost ~0.28 s an example on 2 loaded cores, half of a machine's 200 examples' time.
    Between examples `reset` empties the schema's tables (RESTART IDENTITY: the ids start
    again), sets the database clock back to the real time and frozen, and builds a fresh
    memory driver and clocks, so every example starts from the state a fresh schema has."""

    _shared: ClassVar[dict[str, DriverHost]] = {}

    @classmethod
    def shared(cls, pg_url: str, schema: str) -> DriverHost:
        """The test's host, reset for a new example (created with the first one)."""
        host = cls._shared.get(schema)
        if host is None:
            host = cls._shared[schema] = cls(pg_url, schema)
        else:
            host.reset()
        return host

    @classmethod
    def close_shared(cls, schema: str) -> None:
        host = cls._shared.pop(schema, None)
        if host is not None:
            host.close()

    def __init__(self, pg_url: str, schema: str) -> None:
        self._pg_url, self._schema = pg_url, schema
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
            trio.run(self._serve)
        except BaseException as exc:
            self._failure = exc
        finally:
            self._started.set()

    async def _serve(self) -> None:
        async with open_pg_driver(self._pg_url, self._schema, pool_size=2) as pg:
            await pg.migrate()
            self._pg, self._pg_clock = pg, await SqlClock.install(pg)
            async with pg.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s"
                    " AND tablename NOT IN ('migrations', 'function_digest', 'test_clock')",
                    (self._schema,),
                )
            schema = quote_ident(self._schema)
            self._truncate = "TRUNCATE {} RESTART IDENTITY CASCADE".format(
                ", ".join(f"{schema}.{quote_ident(name)}" for (name,) in rows)
            )
            await self._fresh_pair()
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                with trio.CancelScope(shield=True):
                    async with pg.transaction() as tx:
                        await tx.execute(f"DROP SCHEMA {quote_ident(self._schema)} CASCADE")

    async def _fresh_pair(self) -> None:
        clock = ManualClock()
        memory = MemoryDriver(schema=self._schema, clock=clock)
        await memory.migrate()
        await self._pg_clock.freeze()
        # Every row change either driver makes is checked against TRANSITIONS (the machine's
        # calls are serial); the clocks' raw SQL goes to the bare driver.
        checked_memory: Any = CheckedDriver(memory)
        self.pair = Pair(checked_memory, CheckedDriver(self._pg), clock, self._pg_clock)

    async def _reset(self) -> None:
        schema = quote_ident(self._schema)
        async with self._pg.transaction() as tx:
            await tx.execute(self._truncate)
            await tx.execute(f"UPDATE {schema}.test_clock SET offset_seconds = 0, frozen_at = NULL")
        await self._fresh_pair()

    def reset(self) -> None:
        self.call(self._reset)

    def call(self, function: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(function, *args, trio_token=self._token)

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)
        if self._failure is not None:
            raise self._failure


@attrs.define
class SimWorker:
    name: str
    slots: int
    tasks: tuple[str, ...]
    worker_id: uuid.UUID = attrs.field(factory=uuid.uuid4)
    held: list[int] = attrs.field(factory=list)  # memory ids of the jobs it believes it owns
    key_cursor: str = ""


@attrs.define
class Leases:
    """One job's current leases on each driver (tokens differ between drivers)."""

    memory: Lease
    pg: Lease
    next_position: int = 0
    plain: bool = False  # no partition key, no parent: its completions are marked plain


def _row(record: JobRecord | None) -> tuple[Any, ...] | None:
    """What must agree between the drivers (times and ids differ)."""
    if record is None:
        return None
    error_type = record.error.get("type") if isinstance(record.error, dict) else None
    return (
        record.state,
        record.attempt,
        record.max_attempts,
        record.priority,
        record.partition_key,
        record.task,
        json.dumps(record.result),
        error_type,
        record.run_at is None,
        record.finished_at is None,
    )


class DifferentialMachine(RuleBasedStateMachine):
    pg_url: str
    pg_schema: str

    def __init__(self) -> None:
        super().__init__()
        self.host = DriverHost.shared(self.pg_url, self.pg_schema)
        self.pair: Pair = self.host.pair
        self.to_memory: dict[int, int] = {}  # pg id -> memory id
        self.to_pg: dict[int, int] = {}
        self.leases: dict[int, Leases] = {}  # memory id -> current leases
        self.stale: list[Leases] = []
        self.workers = {name: SimWorker(name, *spec) for name, spec in WORKERS.items()}
        self.dedup_keys = 0

    def both(
        self, method: str, memory_args: tuple[Any, ...], pg_args: tuple[Any, ...]
    ) -> tuple[Any, Any]:
        memory = self.host.call(getattr(self.pair.memory, method), *memory_args)
        pg = self.host.call(getattr(self.pair.pg, method), *pg_args)
        # Both clocks step 1 ms after every call, or rows written by successive statements
        # would tie in claim order.
        self.host.call(self.pair.advance, STEP)
        return memory, pg

    def _inserted_or_refused(self, driver: Any, job: NewJob) -> Any:
        try:
            return self.host.call(driver.job_insert_many, [job])
        except DedupKeyConflict as exc:
            return exc

    # --- rules ----------------------------------------------------------------------------

    @rule(
        task=st.sampled_from(["a", "b"]),
        priority=st.integers(-1, 1),
        key=st.sampled_from([None, "k1", "k2"]),
        delayed=st.booleans(),
        dedup=st.sampled_from([None, "new", "repeat"]),
        max_attempts=st.integers(1, 3),
    )
    def enqueue(
        self,
        task: str,
        priority: int,
        key: str | None,
        delayed: bool,
        dedup: str | None,
        max_attempts: int,
    ) -> None:
        if dedup == "new":
            self.dedup_keys += 1
        dedup_key = None if dedup is None else f"d{self.dedup_keys}"
        job = NewJob(
            QUEUE,
            task,
            "{}",
            priority=priority,
            partition_key=key,
            dedup_key=dedup_key,
            delay_seconds=DELAY if delayed else None,
            max_attempts=max_attempts,
        )
        # A dedup key held by the other task's job is refused by both, or by neither.
        memory_outcome = self._inserted_or_refused(self.pair.memory, job)
        pg_outcome = self._inserted_or_refused(self.pair.pg, job)
        self.host.call(self.pair.advance, STEP)
        if isinstance(memory_outcome, DedupKeyConflict) or isinstance(pg_outcome, DedupKeyConflict):
            assert type(memory_outcome) is type(pg_outcome), (memory_outcome, pg_outcome)
            return
        [memory], [pg] = memory_outcome, pg_outcome
        assert memory.created == pg.created
        if memory.created:
            self.to_memory[pg.id] = memory.id
            self.to_pg[memory.id] = pg.id
        else:
            assert self.to_memory[pg.id] == memory.id

    @rule(
        name=st.sampled_from(sorted(WORKERS)),
        picks=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(KINDS)), max_size=3),
        window=st.sampled_from([1, 200]),
    )
    def settle_and_claim(self, name: str, picks: list[tuple[int, str]], window: int) -> None:
        worker = self.workers[name]
        chosen: dict[int, str] = {}
        for index, kind in picks:
            if worker.held:
                chosen.setdefault(worker.held[index % len(worker.held)], kind)
        memory_now, pg_now = self.host.call(self._nows)
        settlements = [
            (
                self._settlement(self.leases[job].memory, kind, memory_now, self.leases[job].plain),
                self._settlement(self.leases[job].pg, kind, pg_now, self.leases[job].plain),
            )
            for job, kind in chosen.items()
        ]
        # The worker's completer writes the outcomes, then its claim loop claims.
        if settlements:
            memory_written, pg_written = self.both(
                "job_settle_many",
                ([m for m, _ in settlements],),
                ([p for _, p in settlements],),
            )
            assert sorted(memory_written.settled) == sorted(
                (self.to_memory[job], state) for job, state in pg_written.settled
            )
        # A settle the drivers refused while the lease still holds (only a 'cancel' with no
        # stored request: it is recorded only for one) changed nothing: the worker still runs
        # that job, with the same lease. Every other chosen job was settled or had lost its
        # lease, so its lease is stale and its slot free.
        still_held = {job for job in chosen if self._lease_holds(job)}
        assert all(chosen[job] == "cancel" for job in still_held), (chosen, still_held)
        worker.held = [job for job in worker.held if job not in chosen or job in still_held]
        limit = max(0, worker.slots - len(worker.held))
        params = self._params(worker, limit, window)
        memory, pg = self.both("job_claim", (params,), (params,))
        self._compare_rounds(memory, pg)
        worker.key_cursor = memory.key_cursor or ""
        for job in chosen:
            if job not in still_held:
                self.stale.append(self.leases.pop(job))
        for claimed_memory, claimed_pg in zip(
            sorted(memory.claimed, key=lambda j: j.id),
            sorted(pg.claimed, key=lambda j: self.to_memory[j.id]),
            strict=True,
        ):
            history = _history(claimed_memory.history)
            assert history == _history(claimed_pg.history, self.to_memory)
            old = self.leases.get(claimed_memory.id)
            if old is not None:
                self.stale.append(old)
            assert claimed_memory.plain == claimed_pg.plain
            self.leases[claimed_memory.id] = Leases(
                claimed_memory.lease, claimed_pg.lease, len(history), claimed_pg.plain
            )
            worker.held.append(claimed_memory.id)
            for other in self.workers.values():
                if other is not worker and claimed_memory.id in other.held:
                    other.held.remove(claimed_memory.id)

    @precondition(lambda self: bool(self.leases))
    @rule(pick=st.integers(0, 100), sleep=st.booleans())
    def checkpoint(self, pick: int, sleep: bool) -> None:
        job = sorted(self.leases)[pick % len(self.leases)]
        leases = self.leases[job]
        position = leases.next_position

        def write(lease: Lease) -> CheckpointWrite:
            if sleep:
                return CheckpointWrite(lease, position, "sleep", "nap", "{}", SLEEP)
            return CheckpointWrite(lease, position, "step", f"s{position}", json.dumps(position))

        memory, pg = self.both(
            "checkpoint_insert_many", ([write(leases.memory)],), ([write(leases.pg)],)
        )
        assert [(w.position, sleep or w.value) for w in memory] == [
            (w.position, sleep or w.value) for w in pg
        ]
        if memory:
            leases.next_position += 1

    @rule(name=st.sampled_from(sorted(WORKERS)))
    def renew(self, name: str) -> None:
        worker = self.workers[name]
        held = [self.leases[job] for job in worker.held if job in self.leases]
        memory, pg = self.both(
            "lease_renew_many",
            (RenewLeases(worker.worker_id, "running", LEASE, tuple(h.memory for h in held)),),
            (RenewLeases(worker.worker_id, "running", LEASE, tuple(h.pg for h in held)),),
        )
        assert sorted((r.id, r.cancel_requested, r.confirmed) for r in memory.leases) == sorted(
            (self.to_memory[r.id], r.cancel_requested, r.confirmed) for r in pg.leases
        )
        assert memory.registered == pg.registered

    @precondition(lambda self: bool(self.stale))
    @rule(pick=st.integers(0, 100), kind=st.sampled_from([*KINDS, "renew", "checkpoint"]))
    def write_with_a_stale_lease(self, pick: int, kind: str) -> None:
        """A zombie writes with a lease it no longer holds: nothing changes on either side."""
        leases = self.stale[-1 - pick % min(3, len(self.stale))]
        for driver, lease in ((self.pair.memory, leases.memory), (self.pair.pg, leases.pg)):
            if kind == "renew":
                renewal = RenewLeases(uuid.uuid4(), "running", LEASE, (lease,))
                outcome: Any = self.host.call(driver.lease_renew_many, renewal).leases
            elif kind == "checkpoint":
                write = CheckpointWrite(lease, 99, "step", "zombie", "1")
                outcome = self.host.call(driver.checkpoint_insert_many, [write])
            else:
                now = datetime.datetime.now(datetime.UTC)
                settlements = [self._settlement(lease, kind, now)]
                outcome = self.host.call(driver.job_settle_many, settlements).settled
            assert not outcome, (kind, lease, outcome)

    @rule(seconds=st.sampled_from([TICK, PAST_EVERY_LEASE]))
    def let_time_pass(self, seconds: float) -> None:
        self.host.call(self.pair.advance, seconds)

    @rule()
    def recover(self) -> None:
        params = MaintenancePass()
        memory, pg = self.both("maintenance_pass", (params,), (params,))
        assert sorted(memory.recovered) == sorted(
            (self.to_memory[job], state) for job, state in pg.recovered
        )

    @precondition(lambda self: bool(self.to_pg))
    @rule(pick=st.integers(0, 1000), redrive=st.booleans())
    def cancel_or_retry(self, pick: int, redrive: bool) -> None:
        job = sorted(self.to_pg)[pick % len(self.to_pg)]
        method = "job_retry" if redrive else "job_cancel"
        memory, pg = self.both(method, (job,), (self.to_pg[job],))
        assert memory == pg

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def rows_agree_and_stay_safe(self) -> None:
        memory_ids = sorted(self.to_pg)
        memory = self.host.call(_records, self.pair.memory, memory_ids)
        pg = self.host.call(_records, self.pair.pg, [self.to_pg[job] for job in memory_ids])
        holders: collections.Counter[str] = collections.Counter()
        running: collections.Counter[uuid.UUID | None] = collections.Counter()
        for job, m, p in zip(memory_ids, memory, pg, strict=True):
            assert m is not None and p is not None, f"acknowledged job {job} is missing"
            assert _row(m) == _row(p), (job, m, p)
            if m.state in KEY_HOLDING and m.partition_key is not None:
                holders[m.partition_key] += 1
            if m.state == "running":
                running[m.worker_id] += 1
        assert all(count <= 1 for count in holders.values()), holders
        for worker in self.workers.values():
            assert running[worker.worker_id] <= worker.slots, worker

    # --- helpers --------------------------------------------------------------------------

    def _lease_holds(self, job: int) -> bool:
        """Whether the job's current memory lease still fences its row (the rows agree with
        Postgres's, checked by the invariant)."""
        row = self.pair.memory._state.rows.get(job)
        return row is not None and row.holds(self.leases[job].memory)

    async def _nows(self) -> tuple[datetime.datetime, datetime.datetime]:
        empty = Claim(QUEUE, (), 0, LEASE, uuid.uuid4(), promote_limit=0)
        memory = await self.pair.memory.job_claim(empty)
        pg = await self.pair.pg.job_claim(empty)
        return memory.now, pg.now

    @staticmethod
    def _settlement(
        lease: Lease, kind: str, now: datetime.datetime, plain: bool = False
    ) -> Settlement:
        wake_at = now + datetime.timedelta(seconds=SLEEP)
        return Settlement(
            lease,
            kind,
            result_json='{"ok": true}' if kind == "complete" else None,
            error_json=ERROR_JSON if kind in ("retry", "fail", "cancel") else None,
            delay_seconds=DELAY if kind == "retry" else None,
            wake_at=wake_at if kind in ("sleep", "wait") else None,
            plain=plain,
        )

    @staticmethod
    def _params(worker: SimWorker, limit: int, window: int) -> Claim:
        return Claim(
            QUEUE,
            worker.tasks,
            limit,
            LEASE,
            worker.worker_id,
            key_cursor=worker.key_cursor,
            key_window=window,
        )

    def _compare_rounds(self, memory: ClaimResult, pg: ClaimResult) -> None:
        assert sorted(job.id for job in memory.claimed) == sorted(
            self.to_memory[job.id] for job in pg.claimed
        )
        assert (memory.promoted, memory.key_cursor, memory.keys_visited) == (
            pg.promoted,
            pg.key_cursor,
            pg.keys_visited,
        )
        assert (memory.next_due is None) == (pg.next_due is None)
        if memory.next_due is not None and pg.next_due is not None:
            memory_wait = (memory.next_due - memory.now).total_seconds()
            pg_wait = (pg.next_due - pg.now).total_seconds()
            assert abs(memory_wait - pg_wait) < 5, (memory_wait, pg_wait)


def _history(
    history: tuple[Checkpoint, ...], to_memory: dict[int, int] | None = None
) -> list[tuple[Any, ...]]:
    """Checkpoints as both drivers must agree on them: a sleep's wake time, a pending wait's
    deadline and a spawned child's times are each driver's own clock, so every timestamp in a
    value is compared as a placeholder; a spawned child's id is each driver's own too (the
    machine maps ids: `to_memory`), so a PostgreSQL history's is read through `to_memory`.
    Compared raw, a found example (five enqueues, two with dedup keys, a claim, a spawn, a
    release) read the child's id one above the memory driver's."""
    return [
        (c.position, c.kind, c.name, None if c.kind == "sleep" else _without_times(c.value))
        for c in (history if to_memory is None else _children_read(history, to_memory))
    ]


def _children_read(history: tuple[Checkpoint, ...], to_memory: dict[int, int]) -> list[Any]:
    """`history` with each spawn checkpoint's child id as the memory driver's."""
    return [
        attrs.evolve(c, value={**c.value, "child_id": to_memory[c.value["child_id"]]})
        if c.kind == "spawn" and isinstance(c.value, dict) and c.value.get("child_id") in to_memory
        else c
        for c in history
    ]


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_times(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_times(item) for item in value]
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            return value
        return "<time>"
    return value


async def _records(driver: Driver, job_ids: list[int]) -> list[JobRecord | None]:
    return [await driver.job_get(job_id) for job_id in job_ids]


def run_machine(
    machine_class: type[DifferentialMachine], pg_url: str, pg_schema: str, steps: int
) -> None:
    """Run a differential machine's examples on one shared host, closed at the end."""
    machine = type("Machine", (machine_class,), {"pg_url": pg_url, "pg_schema": pg_schema})
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=MACHINE_EXAMPLES,
                stateful_step_count=steps,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            ),
        )
    finally:
        DriverHost.close_shared(pg_schema)


@contextlib.contextmanager
def one_example(
    machine_class: type[DifferentialMachine], pg_url: str, pg_schema: str
) -> Iterator[Any]:
    """A machine for a hand-written sequence of rules (a found example kept as a test: the
    Hypothesis database is not in the repository), its host closed at the end."""
    machine = type("Machine", (machine_class,), {"pg_url": pg_url, "pg_schema": pg_schema})
    try:
        yield machine()
    finally:
        DriverHost.close_shared(pg_schema)


def test_a_refused_cancel_leaves_the_job_held_with_its_lease(pg_url: str, pg_schema: str) -> None:
    """A 'cancel' settle with no stored request is refused: the worker still runs the job
    under the same lease, so it takes no extra job for that slot and the lease is not stale
    (the model once moved it to the stale ones and freed the slot: a 2-slot worker held 3
    running jobs, and a 'complete' with that still-valid lease counted as a zombie write)."""
    with one_example(DifferentialMachine, pg_url, pg_schema) as machine:
        for _ in range(3):
            machine.enqueue("a", 0, None, False, None, 1)
        machine.settle_and_claim("A", [], 1)
        machine.settle_and_claim("A", [(0, "cancel")], 1)
        machine.rows_agree_and_stay_safe()
        assert len(machine.workers["A"].held) == 2
        assert not machine.stale
        machine.settle_and_claim("A", [(0, "complete")], 1)
        machine.rows_agree_and_stay_safe()
        machine.write_with_a_stale_lease(0, "complete")
        machine.rows_agree_and_stay_safe()


@pytest.mark.slow
def test_both_drivers_agree_on_every_rule(pg_url: str, pg_schema: str) -> None:
    run_machine(DifferentialMachine, pg_url, pg_schema, steps=40)
