"""What the claim statement reads and when due work starts.

The claim's cost is read from the statement's own plan (`EXPLAIN (ANALYZE, BUFFERS)` inside a
rolled-back transaction), not from timings: the number of buffers it touches is a count that
either grows with a backlog it should not see or does not.
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from typing import Any

import attrs
import psycopg
import pytest
import trio

import trioq
from tests.support import (
    Gate,
    analyze_records,
    force_checkpoint_count,
    force_sleeping,
    make_app,
    run_explained,
    running_worker,
    wake_waiting,
)
from trioq._pg.driver import claim_params, open_pg_driver
from trioq._runtime.job.claim_loop import WorkerHooks
from trioq._seam.driver import Claim, NewJob, Settlement
from trioq._sql import positional_queries, queries


def _claim_buffers(pg_url: str, schema: str, tasks: list[str]) -> tuple[int, int]:
    """(shared buffers touched, rows claimed) by one claim of `tasks`, rolled back."""
    statement = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries(schema)["job_claim"]
    with psycopg.connect(pg_url) as conn:
        [[plan]] = conn.execute(
            statement,
            claim_params(Claim("default", tuple(tasks), 25, 30.0, uuid.uuid4())),
        ).fetchall()
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], top["Actual Rows"]


async def test_a_backlog_of_a_task_no_worker_serves_is_not_scanned_by_the_claim(
    pg_url: str, pg_schema: str
) -> None:
    """3,000 ready jobs of an unserved task ahead (better priority) of one served job: the claim
    of the served task touches about as many buffers as with no such backlog at all."""
    app = make_app(pg_url, pg_schema)  # a producer: no handlers, tasks by declaration
    async with app.client(migrate=True) as client:
        await client.enqueue(trioq.TaskDeclaration("noop"), {})
        alone, claimed_alone = _claim_buffers(pg_url, pg_schema, ["noop"])
        unserved = trioq.TaskDeclaration("unserved")
        await client.enqueue_many(unserved, [{} for _ in range(3000)], priority=-10)
        behind, claimed_behind = _claim_buffers(pg_url, pg_schema, ["noop"])
    assert claimed_alone == claimed_behind == 1
    # Stepping over the backlog reads 3,000 index entries and their heap rows (thousands of
    # buffer hits); probing the served task's own rows does not grow with it.
    assert behind < alone + 50, (alone, behind)


async def test_a_delayed_job_starts_in_the_round_its_timer_fires(
    pg_url: str, pg_schema: str
) -> None:
    """A job that becomes due is claimed by the same statement that finds it due (no second
    round to claim what the first promoted): with nothing else to do, the worker runs exactly
    one claim round between the job's enqueue-time round and its start."""
    app = make_app(pg_url, pg_schema)
    started = trio.Event()
    first_round = trio.Event()
    rounds: list[tuple[int, int]] = []

    def on_round(queue: str, requested: int, claimed: int) -> None:
        rounds.append((requested, claimed))
        first_round.set()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        started.set()

    hooks = WorkerHooks(on_round=on_round)
    async with (
        app.client(migrate=True) as client,
        running_worker(app, concurrency=2, poll_interval=30.0, hooks=hooks),
    ):
        with trio.fail_after(10):
            await first_round.wait()  # the start-up round has run (it found nothing)
        before = len(rounds)
        await client.enqueue("noop", {}, delay=0.3)
        with trio.fail_after(10):
            await started.wait()
        after = rounds[before:]
    # The enqueue's notification wakes one round (the job is not due yet: it sets the timer);
    # the timer's round claims it. Before, that round only promoted it and a third claimed it.
    claimed = [count for _, count in after]
    assert 1 in claimed and claimed.index(1) <= 1, after


async def test_a_job_claimed_within_the_lookahead_is_held_until_its_run_at(
    pg_url: str, pg_schema: str
) -> None:
    """The timer fires before the due time; the round claims the delayed job early and the
    worker holds it: its handler starts at its run_at (by the wall clock the database shares
    with this machine), never before, although the claim ran before it."""
    app = make_app(pg_url, pg_schema)
    started = trio.Event()
    handler_start: list[float] = []
    claimed_at: list[float] = []

    def on_round(queue: str, requested: int, claimed: int) -> None:
        if claimed:
            claimed_at.append(time.time())

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        handler_start.append(time.time())
        started.set()

    async with (
        app.client(migrate=True) as client,
        running_worker(app, concurrency=2, poll_interval=30.0, hooks=WorkerHooks(on_round)),
    ):
        job = await client.enqueue("noop", {}, delay=0.5)
        with trio.fail_after(10):
            await started.wait()
        record = await client.get_job(job.id)
    assert record is not None and record.run_at is not None
    due = record.run_at.timestamp()
    assert claimed_at[0] < due, "claimed early, within the lookahead"
    assert handler_start[0] >= due, "held until its run_at"
    assert record.started_at == record.run_at


SUSPENDED_FILL = """
INSERT INTO {schema}.job_rows (queue, task, payload, phase, priority, run_at, created_at,
                           checkpoint_count)
SELECT 'default', 'noop', '{{}}', 'sleeping', 0, now() + interval '1 day', now(), 1
FROM generate_series(1, 3000);
INSERT INTO {schema}.job_rows (queue, task, payload, phase, priority, run_at, created_at)
SELECT 'default', 'noop', '{{}}', 'scheduled', -1, now() + interval '1 hour', now()
FROM generate_series(1, 2000)
"""


async def test_the_claim_keeps_one_generic_plan_on_a_table_with_statistics(
    pg_url: str, pg_schema: str
) -> None:
    """Regression (suspended load): on a table whose statistics show a ready backlog
    and suspended rows, the plan cache estimated the claim's generic plan dearer than the
    custom plans (which see the limit, the lookahead and the task list) and re-planned the
    statement at every call (2-3 ms of planning each). Read through scalar sub-selects, the
    parameters shape neither plan's estimates: after its five custom plans, the prepared
    statement runs the generic plan (pg_prepared_statements counts both)."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        await client.enqueue_many(trioq.TaskDeclaration("noop"), [{} for _ in range(10_000)])
    statement = queries(pg_schema)["job_claim"]
    params = claim_params(Claim("default", ("noop",), 25, 30.0, uuid.uuid4()))
    with psycopg.connect(pg_url) as conn:
        for fill in SUSPENDED_FILL.format(schema=pg_schema).split(";"):
            conn.execute(fill)
        analyze_records(conn, pg_schema)
        claimed = [len(conn.execute(statement, params, prepare=True).fetchall()) for _ in range(10)]
        [(generic, custom)] = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%partition_locks%'"
        ).fetchall()
        conn.rollback()
    assert claimed == [25] * 10
    assert (custom, generic) == (5, 5)


async def test_the_driver_runs_the_claim_on_its_generic_plan(pg_url: str, pg_schema: str) -> None:
    """The same through the driver's own path (prepared once per session on a pooled
    connection): ten claims on a table with statistics, then that session's counts. The first
    claim is the full statement, the nine after it the plain one (tests/test_plain_rounds.py):
    five custom plans, then the generic plan."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        await client.enqueue_many(trioq.TaskDeclaration("noop"), [{} for _ in range(10_000)])
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for fill in SUSPENDED_FILL.format(schema=pg_schema).split(";"):
                conn.execute(fill)
            analyze_records(conn, pg_schema)
        claim = Claim("default", ("noop",), 25, 30.0, uuid.uuid4())
        claimed = []
        for _ in range(10):  # each claim in the form the one before said, as the claim loop
            result = await client.driver.job_claim(claim)
            claimed.append(len(result.claimed))
            claim = attrs.evolve(claim, plain=result.plain_next)
        async with client.transaction() as tx:  # the pool hands out the claims' connection
            rows = await tx.fetch(
                "SELECT statement LIKE '%partition_locks%', generic_plans, custom_plans"
                " FROM pg_prepared_statements WHERE statement LIKE '%lease_token%' ORDER BY 1"
            )
    assert claimed == [25] * 10
    assert [tuple(row) for row in rows] == [(False, 4, 5), (True, 0, 1)]


KEYED = {"partition": {"partition_key": "k"}, "concurrency": {"concurrency_key": "k"}}


@pytest.mark.parametrize("kind", sorted(KEYED))
async def test_a_long_keys_backlog_is_not_walked_by_the_claim(
    pg_url: str, pg_schema: str, kind: str
) -> None:
    """The claim of a key's head reads ready_keyed's first entry of the key (migration 0048):
    its buffers with 3,000 more jobs queued on the key are about those with one."""
    keys: dict[str, Any] = KEYED[kind]
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        await driver.job_insert_many([NewJob("default", "noop", "{}", **keys)])
        alone, claimed_alone = _claim_buffers(pg_url, pg_schema, ["noop"])
        await driver.job_insert_many([NewJob("default", "noop", "{}", **keys)] * 3000)
        behind, claimed_behind = _claim_buffers(pg_url, pg_schema, ["noop"])
    assert claimed_alone == claimed_behind == 1
    assert behind < alone + 50, (alone, behind)


async def test_a_held_keys_holder_ready_again_is_found_without_a_walk_of_its_key(
    pg_url: str, pg_schema: str
) -> None:
    """A partition key's holder woken from a wait is the key's only candidate: its row by
    primary key, then one exact probe of its entry. 3,000 jobs of the key queued behind it
    cost the claim about nothing."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        await driver.job_insert_many([NewJob("default", "noop", "{}", partition_key="k")])
        claim = Claim("default", ("noop",), 1, 30.0, uuid.uuid4())
        [holder] = (await driver.job_claim(claim)).claimed
        await driver.job_settle_many([Settlement(holder.lease, "wait", wake_at=None)])
        wake_waiting(pg_url, pg_schema, [holder.id])
        await driver.job_insert_many([NewJob("default", "noop", "{}", partition_key="k")])
        alone, claimed_alone = _claim_buffers(pg_url, pg_schema, ["noop"])
        await driver.job_insert_many([NewJob("default", "noop", "{}", partition_key="k")] * 3000)
        behind, claimed_behind = _claim_buffers(pg_url, pg_schema, ["noop"])
    assert claimed_alone == claimed_behind == 1
    assert behind < alone + 50, (alone, behind)


async def test_a_generic_plan_made_on_an_empty_table_probes_keyed_heads_by_primary_key(
    pg_url: str, pg_schema: str
) -> None:
    """A worker that starts on an empty queue has its claim's generic plan made then; before,
    the keyed source joined jobs to the heads with a seq scan of jobs as the outer side, so
    that plan read every row of the backlog that arrived later at every claim. The plan
    (auto_explain, as a notice) of the keyed source has no seq scan."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True):
        pass
    statement = queries(pg_schema)["job_claim"]
    params = claim_params(Claim("default", ("noop",), 25, 30.0, uuid.uuid4()))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(statement, params, prepare=True)  # planned on the empty table
        conn.execute(
            f"INSERT INTO {pg_schema}.job_rows (queue, task, payload, phase, priority,"
            " run_at, created_at) SELECT 'default', 'noop', '{}', 'ready', 0, now(), now()"
            " FROM generate_series(1, 3000)"
        )
        claimed, plans = run_explained(conn, statement, params)
    [plan] = [text for text in plans if "CTE keyed" in text]
    keyed = plan.split("CTE keyed")[1].split("CTE unkeyed")[0]
    assert len(claimed) == 25
    assert "Seq Scan" not in keyed, keyed


async def test_a_generic_plan_made_on_an_empty_table_reads_ready_keyed_by_its_key(
    pg_url: str, pg_schema: str
) -> None:
    """The keyed claim's generic plan made while ready_keyed is empty still probes its primary
    key for the keys, the heads and the limits (the taken entries are deleted by address,
    ready_keyed_take()): no plan reads the table whole once a backlog of 3,000 entries over
    300 keys of each kind arrived."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        statement = queries(pg_schema)["job_claim"]
        params = claim_params(Claim("default", ("noop",), 25, 30.0, uuid.uuid4()))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(statement, params, prepare=True)  # planned on the empty table
            await driver.job_insert_many(
                [NewJob("default", "noop", "{}", partition_key=f"p{n % 300}") for n in range(3000)]
                + [
                    NewJob("default", "noop", "{}", concurrency_key=f"c{n % 300}")
                    for n in range(3000)
                ]
            )
            claimed, plans = run_explained(conn, statement, params)
    [plan] = [text for text in plans if "CTE heads" in text]
    assert len(claimed) == 25
    assert "Seq Scan on ready_keyed" not in plan, plan
    assert "Bitmap Heap Scan on ready_keyed" not in plan, plan


async def test_an_idle_worker_runs_one_claim_per_notified_job(pg_url: str, pg_schema: str) -> None:
    """Jobs enqueued one at a time into an idle worker: each job is claimed by a round of its
    own, and the slot its handler frees claims nothing more (that claim would find nothing:
    the round before it was short and nothing new was notified). Rounds run one after another,
    so once a job's handler has started its round has been counted. (The client waits on the
    handler, not on the job's result: a result watch on a ready job notifies its queue once
    more, a round that may find nothing.)
    One exception is the design's, not a slot's: on a busy server a round sent while the last
    job's handler still held its slot can run after the next enqueue commits and take that
    job with its one open slot, a full round; after a full round a slot that opens claims
    again, and an empty claim right after a full one is retried once (claim_loop.py). So an
    empty round may follow a full one, at most two in a row, and never a short one (it failed
    1 run in 24 with two runs at once, before and after this stop's changes)."""
    app = make_app(pg_url, pg_schema)
    rounds: list[tuple[int, int]] = []
    first_round = trio.Event()
    send, started = trio.open_memory_channel[int](10)

    def on_round(queue: str, requested: int, claimed: int) -> None:
        rounds.append((requested, claimed))
        first_round.set()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        send.send_nowait(payload["n"])

    hooks = WorkerHooks(on_round=on_round)
    async with (
        app.client(migrate=True) as client,
        running_worker(app, concurrency=2, poll_interval=30.0, hooks=hooks),
    ):
        with trio.fail_after(10):
            await first_round.wait()  # the start-up round (it found nothing)
            # A first job: start-up's wake-ups (the listener's self-probe among them) are
            # over once it has run.
            await client.enqueue("noop", {"n": -1})
            assert await started.receive() == -1
            before = len(rounds)
            for n in range(6):
                await client.enqueue("noop", {"n": n})
                assert await started.receive() == n
            after = rounds[before:]
    assert [claimed for _, claimed in after if claimed] == [1] * 6, after
    last_full, empty_in_a_row = False, 0
    for requested, claimed in after:
        if claimed:
            last_full, empty_in_a_row = claimed == requested, 0
        else:
            empty_in_a_row += 1
            assert last_full and empty_in_a_row <= 2, after


async def test_without_notifications_a_slot_that_opens_claims_work_enqueued_meanwhile(
    pg_url: str, pg_schema: str
) -> None:
    """Poll-only (no LISTEN): nothing announces a job enqueued after a short claim, so the
    slot a handler frees claims again at once, not at the next poll (30 s here)."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()
    started = trio.Event()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: Any) -> None:
        gate.enter()
        await gate.release.wait()

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        started.set()

    async with app.client(migrate=True) as client:
        await client.enqueue("hold", {})
        await client.enqueue("hold", {})
        async with running_worker(app, concurrency=3, poll_interval=30.0, notifications=False):
            with trio.fail_after(10):
                await gate.wait_entered(2)  # the first claim: 2 of 3 slots, short
                await client.enqueue("noop", {})
                gate.release.set()  # the held handlers end: their slots claim again
                await started.wait()


RUNNING_ROW_STATEMENTS = (
    "job_complete_plain",
    "job_complete_discard",
    "job_settle_many",
    "lease_renew_many",
)


def generic_plans(pg_url: str, schema: str, names: tuple[str, ...]) -> dict[str, str]:
    """Each statement's generic plan (PREPARE, then EXPLAIN EXECUTE with every parameter NULL:
    the plan, not a run)."""
    plans = {}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for name in names:
            statement = positional_queries(schema)[name]
            conn.execute(f"PREPARE {name} AS {statement.text.decode()}")
            nulls = ", ".join(["NULL"] * len(statement.names))
            rows = conn.execute(f"EXPLAIN EXECUTE {name}({nulls})").fetchall()
            plans[name] = "\n".join(row[0] for row in rows)
    return plans


async def test_the_statements_of_running_jobs_find_them_by_primary_key(
    pg_url: str, pg_schema: str
) -> None:
    """The completion, the settle, the discard and the renewal find their runs and rows by
    primary key: an index of running jobs is small by the statistics, and under a pinned
    horizon it holds an entry for every job that ran since (a completion that read
    jobs_lease_idx went 0.7 -> 21 ms in 90 s at 800 jobs/s; job_runs has no such index since
    migration 0051, and its primary key is the one left to choose). The runs
    (migration 0047) churn a row per job the same way. RISK: with a few dozen runs a generic
    plan scans job_runs whole (cheaper at that size; 2,000 here, a busy cluster's count, take
    the key): bench.pinned_horizon must show whether such a plan survives into a bloated
    table."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True):
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {pg_schema}.job_rows (queue, task, payload, phase, priority,"
            " run_at, created_at)"
            " SELECT 'default', 'noop', '{}', CASE WHEN n <= 2000 THEN 'claimed' ELSE 'ready' END,"
            " 0, now(), now() FROM generate_series(1, 20000) AS n"
        )
        conn.execute(
            f"INSERT INTO {pg_schema}.job_runs (job_id, attempt, lease_token, lease_expires_at,"
            " traced, executions, queue, result_watched)"
            f" SELECT id, 1, gen_random_uuid(), now() + interval '30 s', false, 1, queue, false"
            f" FROM {pg_schema}.job_rows WHERE phase = 'claimed'"
        )
        analyze_records(conn, pg_schema)
        conn.execute(f"ANALYZE {pg_schema}.job_runs")
    plans = generic_plans(pg_url, pg_schema, RUNNING_ROW_STATEMENTS)
    for name, plan in plans.items():
        # The completions and the settle end their runs in job_runs_finish_fenced() and
        # job_runs_settle_fenced() (the next test shows their plans).
        by_key = ("job_runs_pkey", "job_runs_finish_fenced", "job_runs_settle_fenced")
        assert any(found in plan for found in by_key), (name, plan)


async def test_the_completions_find_their_runs_by_key_in_a_job_runs_bloated_since_planned(
    pg_url: str, pg_schema: str
) -> None:
    """job_runs_finish_fenced() and job_runs_settle_fenced() (the completions' and the settle's
    fence) plan their DELETE once per session, here while job_runs holds a page; then 20,000
    runs come and go without a vacuum (a live drain between two autovacuums leaves 3.5 MB and
    no row). Their next calls still probe the primary key: a few buffers a run, not the table
    (a generic plan made on a page, with seqscan allowed, scans it whole)."""
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many(trioq.TaskDeclaration("noop"), [{}] * 26)
    ids = [job.id for job in jobs]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {pg_schema}.job_runs SET (autovacuum_enabled = off)")
        runs = conn.execute(
            f"INSERT INTO {pg_schema}.job_runs (job_id, attempt, lease_token, lease_expires_at,"
            " traced, executions, queue, result_watched)"
            " SELECT id, 1, gen_random_uuid(), now() + interval '30 s', false, 1, queue, false"
            f" FROM {pg_schema}.job_rows WHERE id = ANY(%s) ORDER BY id"
            " RETURNING job_id, attempt, lease_token",
            (ids,),
        ).fetchall()
        end = f"{pg_schema}.job_runs_finish_fenced(%s, %s, %s)"
        settle = f"{pg_schema}.job_runs_settle_fenced(%s, %s, %s, %s)"

        def ended(batch: list[Any]) -> list[Any]:
            return [[run[0] for run in batch], [run[1] for run in batch], [run[2] for run in batch]]

        def settled(batch: list[Any]) -> list[Any]:
            return [*ended(batch), ["sleeping"] * len(batch)]

        assert conn.execute(f"SELECT count(*) FROM {end}", ended(runs[:1])).fetchone() == (1,)
        assert conn.execute(f"SELECT count(*) FROM {settle}", settled(runs[1:2])).fetchone() == (1,)
        for _ in range(20):  # 1,000 runs at a time, each batch deleted once inserted
            conn.execute(
                f"WITH added AS (INSERT INTO {pg_schema}.job_runs (job_id, attempt, lease_token,"
                " lease_expires_at, traced, executions, queue, result_watched)"
                " SELECT -n, 1, gen_random_uuid(), now(), false, 1, 'default', false"
                " FROM generate_series(1, 1000) AS n RETURNING job_id)"
                " SELECT count(*) FROM added"
            )
            conn.execute(f"DELETE FROM {pg_schema}.job_runs WHERE job_id < 0")
        [[pages]] = conn.execute(
            f"SELECT pg_relation_size('{pg_schema}.job_runs') / 8192"
        ).fetchall()
        plans = [
            conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM {function}", arguments
            ).fetchone()[0][0]["Plan"]  # type: ignore[index]
            for function, arguments in ((end, ended(runs[2:14])), (settle, settled(runs[14:])))
        ]
    assert pages > 100
    for plan in plans:
        assert plan["Actual Rows"] == 12
        assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < 10 * 12 < pages


def _loops_on(plan: dict[str, Any], relation_prefix: str) -> int:
    """How many times the plan's scans of relations named `relation_prefix*` ran."""
    own = plan["Actual Loops"] if plan.get("Relation Name", "").startswith(relation_prefix) else 0
    return own + sum(_loops_on(child, relation_prefix) for child in plan.get("Plans", ()))


async def test_the_plain_claim_reads_each_resumed_workflows_history_once(
    pg_url: str, pg_schema: str
) -> None:
    """The plain claim of 25 workflows that have a history (checkpoint_count > 0: resumed after
    a sleep or a wait) reads the checkpoints once per claimed job. Pulled up under the final
    LEFT JOIN, the history was computed at the scan of `candidates`, the inner side of its join
    with `run`: once per pair, 625 reads (6.3 ms of a 7.0 ms claim during a drain)."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        jobs = await driver.job_insert_many([NewJob("default", "noop", "{}")] * 25)
    with psycopg.connect(pg_url) as conn:
        for job in jobs:
            force_checkpoint_count(conn, pg_schema, job.id, 1)
        statement = "EXPLAIN (ANALYZE, FORMAT JSON) " + queries(pg_schema)["job_claim_plain"]
        claim = Claim("default", ("noop",), 25, 30.0, uuid.uuid4(), plain=True)
        [[plan]] = conn.execute(statement, claim_params(claim)).fetchall()
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    assert top["Actual Rows"] == 25
    assert _loops_on(top, "checkpoints") <= 25


def _subplan(plan: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The plan node of the sub-plan `name` (a CTE: "CTE due"), if the plan has one."""
    if plan.get("Subplan Name") == name:
        return plan
    for child in plan.get("Plans", ()):
        found = _subplan(child, name)
        if found is not None:
            return found
    return None


async def test_the_claim_locks_no_more_rows_of_the_lookahead_than_it_may_claim(
    pg_url: str, pg_schema: str
) -> None:
    """100 sleeping jobs due within the lookahead and a claim of 5: the claim locks (and
    claims early) 5 of them, the earliest, and leaves the others unlocked for the next claim or
    another worker. It locked all 100 (every row within the lookahead, up to promote_limit),
    though none but the 5 could be promoted or claimed."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        jobs = await driver.job_insert_many([NewJob("default", "noop", "{}")] * 100)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    for offset, job in enumerate(jobs):
        force_sleeping(pg_url, pg_schema, job.id, later + datetime.timedelta(seconds=offset / 10))
    statement = "EXPLAIN (ANALYZE, FORMAT JSON) " + queries(pg_schema)["job_claim"]
    claim = Claim("default", ("noop",), 5, 30.0, uuid.uuid4(), lookahead_seconds=60.0)
    with psycopg.connect(pg_url) as conn:
        [[plan]] = conn.execute(statement, claim_params(claim)).fetchall()
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    due = _subplan(top, "CTE due")
    assert due is not None
    assert top["Actual Rows"] == 5
    assert due["Actual Rows"] == 5
