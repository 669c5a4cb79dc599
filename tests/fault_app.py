"""The app the fault tests' worker subprocesses load (`tests.fault_app:app`).

Every handler run is recorded in an execution log (Jepsen style): a `start` row when the handler
begins, an `end` row when it returns, and a `cancelled` row when it is cancelled (written under a
shield, so a cancelled attempt still leaves its trace). Rows go to `<schema>.exec_log` through a
separate short psycopg connection in a worker thread, stamped with the database clock
(`clock_timestamp()`), so the tests check their invariants from the database afterwards.

The schema comes from `TRIOQ_TEST_SCHEMA` and the server from `TRIOQ_DATABASE_URL`, because
`App(schema=...)` is fixed at import time. The test process builds its own producer app with
`build_app(schema, database_url)`, which registers the same task names.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq

SCHEMA_ENV = "TRIOQ_TEST_SCHEMA"
QUEUE = "faults"

EXEC_LOG_DDL = """
CREATE TABLE IF NOT EXISTS {}.exec_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker_pid integer     NOT NULL,
    event      text        NOT NULL CHECK (event IN ('start', 'end', 'cancelled')),
    db_ts      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def create_exec_log(database_url: str, schema: str) -> None:
    """Create the side table (the test process calls this after migrating the schema)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(EXEC_LOG_DDL).format(sql.Identifier(schema)))


def build_app(schema: str, database_url: str | None = None) -> trioq.App:
    app = trioq.App(database_url, schema=schema)

    def log_event_sync(job_id: int, attempt: int, event: str) -> None:
        with psycopg.connect(app.resolve_database_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.exec_log (job_id, attempt, worker_pid, event) "
                    "VALUES (%s, %s, %s, %s)"
                ).format(sql.Identifier(schema)),
                (job_id, attempt, os.getpid(), event),
            )

    async def log_event(ctx: trioq.Context, event: str) -> None:
        await trio.to_thread.run_sync(log_event_sync, ctx.job.id, ctx.job.attempt, event)

    @app.task("work", queue=QUEUE, max_attempts=5)
    async def work(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
        """Sleep `seconds` (`first_seconds` on attempt 1, when given).

        With `stubborn_first`, attempt 1 ignores cancellation: it sleeps and writes its `end` row
        under a shield and then returns without another checkpoint, so its (stale) result is
        handed to the runtime even after its lease was lost.
        """
        first = ctx.job.attempt == 1
        seconds = payload.get("first_seconds") if first else None
        if seconds is None:
            seconds = payload["seconds"]
        await log_event(ctx, "start")
        result = {"job": ctx.job.id, "attempt": ctx.job.attempt, "pid": os.getpid()}
        if first and payload.get("stubborn_first"):
            with trio.CancelScope(shield=True):
                await trio.sleep(seconds)
                await log_event(ctx, "end")
            return result
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await log_event(ctx, "cancelled")
            raise
        await log_event(ctx, "end")
        return result

    return app


app = build_app(os.environ.get(SCHEMA_ENV, "trioq"))
