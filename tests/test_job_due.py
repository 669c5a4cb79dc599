"""job_due (migrations 0044-0046): a narrow table of jobs_live's scheduled, sleeping and waiting
rows, kept exact by triggers, and the migrations that fill it online.

The invariant after every kind of transition is checked by the conformance suite: on
PostgreSQL its driver is a `DueCheckedDriver` (tests/job_due_check.py) that compares job_due
with jobs_live after every call that may write a job (enqueue delayed, promotion, due claim,
sleep, waits, wake-ups by event, message and child, cancels, deadlines, retries with backoff,
recovery, purge, `keep=False`, continue-as-new). Here: that the check can fail, the row
leaving jobs_live through a cross-partition move, and the backfill, from the previous
release's schema, run again, and raced by a writer.
"""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio
from psycopg import sql

from tests.job_due_check import DueCheckedDriver, JobDueMismatch, due_rows, job_due_mismatches
from tests.ready_keyed_check import ready_keyed_mismatches
from tests.releases import JOB_DUE_RELEASE, functions_at
from tests.support import (
    apply_functions,
    apply_migration,
    force_running,
    force_sleeping,
    sql_rows,
    sql_scalar,
    wait_until,
)
from trioq._pg.driver import claim_params, open_pg_driver, settle_params
from trioq._pg.replies import Claimed, ClaimedRow
from trioq._seam.driver import Claim, NewJob, Settlement
from trioq._sql import Migration, migrations, queries

PREVIOUS = 43  # the previous release's last migration
FILL = 45  # the batched backfill (a procedure 0044 creates, 0046 drops)


def _migrations_up_to(schema: str, version: int) -> list[Migration]:
    return [m for m in migrations(schema) if m.version <= version]


def _migration(schema: str, version: int) -> Migration:
    [found] = [m for m in migrations(schema) if m.version == version]
    return found


def _seed_every_state(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """One job per state (two waits: with a timeout, and without), plus keyed ones, written as
    the previous release leaves them; returns state name -> job id."""
    names = [
        "ready",
        "ready_keyed",
        "scheduled",
        "scheduled_keyed",
        "running",
        "sleeping",
        "sleeping_due",
        "waiting",
        "waiting_forever",
        "completed",
        "failed",
        "cancelled",
    ]
    ids = {}
    for name in names:
        key = "k-" + name if name.endswith("_keyed") else None
        ids[name] = conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, payload, state, priority, run_at, created_at,"
                " partition_key) VALUES ('default', %s, '{{}}', 'ready', 0, now(), now(), %s)"
                " RETURNING id"
            ).format(sql.Identifier(schema)),
            (name, key),
        ).fetchone()[0]  # type: ignore[index]
    # The previous release's layout (a `state` column, the lease in the row): tests/support.py's
    # helpers write this tree's, which migration 0047 makes.
    old_layout = [
        ("scheduled", "state = 'scheduled', run_at = now() + interval '1 hour'"),
        ("scheduled_keyed", "state = 'scheduled', run_at = now() + interval '1 hour'"),
        (
            "running",
            "state = 'running', attempt = 1, lease_token = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 hour', started_at = now()",
        ),
        ("sleeping", "state = 'sleeping', run_at = now() + interval '1 hour'"),
        ("sleeping_due", "state = 'sleeping', run_at = now() - interval '1 hour'"),
        ("waiting", "state = 'waiting', wait_event_key = 'e', run_at = now() + interval '1 hour'"),
        ("waiting_forever", "state = 'waiting', wait_event_key = 'e', run_at = NULL"),
    ] + [
        (final, f"state = '{final}', finished_at = now(), lane = {{s}}.job_lane(now())")
        for final in ("completed", "failed", "cancelled")
    ]
    for name, assignments in old_layout:
        conn.execute(
            sql.SQL("UPDATE {s}.jobs SET " + assignments + " WHERE id = %(id)s").format(
                s=sql.Identifier(schema)
            ),
            {"id": ids[name]},
        )
    return ids


DUE = ("scheduled", "scheduled_keyed", "sleeping", "sleeping_due", "waiting", "waiting_forever")


@pytest.fixture
def previous_schema(pg_url: str, pg_schema: str) -> Iterator[dict[str, int]]:
    """A schema at the previous release's last migration, with a job in every state."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
        # The bodies of the release that ships 0044-0046 alone (tests/releases.py).
        apply_functions(conn, pg_schema, functions_at(JOB_DUE_RELEASE, pg_schema))
        for migration in _migrations_up_to(pg_schema, PREVIOUS):
            apply_migration(conn, migration)
        yield _seed_every_state(conn, pg_schema)


def _index_names(pg_url: str, schema: str) -> set[str]:
    rows = sql_rows(pg_url, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))
    return {name for (name,) in rows}


async def test_the_check_fails_when_job_due_lacks_a_due_row_or_keeps_a_stale_one(
    pg_url: str, pg_schema: str
) -> None:
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        await pg.migrate()
        driver = DueCheckedDriver(pg, pg)
        [delayed] = await driver.job_insert_many(
            [NewJob("default", "echo", "{}", delay_seconds=3600)]
        )
        assert [row[0] for row in due_rows(pg_url, pg_schema)] == [delayed.id]
        table = sql.Identifier(pg_schema, "job_due")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DELETE FROM {}").format(table))
        with pytest.raises(JobDueMismatch, match="missing"):
            await driver.job_insert_many([NewJob("default", "echo", "{}")])
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, 'default', 'scheduled', now()), (-1,"
                        " 'default', 'sleeping', now())").format(table),
                (delayed.id,),
            )  # fmt: skip
        with pytest.raises(JobDueMismatch, match="stale"):
            await driver.job_insert_many([NewJob("default", "echo", "{}")])
        assert driver.checked_calls == 3


async def test_a_delayed_job_cancelled_leaves_job_due_as_its_record_turns_done(
    pg_url: str, pg_schema: str
) -> None:
    """A cancel writes the record `done` in place and appends its outcome (migration 0049): the
    update trigger (jobs_live_filed) takes the job out of job_due."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        await pg.migrate()
        driver = DueCheckedDriver(pg, pg)
        jobs = await driver.job_insert_many(
            [NewJob("default", "echo", "{}", delay_seconds=3600) for _ in range(3)]
        )
        assert len(due_rows(pg_url, pg_schema)) == 3
        await driver.job_cancel(jobs[1].id)
        assert [row[0] for row in due_rows(pg_url, pg_schema)] == [jobs[0].id, jobs[2].id]
        phase = sql_scalar(
            pg_url,
            sql.SQL("SELECT phase FROM {} WHERE id = %s").format(
                sql.Identifier(pg_schema, "job_rows")
            ),
            (jobs[1].id,),
        )
        assert phase == "done"


def test_the_backfill_files_every_due_row_of_the_previous_schema_and_can_run_again(
    pg_url: str, pg_schema: str, previous_schema: dict[str, int]
) -> None:
    ids = previous_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        apply_migration(conn, _migration(pg_schema, 44))
        # Only the triggers so far: no row changed since, so none is filed yet.
        assert due_rows(pg_url, pg_schema) == []
        apply_migration(conn, _migration(pg_schema, FILL))
        filed = due_rows(pg_url, pg_schema)
        assert sorted(row[0] for row in filed) == sorted(ids[name] for name in DUE)
        assert job_due_mismatches(conn, pg_schema) == []
        waiting_forever = [row for row in filed if row[0] == ids["waiting_forever"]]
        assert waiting_forever == [(ids["waiting_forever"], "default", "waiting", None)]
        # A migrate killed half-way runs it again: what is filed stays, what is not is filed.
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE job_id = ANY(%s)").format(
                sql.Identifier(pg_schema, "job_due")
            ),
            ([ids["sleeping"], ids["waiting"]],),
        )
        apply_migration(conn, _migration(pg_schema, FILL))
        assert due_rows(pg_url, pg_schema) == filed
        apply_migration(conn, _migration(pg_schema, FILL))
        assert due_rows(pg_url, pg_schema) == filed
    assert {"jobs_due_idx", "jobs_suspended_idx"} <= _index_names(pg_url, pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        apply_migration(conn, _migration(pg_schema, 46))
    assert not {"jobs_due_idx", "jobs_suspended_idx"} & _index_names(pg_url, pg_schema)
    procedures = sql_scalar(
        pg_url,
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = 'job_due_fill'",
        (pg_schema,),
    )
    assert procedures == 0


async def test_migrate_from_the_previous_release_fills_job_due_and_its_claims_run_the_due_jobs(
    pg_url: str, pg_schema: str, previous_schema: dict[str, int]
) -> None:
    """`migrate` itself: the fill's CALL is refused inside the statement's transaction (the
    procedure commits its batches) and runs in autocommit instead."""
    ids = previous_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # What the previous release's migrate records (apply_migration records nothing).
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(pg_schema, "migrations"))
        )
        for migration in _migrations_up_to(pg_schema, PREVIOUS):
            conn.execute(
                sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(pg_schema, "migrations")
                ),
                (migration.version, migration.name),
            )
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        # 0047 too (stop first: the previous release's running job becomes a run), 0048 (its
        # ready keyed job filed in ready_keyed), 0049 (the records copied by epoch) and 0050.
        assert await pg.migrate() == [44, 45, 46, 47, 48, 49, 50, 51]
        assert job_due_mismatches(pg_url, pg_schema) == []
        assert ready_keyed_mismatches(pg_url, pg_schema) == []
        assert len(due_rows(pg_url, pg_schema)) == len(DUE)
        driver = DueCheckedDriver(pg, pg)
        # The overdue sleep is claimed by a full claim reading job_due.
        claim = Claim("default", ("sleeping_due",), 5, 30.0, uuid.uuid4())
        result = await driver.job_claim(claim)
        assert [job.id for job in result.claimed] == [ids["sleeping_due"]]
        assert ids["sleeping_due"] not in [row[0] for row in due_rows(pg_url, pg_schema)]


def _call_fill_in_thread(pg_url: str, schema: str, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True, application_name="job_due_fill") as c:
                apply_migration(c, _migration(schema, FILL))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def _wait_fill(pg_url: str, wait_event: str) -> None:
    """Until the fill's session waits on `wait_event` (pg_stat_activity), at most 30 s."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'job_due_fill'"
        " AND wait_event = %s"
    )

    async def waiting() -> bool:
        return bool(await trio.to_thread.run_sync(sql_scalar, pg_url, query, (wait_event,)))

    with trio.fail_after(30):
        await wait_until(waiting)


async def test_a_row_promoted_after_the_fills_snapshot_is_not_filed_stale(
    pg_url: str, pg_schema: str, previous_schema: dict[str, int]
) -> None:
    """The fill's batch reads the sleeping rows, then stops at its first insert (held by another
    session's uncommitted copy of the same row); meanwhile the second row is promoted and
    committed. The batch's lock then finds the promoted version: not due any more, not filed.
    Without the lock's recheck the snapshot's copy, `sleeping`, would be filed for a ready job
    (never promoted, never claimed through job_due again)."""
    ids = previous_schema
    first, second = sorted([ids["sleeping"], ids["sleeping_due"]])
    table = sql.Identifier(pg_schema, "job_due")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        apply_migration(conn, _migration(pg_schema, 44))
        # Everything due but the two sleeping rows is filed already (a fill that ran before).
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT id, queue, state, run_at FROM {} WHERE state IN"
                " ('scheduled', 'waiting')"
            ).format(table, sql.Identifier(pg_schema, "jobs_live"))
        )
    holder = psycopg.connect(pg_url)  # a transaction of its own, left open
    errors: list[BaseException] = []
    try:
        holder.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'default', 'sleeping', now())").format(table),
            (first,),
        )
        thread = _call_fill_in_thread(pg_url, pg_schema, errors)
        await _wait_fill(pg_url, "transactionid")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET state = 'ready' WHERE id = %s").format(
                    sql.Identifier(pg_schema, "jobs_live")
                ),
                (second,),
            )
        holder.rollback()
        await trio.to_thread.run_sync(thread.join)
    finally:
        holder.close()
    assert errors == []
    filed = {row[0]: row[2] for row in due_rows(pg_url, pg_schema)}
    assert filed[first] == "sleeping"
    assert second not in filed
    assert job_due_mismatches(pg_url, pg_schema) == []


async def test_a_due_row_locked_by_a_writer_is_filed_once_the_writer_lets_go(
    pg_url: str, pg_schema: str, previous_schema: dict[str, int]
) -> None:
    """SKIP LOCKED passes over a row a writer holds; the fill goes round again (pausing while
    it copies nothing) until no due row lacks its copy."""
    ids = previous_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        apply_migration(conn, _migration(pg_schema, 44))
    holder = psycopg.connect(pg_url)
    errors: list[BaseException] = []
    try:
        holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(
                sql.Identifier(pg_schema, "jobs_live")
            ),
            (ids["waiting"],),
        )
        thread = _call_fill_in_thread(pg_url, pg_schema, errors)
        await _wait_fill(pg_url, "PgSleep")
        filed = [row[0] for row in due_rows(pg_url, pg_schema)]
        assert ids["waiting"] not in filed and ids["sleeping"] in filed
        holder.commit()
        await trio.to_thread.run_sync(thread.join)
    finally:
        holder.close()
    assert errors == []
    assert ids["waiting"] in [row[0] for row in due_rows(pg_url, pg_schema)]
    assert job_due_mismatches(pg_url, pg_schema) == []


async def test_a_stale_job_due_row_never_makes_a_claim_the_job_row_would_not(
    pg_url: str, pg_schema: str
) -> None:
    """The claim locks each job's row and rechecks its state: a copy that says `sleeping` and
    due for a job that runs (written by hand: the triggers never leave one) promotes and claims
    nothing, and a due job beside it is claimed as usual."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        await pg.migrate()
        [running, sleeping] = await pg.job_insert_many(
            [NewJob("default", "echo", "{}"), NewJob("default", "echo", "{}")]
        )
        hour = datetime.timedelta(hours=1)
        force_running(pg_url, pg_schema, [running.id], expires_in=hour, attempt=1)
        past = datetime.datetime.now(datetime.UTC) - hour
        force_sleeping(pg_url, pg_schema, sleeping.id, past)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, 'default', 'sleeping', %s)").format(
                    sql.Identifier(pg_schema, "job_due")
                ),
                (running.id, past),
            )
        claim = Claim("default", ("echo",), 5, 30.0, uuid.uuid4())
        result = await pg.job_claim(claim)
        assert [job.id for job in result.claimed] == [sleeping.id]
        states = dict(
            sql_rows(
                pg_url,
                sql.SQL("SELECT id, state FROM {} ORDER BY id").format(
                    sql.Identifier(pg_schema, "jobs")
                ),
            )
        )
        assert states == {running.id: "running", sleeping.id: "running"}
        attempt = sql_scalar(
            pg_url,
            sql.SQL("SELECT attempt FROM {} WHERE id = %s").format(
                sql.Identifier(pg_schema, "jobs")
            ),
            (running.id,),
        )
        assert attempt == 1  # not claimed a second time


def _trigger_calls(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """The PL/pgSQL functions of `schema` this transaction has called (track_functions is set
    for it), by name: row triggers included."""
    rows = conn.execute(
        "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = %s",
        (schema,),
    ).fetchall()
    return dict(rows)


async def test_a_sleep_and_its_due_claim_write_job_due_themselves_without_a_trigger_call(
    pg_url: str, pg_schema: str
) -> None:
    """Migration 0050: the settle that suspends a run into `sleeping` files its copy in the same
    statement, and the claim that takes a due job or promotes one deletes the copy; neither
    calls the filing trigger's function (a PL/pgSQL call per sleep and per wake-up before), and
    job_due stays exact. The promotion still files the ring's entry (its trigger, as on a
    record turning ready anywhere)."""
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        await pg.migrate()
        jobs = await pg.job_insert_many([NewJob("default", "echo", "{}")] * 2)
        claim = Claim("default", ("echo",), 2, 30.0, uuid.uuid4())
        leases = [job.lease for job in (await pg.job_claim(claim)).claimed]
    assert len(leases) == 2
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET LOCAL track_functions = 'pl'")
        conn.execute(
            queries(pg_schema)["job_settle_many"],
            settle_params([Settlement(lease, "sleep", wake_at=later) for lease in leases]),
        )
        assert "jobs_live_file" not in _trigger_calls(conn, pg_schema)
        conn.commit()
    assert [row[2] for row in due_rows(pg_url, pg_schema)] == ["sleeping", "sleeping"]
    assert job_due_mismatches(pg_url, pg_schema) == []
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    for job in jobs:
        force_sleeping(pg_url, pg_schema, job.id, past)
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET LOCAL track_functions = 'pl'")
        rows = conn.execute(
            queries(pg_schema)["job_claim"], claim_params(attrs.evolve(claim, limit=1))
        ).fetchall()
        calls = _trigger_calls(conn, pg_schema)
        conn.commit()
    [row] = rows
    assert row[ClaimedRow.id] is not None and row[Claimed.promoted] == 1
    assert "jobs_live_file" not in calls
    assert calls.get("ready_ring_file") == 1
    assert due_rows(pg_url, pg_schema) == []
    assert job_due_mismatches(pg_url, pg_schema) == []
