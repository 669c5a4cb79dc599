"""Finished jobs by day (migration 0038): unfinished jobs in `jobs_live`, each finished job in
the partition of the UTC day it finished on, whole days dropped by retention with what belongs
to their jobs, and a statement that waited for a row a finishing job moved runs again."""

from __future__ import annotations

import datetime
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest
import trio

from tests.support import blocked_on_a_lock, partitions_of, sql_rows, sql_scalar, wait_until
from trioq._core.retention import seconds_to_day_end
from trioq._pg import Connection, connect
from trioq._pg.driver import PgDriver, complete_plain_params, open_pg_driver
from trioq._seam.admin import CancelOutcome
from trioq._seam.driver import Settlement
from trioq._seam.records import JobRecord
from trioq._seam.services import MaintenancePass
from trioq._sql import queries
from trioq.producer import SyncProducer
from trioq.testing import SqlClock
from trioq.testing.conformance.harness import claim, complete, enqueue, fail, new_job, record

RETENTION = 3600.0


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def partition_of(pg_url: str, schema: str, job_id: int) -> str:
    query = f"SELECT tableoid::regclass::text FROM {schema}.job_rows_legacy WHERE id = %s"
    return str(sql_scalar(pg_url, query, (job_id,)))


def day_partitions(pg_url: str, schema: str) -> list[str]:
    return [
        name
        for name in partitions_of(pg_url, f"{schema}.job_rows_legacy")
        if re.fullmatch(r"jobs_d\d{8}", name)
    ]


def day_name(moment: datetime.datetime) -> str:
    return "jobs_d" + moment.astimezone(datetime.UTC).strftime("%Y%m%d")


async def racing_a_completion(
    driver: PgDriver,
    observer: Connection,
    pg_url: str,
    pg_schema: str,
    racer: Callable[[int], Awaitable[None]],
) -> int:
    """Claim a job, complete it in a transaction held open, start `racer(job_id)` and wait
    until it waits for the job's row lock; then commit, which moves the row to its day's
    partition under it. The job's id, once the racer has returned."""
    await enqueue(driver, new_job(1))
    [job] = await claim(driver)
    session = await connect(pg_url, application_name="trioq-test-history")
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery, session.transaction():
                settled = [Settlement(job.lease, "complete", result_json="1")]
                await session.fetch(
                    queries(pg_schema)["job_complete_plain"], complete_plain_params(settled)
                )
                nursery.start_soon(racer, job.id)
                await wait_until(lambda: blocked_on_a_lock(observer, pg_schema))
                # committed here: the racer goes on
    finally:
        await session.close()
    return job.id


async def test_a_job_lives_in_jobs_live_until_it_finishes_then_in_its_days_partition(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    done_id, failed_id, waiting_id = await enqueue(
        driver, new_job(1), new_job(2, max_attempts=1), new_job(3, delay_seconds=600)
    )
    assert partition_of(pg_url, pg_schema, done_id) == f"{pg_schema}.jobs_live"
    done, failed = await claim(driver)
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    today = f"{pg_schema}.{day_name(finished_at)}"
    assert partition_of(pg_url, pg_schema, done_id) == today
    assert partition_of(pg_url, pg_schema, failed_id) == today
    assert partition_of(pg_url, pg_schema, waiting_id) == f"{pg_schema}.jobs_live"
    # Today's partition and three days ahead exist from the migration on.
    assert len(day_partitions(pg_url, pg_schema)) == 4
    # A redrive brings the failed job back to the live partition, its attempts with it.
    outcome = await driver.job_retry(failed_id)
    assert outcome is not None and outcome.state == "ready"
    assert partition_of(pg_url, pg_schema, failed_id) == f"{pg_schema}.jobs_live"
    assert len(await driver.job_attempts(failed_id)) == 1


async def test_retention_drops_a_finished_day_whole_with_what_belongs_to_its_jobs(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    clock = await SqlClock.install(driver)
    await clock.freeze()
    done_id, failed_id = await enqueue(driver, new_job(1), new_job(2, max_attempts=1))
    done, failed = await claim(driver)
    await complete(driver, done.lease)
    await fail(driver, failed.lease, retry_delay=None)
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    first_day = day_name(finished_at)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 0
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    # A job that finishes on the next day stays.
    [later_id] = await enqueue(driver, new_job(3))
    [later] = await claim(driver)
    await complete(driver, later.lease)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 2
    assert first_day not in day_partitions(pg_url, pg_schema)
    assert await driver.job_get(done_id) is None and await driver.job_get(failed_id) is None
    assert await driver.job_attempts(failed_id) == []
    assert (await record(driver, later_id)).state == "completed"
    # Four days ahead of the new day are there again.
    assert len(day_partitions(pg_url, pg_schema)) == 4
    dead = sql_scalar(
        pg_url,
        "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
        " WHERE schemaname = %s AND relname ~ '^jobs_d'",
        (pg_schema,),
    )
    assert dead == 0  # nothing was deleted row by row


async def test_a_day_with_no_partition_is_kept_in_jobs_unfiled_and_pruned_by_its_day(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await clock.advance(30 * 86_400)  # a database clock far ahead: no partition for that day
    [job_id] = await enqueue(driver, new_job(1))
    [job] = await claim(driver)
    await complete(driver, job.lease)
    assert partition_of(pg_url, pg_schema, job_id) == f"{pg_schema}.jobs_unfiled"
    finished_at = (await record(driver, job_id)).finished_at
    assert finished_at is not None
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 0
    # The day's partition could not be attached over the row already filed for it.
    assert day_name(finished_at) not in day_partitions(pg_url, pg_schema)
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 1
    assert await driver.job_get(job_id) is None


async def test_a_cancel_that_waited_for_a_job_finishing_under_it_runs_again(
    driver: PgDriver, observer: Connection, pg_url: str, pg_schema: str
) -> None:
    """The completer's flush moves a finishing job's row to its day's partition; a cancel that
    waited for the row's lock cannot follow it there (SQLSTATE 40001 under READ COMMITTED)
    and runs again instead of failing: it finds the job completed and changes nothing."""
    cancelled: list[CancelOutcome | None] = []

    async def cancel(job_id: int) -> None:
        cancelled.append(await driver.job_cancel(job_id))

    job_id = await racing_a_completion(driver, observer, pg_url, pg_schema, cancel)
    [outcome] = cancelled
    assert outcome is not None and (outcome.previous_state, outcome.state) == (
        "completed",
        "completed",
    )
    assert partition_of(pg_url, pg_schema, job_id).startswith(f"{pg_schema}.jobs_d")


async def test_a_failed_rotation_does_not_fail_the_maintenance_pass(
    driver: PgDriver, pg_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention is not worth the pass: with job_history_rotate() failing, the pass still
    recovers and reports, and says once that the days are tried again in a minute."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE OR REPLACE FUNCTION {pg_schema}.job_history_rotate(retention interval)"
            " RETURNS TABLE (pruned bigint, next_due timestamptz) LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'rotation refused'; END $$"
        )
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert (report.leader, report.pruned_jobs) == (True, 0)
    assert "job_history_rotate failed, tried again in a minute" in caplog.text
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert caplog.text.count("job_history_rotate failed") == 1  # not before the minute


def detached_days(pg_url: str, schema: str) -> list[str]:
    rows = sql_rows(
        pg_url,
        "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace"
        " AND relkind = 'r' AND NOT relispartition AND relname ~ '^jobs_d[0-9]{8}$'",
        (schema,),
    )
    return [name for (name,) in rows]


async def test_the_rotation_detaches_and_the_drop_comes_in_a_transaction_of_its_own(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The detach's ACCESS EXCLUSIVE lock on `jobs` lasts until its transaction ends, so the
    drop of the detached day (66-84 ms for 1,000,000 jobs) is not in it: job_history_rotate()
    detaches, job_history_drop() drops. A day a reader still holds is left, and a later call
    drops it (the next rotation, too: a process that stopped between the two leaves one)."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    [done_id] = await enqueue(driver, new_job(1))
    [done] = await claim(driver)
    await complete(driver, done.lease)
    finished_at = (await record(driver, done_id)).finished_at
    assert finished_at is not None
    day = day_name(finished_at)
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    rotate = f"SELECT pruned FROM {pg_schema}.job_history_rotate(%s * interval '1 second')"
    assert sql_scalar(pg_url, rotate, (RETENTION,)) == 1
    assert day not in day_partitions(pg_url, pg_schema)
    assert detached_days(pg_url, pg_schema) == [day]
    drop = f"SELECT dropped, left_over FROM {pg_schema}.job_history_drop()"
    with psycopg.connect(pg_url) as reader:
        reader.execute(f"LOCK TABLE {pg_schema}.{day} IN ACCESS SHARE MODE")
        assert sql_rows(pg_url, drop) == [(0, 1)]
        assert detached_days(pg_url, pg_schema) == [day]
        reader.rollback()
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 0  # detached before: its jobs were counted then
    assert detached_days(pg_url, pg_schema) == []
    assert sql_rows(pg_url, drop) == [(0, 0)]
    assert await driver.job_get(done_id) is None


async def test_the_rotation_counts_a_large_day_in_chunks_each_job_once(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """job_history_rotate() counts a day's jobs 50,000 at a time in id order (one count(*) of a
    large day held both cores): a day of exactly two chunks is counted once per job, the loop
    ending on the empty third chunk."""
    day_ago = "now() - interval '2 days'"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"SELECT {pg_schema}.job_history_add({pg_schema}.job_lane({day_ago}))")
        conn.execute(
            f"INSERT INTO {pg_schema}.job_rows_legacy (queue, task, payload, phase, run_at,"
            " created_at,"
            " started_at, finished_at, attempt, result, lane)"
            f" SELECT 'default', 'noop', '{{}}', 'completed', {day_ago}, {day_ago}, {day_ago},"
            f" {day_ago}, 1, 'null', {pg_schema}.job_lane({day_ago})"
            " FROM generate_series(1, 100000)"
        )
    rotate = f"SELECT pruned FROM {pg_schema}.job_history_rotate(%s * interval '1 second')"
    assert sql_scalar(pg_url, rotate, (RETENTION,)) == 100_000
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 0


async def test_a_producers_result_watch_that_waited_for_a_job_finishing_under_it_runs_again(
    driver: PgDriver, observer: Connection, pg_url: str, pg_schema: str
) -> None:
    """The producers run their statements as the driver does: a result watch (an UPDATE of the
    job's row) that waited for the completion moving the row to its day's partition gets
    SQLSTATE 40001 and runs again, finding the job final, instead of failing the wait."""
    finals: list[JobRecord] = []

    def wait(job_id: int) -> None:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            finals.append(producer.wait_final(job_id, timeout=15))

    async def watch(job_id: int) -> None:
        await trio.to_thread.run_sync(wait, job_id)

    await racing_a_completion(driver, observer, pg_url, pg_schema, watch)
    [final] = finals
    assert (final.state, final.result) == ("completed", 1)
