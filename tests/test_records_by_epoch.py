"""Write-once records (migration 0049): a job's record (job_rows) and its outcome
(job_outcomes) live in the partitions of its id's epoch; retention empties an ended epoch whole
with what belongs to its jobs, the jobs still kept (unfinished, or finished too recently)
copied aside and written back without being filed again, and falls back to deleting the
expired jobs row by row when too many are kept."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from tests.job_due_check import job_due_mismatches
from tests.ready_keyed_check import ready_keyed_mismatches
from tests.support import sql_rows, sql_scalar, wait_stalled, wait_until
from trioq._core.retention import seconds_to_day_end
from trioq._pg.driver import PgDriver, open_pg_driver
from trioq._seam.driver import Claim, Settlement
from trioq._seam.records import NewJob
from trioq._seam.services import MaintenancePass
from trioq.testing import SqlClock
from trioq.testing.conformance.harness import (
    LEASE_SECONDS,
    QUEUE,
    TASK,
    claim,
    complete,
    enqueue,
    fail,
    new_job,
    record,
)

RETENTION = 3600.0


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def partition_of(pg_url: str, schema: str, table: str, column: str, job_id: int) -> str | None:
    query = f"SELECT tableoid::regclass::text FROM {schema}.{table} WHERE {column} = %s"
    rows = sql_rows(pg_url, query, (job_id,))
    return str(rows[0][0]) if rows else None


def dead_rows(pg_url: str, schema: str) -> int:
    """Rows ever deleted one by one from a record or outcome partition (a TRUNCATE counts
    none)."""
    sql_rows(pg_url, "SELECT pg_stat_force_next_flush() IS NULL")
    return int(
        sql_scalar(
            pg_url,
            "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname ~ '^job_(rows|outcomes)_e'",
            (schema,),
        )
    )


async def test_a_jobs_record_and_outcome_live_in_its_epoch_and_a_redrive_deletes_the_outcome(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    done_id, failed_id = await enqueue(driver, new_job(1), new_job(2, max_attempts=1))
    epoch = f"{pg_schema}.job_rows_e0"
    assert partition_of(pg_url, pg_schema, "job_rows", "id", done_id) == epoch
    done, failed = await claim(driver)
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    for job_id in (done_id, failed_id):
        assert partition_of(pg_url, pg_schema, "job_rows", "id", job_id) == epoch
        where = partition_of(pg_url, pg_schema, "job_outcomes", "job_id", job_id)
        assert where == f"{pg_schema}.job_outcomes_e0"
    # The completion on the fast path left the record as the enqueue wrote it.
    phase = f"SELECT phase FROM {pg_schema}.job_rows WHERE id = %s"
    assert sql_scalar(pg_url, phase, (done_id,)) == "ready"
    assert (await record(driver, done_id)).state == "completed"
    # A redrive deletes the outcome; the record is ready again, its attempts kept.
    outcome = await driver.job_retry(failed_id)
    assert outcome is not None and outcome.state == "ready"
    assert partition_of(pg_url, pg_schema, "job_outcomes", "job_id", failed_id) is None
    assert (await record(driver, failed_id)).attempt == 1
    assert len(await driver.job_attempts(failed_id)) == 1
    [again] = await claim(driver)
    assert (again.id, again.attempt) == (failed_id, 2)


async def test_retention_empties_an_ended_epoch_and_keeps_what_is_not_expired(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """Two jobs of day 0 expire; a job delayed past the retention, a keyed job still ready and
    a job finished on the next day (all of the same epoch) are kept: written back, filed once
    (job_due, ready_keyed and the ring stay exact) and claimable. Nothing is deleted row by
    row."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    done_id, failed_id, delayed_id, keyed_id = await enqueue(
        driver,
        new_job(1),
        new_job(2, max_attempts=1),
        new_job(3, delay_seconds=10 * 86_400),
        new_job(4, partition_key="k", priority=1),
    )
    done, failed = await claim(driver, limit=2)  # claim order: the keyed job comes last
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 0
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    [later_id] = await enqueue(driver, new_job(5))  # epoch 0 still: the day turns below
    [later] = await claim(driver, limit=1)
    await complete(driver, later.lease)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 2
    assert await driver.job_get(done_id) is None and await driver.job_get(failed_id) is None
    assert await driver.job_attempts(failed_id) == []
    assert (await record(driver, later_id)).state == "completed"
    assert (await record(driver, delayed_id)).state == "scheduled"
    assert (await record(driver, keyed_id)).state == "ready"
    assert job_due_mismatches(pg_url, pg_schema) == []
    assert ready_keyed_mismatches(pg_url, pg_schema) == []
    ring = f"SELECT count(*) FROM {pg_schema}.ready_ring WHERE id = ANY(%s)"
    assert sql_scalar(pg_url, ring, ([later_id, delayed_id, keyed_id],)) == 0
    assert dead_rows(pg_url, pg_schema) == 0
    # A new epoch started with the new day: a new job's id is in it.
    [fresh_id] = await enqueue(driver, new_job(6))
    assert partition_of(pg_url, pg_schema, "job_rows", "id", fresh_id) == (
        f"{pg_schema}.job_rows_e1"
    )
    taken = await claim(driver, limit=5)
    assert {job.id for job in taken} == {fresh_id, keyed_id}


async def test_an_epoch_mostly_kept_loses_its_expired_jobs_row_by_row(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """When the copy aside would keep more than half of an epoch's records, the expired jobs
    are deleted one by one (outcome and record together), so none outlives the rule."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    [done_id] = await enqueue(driver, new_job(1))
    kept = await enqueue(driver, *[new_job(10 + n, delay_seconds=10 * 86_400) for n in range(3)])
    [done] = await claim(driver, limit=1)
    await complete(driver, done.lease)
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 1
    assert await driver.job_get(done_id) is None
    for job_id in kept:
        assert (await record(driver, job_id)).state == "scheduled"
    assert job_due_mismatches(pg_url, pg_schema) == []
    outcomes = f"SELECT count(*) FROM {pg_schema}.job_outcomes"
    assert sql_scalar(pg_url, outcomes) == 0


async def ended_epoch(driver: PgDriver, pg_url: str, pg_schema: str, *jobs: NewJob) -> list[int]:
    """Epoch 0 ended, holding three jobs completed a retention ago, one failed (no attempt
    left) and `jobs`; new jobs go to epoch 1. The ids: the completed ones, the failed one,
    then `jobs`'."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    # Four expired to the kept: the epoch is copied, not deleted row by row.
    ids = await enqueue(driver, new_job(1), new_job(2), new_job(3))
    [failed_id] = await enqueue(driver, new_job(4, max_attempts=1))
    await complete(driver, *[job.lease for job in await claim(driver, limit=3)])
    [failed] = await claim(driver, limit=1)
    await fail(driver, failed.lease, retry_delay=None)
    kept = await enqueue(driver, *jobs)
    finished_at = (await record(driver, ids[0])).finished_at
    assert finished_at is not None
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    sql_rows(pg_url, f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(NULL)")
    return [*ids, failed_id, *kept]


@contextlib.asynccontextmanager
async def rotation_held_after_its_read(
    pg_url: str, pg_schema: str
) -> AsyncIterator[list[tuple[int, object]]]:
    """Run the rotation (retention RETENTION) held after its survivors' read, by a trigger on
    job_keys (the statement between the read and the locks) that waits for an advisory lock
    the test holds; released when the block ends. Yields the rotation's rows, filled once it
    has returned."""
    key = f"{pg_schema}: rotation held"
    rotate = f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(%s)"
    rotated: list[tuple[int, object]] = []
    with (
        psycopg.connect(pg_url, autocommit=True) as holder,
        psycopg.connect(pg_url, autocommit=True) as rotator,
    ):
        holder.execute(
            f"CREATE FUNCTION {pg_schema}.hold_rotation() RETURNS trigger LANGUAGE plpgsql"
            " SET lock_timeout = 0"
            f" AS $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('{key}')); RETURN NULL; END $$"
        )
        holder.execute(
            f"CREATE TRIGGER hold_rotation BEFORE DELETE ON {pg_schema}.job_keys"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {pg_schema}.hold_rotation()"
        )
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))

        async def rotation() -> None:
            rows = await trio.to_thread.run_sync(
                lambda: rotator.execute(rotate, (f"{RETENTION} seconds",)).fetchall()
            )
            rotated.extend(rows)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rotation)
            try:
                pid = rotator.info.backend_pid
                await trio.to_thread.run_sync(wait_stalled, holder, pid)
                yield rotated
            finally:
                holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
        holder.execute(f"DROP TRIGGER hold_rotation ON {pg_schema}.job_keys")


async def test_claims_and_settles_go_on_while_the_rotation_reads_an_epochs_survivors(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The survivors are read before the truncations' ACCESS EXCLUSIVE locks, with only the
    epoch's outcomes locked in SHARE mode: the full claim and the settle (an UPDATE of
    job_rows, whose generic plan locks every partition) and the plain claim and completion
    all go on meanwhile."""
    *expired_ids, delayed_id = await ended_epoch(
        driver, pg_url, pg_schema, new_job(5, delay_seconds=10 * 86_400)
    )
    fresh_id, other_id = await enqueue(driver, new_job(6), new_job(7))
    async with rotation_held_after_its_read(pg_url, pg_schema) as rotated:
        with trio.fail_after(10):
            plain = Claim(QUEUE, (TASK,), 1, LEASE_SECONDS, uuid.uuid4(), plain=True)
            [fresh] = (await driver.job_claim(plain)).claimed
            assert fresh.id == fresh_id
            completion = Settlement(fresh.lease, "complete", "null", plain=fresh.plain)
            outcome = await driver.job_settle_many([completion])
            assert [job_id for job_id, _ in outcome.settled] == [fresh_id]
            [other] = await claim(driver, limit=1)  # the full claim
            assert other.id == other_id
            assert await complete(driver, other.lease) == (other_id,)  # the settle
    assert [pruned for pruned, _ in rotated] == [4]
    for expired_id in expired_ids:
        assert await driver.job_get(expired_id) is None
    assert (await record(driver, delayed_id)).state == "scheduled"
    for job_id in (fresh_id, other_id):
        assert (await record(driver, job_id)).state == "completed"
    assert job_due_mismatches(pg_url, pg_schema) == []


def rotate_noting(pg_url: str, pg_schema: str) -> tuple[int, list[str]]:
    """The rotation (retention RETENTION) run directly: the jobs it pruned and its DEBUG
    notices (how it read the epoch's unfinished jobs)."""
    notices: list[str] = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SET client_min_messages = debug1")
        rotate = f"SELECT pruned FROM {pg_schema}.satellite_epochs_rotate(%s)"
        [(pruned,)] = conn.execute(rotate, (f"{RETENTION} seconds",)).fetchall()
    return int(pruned), [n for n in notices if n.startswith("satellite_epochs_rotate")]


async def unfinished_of_each_kind(
    driver: PgDriver, pg_url: str, pg_schema: str, *jobs: NewJob
) -> list[int]:
    """An ended epoch (`ended_epoch`) keeping one unfinished job of each kind the claims find
    by id, and `jobs`: running (a run), keyed and ready (ready_keyed), delayed (job_due). Their
    ids, then `jobs`'."""
    ids = await ended_epoch(
        driver,
        pg_url,
        pg_schema,
        new_job(5),
        new_job(7, partition_key="k", priority=1),
        new_job(8, delay_seconds=10 * 86_400),
        *jobs,
    )
    [running] = await claim(driver, limit=1)
    assert running.id == ids[4]
    return ids[4:]


async def test_the_rotation_reads_an_epochs_unfinished_jobs_where_the_claims_find_them(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The unfinished jobs of an ended epoch are read from the claims' tables (ready_keyed,
    job_due, job_runs), not by a scan of the epoch's records: every kind is kept."""
    running_id, keyed_id, delayed_id = await unfinished_of_each_kind(driver, pg_url, pg_schema)
    pruned, notices = rotate_noting(pg_url, pg_schema)
    assert notices == [
        "satellite_epochs_rotate: epoch 0: 3 unfinished, found by the claims' tables"
    ]
    assert pruned == 4
    assert (await record(driver, running_id)).state == "running"
    assert (await record(driver, keyed_id)).state == "ready"
    assert (await record(driver, delayed_id)).state == "scheduled"
    assert job_due_mismatches(pg_url, pg_schema) == []
    assert ready_keyed_mismatches(pg_url, pg_schema) == []


async def test_an_unfinished_job_the_claims_tables_do_not_find_is_kept_by_the_anti_join(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The claims' tables are trusted only when they hold as many unfinished jobs as the
    epoch's counts say. A plain job still ready is in the ring, which the rotation does not
    read (it would hold the ring's slots until its commit): one fewer, so the rotation reads
    the records themselves and keeps it, and the claims still find it in the ring."""
    running_id, keyed_id, delayed_id, ready_id = await unfinished_of_each_kind(
        driver, pg_url, pg_schema, new_job(9)
    )
    pruned, notices = rotate_noting(pg_url, pg_schema)
    assert notices == [
        "satellite_epochs_rotate: epoch 0: 4 unfinished, 3 found by the claims' tables: read by"
        " the anti-join"
    ]
    assert pruned == 4
    for job_id in (running_id, keyed_id, delayed_id):
        assert await driver.job_get(job_id) is not None
    assert (await record(driver, ready_id)).state == "ready"
    assert {job.id for job in await claim(driver, limit=5)} == {keyed_id, ready_id}


async def test_an_expired_job_redriven_during_the_rotations_read_is_pruned_whole_or_kept(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A redrive deletes the outcome, which makes an expired job a survivor the read did not
    see: the outcomes' SHARE lock holds the redrive off until the rotation has committed (or
    given the epoch up), so the job is either gone whole (the redrive finds nothing) or ready
    and claimable; never a record truncated after its outcome was deleted."""
    *_, failed_id, delayed_id = await ended_epoch(
        driver, pg_url, pg_schema, new_job(5, delay_seconds=10 * 86_400)
    )
    redriven: list[object] = []

    async def redrive() -> None:
        redriven.append(await driver.job_retry(failed_id))

    async def redrive_waits() -> bool:
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND position('job_outcomes' in query) > 0 AND position('rotate' in query) = 0"
        )
        return bool(await trio.to_thread.run_sync(sql_scalar, pg_url, query))

    async with (
        trio.open_nursery() as nursery,
        rotation_held_after_its_read(pg_url, pg_schema) as rotated,
    ):
        nursery.start_soon(redrive)
        with trio.fail_after(10):
            await wait_until(redrive_waits)
    assert len(rotated) == 1
    [outcome] = redriven
    if outcome is None:  # pruned first: nothing of it left
        assert await driver.job_get(failed_id) is None
        assert partition_of(pg_url, pg_schema, "job_outcomes", "job_id", failed_id) is None
    else:  # the epoch given up for now: the job is ready again
        assert (await record(driver, failed_id)).state == "ready"
        assert [job.id for job in await claim(driver, limit=5)] == [failed_id]
    assert (await record(driver, delayed_id)).state == "scheduled"
    assert job_due_mismatches(pg_url, pg_schema) == []
    assert ready_keyed_mismatches(pg_url, pg_schema) == []


async def test_an_epoch_ended_days_ago_is_truncated_though_a_claim_holds_a_satellites_parent(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """An epoch whose end is more than a day old, its records expired and its checkpoints
    partition empty: the pass truncates what holds rows and drops nothing, so a session holding
    the `checkpoints` parent (as the full claim's plan does) does not undo the prune; the five
    partitions are dropped by a later call once all are empty."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    done_ids = await enqueue(driver, new_job(1), new_job(2))
    await complete(driver, *[job.lease for job in await claim(driver, limit=2)])
    finished_at = (await record(driver, done_ids[0])).finished_at
    assert finished_at is not None
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    rotate = f"SELECT pruned FROM {pg_schema}.satellite_epochs_rotate(%s)"
    sql_rows(pg_url, rotate, (None,))  # epoch 0 ends
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {pg_schema}.satellite_epochs SET ended_at = ended_at - interval '2 days'"
            " WHERE epoch = 0"
        )
    retention = f"{RETENTION} seconds"
    with psycopg.connect(pg_url) as holder:
        holder.execute(f"LOCK TABLE {pg_schema}.checkpoints IN ACCESS SHARE MODE")
        assert sql_scalar(pg_url, rotate, (retention,)) == 2
        holder.rollback()
    for job_id in done_ids:
        assert await driver.job_get(job_id) is None
    assert partition_of(pg_url, pg_schema, "job_rows", "id", done_ids[0]) is None
    exists = "SELECT to_regclass(%s) IS NOT NULL"
    assert sql_scalar(pg_url, exists, (f"{pg_schema}.job_rows_e0",)) is True
    assert sql_scalar(pg_url, rotate, (retention,)) == 0
    for table in ("job_rows", "job_outcomes", "checkpoints", "attempts", "workflow_values"):
        assert sql_scalar(pg_url, exists, (f"{pg_schema}.{table}_e0",)) is False


async def test_the_claims_tables_are_locked_last_for_their_truncation(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The claims read the records (a generic plan locks every partition of `job_rows`), so
    the prune's window they queue behind starts at the records' lock: the outcomes are
    truncated first, before that lock is asked for, and the records last."""
    await ended_epoch(driver, pg_url, pg_schema, new_job(5, delay_seconds=10 * 86_400))
    records = f"{pg_schema}.job_rows_e0"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pg_schema}.truncations (part text, records_locked boolean)")
        conn.execute(
            f"CREATE FUNCTION {pg_schema}.truncation_seen() RETURNS trigger LANGUAGE plpgsql"
            f" AS $$ BEGIN INSERT INTO {pg_schema}.truncations SELECT TG_TABLE_NAME, EXISTS ("
            " SELECT FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.granted"
            f" AND l.mode = 'AccessExclusiveLock' AND l.relation = '{records}'::regclass);"
            " RETURN NULL; END $$"
        )
        for part in ("job_outcomes_e0", "job_rows_e0"):
            conn.execute(
                f"CREATE TRIGGER truncation_seen BEFORE TRUNCATE ON {pg_schema}.{part}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION {pg_schema}.truncation_seen()"
            )
    pruned, _ = rotate_noting(pg_url, pg_schema)
    assert pruned == 4
    seen = sql_rows(pg_url, f"SELECT part, records_locked FROM {pg_schema}.truncations")
    assert seen == [("job_outcomes_e0", False), ("job_rows_e0", True)]


async def test_a_failed_rotation_does_not_fail_the_maintenance_pass(
    driver: PgDriver, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention is not worth the pass: with satellite_epochs_rotate() failing, the pass still
    recovers and reports, and says once that the epochs are tried again in a minute."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE OR REPLACE FUNCTION {pg_schema}.satellite_epochs_rotate(retention interval)"
            " RETURNS TABLE (pruned bigint, next_due timestamptz) LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'rotation refused'; END $$"
        )
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert (report.leader, report.pruned_jobs) == (True, 0)
    assert "job_epochs_rotate failed, tried again in a minute" in caplog.text
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert caplog.text.count("job_epochs_rotate failed") == 1  # not before the minute
