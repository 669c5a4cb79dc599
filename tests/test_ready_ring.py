"""The ready ring (migration 0039): every job that becomes ready with no key is filed in a slot
of `ready_ring`, the claims take jobs from there and delete what they read, an entry that
outlived its job's readiness is never claimed, and the leader truncates drained slots."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from tests.support import (
    force_final,
    force_running,
    partitions_of,
    run_explained,
    sql_rows,
    sql_scalar,
)
from trioq._pg.driver import PgDriver, claim_params, open_pg_driver
from trioq._seam.driver import Claim
from trioq._sql import queries
from trioq.testing import SqlClock
from trioq.testing.conformance.harness import QUEUE, TASK, claim, claim_due, enqueue, new_job


@pytest.fixture
async def driver(pg_url: str, pg_schema: str) -> AsyncIterator[PgDriver]:
    async with open_pg_driver(pg_url, pg_schema, pool_size=4) as opened:
        await opened.migrate()
        yield opened


def ring_ids(pg_url: str, schema: str) -> list[int]:
    return [row[0] for row in sql_rows(pg_url, f"SELECT id FROM {schema}.ready_ring ORDER BY id")]


async def plain_claim(driver: PgDriver, limit: int = 10) -> list[int]:
    claim_params = Claim(
        queue=QUEUE,
        tasks=(TASK,),
        limit=limit,
        lease_seconds=30.0,
        worker_id=uuid.uuid4(),
        plain=True,
    )
    result = await driver.job_claim(claim_params)
    return sorted(job.id for job in result.claimed)


async def test_ready_unkeyed_jobs_are_filed_and_a_claim_deletes_what_it_took(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    ready, keyed, concurrency, later = await enqueue(
        driver,
        new_job(1),
        new_job(2, partition_key="k"),
        new_job(3, concurrency_key="c"),
        new_job(4, delay_seconds=600),
    )
    # Keyed jobs are claimed through their keys, a scheduled one when it is promoted.
    assert ring_ids(pg_url, pg_schema) == [ready]
    assert [job.id for job in await claim(driver)] == [ready, keyed, concurrency]
    assert ring_ids(pg_url, pg_schema) == []
    more = await enqueue(driver, new_job(5), new_job(6))
    assert ring_ids(pg_url, pg_schema) == more
    assert await plain_claim(driver) == more
    assert ring_ids(pg_url, pg_schema) == []
    assert later not in ring_ids(pg_url, pg_schema)


async def test_a_promoted_job_is_filed_when_it_becomes_ready(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    clock = await SqlClock.install(driver)
    [job_id] = await enqueue(driver, new_job(1, delay_seconds=60))
    assert ring_ids(pg_url, pg_schema) == []
    await clock.advance(61)
    # The claim that promotes a due job it does not claim at once files it; with a limit of 0
    # it claims nothing, so the job stays ready in the ring.
    await claim_due(driver, limit=0)
    state = sql_scalar(pg_url, f"SELECT state FROM {pg_schema}.jobs WHERE id = %s", (job_id,))
    assert state == "ready"
    assert ring_ids(pg_url, pg_schema) == [job_id]
    assert [job.id for job in await claim(driver)] == [job_id]


async def test_an_entry_that_outlived_its_job_is_stepped_over_not_claimed(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    cancelled, other = await enqueue(driver, new_job(1), new_job(2))
    outcome = await driver.job_cancel(cancelled)
    assert outcome is not None
    # The cancel leaves the entry; a claim of one job steps over it and takes the next (it
    # is not a claim of nothing while a job is ready), and the entry goes with its slot.
    assert ring_ids(pg_url, pg_schema) == [cancelled, other]
    assert [job.id for job in await claim(driver, 1)] == [other]
    assert ring_ids(pg_url, pg_schema) == [cancelled]
    # A redrive files the job again, and it is claimed once.
    retried = await driver.job_retry(cancelled)
    assert retried is not None and retried.state == "ready"
    assert ring_ids(pg_url, pg_schema) == [cancelled, cancelled]
    assert await plain_claim(driver) == [cancelled]
    assert await plain_claim(driver) == []
    assert [job.id for job in await claim(driver)] == []


async def test_a_job_claimed_elsewhere_leaves_its_entry_and_is_not_claimed_twice(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    # A worker of the previous release claims from jobs_live and leaves the entry behind.
    [job_id] = await enqueue(driver, new_job(1))
    force_running(pg_url, pg_schema, [job_id], expires_in=datetime.timedelta(seconds=30))
    assert ring_ids(pg_url, pg_schema) == [job_id]
    assert await plain_claim(driver) == []
    [next_id] = await enqueue(driver, new_job(2))
    assert [job.id for job in await claim(driver)] == [next_id]


async def test_the_sweep_truncates_a_drained_slot_and_leaves_a_filled_or_locked_one(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    # One transaction: now(), which names the slot being written, is fixed in it, and the slots
    # two and three ahead are neither the one written nor the next.
    [ready_id] = await enqueue(driver, new_job(1))
    with psycopg.connect(pg_url) as conn, psycopg.connect(pg_url) as other:
        drained, filled = conn.execute(
            f"SELECT ({pg_schema}.ready_slot(now()) + 2) % 4,"
            f" ({pg_schema}.ready_slot(now()) + 3) % 4"
        ).fetchone()
        row = f"INSERT INTO {pg_schema}.ready_ring VALUES (%s, 'q', 't', 1, 0, now(), %s)"
        # An entry of a job that is no longer (or never was) ready does not keep its slot; an
        # entry of a ready job does.
        conn.execute(row, (drained, ready_id + 1000))
        conn.execute(row, (filled, ready_id))
        size = f"SELECT pg_relation_size('{pg_schema}.ready_ring_' || %s)"
        assert conn.execute(size, (drained,)).fetchone()[0] > 0
        assert conn.execute(f"SELECT truncated FROM {pg_schema}.ready_sweep()").fetchone()[0] == 1
        assert conn.execute(size, (drained,)).fetchone()[0] == 0
        assert conn.execute(size, (filled,)).fetchone()[0] > 0
        conn.commit()
        # A slot another session holds (a pg_dump's lock) is left for a later sweep.
        force_final(conn, pg_schema, [ready_id], "cancelled")
        conn.commit()
        other.execute(f"SELECT count(*) FROM {pg_schema}.ready_ring_{int(filled)}")
        conn.execute(f"SELECT truncated FROM {pg_schema}.ready_sweep()")
        assert conn.execute(size, (filled,)).fetchone()[0] > 0
        conn.commit()
        other.rollback()
        conn.execute(f"SELECT truncated FROM {pg_schema}.ready_sweep()")
        assert conn.execute(size, (filled,)).fetchone()[0] == 0
        conn.commit()


async def test_the_readers_of_ready_jobs_count_each_ready_job_once_through_the_ring(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """jobs_live has no index of unkeyed ready jobs (migration 0040): the queue probe, the
    dashboard's queue counts and its ready page read the ring, where an entry counts only while
    its job is ready, and a job with two entries (cancelled and redriven) counts once."""
    redriven, other, gone = await enqueue(driver, new_job(1), new_job(2), new_job(3))
    for job_id in (redriven, gone):
        assert await driver.job_cancel(job_id) is not None
    assert await driver.job_retry(redriven) is not None
    assert ring_ids(pg_url, pg_schema) == sorted([redriven, redriven, other, gone])
    statements = queries(pg_schema)
    probe = f"SELECT work_due FROM {pg_schema}.queue_probe(ARRAY[%s])"
    with psycopg.connect(pg_url, autocommit=True) as conn:

        def ready_count() -> int:
            rows = conn.execute(
                statements["dashboard_queue_counts"], {"cap": 100, "also": []}
            ).fetchall()
            return int({row[0]: row[1] for row in rows}[QUEUE])

        def ready_page() -> list[int]:
            filters = dict.fromkeys(
                ("task", "queue", "partition_key", "created_after", "created_before", "text")
            )
            rows = conn.execute(
                statements["dashboard_job_search_ready"],
                {**filters, "before_id": None, "limit": 10, "walk": 10},
            ).fetchall()
            return [row[0] for row in rows if row[0] is not None]

        assert conn.execute(probe, (QUEUE,)).fetchone() == (True,)
        assert ready_count() == 2
        assert ready_page() == sorted([redriven, other], reverse=True)
        assert await plain_claim(driver) == sorted([redriven, other])
        # Only the entries of the cancelled job and the redriven job's first one are left, the
        # latter stale by `filed` (migration 0047: the claim took the entry its redrive filed):
        # nothing is ready.
        assert ring_ids(pg_url, pg_schema) == sorted([redriven, gone])
        assert conn.execute(probe, (QUEUE,)).fetchone() == (False,)
        assert ready_count() == 0
        assert ready_page() == []
        index = f"{pg_schema}.jobs_ready_task_idx"
        assert conn.execute("SELECT to_regclass(%s)", (index,)).fetchone() == (None,)


def ring_slots(pg_url: str, schema: str) -> list[int]:
    return sorted(
        int(name.removeprefix("ready_ring_"))
        for name in partitions_of(pg_url, f"{schema}.ready_ring")
    )


async def test_a_dump_holding_the_slots_moves_the_ring_to_a_bank_the_claims_read_alone(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A `pg_dump` holds ACCESS SHARE on every slot while it runs, so none can be truncated
    (migration 0041): after 10 s of that, the sweep attaches four new slots and files there;
    5 s later it moves the old bank's entries of ready jobs over and the claims stop reading
    it (their plan never runs its scans); an entry filed there late is moved to the bank being
    written by the next sweep, and once the dump lets go the old bank is dropped."""
    [before] = await enqueue(driver, new_job(1))
    state = f"SELECT base, low FROM {pg_schema}.ready_ring_state"
    sweep = f"SELECT truncated FROM {pg_schema}.ready_sweep()"
    row = f"INSERT INTO {pg_schema}.ready_ring VALUES (%s, %s, %s, 1, 0, now(), %s)"
    old_bank = ", ".join(f"{pg_schema}.ready_ring_{slot}" for slot in range(4))
    with psycopg.connect(pg_url) as dump, psycopg.connect(pg_url) as conn:
        dump.execute(f"LOCK TABLE {pg_schema}.ready_ring, {old_bank} IN ACCESS SHARE MODE")
        # A drained slot (neither written nor next: one transaction, so now() is fixed) the
        # dump keeps from being truncated, for a minute already.
        [drained] = conn.execute(f"SELECT ({pg_schema}.ready_slot(now()) + 2) % 4").fetchone()
        conn.execute(row, (drained, "q", "t", before + 1000))
        conn.execute(
            f"UPDATE {pg_schema}.ready_ring_state SET blocked_since = now() - interval '1 minute'"
        )
        assert conn.execute(sweep).fetchone() == (0,)
        assert conn.execute(state).fetchone() == (4, 0)
        conn.commit()
        assert ring_slots(pg_url, pg_schema) == list(range(8))
        [after] = await enqueue(driver, new_job(2))
        [slot] = sql_rows(pg_url, f"SELECT slot FROM {pg_schema}.ready_ring WHERE id = {after}")
        assert slot[0] >= 4
        # 5 s after the move the old bank is left, its ready job's entry moved.
        conn.execute(f"UPDATE {pg_schema}.ready_ring_state SET moved_at = now() - interval '1 min'")
        conn.execute(sweep)
        assert conn.execute(state).fetchone() == (4, 4)
        conn.commit()
        statement = queries(pg_schema)["job_claim_plain"]
        params = Claim(QUEUE, (TASK,), 10, 30.0, uuid.uuid4(), plain=True)
        with psycopg.connect(pg_url, autocommit=True) as explained:
            explained.execute("SET auto_explain.log_analyze = on")
            claimed, plans = run_explained(explained, statement, claim_params(params))
        assert len(claimed) == 2
        running = f"SELECT id FROM {pg_schema}.jobs WHERE state = 'running' ORDER BY id"
        assert [row[0] for row in sql_rows(pg_url, running)] == [before, after]
        # The old bank's slots are pruned as the claim runs (the bank's low read once, by a
        # sub-select): no scan of them runs, the plan shows each never executed.
        [plan] = [text for text in plans if "ready_ring_4" in text]
        old_scans = [scan for slot in range(4) for scan in plan.split(f"on ready_ring_{slot} ")[1:]]
        assert old_scans, plan
        for scan in old_scans:
            assert "never executed" in scan.splitlines()[0], plan
        # An entry filed in the old bank late (an enqueue whose slot was chosen before the
        # move and written after it: a REPEATABLE READ transaction that read the ring's state
        # before the move): moved to the bank being written by the next sweep, while the dump
        # still holds the old bank (it waited for the dump's end before, minutes or hours).
        [late] = await enqueue(driver, new_job(3))
        conn.execute(f"DELETE FROM {pg_schema}.ready_ring WHERE id = %s", (late,))
        conn.execute(row, (1, QUEUE, TASK, late))
        conn.commit()
        assert await plain_claim(driver) == []
        conn.execute(sweep)
        assert ring_slots(pg_url, pg_schema) == list(range(8))  # the dump still holds them
        conn.commit()
        assert await plain_claim(driver) == [late]
        # Filed late again, while the dump holds the bank: the sweep that drops the bank once
        # the dump has let go moves it first.
        [later] = await enqueue(driver, new_job(4))
        conn.execute(f"DELETE FROM {pg_schema}.ready_ring WHERE id = %s", (later,))
        conn.execute(row, (2, QUEUE, TASK, later))
        conn.commit()
        dump.rollback()
        conn.execute(f"UPDATE {pg_schema}.ready_ring_state SET retired_tried_at = NULL")
        conn.execute(sweep)
        conn.commit()
        assert ring_slots(pg_url, pg_schema) == [4, 5, 6, 7]
        assert await plain_claim(driver) == [later]


async def test_a_ring_state_emptied_by_hand_reads_as_the_first_bank(
    driver: PgDriver, pg_url: str, pg_schema: str
) -> None:
    """A test suite that truncates every table empties ready_ring_state too: the filing and
    the claims read its missing row as bank 0 (a job filed nowhere would never run), and the
    next sweep writes the row again."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {pg_schema}.ready_ring_state")
        [job_id] = await enqueue(driver, new_job(1))
        assert ring_ids(pg_url, pg_schema) == [job_id]
        assert await plain_claim(driver) == [job_id]
        conn.execute(f"SELECT {pg_schema}.ready_sweep()")
        state = conn.execute(f"SELECT base, low FROM {pg_schema}.ready_ring_state").fetchall()
        assert state == [(0, 0)]
