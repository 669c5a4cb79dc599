"""Durable workflows on PostgreSQL: steps, determinism, durable sleep, due-time precision, and
the claim path's guarantees (one job per key under racing snapshots, outcomes flushed on a hard
stop, only connection losses retried)."""

from __future__ import annotations

import datetime
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing

import trioq
from tests.support import (
    end_stall,
    hold_stall,
    make_app,
    running_worker,
    stall_db_now_once,
    wait_stalled,
    wait_until,
)
from trioq._memory import MemoryDriver
from trioq._pg.driver import PgDriver, _claimed_job, claim_params, open_pg_driver
from trioq._pg.replies import ClaimedRow
from trioq._seam.driver import Claim, ClaimResult, NewJob, Settlement, SettleResult
from trioq._seam.services import MaintenancePass
from trioq._seam.workflow import CheckpointWrite
from trioq._sql import queries
from trioq.testing import SqlClock


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


async def in_state(client: trioq.Client, job_id: int, state: str) -> bool:
    return (await client.get_job(job_id)).state == state


async def has_attempts(client: trioq.Client, job_id: int) -> bool:
    return bool(await client.attempts(job_id))


# --- steps -----------------------------------------------------------------------------------


async def test_completed_steps_are_not_rerun_when_the_job_retries(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    calls: list[str] = []

    def charge(amount: int) -> dict[str, int]:
        calls.append("charge")
        return {"charged": amount}

    async def notify() -> str:
        calls.append("notify")
        return "sent"

    @app.task("order", max_attempts=3, retry=trioq.RetryPolicy(base_seconds=0, jitter=0))
    async def order(ctx: trioq.Context, payload: dict[str, int]) -> list[Any]:
        charged = await ctx.step("charge", charge, payload["amount"])
        if ctx.job.attempt == 1:
            raise RuntimeError("crash between the steps")
        sent = await ctx.step("notify", notify)
        return [charged, sent]

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("order", {"amount": 5})
        with trio.fail_after(20):
            assert await client.wait_result(job.id) == [{"charged": 5}, "sent"]
    assert calls == ["charge", "notify"]


async def test_a_step_is_retried_in_place_then_fails_the_execution_naming_the_step(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    tries: list[int] = []

    async def flaky() -> None:
        tries.append(1)
        raise ValueError("card declined")

    @app.task("pay", max_attempts=1)
    async def pay(ctx: trioq.Context, payload: object) -> None:
        await ctx.step("charge card", flaky, retry=trioq.RetryPolicy(0, 0, 0, max_attempts=3))

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("pay", {})
        with trio.fail_after(20):
            record = await client.wait_final(job.id)
    assert len(tries) == 3
    assert record.state == "failed"
    assert record.error["step"] == "charge card"
    assert "step 'charge card'" in record.error["message"]
    assert "card declined" in record.error["message"]


async def test_step_writes_of_concurrent_handlers_share_statements(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("flow")
    async def flow(ctx: trioq.Context, payload: object) -> int:
        total = 0
        for n in range(3):
            total += await ctx.step(f"s{n}", lambda n=n: n)
        return total

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("flow", [{}] * 50)
        async with running_worker(app, concurrency=25) as worker:
            with trio.fail_after(30):
                results = [await client.wait_result(job.id) for job in jobs]
            statements, written = worker.checkpoints.statistics()
    assert results == [3] * 50
    assert written == 150
    assert statements < written / 3  # group commit: several handlers per statement


async def test_a_deleted_jobs_checkpoints_go_with_it_and_other_jobs_keep_theirs(
    pg_url: str, pg_schema: str
) -> None:
    """checkpoints has no foreign key to jobs (migration 0033): the jobs_checkpoints_delete
    trigger removes the history of deleted jobs, as ON DELETE CASCADE did, for a DELETE of
    several jobs in one statement and for `purge`."""
    app = make_app(pg_url, pg_schema)

    @app.task("flow")
    async def flow(ctx: trioq.Context, payload: object) -> int:
        return await ctx.step("a", lambda: 1) + await ctx.step("b", lambda: 2)

    def histories(conn: psycopg.Connection[Any]) -> dict[int, int]:
        rows = conn.execute(
            f"SELECT job_id, count(*) FROM {pg_schema}.checkpoints GROUP BY job_id"
        ).fetchall()
        return dict(rows)

    async with app.client(migrate=True) as client:
        jobs = [job.id for job in await client.enqueue_many("flow", [{}] * 3)]
        async with running_worker(app):
            with trio.fail_after(30):
                assert [await client.wait_result(job_id) for job_id in jobs] == [3] * 3
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert histories(conn) == dict.fromkeys(jobs, 2)
            conn.execute(f"DELETE FROM {pg_schema}.job_rows WHERE id = ANY(%s)", [jobs[:2]])
            assert histories(conn) == {jobs[2]: 2}
            assert await client.purge(states=["completed"], older_than=0) == 1
            assert histories(conn) == {}


# --- determinism -----------------------------------------------------------------------------


async def test_replay_against_changed_code_fails_with_nondeterminism_and_retry_after_the_fix(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    code = {"version": 1}
    gate = trio.Event()

    @app.task("flow", max_attempts=5)
    async def flow(ctx: trioq.Context, payload: object) -> str:
        name = "fetch" if code["version"] != 2 else "download"
        data = await ctx.step(name, lambda: "data")
        if not gate.is_set():
            raise RuntimeError("fail after the step: the next attempt replays it")
        return data

    async with app.client(migrate=True) as client:
        async with running_worker(app):
            job = await client.enqueue("flow", {})
            with trio.fail_after(20):
                await wait_until(lambda: has_attempts(client, job.id))
            code["version"] = 2  # a deploy renames the step under the running job
            gate.set()
            with trio.fail_after(20):
                record = await client.wait_final(job.id)
        assert record.state == "failed"
        assert record.error["type"] == "trioq._core.errors.NondeterminismError"
        assert "position 0" in record.error["message"]
        assert "'fetch'" in record.error["message"] and "'download'" in record.error["message"]
        code["version"] = 3  # the fix
        assert await client.retry(job.id) == "ready"
        async with running_worker(app):
            with trio.fail_after(20):
                assert await client.wait_result(job.id) == "data"


# --- durable sleep ---------------------------------------------------------------------------


async def test_sleep_frees_the_slot_and_resumes_after_the_wake_time(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    before: list[int] = []

    @app.task("nap")
    async def nap(ctx: trioq.Context, payload: object) -> int:
        await ctx.step("first", lambda: before.append(1))
        await ctx.sleep("nap", datetime.timedelta(seconds=10))
        return ctx.job.attempt

    async with app.client(migrate=True) as client:
        clock = await SqlClock.install(client.driver)
        async with running_worker(app, concurrency=1, poll_interval=30) as worker:
            job = await client.enqueue("nap", {})
            with trio.fail_after(20):
                await wait_until(lambda: in_state(client, job.id, "sleeping"))
            sleeping = await client.get_job(job.id)
            assert sleeping.attempt == 0  # no attempt consumed by the suspension
            await clock.advance(11)
            wake_loops(worker)
            with trio.fail_after(20):
                assert await client.wait_result(job.id) == 1
    assert before == [1]  # the step ran once


def wake_loops(worker: trioq.Worker) -> None:
    """SqlClock moved database time, not trio's: the loop's timer (set from the next due time
    its claim returned) would fire at the real wake time. Stand in for that timer."""
    for loop in worker.loops.values():
        loop.wake()


async def test_crash_during_a_durable_sleep_resumes_at_the_original_wake_time(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The sleep's checkpoint committed, then the worker died before settling: the job is
    recovered after its lease and replayed early; it sleeps again until the ORIGINAL wake time,
    not a fresh full sleep."""
    clock = await SqlClock.install(driver)
    [inserted] = await driver.job_insert_many([NewJob("default", "nap", "{}")])
    claim = await driver.job_claim(Claim("default", ("nap",), 1, 5, uuid.uuid4()))
    [job] = claim.claimed
    [written] = await driver.checkpoint_insert_many(
        [CheckpointWrite(job.lease, 0, "sleep", "nap", "{}", wake_in_seconds=10)]
    )
    wake_at = datetime.datetime.fromisoformat(written.value["wake_at"])
    await clock.advance(6)  # the lease (5 s) expires; 4 s of the sleep remain
    await driver.maintenance_pass(MaintenancePass())

    app = make_app(pg_url, pg_schema)

    @app.task("nap")
    async def nap(ctx: trioq.Context, payload: object) -> str:
        await ctx.sleep("nap", datetime.timedelta(seconds=10))
        return "awake"

    async with (
        app.client(driver=driver) as client,
        running_worker(app, poll_interval=30) as worker,
    ):
        with trio.fail_after(20):
            await wait_until(lambda: in_state(client, inserted.id, "sleeping"))
        record = await client.get_job(inserted.id)
        assert record.run_at == wake_at
        await clock.advance(5)
        wake_loops(worker)
        with trio.fail_after(20):
            assert await client.wait_result(inserted.id) == "awake"


async def test_fifty_sleeping_workflows_do_not_delay_a_ready_job_at_concurrency_one(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("sleeper")
    async def sleeper(ctx: trioq.Context, payload: object) -> None:
        await ctx.sleep("long", datetime.timedelta(hours=1))

    @app.task("quick")
    async def quick(ctx: trioq.Context, payload: object) -> str:
        return "done"

    async with app.client(migrate=True) as client:
        await client.enqueue_many("sleeper", [{}] * 50)
        async with running_worker(app, concurrency=1, poll_interval=30):
            with trio.fail_after(30):
                await wait_until(lambda: all_sleeping(client, 50))
            job = await client.enqueue("quick", {})
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == "done"


async def all_sleeping(client: trioq.Client, n: int) -> bool:
    status = {s.queue: s for s in await client.queue_status()}
    return "default" in status and status["default"].sleeping == n


# --- due-time precision ---------------------------------------------------------------------


async def test_jobs_due_between_polls_start_before_the_next_30_s_poll(
    pg_url: str, pg_schema: str
) -> None:
    """Three jobs due at staggered times; lateness is start vs due in database time. Only the
    poll interval bounds it here (a loaded machine delays everything); the exact start at the due
    time is tested in virtual time (test_runtime_virtual_time.py)."""
    app = make_app(pg_url, pg_schema)

    @app.task("due")
    async def due(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=30):
        jobs = [await client.enqueue("due", {}, delay=delay) for delay in (1.0, 1.4, 1.8)]
        with trio.fail_after(15):
            records = [await client.wait_final(job.id) for job in jobs]
    lateness = []
    for record in records:
        assert record.started_at is not None and record.run_at is not None
        lateness.append((record.started_at - record.run_at).total_seconds())
    assert all(late >= 0 for late in lateness), lateness
    assert max(lateness) < 30.0, lateness  # the worker's timer, not its next poll, started them


# --- one job per key, even across snapshots --------------------------------------------------


def test_better_priority_job_committed_between_two_snapshots_never_runs_beside_the_head(
    pg_url: str, pg_schema: str
) -> None:
    """Worker B takes its snapshot (key k free, head K1) and stalls; meanwhile a better-priority
    job K0 of key k commits and worker A claims it. When B resumes, its snapshot still says k is
    free and K1 is the head: only the database can stop it. B must claim nothing, without an
    error, and k must have one running job."""
    trio.run(_enqueue, pg_url, pg_schema, [NewJob("q", "t", "{}", partition_key="k")])
    statements = queries(pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as setup:
        stall_db_now_once(setup, pg_schema)

    def raw_claim(conn: psycopg.Connection[tuple[Any, ...]]) -> list[Any]:
        params = claim_params(Claim("q", ("t",), 1, 30, uuid.uuid4(), key_window=200))
        rows = conn.execute(statements["job_claim"], params).fetchall()
        return [_claimed_job(row) for row in rows if row[ClaimedRow.id] is not None]

    claimed_by_b: list[list[Any]] = []
    errors: list[BaseException] = []
    b_pid: queue.Queue[int] = queue.Queue()

    def worker_b() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("SELECT set_config('test.stall', 'on', false)")
                b_pid.put(conn.info.backend_pid)
                claimed_by_b.append(raw_claim(conn))
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(pg_url, autocommit=True) as a:
        hold_stall(a, pg_schema)  # B stays stalled until K0 is committed and claimed
        b = threading.Thread(target=worker_b)
        b.start()
        wait_stalled(a, b_pid.get(timeout=30))
        trio.run(
            _enqueue, pg_url, pg_schema, [NewJob("q", "t", "{}", priority=-1, partition_key="k")]
        )
        [k0] = raw_claim(a)
        end_stall(a, pg_schema)
        b.join(timeout=30)
        assert not b.is_alive(), "B's claim did not return"
        running = a.execute(
            f"SELECT id FROM {pg_schema}.jobs WHERE state = 'running' ORDER BY id"
        ).fetchall()
    assert errors == []
    assert claimed_by_b == [[]]
    assert running == [(k0.id,)]


async def _enqueue(pg_url: str, pg_schema: str, jobs: list[NewJob]) -> None:
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        await driver.job_insert_many(jobs)


# --- the claim round's error and exit paths (memory driver, virtual time) -------------------


@attrs.define(eq=False)
class FaultyDriver:
    """Wraps a MemoryDriver: the n-th claim or settle (counted together, in call order: the
    claim loop's and the completer's statements) hangs or raises, as told."""

    inner: MemoryDriver
    hang_on: int | None = None
    raise_on: dict[int, BaseException] = attrs.field(factory=dict)
    calls: int = 0
    hanging: trio.Event = attrs.field(factory=trio.Event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _call(self) -> None:
        self.calls += 1
        if self.calls == self.hang_on:
            self.hanging.set()
            await trio.sleep_forever()
        if self.calls in self.raise_on:
            await trio.lowlevel.checkpoint()
            raise self.raise_on[self.calls]

    async def job_claim(self, params: Claim) -> ClaimResult:
        await self._call()
        return await self.inner.job_claim(params)

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        await self._call()
        return await self.inner.job_settle_many(settlements)


async def test_outcomes_buffered_at_a_hard_stop_are_written_on_the_way_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")
    finished = trio.Event()

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> str:
        finished.set()
        return "result"

    memory = MemoryDriver()
    # Call 1 claims the job; call 2 (the completer writing its completion) hangs: a database
    # that stalls.
    faulty = FaultyDriver(memory, hang_on=2)
    async with app.client(driver=faulty) as client:  # type: ignore[arg-type]
        job = await client.enqueue("work", {})
        with trio.CancelScope() as hard_stop:
            async with running_worker(app, poll_interval=1.0):
                await finished.wait()
                await faulty.hanging.wait()
                hard_stop.cancel()  # second signal / write timeout: the loop is cancelled
        record = await memory.job_get(job.id)
    assert record is not None
    assert (record.state, record.result) == ("completed", "result")


async def test_a_bug_in_the_claim_round_stops_the_worker_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> None:
        return None

    faulty = FaultyDriver(MemoryDriver(), raise_on={2: RuntimeError("a bug in the round")})
    async with app.client(driver=faulty):  # type: ignore[arg-type]
        with pytest.RaisesGroup(
            pytest.RaisesExc(RuntimeError, match="a bug in the round"), flatten_subgroups=True
        ):
            with trio.fail_after(60):
                async with running_worker(app, poll_interval=1.0):
                    await trio.sleep(30)  # the worker stops by itself long before this


async def test_a_lost_connection_in_the_claim_round_is_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = trioq.App(schema="virtual")

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> str:
        return "ok"

    lost = {n: ConnectionError("server closed the connection") for n in (2, 3, 4)}
    faulty = FaultyDriver(MemoryDriver(), raise_on=lost)
    async with (
        app.client(driver=faulty) as client,  # type: ignore[arg-type]
        running_worker(app, poll_interval=1.0),
    ):
        await trio.sleep(2)  # the failing rounds pass
        job = await client.enqueue("work", {})
        with trio.fail_after(60):
            assert await client.wait_result(job.id, timeout=None) == "ok"


async def test_a_checkpoint_batch_without_values_is_written_by_the_plain_statement(
    driver: PgDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain workflow's checkpoints skip the values' CTEs; a batch carrying a value still
    writes it (and both are fenced alike)."""
    sent: list[str] = []
    original = PgDriver._retrying

    async def recording(self: PgDriver, name: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(name)
        return await original(self, name, *args, **kwargs)

    monkeypatch.setattr(PgDriver, "_retrying", recording)
    await driver.job_insert_many([NewJob("default", "flow", "{}")])
    claim = await driver.job_claim(Claim("default", ("flow",), 1, 30, uuid.uuid4()))
    [job] = claim.claimed
    sent.clear()
    [plain] = await driver.checkpoint_insert_many([CheckpointWrite(job.lease, 0, "step", "a", "1")])
    valued = CheckpointWrite(job.lease, 1, "step", "b", "2", values=(("progress", '"half"'),))
    [carried] = await driver.checkpoint_insert_many([valued])
    stale = attrs.evolve(job.lease, attempt=job.lease.attempt + 1)
    lost = await driver.checkpoint_insert_many([CheckpointWrite(stale, 2, "step", "c", "3")])
    assert sent == [
        "checkpoint_insert_many_plain",
        "checkpoint_insert_many",
        "checkpoint_insert_many_plain",
    ]
    assert (plain.value, carried.value, lost) == (1, 2, [])
    read = await driver.job_value_get(job.id, "progress")
    assert (read.found, read.value) == (True, "half")


async def test_a_repeated_checkpoint_write_answers_the_stored_value(driver: PgDriver) -> None:
    """A batch sent again after a lost connection finds its positions taken: each write is
    answered with the value stored first (not the repeat's), beside a new write in the same
    batch, and names and values that need quoting in an array literal arrive intact."""
    await driver.job_insert_many([NewJob("default", "flow", "{}")])
    claim = await driver.job_claim(Claim("default", ("flow",), 1, 30, uuid.uuid4()))
    [job] = claim.claimed
    name = 'odd "name", {with} \\ quotes'
    [first] = await driver.checkpoint_insert_many(
        [CheckpointWrite(job.lease, 0, "step", name, '{"a": "x\\"y", "b": null}')]
    )
    again, new = await driver.checkpoint_insert_many(
        [
            CheckpointWrite(job.lease, 0, "step", name, '"other"'),
            CheckpointWrite(job.lease, 1, "sleep", "nap", None, wake_in_seconds=1.5),
        ]
    )
    assert first.value == again.value == {"a": 'x"y', "b": None}
    assert (new.position, sorted(new.value)) == (1, ["wake_at"])
    stored = await driver.checkpoint_list(job.id)
    assert [(c.position, c.kind, c.name) for c in stored] == [
        (0, "step", name),
        (1, "sleep", "nap"),
    ]
