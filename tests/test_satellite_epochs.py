"""Checkpoints, attempts and workflow values by their job's id (migration 0043): a new epoch of
ids each UTC day, and retention empties an epoch's partitions whole (TRUNCATE, then DROP), never
a DELETE a row, while the rows of a job still kept stay readable."""

from __future__ import annotations

import datetime
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from tests.support import partitions_of, sql_rows, sql_scalar
from trioq._core.retention import seconds_to_day_end
from trioq._pg.driver import PgDriver, open_pg_driver
from trioq._seam.services import MaintenancePass
from trioq.testing import SqlClock
from trioq.testing.conformance.harness import claim, complete, enqueue, fail, new_job, record

RETENTION = 3600.0
DAY = 86_400.0
EPOCH_1 = 2**40  # migration 0043: epoch 0 is every id below it


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def checkpoint_add(pg_url: str, schema: str, job_id: int, positions: int) -> None:
    sql_rows(
        pg_url,
        f"INSERT INTO {schema}.checkpoints (job_id, position, kind, name, value, created_at)"
        " SELECT %s, p, 'step', 'a step', '1', now() FROM generate_series(0, %s - 1) AS p"
        " RETURNING job_id",
        (job_id, positions),
    )


def satellite_parts(pg_url: str, schema: str) -> dict[str, list[str]]:
    return {
        table: sorted(partitions_of(pg_url, f"{schema}.{table}"))
        for table in ("checkpoints", "attempts", "workflow_values")
    }


def deleted_rows(pg_url: str, schema: str) -> int:
    """Rows ever deleted one by one from any satellite partition (a TRUNCATE counts none)."""
    return int(
        sql_scalar(
            pg_url,
            "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname ~ '^(checkpoints|attempts|workflow_values)_e'",
            (schema,),
        )
    )


def flush_stats(pg_url: str) -> None:
    sql_rows(pg_url, "SELECT pg_stat_force_next_flush() IS NULL")


async def test_retention_empties_an_epoch_whole_and_keeps_the_rows_of_a_job_still_kept(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    clock = await SqlClock.install(driver)
    await clock.freeze()
    # Day one (epoch 0): three jobs that fail with two checkpoints each, and one that fails
    # once and is retried days later (kept, with its attempt and checkpoints).
    doomed = await enqueue(driver, *[new_job(n, max_attempts=1) for n in range(3)])
    [kept_id] = await enqueue(driver, new_job(9, max_attempts=2))
    assert max([*doomed, kept_id]) < EPOCH_1
    claimed = await claim(driver, limit=10)
    for job in claimed:
        checkpoint_add(pg_url, pg_schema, job.id, 2)
        await fail(driver, job.lease, retry_delay=3 * DAY if job.id == kept_id else None)
    finished_at = (await record(driver, doomed[0])).finished_at
    assert finished_at is not None
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert satellite_parts(pg_url, pg_schema)["checkpoints"] == ["checkpoints_e0", "checkpoints_e1"]

    # The next day, past retention: epoch 1 starts (the ids jump to it), the failed jobs' day
    # goes, and epoch 0 keeps only the retried job's rows.
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 3
    [new_id] = await enqueue(driver, new_job(20))
    assert new_id >= EPOCH_1
    assert satellite_parts(pg_url, pg_schema)["checkpoints"] == [
        "checkpoints_e0",
        "checkpoints_e1",
        "checkpoints_e2",
    ]
    rows = sql_rows(pg_url, f"SELECT job_id, count(*) FROM {pg_schema}.checkpoints GROUP BY 1")
    assert rows == [(kept_id, 2)]
    assert [a.outcome for a in await driver.job_attempts(kept_id)] == ["retried"]
    for job_id in doomed:
        assert await driver.job_attempts(job_id) == []
    flush_stats(pg_url)
    assert deleted_rows(pg_url, pg_schema) == 0

    # The retried job finishes; once its day has gone too, epoch 0 is emptied (TRUNCATE: the
    # partition's lock alone), and at the next rotation, a day after it ended, its empty
    # partitions are dropped (their parents' lock, which the claims queue behind, held for an
    # empty table only).
    await clock.advance(3 * DAY)
    claimed = await claim(driver, limit=10)
    assert sorted(job.id for job in claimed) == [kept_id, new_id]
    await complete(driver, *[job.lease for job in claimed])
    kept_finished = (await record(driver, kept_id)).finished_at
    assert kept_finished is not None
    await clock.advance(seconds_to_day_end(kept_finished) + RETENTION + 1)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e0") == 0
    assert await driver.job_get(kept_id) is None
    await clock.advance(DAY)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    parts = satellite_parts(pg_url, pg_schema)
    assert "checkpoints_e0" not in parts["checkpoints"]
    assert "attempts_e0" not in parts["attempts"]
    assert "workflow_values_e0" not in parts["workflow_values"]
    assert await driver.job_attempts(kept_id) == []
    flush_stats(pg_url)
    assert deleted_rows(pg_url, pg_schema) == 0


async def test_an_id_taken_before_its_epoch_ended_still_files_its_rows_for_a_day(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A producer that took a job id (nextval) before the day's jump and inserts the job after
    the epoch was emptied: the partition is still there to take the job's rows, and it is
    dropped only once a day has passed and no job of it is kept."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    early_id = int(sql_scalar(pg_url, f"SELECT nextval('{pg_schema}.jobs_id_seq')"))
    assert early_id < EPOCH_1
    await clock.advance(DAY)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    ended = sql_rows(
        pg_url, f"SELECT epoch FROM {pg_schema}.satellite_epochs WHERE ended_at IS NOT NULL"
    )
    assert ended == [(0,)]
    checkpoint_add(pg_url, pg_schema, early_id, 1)
    assert "checkpoints_e0" in satellite_parts(pg_url, pg_schema)["checkpoints"]
    # Two days on, with no job of epoch 0 kept, it is emptied, and dropped at the next
    # rotation (a partition is dropped once empty: the parent's lock, for an empty table).
    await clock.advance(2 * DAY)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e0") == 0
    await clock.advance(DAY)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert "checkpoints_e0" not in satellite_parts(pg_url, pg_schema)["checkpoints"]


async def three_finished_and_expired(
    driver: PgDriver, pg_url: str, pg_schema: str, checkpoints: int
) -> SqlClock:
    """Three jobs completed today with `checkpoints` each, then the clock moved in one jump
    past both the day's end (a new epoch is due) and their expiry (a prune is due)."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    enqueued = await enqueue(driver, *[new_job(n) for n in range(3)])
    claimed = await claim(driver, limit=10)
    for job in claimed:
        checkpoint_add(pg_url, pg_schema, job.id, checkpoints)
    await complete(driver, *[job.lease for job in claimed])
    finished_at = (await record(driver, enqueued[0])).finished_at
    assert finished_at is not None
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(seconds_to_day_end(finished_at) + RETENTION + 1)
    return clock


async def test_a_reader_holding_an_epoch_postpones_its_emptying_by_a_minute(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A `pg_dump` holds ACCESS SHARE on every table it dumps: the rotation's lock on an ended
    epoch's partition is then not granted within its 50 ms, the pass goes on, and the epoch,
    its jobs with it (migration 0049: the records and outcomes are partitions of the same
    epoch), is emptied by a call a minute later, once the reader has gone."""
    clock = await three_finished_and_expired(driver, pg_url, pg_schema, checkpoints=2)
    with psycopg.connect(pg_url) as reader:
        reader.execute(f"LOCK TABLE {pg_schema}.checkpoints_e0 IN ACCESS SHARE MODE")
        report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
        assert report.pruned_jobs == 0
        reader.rollback()
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e0") == 6
    # Not before the minute is up: the rotation is not due.
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e0") == 6
    await clock.advance(61)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 3
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e0") == 0
    flush_stats(pg_url)
    assert deleted_rows(pg_url, pg_schema) == 0


def statistics_of(pg_url: str, schema: str, epoch: int) -> dict[str, float]:
    """reltuples of each partition of `epoch` (-1: never vacuumed or analyzed)."""
    rows = sql_rows(
        pg_url,
        "SELECT c.relname, c.reltuples FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = ANY(%s)",
        (schema, [f"{table}_e{epoch}" for table in EPOCH_TABLES]),
    )
    return {name: float(tuples) for name, tuples in rows}


EPOCH_TABLES = ("job_rows", "job_outcomes", "checkpoints", "attempts", "workflow_values")


async def test_the_days_partitions_analyzed_while_empty_are_analyzed_again_once_filled(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A VACUUM or ANALYZE of the whole database (a nightly `vacuumdb --analyze`) also reaches
    the next epoch's partitions, made a day ahead and empty, and records them as empty: a
    generic plan made in the new day's first moments would read a record by a sequential scan
    of its partition until autovacuum analyzed it. The jump leaves them as they are (making
    one again took its parent's ACCESS EXCLUSIVE lock, which every claim queued behind); the
    rotation calls again every 10 s until the records' partition holds ten pages, and
    analyzes each partition that does."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for table in EPOCH_TABLES:
            conn.execute(f"VACUUM ANALYZE {pg_schema}.{table}_e1")
    assert set(statistics_of(pg_url, pg_schema, 1).values()) == {0.0}
    made = partition_oids(pg_url, pg_schema, 1)
    await clock.advance(seconds_to_day_end(db_now(pg_url, pg_schema)) + 1)
    # The day's jump, held open: no parent locked against the claims.
    with psycopg.connect(pg_url) as conn:
        [(_, due)] = conn.execute(
            f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(NULL)"
        ).fetchall()
        held = conn.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.pid = pg_backend_pid() AND l.mode = 'AccessExclusiveLock'"
            " AND c.relname = ANY(%s)",
            (list(EPOCH_TABLES),),
        ).fetchall()
        conn.commit()
    assert held == []
    assert partition_oids(pg_url, pg_schema, 1) == made
    assert due == db_now(pg_url, pg_schema) + datetime.timedelta(seconds=10)
    # The day's jobs fill ten pages of the records' partition: the next call analyzes it.
    ten_pages = 10 * int(sql_scalar(pg_url, "SELECT current_setting('block_size')::int"))
    for n in range(20):
        if int(sql_scalar(pg_url, f"SELECT pg_relation_size('{pg_schema}.job_rows_e1')")) >= (
            ten_pages
        ):
            break
        await enqueue(driver, *[new_job(n * 500 + k) for k in range(500)])
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    statistics = statistics_of(pg_url, pg_schema, 1)
    assert statistics.pop("job_rows_e1") > 0
    assert set(statistics.values()) == {0.0}  # the others still under ten pages
    # Only the records' partition keeps the rotation due every 10 s: a partition written
    # rarely (the values', the attempts') would keep it, and the prune with it, due all hour.
    [(_, due)] = sql_rows(pg_url, f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(NULL)")
    today = db_now(pg_url, pg_schema).replace(hour=0, minute=0, second=0, microsecond=0)
    assert due == today + datetime.timedelta(days=1)
    [job] = await claim(driver, limit=1)
    assert job.id >= EPOCH_1
    checkpoint_add(pg_url, pg_schema, job.id, 1)
    await complete(driver, job.lease)
    assert (await record(driver, job.id)).state == "completed"


def partition_oids(pg_url: str, schema: str, epoch: int) -> list[int]:
    return [
        int(oid)
        for (oid,) in sql_rows(
            pg_url,
            "SELECT to_regclass(%s || '.' || t || '_e' || %s)::oid FROM unnest(%s::text[]) AS t",
            (schema, epoch, list(EPOCH_TABLES)),
        )
    ]


def parent_locks_while_waiting(pg_url: str, schema: str) -> list[str]:
    """Wait (in a thread: the pass's statement runs on the server meanwhile) until a session
    waits for a lock on `checkpoints_e0`, then the locks it holds on the five parents. A thread
    is not cancelled by the test's `fail_after`: it gives up by itself after 30 s."""
    deadline = time.monotonic() + 30
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                (f"{schema}.checkpoints_e0",),
            ).fetchall()
            if rows:
                return [
                    f"{name} {mode}"
                    for name, mode in conn.execute(
                        "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c"
                        " ON c.oid = l.relation WHERE l.pid = %s AND l.granted"
                        " AND c.relname = ANY(%s)",
                        (rows[0][0], list(EPOCH_TABLES)),
                    ).fetchall()
                ]
    raise AssertionError("no session waited for checkpoints_e0 within 30 s")


async def test_the_days_prune_runs_without_the_parents_locks_of_its_new_partitions(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """The day's jump makes the next epoch's partitions, which locks each parent until the
    transaction ends (SHARE UPDATE EXCLUSIVE for an attach). With a retention of whole days, an
    epoch's jobs expire at a midnight too, and the same pass prunes them: the prune (its
    survivors' read, its locks' waits, up to five of 50 ms for a reader) must not run under
    those locks. The partitions are made and committed first."""
    await three_finished_and_expired(driver, pg_url, pg_schema, checkpoints=1)
    with psycopg.connect(pg_url) as reader:
        reader.execute(f"LOCK TABLE {pg_schema}.checkpoints_e0 IN ACCESS SHARE MODE")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    driver.maintenance_pass, MaintenancePass(retention_seconds=RETENTION)
                )
                held = await trio.to_thread.run_sync(parent_locks_while_waiting, pg_url, pg_schema)
        reader.rollback()
    assert held == []
    started = sql_rows(
        pg_url, f"SELECT epoch FROM {pg_schema}.satellite_epochs WHERE started_at IS NOT NULL"
    )
    assert sorted(started) == [(0,), (1,)]
    assert "checkpoints_e2" in satellite_parts(pg_url, pg_schema)["checkpoints"]


async def test_the_next_epochs_partitions_are_made_while_a_writer_holds_the_records(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """`CREATE TABLE ... PARTITION OF` needs its parent's ACCESS EXCLUSIVE lock: every claim,
    enqueue and completion in flight holds it off, and every one after queues behind it. Made
    apart and attached, a partition needs only SHARE UPDATE EXCLUSIVE, which none of them
    conflicts with: an open transaction that wrote a record does not stop the day's jump from
    making the next epoch's partitions."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(DAY)
    with psycopg.connect(pg_url) as writer:
        for table in EPOCH_TABLES:  # what an enqueue or a settle in an open transaction holds
            writer.execute(f"LOCK TABLE {pg_schema}.{table} IN ROW EXCLUSIVE MODE")
        await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
        writer.rollback()
    for table in EPOCH_TABLES:
        assert f"{table}_e2" in partitions_of(pg_url, f"{pg_schema}.{table}"), table
    # The attached partitions take the jobs of their ids as the others do.
    sql_rows(pg_url, f"SELECT setval('{pg_schema}.jobs_id_seq', {EPOCH_1 + 2**32}, false)")
    [job_id] = await enqueue(driver, new_job(1))
    assert job_id >= EPOCH_1 + 2**32
    [job] = await claim(driver, limit=1)
    checkpoint_add(pg_url, pg_schema, job_id, 1)
    await complete(driver, job.lease)
    assert (await record(driver, job_id)).state == "completed"
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints_e2") == 1


def db_now(pg_url: str, schema: str) -> datetime.datetime:
    now = sql_scalar(pg_url, f"SELECT {schema}.db_now()")
    assert isinstance(now, datetime.datetime)
    return now


async def test_the_midnight_prune_leaves_the_epoch_that_just_ended_unread_and_unlocked(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """At the day's jump the epoch that has just ended still has jobs running and completing
    (its last claims, its backlog). None of them can have expired yet (each finished after the
    epoch began), so the day's prune neither reads nor locks that epoch: its outcomes' SHARE
    lock, held until the prune's commit, made every completion of those jobs wait for the whole
    pass. Once its jobs can expire, it is pruned as any other."""
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    await clock.advance(seconds_to_day_end(db_now(pg_url, pg_schema)) + 1)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))  # epoch 1
    ids = await enqueue(driver, new_job(1), new_job(2))
    assert min(ids) >= EPOCH_1
    running, done = sorted(await claim(driver, limit=2), key=lambda job: job.id)
    await complete(driver, done.lease)
    # The next midnight, as the leader's pass runs it: the epochs in a call of their own, then
    # the prune, here held open.
    await clock.advance(seconds_to_day_end(db_now(pg_url, pg_schema)) + 1)
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(NULL)")
        conn.commit()
        conn.execute(f"SELECT * FROM {pg_schema}.satellite_epochs_rotate(interval '1 hour')")
        held = conn.execute(
            "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.pid = pg_backend_pid() AND c.relname ~ '_e1$' ORDER BY 1, 2"
        ).fetchall()
        conn.commit()
    assert held == []
    ended = sql_rows(
        pg_url, f"SELECT epoch FROM {pg_schema}.satellite_epochs WHERE ended_at IS NOT NULL"
    )
    assert sorted(ended) == [(0,), (1,)]
    await complete(driver, running.lease)
    # A day and the retention later, both jobs of epoch 1 have expired, and the prune takes it.
    await clock.advance(DAY + RETENTION)
    report = await driver.maintenance_pass(MaintenancePass(retention_seconds=RETENTION))
    assert report.pruned_jobs == 2
    assert sql_scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.job_rows_e1") == 0


async def test_an_epoch_with_no_job_is_dropped_a_day_after_it_ended_within_the_retention(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """An epoch that began after the cutoff's day holds no job that can have expired, and the
    prune leaves it unread; one that holds no row at all (a day without jobs) is still dropped
    a day after it ended, not once the retention has passed: every claim's plan locks each
    partition there is."""
    three_days = 3 * DAY
    clock = await SqlClock.install(driver)
    await clock.freeze()
    await driver.maintenance_pass(MaintenancePass(retention_seconds=three_days))
    for _ in range(2):  # epoch 1 starts, then ends with no job
        await clock.advance(seconds_to_day_end(db_now(pg_url, pg_schema)) + 1)
        await driver.maintenance_pass(MaintenancePass(retention_seconds=three_days))
    assert "checkpoints_e1" in satellite_parts(pg_url, pg_schema)["checkpoints"]
    await clock.advance(DAY + 1)
    await driver.maintenance_pass(MaintenancePass(retention_seconds=three_days))
    for table in EPOCH_TABLES:
        assert f"{table}_e1" not in partitions_of(pg_url, f"{pg_schema}.{table}"), table
    assert "job_rows_e2" in partitions_of(pg_url, f"{pg_schema}.job_rows")
