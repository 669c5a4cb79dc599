"""The job-state helpers of tests/support.py write a state whole: a worker racing them never sees
half of it."""

from __future__ import annotations

import datetime

import psycopg
import trio
from psycopg import sql

from tests.support import force_running, in_thread, make_app, wait_until


async def test_force_running_writes_the_run_and_the_record_in_one_transaction(
    pg_url: str, pg_schema: str
) -> None:
    # Its run and its record were two autocommit sessions: a leader's recovery pass (every 0.1 s
    # in tests/test_leadership.py) could take the expired run between them and file the job
    # ready, and the record's write then set it `claimed` with no run, so no worker ever took it
    # (a 10 s wait timed out there under a loaded full suite).
    app = make_app(pg_url, pg_schema)

    @app.task("orphan")
    async def orphan(ctx: object, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client:
        job = await client.enqueue("orphan", {}, delay=3600)
    records = sql.Identifier(pg_schema, "job_rows")
    runs = sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s").format(
        sql.Identifier(pg_schema, "job_runs")
    )
    with (
        psycopg.connect(pg_url) as blocker,
        psycopg.connect(pg_url, autocommit=True) as watcher,
    ):
        # Readers pass an EXCLUSIVE lock; the record's UPDATE waits on it.
        blocker.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(records))

        # The record's write is an UPDATE inside a WITH (it writes job_due too: migration 0050).
        async def record_write_waits() -> bool:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%UPDATE %%job_rows%%'"
            ).fetchone()
            return row is not None and row[0] > 0

        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: in_thread(
                    force_running,
                    pg_url,
                    pg_schema,
                    [job.id],
                    expires_in=datetime.timedelta(seconds=-1),
                    due_now=True,
                )
            )
            with trio.fail_after(10):
                await wait_until(record_write_waits)
            seen = watcher.execute(runs, (job.id,)).fetchone()
            blocker.rollback()
        assert seen == (0,), "the run was visible before its record was written"
        assert watcher.execute(runs, (job.id,)).fetchone() == (1,)
