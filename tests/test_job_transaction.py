"""Handlers reach the database through their context: `ctx.client` (the worker's pool) and
`ctx.transaction()` with transactional completion (River's JobCompleteTx)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.support import make_app, running_worker, sql_rows, steal_lease, wait_until
from tests.tx_app import QUEUE, SCHEMA_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent


def create_ledger(pg_url: str, schema: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".ledger (job_id bigint, attempt int, UNIQUE (job_id, attempt))'
        )


async def test_handler_writes_and_completes_in_one_transaction_or_not_at_all(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    runs: list[int] = []

    @app.task("post", max_attempts=3, retry=trioq.RetryPolicy(base_seconds=0.01, max_seconds=0.01))
    async def post(ctx: trioq.Context, payload: dict[str, Any]) -> str:
        runs.append(ctx.job.attempt)
        async with ctx.transaction() as tx:
            await tx.execute(
                f'INSERT INTO "{pg_schema}".ledger VALUES (%s, %s)', (ctx.job.id, ctx.job.attempt)
            )
            await tx.enqueue("receipt", {"job": ctx.job.id})
            if ctx.job.attempt == 1:
                raise RuntimeError("boom before commit")  # rolls back the row and the enqueue
            await tx.complete({"attempt": ctx.job.attempt})
        return "not the result"

    @app.task("receipt")
    async def receipt(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        job = await ctx.client.get_job(payload["job"])  # the worker's own client
        return job.id

    async with app.client(migrate=True) as client:
        create_ledger(pg_url, pg_schema)
        job = await client.enqueue("post", {})
        with trio.fail_after(20):
            async with running_worker(app, poll_interval=0.05):
                record = await client.wait_final(job.id, timeout=None)
                [receipt_job] = await client.jobs(task="receipt")
                assert await client.wait_result(receipt_job.id, timeout=None) == job.id
        attempts = await client.attempts(job.id)
    assert (record.state, record.result, record.attempt) == ("completed", {"attempt": 2}, 2)
    assert runs == [1, 2]
    assert sql_rows(pg_url, f'SELECT job_id, attempt FROM "{pg_schema}".ledger') == [(job.id, 2)]
    assert [a.outcome for a in attempts] == ["retried"]  # the rolled-back first attempt


async def test_complete_after_the_lease_was_lost_rolls_the_writes_back(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    outcome: list[str] = []
    settled = trio.Event()

    @app.task("post", max_attempts=1)
    async def post(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        # Another attempt took the job over (as lease recovery would): the fence fails.
        steal_lease(pg_url, pg_schema, ctx.job.id)
        try:
            async with ctx.transaction() as tx:
                await tx.execute(f'INSERT INTO "{pg_schema}".ledger VALUES (%s, 1)', (ctx.job.id,))
                await tx.complete("done")
        except trioq.JobLeaseLost:
            outcome.append("lease lost")
        finally:
            settled.set()

    async with app.client(migrate=True) as client:
        create_ledger(pg_url, pg_schema)
        job = await client.enqueue("post", {})
        with trio.fail_after(20):
            async with running_worker(app, poll_interval=0.05):
                await settled.wait()
        record = await client.get_job(job.id)
    assert outcome == ["lease lost"]
    assert sql_rows(pg_url, f'SELECT * FROM "{pg_schema}".ledger') == []
    assert record.state == "running"  # still owned by the (pretend) other attempt


@pytest.mark.slow
async def test_worker_killed_between_write_and_commit_leaves_neither_and_the_retry_both(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """The first attempt SIGKILLs its worker after writing and completing, before COMMIT: no
    row, job still running; a second worker recovers the lease and runs attempt 2, whose row and
    completion commit together; the job never runs again."""
    app = make_app(pg_url, pg_schema)

    @app.task("post_ledger", queue=QUEUE)
    async def unused(ctx: trioq.Context, payload: Any) -> None: ...

    env = {**os.environ, SCHEMA_ENV: pg_schema, "TRIOQ_DATABASE_URL": pg_url}
    args = [
        sys.executable,
        "-m",
        "trioq.cli",
        "worker",
        "tests.tx_app:app",
        "--queue",
        QUEUE,
        "--lease",
        "2",
        "--maintenance-interval",
        "0.3",
        "--poll-interval",
        "0.2",
        "--grace",
        "1",
    ]

    async def state_of(job_id: int) -> tuple[str, int]:
        [(state, attempt)] = sql_rows(
            pg_url, f'SELECT state, attempt FROM "{pg_schema}".jobs WHERE id = %s', (job_id,)
        )
        return state, attempt

    async with app.client(migrate=True) as client:
        create_ledger(pg_url, pg_schema)
        job = await client.enqueue("post_ledger", {"die_before_commit": True})
        with (tmp_path / "first.log").open("wb") as log, trio.fail_after(30):
            first = await trio.run_process(
                args, env=env, cwd=REPO_ROOT, stdout=log, stderr=log, check=False
            )
            assert first.returncode == -signal.SIGKILL
        assert await state_of(job.id) == ("running", 1)
        assert sql_rows(pg_url, f'SELECT * FROM "{pg_schema}".ledger') == []
        with (tmp_path / "second.log").open("wb") as log:
            second = await trio.lowlevel.open_process(
                args, env=env, cwd=REPO_ROOT, stdout=log, stderr=log
            )
            try:
                with trio.fail_after(30):
                    record = await client.wait_final(job.id, timeout=None)

                    async def settled_for_good() -> bool:  # renewals and maintenance ran
                        return await state_of(job.id) == ("completed", 2)

                    await wait_until(settled_for_good)
            finally:
                second.send_signal(signal.SIGTERM)
                with trio.fail_after(30):
                    exit_code = await second.wait()
    assert exit_code == 0, (tmp_path / "second.log").read_text()
    assert (record.state, record.result) == ("completed", {"posted_by_attempt": 2})
    assert sql_rows(pg_url, f'SELECT job_id, attempt FROM "{pg_schema}".ledger') == [(job.id, 2)]
    assert await state_of(job.id) == ("completed", 2)  # never ran a third time
