"""ready_keyed (migration 0048; bench/plans/write_once_layout.md, stage 3): a narrow table of
jobs_live's ready rows with a partition key or a concurrency key, the keyed claims' source.

The invariant after every kind of transition is checked by the conformance suite: on
PostgreSQL its driver is also a `KeyedCheckedDriver` (tests/ready_keyed_check.py) comparing
ready_keyed with jobs_live after every call that may write a job. Here: that the check can
fail; a keyed job's entry through enqueue, claim, release, retry, sleep and wake-up, cancel;
that an entry no longer its job's claims nothing; that a claimer whose snapshot predates
another's claim (forced: tests/support.py, `stall_db_now_once`) takes neither the job nor the
key; and the migration's fill."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
import trio

from tests.ready_keyed_check import (
    KeyedCheckedDriver,
    ReadyKeyedMismatch,
    entries,
    ready_keyed_mismatches,
)
from tests.support import (
    apply_functions,
    apply_migration,
    sql_rows,
    stalled_claim,
    wake_waiting,
)
from trioq._pg.driver import PgDriver, _claimed_job, claim_params, open_pg_driver, settle_params
from trioq._pg.replies import ClaimedRow
from trioq._seam.driver import Claim, ClaimedJob, NewJob, Settlement
from trioq._sql import migrations as sql_migrations
from trioq._sql import queries

WORKER = uuid.uuid4()
Conn = psycopg.Connection[tuple[Any, ...]]
KEYS = {"partition": {"partition_key": "k"}, "concurrency": {"concurrency_key": "k"}}


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def full_claim(limit: int = 1) -> Claim:
    return Claim("q", ("t",), limit, 30, WORKER)


def raw_claim(conn: Conn, schema: str, limit: int = 1) -> list[ClaimedJob]:
    """job_claim (the full claim, the keyed one) as the worker sends it, on `conn`."""
    rows = conn.execute(queries(schema)["job_claim"], claim_params(full_claim(limit)))
    return [_claimed_job(row) for row in rows.fetchall() if row[ClaimedRow.id] is not None]


def settle(conn: Conn, schema: str, settlements: list[Settlement]) -> list[int]:
    [row] = conn.execute(queries(schema)["job_settle_many"], settle_params(settlements))
    return list(row[0])


def entry_ids(pg_url: str, schema: str) -> list[tuple[int, int]]:
    """(id, filed) of each entry."""
    return [(row[5], row[6]) for row in entries(pg_url, schema)]


async def _enqueue_keyed(pg_url: str, schema: str, keys: dict[str, str], n: int) -> list[int]:
    async with open_pg_driver(pg_url, schema, pool_size=1) as driver:
        await driver.migrate()
        jobs = await driver.job_insert_many([NewJob("q", "t", "{}", **keys)] * n)  # type: ignore[arg-type]
        return [job.id for job in jobs]


async def test_the_check_fails_when_an_entry_is_missing_or_stale(
    pg_url: str, pg_schema: str
) -> None:
    async with open_pg_driver(pg_url, pg_schema, pool_size=2) as pg:
        await pg.migrate()
        driver = KeyedCheckedDriver(pg, pg)
        [job] = await driver.job_insert_many([NewJob("q", "t", "{}", partition_key="k")])
        assert entry_ids(pg_url, pg_schema) == [(job.id, 0)]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"UPDATE {pg_schema}.ready_keyed SET filed = filed + 1")
            # Both sides of the one difference: the row lacks its entry, the entry is stale.
            found = ready_keyed_mismatches(conn, pg_schema)
            assert [row[0] for row in found] == ["missing", "stale"]
            with pytest.raises(ReadyKeyedMismatch):
                await driver.assert_exact("a write by hand")
            conn.execute(f"DELETE FROM {pg_schema}.ready_keyed")
            assert [row[0] for row in ready_keyed_mismatches(conn, pg_schema)] == ["missing"]


@pytest.mark.parametrize("kind", sorted(KEYS))
async def test_a_keyed_job_has_its_entry_exactly_while_it_is_ready(
    driver: PgDriver, pg_url: str, pg_schema: str, kind: str
) -> None:
    """Enqueue files it, a delayed enqueue does not; the claim deletes it; a release and an
    immediate retry and a sleep already due file it again with the row's new `filed`; a cancel
    of a ready job deletes it. Exact after every call."""
    checked = KeyedCheckedDriver(driver, driver)
    keys: dict[str, Any] = KEYS[kind]
    [job] = await checked.job_insert_many([NewJob("q", "t", "{}", **keys)])
    [delayed] = await checked.job_insert_many([NewJob("q", "t", "{}", delay_seconds=3600, **keys)])
    assert entry_ids(pg_url, pg_schema) == [(job.id, 0)]
    [claimed] = (await checked.job_claim(full_claim())).claimed
    assert claimed.id == job.id
    assert entry_ids(pg_url, pg_schema) == []
    await checked.job_settle_many([Settlement(claimed.lease, "release")])
    assert entry_ids(pg_url, pg_schema) == [(job.id, 1)]
    [claimed] = (await checked.job_claim(full_claim())).claimed
    await checked.job_settle_many(
        [Settlement(claimed.lease, "retry", error_json='{"type": "E"}', delay_seconds=0)]
    )
    assert entry_ids(pg_url, pg_schema) == [(job.id, 2)]
    [claimed] = (await checked.job_claim(full_claim())).claimed
    async with driver._pool.connection() as conn:
        [[wake_at]] = await conn.fetch(f"SELECT {pg_schema}.db_now() - interval '1 second'")
    # A sleep already due settles into ready (filed again); one due later leaves ready and is
    # filed by its promotion (the conformance suite's sleeps, checked after every call).
    await checked.job_settle_many([Settlement(claimed.lease, "sleep", wake_at=wake_at)])
    assert entry_ids(pg_url, pg_schema) == [(job.id, 3)]
    [claimed] = (await checked.job_claim(full_claim())).claimed
    assert claimed.id == job.id
    await checked.job_settle_many([Settlement(claimed.lease, "complete", result_json="1")])
    [other] = await checked.job_insert_many([NewJob("q", "t", "{}", **keys)])
    assert [entry[0] for entry in entry_ids(pg_url, pg_schema)] == [other.id]
    await checked.job_cancel(other.id)
    await checked.job_cancel(delayed.id)
    assert entry_ids(pg_url, pg_schema) == []


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_an_entry_that_is_not_its_jobs_any_more_claims_nothing(
    pg_url: str, pg_schema: str, kind: str
) -> None:
    """An entry whose `filed` is not the row's (written by hand, ahead of the row's own in claim
    order) claims nothing, even though the row reads ready: the row's own entry claims it."""
    [job_id] = trio.run(_enqueue_keyed, pg_url, pg_schema, KEYS[kind], 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {pg_schema}.ready_keyed SELECT queue, kind, key, priority - 1, run_at,"
            f" id, filed - 1, task, version, concurrency_limit FROM {pg_schema}.ready_keyed"
            f" WHERE id = %s",
            [job_id],
        )
        assert raw_claim(conn, pg_schema, limit=5) == []
        conn.execute(f"DELETE FROM {pg_schema}.ready_keyed WHERE filed < 0")
        [claimed] = raw_claim(conn, pg_schema, limit=5)
    assert claimed.id == job_id
    assert entry_ids(pg_url, pg_schema) == []


def stalled_claimer(
    pg_url: str, schema: str, act: Callable[[Conn], None]
) -> list[ClaimedJob] | BaseException:
    """tests/support.py's stalled_claim with this module's raw_claim."""
    return stalled_claim(pg_url, schema, raw_claim, act)


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_no_double_keyed_claim_from_an_old_snapshot(pg_url: str, pg_schema: str, kind: str) -> None:
    """A claims the key's job and is still running it. B's snapshot predates A's commit: it
    still sees the entry and the key free (no lock row, no hold). B takes nothing: the row's
    newest version, which its lock reads, is A's claim."""
    [job_id] = trio.run(_enqueue_keyed, pg_url, pg_schema, KEYS[kind], 1)
    taken: list[ClaimedJob] = []
    outcome = stalled_claimer(pg_url, pg_schema, lambda a: taken.extend(raw_claim(a, pg_schema)))
    assert outcome == []
    assert [job.id for job in taken] == [job_id]
    runs = sql_rows(pg_url, f"SELECT job_id, attempt FROM {pg_schema}.job_runs")
    assert runs == [(job_id, 1)]


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_an_old_snapshot_does_not_claim_a_keyed_job_released_and_filed_again(
    pg_url: str, pg_schema: str, kind: str
) -> None:
    """A claims and releases the job: its row is ready again with a new `filed`, and a new
    entry under the same primary key. B's old snapshot reads the old entry: its `filed` is not
    the row's, so B takes nothing; the next claim takes the job on the same attempt."""
    [job_id] = trio.run(_enqueue_keyed, pg_url, pg_schema, KEYS[kind], 1)

    def claim_and_release(a: Conn) -> None:
        [job] = raw_claim(a, pg_schema)
        settle(a, pg_schema, [Settlement(job.lease, "release")])

    assert stalled_claimer(pg_url, pg_schema, claim_and_release) == []
    assert entry_ids(pg_url, pg_schema) == [(job_id, 1)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        [again] = raw_claim(conn, pg_schema)
    assert (again.id, again.attempt) == (job_id, 1)
    assert entry_ids(pg_url, pg_schema) == []


def test_migration_0048_files_the_ready_keyed_rows_and_drops_the_keyed_indexes(
    pg_url: str, pg_schema: str
) -> None:
    """A schema at version 47 with ready, delayed and claimed keyed rows of both kinds and an
    unkeyed one: 0048 files exactly the ready keyed rows, and the two partial indexes go."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        apply_functions(conn, pg_schema)
        for migration in sql_migrations(pg_schema):
            if migration.version <= 47:
                apply_migration(conn, migration)
        for partition_key, concurrency_key, phase in [
            ("p1", None, "ready"),
            ("p1", None, "ready"),
            (None, "c1", "ready"),
            ("p2", None, "scheduled"),
            (None, "c2", "claimed"),
            (None, None, "ready"),
        ]:
            conn.execute(
                f"INSERT INTO {pg_schema}.job_rows_legacy (queue, task, payload, phase, priority,"
                " run_at, created_at, partition_key, concurrency_key, concurrency_limit)"
                " VALUES ('q', 't', '{}', %s, 0, now() + CASE WHEN %s = 'scheduled'"
                " THEN interval '1 hour' ELSE interval '0' END, now(), %s, %s, 3)",
                (phase, phase, partition_key, concurrency_key),
            )
        [migration] = [m for m in sql_migrations(pg_schema) if m.version == 48]
        apply_migration(conn, migration)
        assert ready_keyed_mismatches(conn, pg_schema) == []
        kinds = conn.execute(
            f"SELECT kind::text, key FROM {pg_schema}.ready_keyed ORDER BY id"
        ).fetchall()
        assert kinds == [("p", "p1"), ("p", "p1"), ("c", "c1")]
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (pg_schema,)
        ).fetchall()
        names = {name for (name,) in indexes}
        assert not names & {"jobs_partition_ready_idx", "jobs_concurrency_ready_idx"}


async def test_a_waiting_keyed_job_woken_is_filed_and_claimed_through_its_held_key(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A partition key's holder waits for an event; a job of its key queued behind it is not
    claimed (the key is held); the event wakes the holder, which is filed and claimed again
    through the held key's exact probe of its entry, before the job behind it."""
    checked = KeyedCheckedDriver(driver, driver)
    [holder, behind] = await checked.job_insert_many(
        [NewJob("q", "t", "{}", partition_key="k")] * 2
    )
    [claimed] = (await checked.job_claim(full_claim())).claimed
    assert claimed.id == holder.id
    await checked.job_settle_many([Settlement(claimed.lease, "wait", wake_at=None)])
    assert (await checked.job_claim(full_claim(5))).claimed == ()
    wake_waiting(pg_url, pg_schema, [holder.id])
    await checked.assert_exact("the wake-up")
    [again] = (await checked.job_claim(full_claim(5))).claimed
    assert again.id == holder.id
    assert [entry[0] for entry in entry_ids(pg_url, pg_schema)] == [behind.id]
