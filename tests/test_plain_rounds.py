"""The plain round (queries.sql job_settle_and_claim_plain): PgDriver runs the lean statement
only when it does exactly what the full one would, and goes back to the full one as soon as a
round needs it (a keyed or due row, an outcome other than a plain completion)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest
import trio

import trioq
from tests.support import make_app, run_explained, running_worker, scalar
from trioq._driver import (
    ClaimedJob,
    Lease,
    NewJob,
    SettleAndClaim,
    SettleAndClaimResult,
    Settlement,
)
from trioq._pg.driver import PgDriver, open_pg_driver, settle_and_claim_params
from trioq._sql import queries

WORKER = uuid.uuid4()
POLL = 60.0  # nothing below may wait for a poll: notifications and timers only
PLAIN = "job_settle_and_claim_plain"
CLAIM = "job_claim_plain"  # the plain round with no outcomes
FULL = "job_settle_and_claim"
COMPLETE = "job_complete_plain"


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def complete(jobs: Sequence[ClaimedJob]) -> tuple[Settlement, ...]:
    return tuple(
        Settlement(job.lease, "complete", result_json="null", plain=job.plain) for job in jobs
    )


async def round_(
    driver: PgDriver,
    settlements: tuple[Settlement, ...] = (),
    limit: int = 25,
    versions: tuple[str, ...] | None = None,
    lookahead: float = 0.0,
) -> tuple[tuple[str, ...], SettleAndClaimResult]:
    """One round; returns the statements it ran, in order, and its result."""
    before = dict(driver.statistics().calls)
    result = await driver.job_settle_and_claim(
        SettleAndClaim(
            queue="q",
            tasks=("t",),
            limit=limit,
            lease_seconds=30,
            worker_id=WORKER,
            settlements=settlements,
            task_versions=versions,
            lookahead_seconds=lookahead,
        )
    )
    after = driver.statistics().calls
    ran = tuple(
        name for name in (PLAIN, CLAIM, FULL, COMPLETE) if after.get(name, 0) > before.get(name, 0)
    )
    return ran, result


async def test_the_first_round_is_full_and_an_empty_queue_makes_the_next_plain(
    driver: PgDriver,
) -> None:
    ran, _ = await round_(driver)
    assert ran == (FULL,)  # nothing is known about the queue yet
    await driver.job_insert_many([NewJob("q", "t", '{"n": 1}')] * 3)
    ran, result = await round_(driver)
    assert ran == (CLAIM,)
    assert [job.payload for job in result.claimed] == [{"n": 1}] * 3
    assert all(job.plain for job in result.claimed)
    ran, result = await round_(driver, complete(result.claimed))
    assert ran == (PLAIN,)
    assert sorted(state for _, state in result.settled) == ["completed"] * 3


async def test_a_keyed_row_hands_the_claim_to_the_full_statement_in_the_same_round(
    driver: PgDriver,
) -> None:
    await round_(driver)  # full, empty: plain from here
    await driver.job_insert_many([NewJob("q", "t", "{}", partition_key="k")])
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await round_(driver)
    # The plain statement saw the keyed row and claimed nothing; the full one claimed both,
    # as it would have alone.
    assert ran == (CLAIM, FULL)
    assert sorted(job.partition_key or "" for job in result.claimed) == ["", "k"]
    keyed = next(job for job in result.claimed if job.partition_key == "k")
    assert not keyed.plain
    # The keyed job's completion is not plain: the full statement releases its key.
    ran, result = await round_(driver, complete(result.claimed))
    assert ran == (FULL,)
    assert sorted(state for _, state in result.settled) == ["completed"] * 2
    locks = f'SELECT count(*) FROM "{driver.schema}".partition_locks'
    assert await scalar(driver._conninfo, locks) == 0
    ran, _ = await round_(driver)  # no keyed or suspended row seen: plain again
    assert ran == (CLAIM,)


async def test_a_row_due_later_keeps_the_queue_plain_and_gives_the_timer_its_due_time(
    driver: PgDriver,
) -> None:
    await round_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}", delay_seconds=3600)])
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await round_(driver, lookahead=5.0)
    assert ran == (CLAIM,)  # not due within the lookahead: nothing to claim early
    assert len(result.claimed) == 1 and result.claimed[0].run_at <= result.now
    assert result.next_due is not None and result.next_due > result.now
    ran, again = await round_(driver, complete(result.claimed), lookahead=5.0)
    assert ran == (PLAIN,)
    assert again.next_due == result.next_due  # the loop's timer follows it


async def test_a_row_due_within_the_lookahead_is_claimed_in_the_same_round(
    driver: PgDriver,
) -> None:
    await round_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}", delay_seconds=0.5)])
    ran, result = await round_(driver, lookahead=5.0)
    assert ran == (CLAIM, FULL)  # blocked: the full statement claims it early
    [job] = result.claimed
    assert job.run_at > result.now  # claimed before its run_at (the executor holds it)
    ran, _ = await round_(driver, complete([job]), lookahead=5.0)
    assert ran == (PLAIN,)  # the full one claimed what was due and saw nothing else


async def test_only_plain_completions_go_through_the_plain_statement(driver: PgDriver) -> None:
    await round_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}")] * 2)
    ran, result = await round_(driver)
    assert ran == (CLAIM,)
    first, second = result.claimed
    failed = Settlement(second.lease, "fail", error_json='{"type": "E", "message": "m"}')
    ran, result = await round_(driver, (*complete([first]), failed), limit=0)
    assert ran == (FULL,)  # a failure records its attempt: the full statement's work
    assert dict(result.settled) == {first.id: "completed", second.id: "failed"}
    attempts = await scalar(
        driver._conninfo,
        f'SELECT count(*) FROM "{driver.schema}".attempts WHERE job_id = %s',
        (second.id,),
    )
    assert attempts == 1
    # A completion not marked plain (the default) is never taken for one.
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await round_(driver)  # a settle-only round tells nothing of the queue
    assert ran == (CLAIM,)
    ran, result = await round_(driver, (Settlement(result.claimed[0].lease, "complete", "1"),))
    assert ran == (FULL,)
    assert [state for _, state in result.settled] == ["completed"]


async def test_a_settle_only_round_of_plain_completions_runs_the_complete_statement(
    driver: PgDriver,
) -> None:
    """The completer's common flush: plain completions with nothing to claim run
    job_complete_plain (fenced like the others); a batch with anything else runs the full
    statement."""
    await round_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}")] * 3)
    _, result = await round_(driver)
    first, second, third = result.claimed
    lease = Lease(second.id, second.attempt, uuid.uuid4())
    stale = Settlement(lease, "complete", result_json="null", plain=True)
    ran, written = await round_(driver, (*complete([first]), stale), limit=0)
    assert ran == (COMPLETE,)
    assert dict(written.settled) == {first.id: "completed"}  # the stale lease wrote nothing
    assert written.claimed == () and written.now is not None
    release = Settlement(third.lease, "release")
    ran, written = await round_(driver, (*complete([second]), release), limit=0)
    assert ran == (FULL,)
    assert dict(written.settled) == {second.id: "completed", third.id: "ready"}


async def test_the_plain_claim_keeps_pauses_versions_and_fencing(driver: PgDriver) -> None:
    await round_(driver, versions=("t@1",))
    await driver.job_insert_many([NewJob("q", "t", "{}", version=2), NewJob("q", "t", "{}")])
    ran, result = await round_(driver, versions=("t@1",))
    assert ran == (CLAIM,)
    assert [job.version for job in result.claimed] == [1]  # the v2 job is not this worker's
    (job,) = result.claimed
    wrong_token = Lease(job.id, job.attempt, uuid.uuid4())
    stale = Settlement(wrong_token, "complete", result_json="null", plain=True)
    ran, lost = await round_(driver, (stale,), versions=("t@1",))
    assert ran == (PLAIN,)
    assert lost.settled == ()  # fenced: nothing written
    assert await driver.queue_pause("q")
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, paused = await round_(driver, complete([job]), versions=("t@1",))
    assert ran == (PLAIN,)
    assert dict(paused.settled) == {job.id: "completed"}  # completions still go through
    assert paused.claimed == ()  # a paused queue claims nothing


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


@pytest.mark.parametrize("name", [PLAIN, CLAIM])
async def test_the_generic_plan_reads_no_table_in_full_on_a_backlog(
    pg_url: str, pg_schema: str, driver: PgDriver, name: str
) -> None:
    """The plain statements' generic plan on a table whose statistics show a backlog has no
    Seq Scan of jobs: the claim's UPDATE finds the rows by primary key (a join left to the
    planner hashed a seq scan of jobs: a LIMIT read through a sub-select is estimated at a tenth
    of the table)."""
    statement = queries(pg_schema)[name]
    params = settle_and_claim_params(SettleAndClaim("q", ("t",), 25, 30.0, WORKER))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(
            f"INSERT INTO {pg_schema}.jobs (queue, task, payload, state, priority, run_at,"
            " created_at) SELECT 'q', 't', '{}', 'ready', 0, now(), now()"
            " FROM generate_series(1, 3000)"
        )
        conn.execute(f"ANALYZE {pg_schema}.jobs")
        claimed, plans = run_explained(conn, statement, params)
    [plan] = [text for text in plans if "CTE unkeyed" in text]
    assert len(claimed) == 25
    assert "Seq Scan" not in plan, plan


async def test_a_lost_connection_after_a_blocked_plain_round_reports_what_it_wrote(
    driver: PgDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain statement commits its completions before the full one claims: when the full
    one then fails with a lost connection, the round still reports the completions (a retried
    round would find them written and call their leases lost), and the next round, a full one,
    claims."""
    await round_(driver)
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    ran, result = await round_(driver)
    assert ran == (CLAIM,)
    await driver.job_insert_many([NewJob("q", "t", "{}", partition_key="k")])  # blocks the next
    settle_rows = PgDriver._settle_rows

    async def lose_the_full_one(self, conn, params, name=FULL):  # type: ignore[no-untyped-def]
        if name == FULL:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await settle_rows(self, conn, params, name)

    monkeypatch.setattr(PgDriver, "_settle_rows", lose_the_full_one)
    blocked = await driver.job_settle_and_claim(
        SettleAndClaim("q", ("t",), 25, 30, WORKER, complete(result.claimed))
    )
    assert dict(blocked.settled) == {result.claimed[0].id: "completed"}
    assert blocked.claimed == ()
    monkeypatch.undo()
    ran, after = await round_(driver)
    assert ran == (FULL,)
    assert [job.partition_key for job in after.claimed] == ["k"]
