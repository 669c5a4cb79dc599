"""The plain claim and the plain completion (queries.sql job_claim_plain, job_complete_plain).
The claim loop asks for the plain claim when the queue's last claim said the next may be plain
(`ClaimResult.plain_next`); PgDriver runs it only when it does exactly what the full one would,
and hands the claim to the full one in the same call as soon as a keyed or due row shows up.
The completer's settle runs job_complete_plain only for completions of plain jobs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest
import trio

import trioq
from tests.support import analyze_records, make_app, run_explained, running_worker, scalar
from trioq._pg.driver import PgDriver, claim_params, open_pg_driver
from trioq._pg.replies import ClaimedRow
from trioq._seam.driver import Claim, ClaimedJob, ClaimResult, NewJob, Settlement, SettleResult
from trioq._seam.lease import Lease
from trioq._sql import queries

WORKER = uuid.uuid4()
POLL = 60.0  # nothing below may wait for a poll: notifications and timers only
CLAIM = "job_claim_plain"
FULL = "job_claim"
SETTLE = "job_settle_many"
COMPLETE = "job_complete_plain"
STATEMENTS = (CLAIM, FULL, SETTLE, COMPLETE)


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def complete(jobs: Sequence[ClaimedJob]) -> tuple[Settlement, ...]:
    return tuple(
        Settlement(job.lease, "complete", result_json="null", plain=job.plain) for job in jobs
    )


def _ran(driver: PgDriver, before: dict[str, int]) -> tuple[str, ...]:
    after = driver.statistics().calls
    return tuple(name for name in STATEMENTS if after.get(name, 0) > before.get(name, 0))


async def claim_(
    driver: PgDriver,
    plain: bool = False,
    limit: int = 25,
    versions: tuple[str, ...] | None = None,
    lookahead: float = 0.0,
) -> tuple[tuple[str, ...], ClaimResult]:
    """One claim; returns the statements it ran, in order, and its result."""
    before = dict(driver.statistics().calls)
    result = await driver.job_claim(
        Claim(
            queue="q",
            tasks=("t",),
            limit=limit,
            lease_seconds=30,
            worker_id=WORKER,
            task_versions=versions,
            lookahead_seconds=lookahead,
            plain=plain,
        )
    )
    return _ran(driver, before), result


async def settle_(
    driver: PgDriver, settlements: Sequence[Settlement]
) -> tuple[tuple[str, ...], SettleResult]:
    """One settle (the completer's flush); the statements it ran and its result."""
    before = dict(driver.statistics().calls)
    result = await driver.job_settle_many(settlements)
    return _ran(driver, before), result


async def test_the_first_claim_is_full_and_an_empty_queue_makes_the_next_plain(
    driver: PgDriver,
) -> None:
    ran, first = await claim_(driver)
    assert ran == (FULL,)  # nothing is known about the queue yet
    assert first.plain_next
    await driver.job_insert_many([NewJob("q", "t", '{"n": 1}')] * 3)
    ran, result = await claim_(driver, plain=first.plain_next)
    assert ran == (CLAIM,)
    assert [job.payload for job in result.claimed] == [{"n": 1}] * 3
    assert all(job.plain for job in result.claimed) and result.plain_next
    ran, written = await settle_(driver, complete(result.claimed))
    assert ran == (COMPLETE,)
    assert sorted(state for _, state in written.settled) == ["completed"] * 3


async def test_a_keyed_row_hands_the_claim_to_the_full_statement_in_the_same_call(
    driver: PgDriver,
) -> None:
    _, first = await claim_(driver)  # full, empty: plain from here
    await driver.job_insert_many([NewJob("q", "t", "{}", partition_key="k")])
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await claim_(driver, plain=first.plain_next)
    # The plain statement saw the keyed row and claimed nothing; the full one claimed both,
    # as it would have alone.
    assert ran == (CLAIM, FULL)
    assert sorted(job.partition_key or "" for job in result.claimed) == ["", "k"]
    keyed = next(job for job in result.claimed if job.partition_key == "k")
    assert not keyed.plain
    assert not result.plain_next  # it visited a key
    # The keyed job's completion is not plain: the full settle releases its key.
    ran, written = await settle_(driver, complete(result.claimed))
    assert ran == (SETTLE,)
    assert sorted(state for _, state in written.settled) == ["completed"] * 2
    locks = f'SELECT count(*) FROM "{driver.schema}".partition_locks'
    assert await scalar(driver._conninfo, locks) == 0
    ran, again = await claim_(driver, plain=result.plain_next)
    assert ran == (FULL,)
    assert again.plain_next  # no keyed or suspended row seen: plain again


async def test_a_row_due_later_keeps_the_queue_plain_and_gives_the_timer_its_due_time(
    driver: PgDriver,
) -> None:
    await claim_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}", delay_seconds=3600)])
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await claim_(driver, plain=True, lookahead=5.0)
    assert ran == (CLAIM,)  # not due within the lookahead: nothing to claim early
    assert len(result.claimed) == 1 and result.claimed[0].run_at <= result.now
    assert result.next_due is not None and result.next_due > result.now
    assert result.plain_next
    ran, again = await claim_(driver, plain=True, lookahead=5.0)
    assert ran == (CLAIM,)
    assert again.next_due == result.next_due  # the loop's timer follows it


async def test_a_row_due_within_the_lookahead_is_claimed_in_the_same_call(
    driver: PgDriver,
) -> None:
    await claim_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}", delay_seconds=0.5)])
    ran, result = await claim_(driver, plain=True, lookahead=5.0)
    assert ran == (CLAIM, FULL)  # blocked: the full statement claims it early
    [job] = result.claimed
    assert job.run_at > result.now  # claimed before its run_at (the executor holds it)
    assert result.plain_next  # the full one claimed what was due and saw nothing else


async def test_only_plain_completions_go_through_the_plain_statement(driver: PgDriver) -> None:
    await claim_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}")] * 2)
    _, result = await claim_(driver, plain=True)
    first, second = result.claimed
    failed = Settlement(second.lease, "fail", error_json='{"type": "E", "message": "m"}')
    ran, written = await settle_(driver, (*complete([first]), failed))
    assert ran == (SETTLE,)  # a failure records its attempt: the full statement's work
    assert dict(written.settled) == {first.id: "completed", second.id: "failed"}
    attempts = await scalar(
        driver._conninfo,
        f'SELECT count(*) FROM "{driver.schema}".attempts WHERE job_id = %s',
        (second.id,),
    )
    assert attempts == 1
    # A completion not marked plain (the default) is never taken for one.
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    _, result = await claim_(driver, plain=True)
    ran, written = await settle_(driver, (Settlement(result.claimed[0].lease, "complete", "1"),))
    assert ran == (SETTLE,)
    assert [state for _, state in written.settled] == ["completed"]


async def test_a_settle_of_plain_completions_runs_the_complete_statement(
    driver: PgDriver,
) -> None:
    """The completer's common flush: plain completions run job_complete_plain (fenced like
    the others); a batch with anything else runs job_settle_many."""
    await claim_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}")] * 3)
    _, result = await claim_(driver, plain=True)
    first, second, third = result.claimed
    lease = Lease(second.id, second.attempt, uuid.uuid4())
    stale = Settlement(lease, "complete", result_json="null", plain=True)
    ran, written = await settle_(driver, (*complete([first]), stale))
    assert ran == (COMPLETE,)
    assert dict(written.settled) == {first.id: "completed"}  # the stale lease wrote nothing
    assert written.now is not None and written.next_due is None
    release = Settlement(third.lease, "release")
    ran, written = await settle_(driver, (*complete([second]), release))
    assert ran == (SETTLE,)
    assert dict(written.settled) == {second.id: "completed", third.id: "ready"}


async def test_a_settle_reports_the_earliest_due_time_of_the_rows_it_suspended(
    driver: PgDriver,
) -> None:
    """The claim loop's timer takes it: a claim sent before the settle committed could not see
    those rows."""
    await driver.job_insert_many([NewJob("q", "t", "{}")] * 2)
    _, result = await claim_(driver)
    first, second = result.claimed
    retried = Settlement(first.lease, "retry", error_json='{"type": "E"}', delay_seconds=60)
    later = Settlement(second.lease, "retry", error_json='{"type": "E"}', delay_seconds=600)
    _, written = await settle_(driver, (retried, later))
    assert dict(written.settled) == {first.id: "scheduled", second.id: "scheduled"}
    assert written.next_due is not None
    assert 59 <= (written.next_due - written.now).total_seconds() <= 61


async def test_the_plain_claim_keeps_pauses_versions_and_fencing(driver: PgDriver) -> None:
    await claim_(driver, versions=("t@1",))
    await driver.job_insert_many([NewJob("q", "t", "{}", version=2), NewJob("q", "t", "{}")])
    ran, result = await claim_(driver, plain=True, versions=("t@1",))
    assert ran == (CLAIM,)
    assert [job.version for job in result.claimed] == [1]  # the v2 job is not this worker's
    (job,) = result.claimed
    wrong_token = Lease(job.id, job.attempt, uuid.uuid4())
    stale = Settlement(wrong_token, "complete", result_json="null", plain=True)
    ran, lost = await settle_(driver, (stale,))
    assert ran == (COMPLETE,)
    assert lost.settled == ()  # fenced: nothing written
    assert await driver.queue_pause("q")
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, paused = await claim_(driver, plain=True, versions=("t@1",))
    assert ran == (CLAIM,)
    assert paused.claimed == ()  # a paused queue claims nothing
    _, written = await settle_(driver, complete([job]))
    assert dict(written.settled) == {job.id: "completed"}  # completions still go through


async def test_a_worker_drains_plain_jobs_on_the_plain_statement_and_keyed_and_due_jobs_promptly(
    pg_url: str, pg_schema: str
) -> None:
    """Through a real worker whose poll never fires: the plain rounds of a drain, then a keyed
    job and a delayed job arriving in plain mode (a notification starts a plain round, which
    hands the claim to the full statement or follows the due time), then the key released for
    the next."""
    app = make_app(pg_url, pg_schema)

    @app.task("t")
    async def echo(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["n"]

    async with (
        app.client(migrate=True) as client,
        running_worker(app, poll_interval=POLL, concurrency=4),
    ):
        with trio.fail_after(20):
            jobs = await client.enqueue_many("t", [{"n": n} for n in range(40)])
            assert [await client.wait_result(job.id) for job in jobs] == list(range(40))
            assert client.driver.statistics().calls.get(CLAIM, 0) > 0
            keyed = await client.enqueue("t", {"n": 1}, partition_key="k")
            assert await client.wait_result(keyed.id) == 1
            due = await client.enqueue("t", {"n": 2}, delay=0.3)
            assert await client.wait_result(due.id) == 2
            again = await client.enqueue("t", {"n": 3}, partition_key="k")
            assert await client.wait_result(again.id) == 3  # the key was released


async def test_a_child_completing_in_plain_mode_wakes_its_suspended_parent(
    pg_url: str, pg_schema: str
) -> None:
    """Concurrency 1: the parent suspends (waiting, no deadline: the queue stays in plain
    mode) so the child can run; the child's completion is not plain (it has a parent), so the
    full statement writes it and wakes the parent."""
    app = make_app(pg_url, pg_schema)
    parent_runs = 0

    @app.task("square")
    async def square(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["n"] ** 2

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> int:
        nonlocal parent_runs
        parent_runs += 1
        child = await ctx.spawn("square", {"n": 7})
        return int(await ctx.wait_result(child))

    async with app.client(migrate=True) as client:
        warm = await client.enqueue("square", {"n": 1})
        async with running_worker(app, poll_interval=POLL, concurrency=1):
            with trio.fail_after(20):
                assert await client.wait_result(warm.id) == 1  # plain mode from here
                workflow = await client.enqueue("parent")
                assert await client.wait_result(workflow.id) == 49
    assert parent_runs == 2  # suspended once, woken by the child's completion
    child_parent = await scalar(
        pg_url,
        f'SELECT parent_id FROM "{pg_schema}".jobs WHERE task = %s AND id <> %s',
        ("square", warm.id),
    )
    assert child_parent == workflow.id


@pytest.mark.parametrize("name", [CLAIM])
async def test_the_generic_plan_reads_no_table_in_full_on_a_backlog(
    pg_url: str, pg_schema: str, driver: PgDriver, name: str
) -> None:
    """The plain claim's generic plan on a table whose statistics show a backlog has no
    Seq Scan of jobs: the claim's UPDATE finds the rows by primary key (a join left to the
    planner hashed a seq scan of jobs: a LIMIT read through a sub-select is estimated at a tenth
    of the table)."""
    statement = queries(pg_schema)[name]
    params = claim_params(Claim("q", ("t",), 25, 30.0, WORKER))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(
            f"INSERT INTO {pg_schema}.job_rows (queue, task, payload, phase, priority,"
            " run_at, created_at) SELECT 'q', 't', '{}', 'ready', 0, now(), now()"
            " FROM generate_series(1, 3000)"
        )
        analyze_records(conn, pg_schema)
        claimed, plans = run_explained(conn, statement, params)
    [plan] = [text for text in plans if "CTE unkeyed" in text]
    assert len(claimed) == 25
    # The ring's state is one row (migration 0041): read whole, it is one page.
    scans = [line for line in plan.splitlines() if "Seq Scan" in line]
    assert all("on ready_ring_state" in line for line in scans), plan


async def test_a_lost_connection_in_the_full_claim_after_a_blocked_plain_one_claims_nothing(
    driver: PgDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocked plain claim wrote nothing: when the full claim then fails with a lost
    connection, the call raises (the claim loop claims again at its next wake-up), and the next
    claim, a full one, takes the keyed job."""
    _, first = await claim_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}", partition_key="k")])  # blocks
    query = PgDriver._query

    async def lose_the_full_one(self, conn, name, params):  # type: ignore[no-untyped-def]
        if name == FULL:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await query(self, conn, name, params)

    monkeypatch.setattr(PgDriver, "_query", lose_the_full_one)
    with pytest.raises(psycopg.OperationalError):
        await claim_(driver, plain=first.plain_next)
    monkeypatch.undo()
    ran, after = await claim_(driver)
    assert ran == (FULL,)
    assert [job.partition_key for job in after.claimed] == ["k"]


@pytest.mark.parametrize("name", [CLAIM, FULL, "job_claim_rated"])
async def test_a_claim_commits_as_durably_as_every_other_write(
    pg_url: str, pg_schema: str, driver: PgDriver, name: str
) -> None:
    """No claim statement turns synchronous_commit off for its transaction. The worker starts
    the jobs on the claim's reply: a claim whose commit a crash lost after that reply had its
    jobs claimed again while the first worker still ran them, two runs of one job at once
    until its renewal noticed (the chaos soak's PostgreSQL restarts found it)."""
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    params = claim_params(Claim("q", ("t",), 25, 30.0, WORKER))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")  # production's (the test cluster's is off)
        with conn.transaction():
            claimed = conn.execute(queries(pg_schema)[name], params).fetchall()
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert [row[ClaimedRow.id] is not None for row in claimed] == [True]


async def test_a_claim_lost_with_its_commit_leaves_the_job_ready_and_fences_its_lease(
    pg_url: str, pg_schema: str, driver: PgDriver
) -> None:
    """A claim that rolls back (a statement timeout, a connection lost before its commit) is
    as if it never ran: the job is claimed again with the same attempt and a new lease token,
    and the lost claim's completion changes nothing."""
    [inserted] = await driver.job_insert_many([NewJob("q", "t", '{"n": 1}')])
    params = claim_params(Claim("q", ("t",), 25, 30.0, WORKER))
    with psycopg.connect(pg_url) as conn:  # a transaction, never committed
        rows = conn.execute(queries(pg_schema)[CLAIM], params).fetchall()
        [(lost_attempt, lost_token)] = [
            (row[ClaimedRow.attempt], row[ClaimedRow.lease_token]) for row in rows
        ]
        conn.rollback()
    _, result = await claim_(driver, plain=True)
    [job] = result.claimed
    assert (job.id, job.attempt) == (inserted.id, lost_attempt)
    assert job.lease_token != lost_token
    lost = Settlement(
        Lease(job.id, lost_attempt, lost_token), "complete", result_json="1", plain=True
    )
    _, written = await settle_(driver, [lost])
    assert written.settled == ()
    _, written = await settle_(driver, complete([job]))
    assert written.settled == ((job.id, "completed"),)
