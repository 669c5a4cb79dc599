"""Leases in a table of their own (`job_runs`, migration 0047; bench/plans/write_once_layout.md,
stage 5): a claim from the ready ring inserts the job's run and writes no version of its row;
every fenced write is fenced by the run; and the races the row's lock used to settle alone
are settled by the run, the ring entry and the row together. Interleavings are forced: a
claimer whose statement has taken its snapshot is stalled (tests/support.py,
`stall_db_now_once`) while another session claims, releases or completes; a held transaction
is proven to block another session through pg_stat_activity."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
import trio

from tests.support import (
    apply_functions,
    apply_migration,
    expire_lease,
    pass_deadline,
    sql_rows,
    sql_scalar,
    stalled_claim,
)
from trioq._pg.driver import PgDriver, _claimed_job, claim_params, open_pg_driver, settle_params
from trioq._pg.replies import ClaimedRow, LeaseRenewal
from trioq._pg.services import renewal_params
from trioq._seam.driver import Claim, ClaimedJob, Lease, NewJob, Settlement
from trioq._seam.services import MaintenancePass, RenewLeases
from trioq._seam.workflow import CheckpointWrite, ValueSet
from trioq._sql import migrations as sql_migrations
from trioq._sql import queries

WORKER = uuid.uuid4()
Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def plain_claim(limit: int = 1) -> Claim:
    return Claim("q", ("t",), limit, 30, WORKER, plain=True)


def raw_claim(conn: Conn, schema: str, limit: int = 1) -> list[ClaimedJob]:
    """job_claim_plain as the worker sends it, on `conn` (its own transaction)."""
    rows = conn.execute(queries(schema)["job_claim_plain"], claim_params(plain_claim(limit)))
    return [_claimed_job(row) for row in rows.fetchall() if row[ClaimedRow.id] is not None]


def settle(conn: Conn, schema: str, settlements: list[Settlement]) -> list[int]:
    [row] = conn.execute(queries(schema)["job_settle_many"], settle_params(settlements))
    return list(row[0])


def runs(pg_url: str, schema: str) -> list[tuple[Any, ...]]:
    return sql_rows(pg_url, f"SELECT job_id, attempt, lease_token FROM {schema}.job_runs")


def state_of(pg_url: str, schema: str, job_id: int) -> str:
    return str(sql_scalar(pg_url, f"SELECT state FROM {schema}.jobs WHERE id = %s", [job_id]))


def stalled_claimer(
    pg_url: str, schema: str, act: Callable[[Conn], None]
) -> list[ClaimedJob] | BaseException:
    """tests/support.py's stalled_claim with this module's raw_claim."""
    return stalled_claim(pg_url, schema, raw_claim, act)


async def test_a_claim_from_the_ring_and_its_completion_write_no_version_of_the_record(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The fast path writes the record once, at enqueue (migration 0049): the claim inserts a
    run, the completion deletes it and appends the outcome."""
    [job] = await driver.job_insert_many([NewJob("q", "t", "{}")])
    row = f"SELECT ctid::text, xmin::text FROM {pg_schema}.job_rows WHERE id = %s"
    before = sql_rows(pg_url, row, [job.id])
    [claimed] = (await driver.job_claim(plain_claim())).claimed
    assert sql_rows(pg_url, row, [job.id]) == before
    assert runs(pg_url, pg_schema) == [(job.id, 1, claimed.lease_token)]
    view = f"SELECT state, attempt, lease_token, worker_id FROM {pg_schema}.jobs WHERE id = %s"
    assert sql_rows(pg_url, view, [job.id]) == [("running", 1, claimed.lease_token, WORKER)]
    await driver.job_settle_many([Settlement(claimed.lease, "complete", result_json="7")])
    assert runs(pg_url, pg_schema) == []
    final = f"SELECT state, attempt, result, executions FROM {pg_schema}.jobs WHERE id = %s"
    assert sql_rows(pg_url, final, [job.id]) == [("completed", 1, 7, 1)]
    assert sql_rows(pg_url, row, [job.id]) == before


async def test_a_lease_renewal_updates_its_run_in_place(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A renewal changes only the run's lease expiry, which no index holds (migration 0051): a
    heap-only update, no index entry written (read from the transaction's own statistics).
    With job_runs_lease_idx every renewal wrote an entry in both of the table's indexes."""
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    [claimed] = (await driver.job_claim(plain_claim())).claimed
    params = renewal_params(RenewLeases(WORKER, "running", 60.0, (claimed.lease,)))
    counts = (
        "SELECT pg_stat_get_xact_tuples_updated(%(runs)s::regclass),"
        " pg_stat_get_xact_tuples_hot_updated(%(runs)s::regclass)"
    )
    with psycopg.connect(pg_url) as conn:
        renewed = conn.execute(queries(pg_schema)["lease_renew_many"], params).fetchall()
        updated = conn.execute(counts, {"runs": f"{pg_schema}.job_runs"}).fetchone()
        conn.rollback()
    assert [row[LeaseRenewal.id] for row in renewed] == [claimed.id]
    assert updated == (1, 1)


@pytest.mark.parametrize("name", ["job_runs_finish", "job_runs_settle"])
async def test_the_previous_releases_fence_functions_still_end_runs(
    driver: PgDriver, pg_url: str, pg_schema: str, name: str
) -> None:
    """job_runs_finish() and job_runs_settle(), called by the previous release's completions
    while its workers drain, end a run as they did, with their columns (wrappers of the fenced
    functions, which add the token): the fenced-out lease first ends nothing."""
    await driver.job_insert_many([NewJob("q", "t", "{}")])
    [claimed] = (await driver.job_claim(plain_claim())).claimed
    states = ", ARRAY['completed']" if name == "job_runs_settle" else ""
    call = f"SELECT * FROM {pg_schema}.{name}(ARRAY[%s]::bigint[], ARRAY[%s], ARRAY[%s]{states})"
    stale = sql_rows(pg_url, call, [claimed.id, claimed.attempt, uuid.uuid4()])
    ended = sql_rows(pg_url, call, [claimed.id, claimed.attempt, claimed.lease_token])
    assert stale == []
    assert [row[:2] for row in ended] == [(claimed.id, claimed.attempt)]
    assert len(ended[0]) == (8 if name == "job_runs_finish" else 7)
    assert runs(pg_url, pg_schema) == []


def test_no_double_claim_from_an_old_snapshot(pg_url: str, pg_schema: str) -> None:
    """A claims the job and is still running it: its row was never written, so it is
    unlocked and reads ready to B, whose snapshot predates A's commit. B must not take it: the
    entry A deleted fails B's lock."""
    trio.run(_enqueue, pg_url, pg_schema, 1)
    taken: list[ClaimedJob] = []
    outcome = stalled_claimer(pg_url, pg_schema, lambda a: taken.extend(raw_claim(a, pg_schema)))
    assert outcome == []
    [job] = taken
    assert runs(pg_url, pg_schema) == [(job.id, 1, job.lease_token)]


def test_an_old_snapshot_does_not_claim_a_job_released_and_filed_again(
    pg_url: str, pg_schema: str
) -> None:
    """A claims the job and releases it (a drain): its row reads ready again with a new entry,
    which B's old snapshot does not see, and the entry B sees is gone. B takes nothing; the
    next claim takes the job on the same attempt (a release gives it back)."""
    trio.run(_enqueue, pg_url, pg_schema, 1)
    released: list[int] = []

    def claim_and_release(a: Conn) -> None:
        [job] = raw_claim(a, pg_schema)
        released.extend(settle(a, pg_schema, [Settlement(job.lease, "release")]))

    assert stalled_claimer(pg_url, pg_schema, claim_and_release) == []
    assert runs(pg_url, pg_schema) == []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [again] = raw_claim(conn, pg_schema)
    assert [again.id] == released
    assert again.attempt == 1


def test_an_entry_filed_before_the_job_ran_and_came_back_is_stale(
    pg_url: str, pg_schema: str
) -> None:
    """An entry whose `filed` is not the row's any more (a copy a sweep left, here written by
    hand) claims nothing, even though the row reads ready: the row's own entry does."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [job] = raw_claim(conn, pg_schema)
        settle(conn, pg_schema, [Settlement(job.lease, "release")])
        conn.execute(
            f"INSERT INTO {pg_schema}.ready_ring (slot, queue, task, version, priority, run_at,"
            f" id, filed) SELECT slot, queue, task, version, priority - 1, run_at, id, filed - 1"
            f" FROM {pg_schema}.ready_ring WHERE id = %s",
            [job_id],
        )
        [again] = raw_claim(conn, pg_schema, limit=5)
        assert raw_claim(conn, pg_schema, limit=5) == []
    assert again.id == job_id
    assert runs(pg_url, pg_schema) == [(job_id, 1, again.lease_token)]


async def test_every_fenced_write_is_refused_after_recovery(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The run is the fence: once recovery took the lease (and another claim the job), the old
    attempt's completion, checkpoint, value, renewal and wait change nothing."""
    await driver.job_insert_many([NewJob("q", "t", "{}", max_attempts=3)])
    [old] = (await driver.job_claim(plain_claim())).claimed
    expire_lease(pg_url, pg_schema, [old.id])
    report = await driver.maintenance_pass(MaintenancePass(queues=("q",)))
    assert report.recovered == ((old.id, "ready"),)
    [new] = (await driver.job_claim(plain_claim())).claimed
    assert (new.id, new.attempt) == (old.id, 2)
    write = CheckpointWrite(old.lease, 0, "step", "s", "1")
    assert await driver.checkpoint_insert_many([write]) == []
    assert not await driver.job_value_set_many(ValueSet(old.lease, (("k", "1"),)))
    renewal = await driver.lease_renew_many(RenewLeases(WORKER, "running", 30, (old.lease,)))
    assert renewal.leases == ()
    result = await driver.job_settle_many([Settlement(old.lease, "complete", result_json="1")])
    assert result.settled == ()
    assert runs(pg_url, pg_schema) == [(new.id, 2, new.lease_token)]
    assert state_of(pg_url, pg_schema, new.id) == "running"
    result = await driver.job_settle_many([Settlement(new.lease, "complete", result_json="2")])
    assert result.settled == ((new.id, "completed"),)
    history = f"SELECT attempt, outcome FROM {pg_schema}.attempts WHERE job_id = %s"
    assert sql_rows(pg_url, history, [new.id]) == [(1, "lost")]


def test_a_cancel_holding_the_row_keeps_the_claim_off_and_the_job_never_runs(
    pg_url: str, pg_schema: str
) -> None:
    """A claim skips a row a cancel holds (SKIP LOCKED); the cancel reads no run (none can start
    while it holds the row) and ends the job cancelled; its entry then claims nothing."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    statements = queries(pg_schema)
    with psycopg.connect(pg_url) as canceller, psycopg.connect(pg_url, autocommit=True) as b:
        [(previous, state)] = canceller.execute(
            statements["job_cancel"], {"id": job_id, "control_channel": "c"}
        ).fetchall()
        assert (previous, state) == ("ready", "cancelled")
        assert raw_claim(b, pg_schema) == []
        canceller.commit()
        assert raw_claim(b, pg_schema) == []
    assert state_of(pg_url, pg_schema, job_id) == "cancelled"
    assert runs(pg_url, pg_schema) == []


# A writer that commits between a plain claim's snapshot and its lock: the claim read the job
# ready with its record's old version. Its lock on the record re-reads the newest version
# (READ COMMITTED), and the recheck (`j.phase = 'ready' AND j.filed = r.filed`) or the
# projection acts on that one. A claim without the record's lock must cover each of these by
# filing the job's entry again in the writer's transaction (bench/plans/
# claim_without_record_lock.md): these tests are the cases it must keep.


def test_a_cancel_committed_after_a_claims_snapshot_keeps_the_claim_off(
    pg_url: str, pg_schema: str
) -> None:
    """A cancel ends a ready job while a claim that read it ready has not locked it yet: the
    claim takes nothing, and the job never runs."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    cancel = queries(pg_schema)["job_cancel"]

    def cancelled(a: Conn) -> None:
        [row] = a.execute(cancel, {"id": job_id, "control_channel": "c"}).fetchall()
        assert row == ("ready", "cancelled")

    assert stalled_claimer(pg_url, pg_schema, cancelled) == []
    assert state_of(pg_url, pg_schema, job_id) == "cancelled"
    assert runs(pg_url, pg_schema) == []


def test_a_deadline_passed_after_a_claims_snapshot_keeps_the_claim_off(
    pg_url: str, pg_schema: str
) -> None:
    """The leader's deadline pass cancels a ready job past its deadline while a claim that read
    it ready has not locked it yet: the claim takes nothing."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    pass_deadline(pg_url, pg_schema, [job_id])

    def deadline_pass(a: Conn) -> None:
        [(passed,)] = a.execute(f"SELECT {pg_schema}.job_deadline_pass(10, 'c')").fetchall()
        assert passed == 1

    assert stalled_claimer(pg_url, pg_schema, deadline_pass) == []
    assert state_of(pg_url, pg_schema, job_id) == "cancelled"
    assert runs(pg_url, pg_schema) == []


def test_a_result_watch_committed_after_a_claims_snapshot_is_copied_into_its_run(
    pg_url: str, pg_schema: str
) -> None:
    """A waiter registers on a ready job (the record's flag, then the run's, which finds none)
    while a claim that read the job unwatched has not locked it yet: the claim's run carries
    the flag, so the job's completion notifies the waiter."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    statements = queries(pg_schema)
    taken: list[int] = []

    def watched(a: Conn) -> None:
        a.execute(statements["job_result_watch"], {"id": job_id})
        [(runs_flagged,)] = a.execute(statements["job_result_watch_run"], {"id": job_id})
        assert runs_flagged == 0  # the claim's run is not written yet

    def claim(conn: Conn, schema: str) -> list[ClaimedJob]:
        claimed = raw_claim(conn, schema)
        taken.extend(job.id for job in claimed)
        return claimed

    outcome = stalled_claim(pg_url, pg_schema, claim, watched)
    assert not isinstance(outcome, BaseException), outcome
    assert taken == [job_id]
    flag = f"SELECT result_watched FROM {pg_schema}.job_runs WHERE job_id = %s"
    assert sql_rows(pg_url, flag, [job_id]) == [(True,)]


def test_a_completion_under_a_cancel_holding_the_record_completes_the_flagged_job(
    pg_url: str, pg_schema: str
) -> None:
    """A completion writes the run and the outcome, never the record (migration 0049): it does
    not wait for a cancel that holds the record and saw the run; the cancel flags the job, no
    deadlock, and the job ends completed (its run's outcome was in first)."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    statements = queries(pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [job] = raw_claim(conn, pg_schema)
    with psycopg.connect(pg_url) as canceller:
        [(previous, state)] = canceller.execute(
            statements["job_cancel"], {"id": job_id, "control_channel": "c"}
        ).fetchall()
        assert (previous, state) == ("running", "running")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            completion = Settlement(job.lease, "complete", result_json="1")
            assert settle(conn, pg_schema, [completion]) == [job_id]
        canceller.commit()
    assert state_of(pg_url, pg_schema, job_id) == "completed"


def test_a_cancelled_outcome_of_a_flagged_fast_path_job_ends_it_cancelled(
    pg_url: str, pg_schema: str
) -> None:
    """A job claimed from the ring reads ready in its row while it runs: a cancel must see its
    run and flag it (not end it at once), and the worker's cancelled outcome ends it."""
    [job_id] = trio.run(_enqueue, pg_url, pg_schema, 1)
    statements = queries(pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [job] = raw_claim(conn, pg_schema)
        [(previous, state)] = conn.execute(
            statements["job_cancel"], {"id": job_id, "control_channel": "c"}
        ).fetchall()
        assert (previous, state) == ("running", "running")
        assert state_of(pg_url, pg_schema, job_id) == "running"
        cancelled = Settlement(job.lease, "cancel", error_json='{"type": "Cancelled"}')
        assert settle(conn, pg_schema, [cancelled]) == [job_id]
    assert state_of(pg_url, pg_schema, job_id) == "cancelled"
    assert runs(pg_url, pg_schema) == []


def _wait_lock_waiter(pg_url: str, pid: int, within: float = 30.0) -> None:
    """Until backend `pid` waits for a lock (another session's state: polled, there is no
    event)."""
    deadline = time.monotonic() + within
    query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while conn.execute(query, (pid,)).fetchone() != ("Lock",):
            assert time.monotonic() < deadline, f"session {pid} never waited for a lock"
            time.sleep(0.01)


async def _enqueue(pg_url: str, pg_schema: str, n: int) -> list[int]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        await driver.migrate()
        return [job.id for job in await driver.job_insert_many([NewJob("q", "t", "{}")] * n)]


async def test_a_job_running_when_migration_0047_runs_keeps_its_lease_as_a_run(
    pg_url: str, pg_schema: str
) -> None:
    """A stop-first upgrade finds the running rows of crashed workers: each becomes a run with
    the lease, worker and start it had, its row `claimed` with the attempt before the run, and
    its lease's fenced writes still hold (here, its completion)."""
    token, worker = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(queries(pg_schema)["migration_prepare"])
        apply_functions(conn, pg_schema)
        for migration in sql_migrations(pg_schema):
            if migration.version == 47:
                # As a worker of the previous release left a claim of the job (0039-0043).
                [[job_id]] = conn.execute(
                    f"INSERT INTO {pg_schema}.jobs (queue, task, payload, state, run_at,"
                    " created_at, attempt, executions, lease_token, lease_expires_at,"
                    " worker_id, started_at, concurrency_key)"
                    " VALUES ('q', 't', '{}', 'running', now(), now(), 2, 3, %s,"
                    " now() + interval '1 hour', %s, now(), 'k') RETURNING id",
                    [token, worker],
                ).fetchall()
            apply_migration(conn, migration)
            conn.execute(
                queries(pg_schema)["migration_record"],
                {"version": migration.version, "name": migration.name},
            )
        run = conn.execute(
            f"SELECT attempt, lease_token, worker_id, executions, queue, concurrency_key"
            f" FROM {pg_schema}.job_runs WHERE job_id = %s",
            [job_id],
        ).fetchall()
        row = conn.execute(
            f"SELECT phase, attempt, executions FROM {pg_schema}.job_rows WHERE id = %s",
            [job_id],
        ).fetchall()
    assert run == [(2, token, worker, 3, "q", "k")]
    assert row == [("claimed", 1, 2)]
    assert state_of(pg_url, pg_schema, job_id) == "running"
    async with open_pg_driver(pg_url, pg_schema, pool_size=1) as driver:
        lease = Lease(job_id, 2, token)
        result = await driver.job_settle_many([Settlement(lease, "complete", result_json="1")])
    assert result.settled == ((job_id, "completed"),)
    view = f"SELECT state, attempt, executions, worker_id FROM {pg_schema}.jobs WHERE id = %s"
    assert sql_rows(pg_url, view, [job_id]) == [("completed", 2, 3, worker)]
