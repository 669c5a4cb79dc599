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

import atexit
import datetime
import itertools
import os
import queue
import threading
import time
import uuid
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq

SCHEMA_ENV = "TRIOQ_TEST_SCHEMA"
POOL_SIZE_ENV = "TRIOQ_TEST_POOL_SIZE"
CLOCK_SKEW_ENV = "TRIOQ_TEST_CLOCK_SKEW"  # seconds added to this process's wall clock


def skew_wall_clock(seconds: float) -> None:
    """Shift `time.time` / `time.time_ns` (what logging and most libraries read) by `seconds`:
    the clock-skew fault test runs a worker whose host clock is wrong."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)  # type: ignore[assignment]


if os.environ.get(CLOCK_SKEW_ENV):
    skew_wall_clock(float(os.environ[CLOCK_SKEW_ENV]))
QUEUE = "faults"

EXEC_LOG_DDL = """
CREATE TABLE IF NOT EXISTS {}.exec_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    attempt    integer     NOT NULL,
    worker_pid integer     NOT NULL,
    event      text        NOT NULL CHECK (event IN ('start', 'end', 'cancelled')),
    db_ts      timestamptz NOT NULL DEFAULT clock_timestamp(),
    partition_key text,
    UNIQUE (job_id, attempt, worker_pid, event)
)
"""


class ExecLog:
    """Execution-log writes from worker threads over a few kept connections (the fast tasks log
    thousands of runs; one connection per row would dominate the run). A write that meets a
    lost connection (the server restarting) reconnects and retries for up to `patience` seconds,
    so a run's rows survive a restart of PostgreSQL."""

    def __init__(self, database_url: str, schema: str, patience: float = 60.0) -> None:
        self._url = database_url
        self._insert = sql.SQL(
            "INSERT INTO {}.exec_log (job_id, attempt, worker_pid, event, partition_key) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"  # a retried row lands once
        ).format(sql.Identifier(schema))
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._patience = patience

    def write(self, job_id: int, attempt: int, event: str, partition_key: str | None) -> None:
        self.run(self._insert, (job_id, attempt, os.getpid(), event, partition_key))

    def run(self, statement: sql.Composable, params: tuple[Any, ...]) -> None:
        deadline = time.monotonic() + self._patience
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = None
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
                conn.execute(statement, params)
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            self._idle.put(conn)
            return

    def close(self) -> None:
        """Close the kept connections (a later write opens new ones)."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


_exec_logs: dict[tuple[str, str], ExecLog] = {}
_exec_logs_lock = threading.Lock()


@atexit.register
def _close_exec_logs() -> None:
    """The logs live as long as the process; when that is pytest's (the app run in-process),
    their connections are closed here rather than left to the garbage collector at exit (15
    ResourceWarnings at the end of every suite run)."""
    with _exec_logs_lock:
        for log in _exec_logs.values():
            log.close()


def exec_log(database_url: str, schema: str) -> ExecLog:
    with _exec_logs_lock:
        return _exec_logs.setdefault((database_url, schema), ExecLog(database_url, schema))


WF_EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS {}.wf_effects (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    step       text        NOT NULL,
    worker_pid integer     NOT NULL,
    token      uuid        NOT NULL UNIQUE,
    db_ts      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

SIDE_EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS {}.side_effects (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    name   text   NOT NULL
)
"""


def create_exec_log(database_url: str, schema: str) -> None:
    """Create the side tables (the test process calls this after migrating the schema)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(EXEC_LOG_DDL).format(sql.Identifier(schema)))
        conn.execute(sql.SQL(WF_EFFECTS_DDL).format(sql.Identifier(schema)))
        conn.execute(sql.SQL(SIDE_EFFECTS_DDL).format(sql.Identifier(schema)))


def build_app(schema: str, database_url: str | None = None) -> trioq.App:
    app = trioq.App(database_url, schema=schema, pool_size=int(os.environ.get(POOL_SIZE_ENV, 10)))

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

    async def log_fast(ctx: trioq.Context, event: str) -> None:
        log = exec_log(app.resolve_database_url(), schema)
        job = ctx.job
        await trio.to_thread.run_sync(log.write, job.id, job.attempt, event, job.partition_key)

    @app.task("quick", queue=QUEUE, max_attempts=10)
    async def quick(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
        """Log start, sleep `seconds` (default 0), log end; a cancelled run logs `cancelled`."""
        await log_fast(ctx, "start")
        if payload.get("fail_first") and ctx.job.attempt == 1:
            await log_fast(ctx, "end")
            raise RuntimeError("failing the first attempt, as asked")
        try:
            await trio.sleep(payload.get("seconds", 0))
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(60):
                await log_fast(ctx, "cancelled")
            raise
        await log_fast(ctx, "end")
        return {"job": ctx.job.id, "attempt": ctx.job.attempt}

    @app.task("blocking", queue=QUEUE, max_attempts=3)
    async def blocking(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        """Attempt 1 blocks a thread for `seconds` (trio cannot cancel it); later ones return."""
        await log_fast(ctx, "start")
        if ctx.job.attempt == 1:
            await trio.to_thread.run_sync(time.sleep, payload["seconds"])
        await log_fast(ctx, "end")
        return ctx.job.attempt

    effects = sql.SQL(
        "INSERT INTO {}.wf_effects (job_id, step, worker_pid, token) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING"  # a retried write of one execution lands once
    ).format(sql.Identifier(schema))

    def record_effect(job_id: int, step: str) -> None:
        # the step's side effect: one row per execution of the step function
        log = exec_log(app.resolve_database_url(), schema)
        log.run(effects, (job_id, step, os.getpid(), uuid.uuid4()))

    @app.task("flow", queue=QUEUE, max_attempts=20)
    async def flow(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        """A durable workflow: four steps with a side effect each and a durable sleep between
        them; the result is the sum of the step results."""
        total = 0
        for n in range(4):

            async def effect(n: int = n) -> int:
                await trio.to_thread.run_sync(record_effect, ctx.job.id, f"s{n}")
                return n * 10

            total += await ctx.step(f"s{n}", effect)
            if n < 3:
                await ctx.sleep(f"z{n}", datetime.timedelta(seconds=payload.get("sleep", 0.2)))
        return total + payload["base"]

    @app.task("poison", queue=QUEUE, max_attempts=3)
    async def poison(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        """Kill the whole worker process, on every attempt (a segfaulting C extension, OOM)."""
        await log_fast(ctx, "start")
        os._exit(1)

    @app.task("report", queue="reports")
    async def report(ctx: trioq.Context, payload: object) -> None:
        """On a queue the fault workers do not serve: `trioq worker` warns about it."""

    @app.task("uses_db", queue=QUEUE, max_attempts=10)
    async def uses_db(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        """A handler that needs a pooled connection of its own for a while."""
        await log_fast(ctx, "start")
        async with app.client() as client, client.transaction() as tx:
            await tx.execute("SELECT pg_sleep(%s)", (payload.get("seconds", 0.01),))
        await log_fast(ctx, "end")
        return ctx.job.attempt

    def side_effect_sync(job_id: int, name: str) -> int:
        """Record one execution of a step's side effect; returns how many there are so far."""
        with psycopg.connect(app.resolve_database_url(), autocommit=True) as conn:
            table = sql.Identifier(schema, "side_effects")
            conn.execute(
                sql.SQL("INSERT INTO {} (job_id, name) VALUES (%s, %s)").format(table),
                (job_id, name),
            )
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE job_id = %s AND name = %s").format(table),
                (job_id, name),
            ).fetchone()
            return int(row[0]) if row else 0

    @app.task("crash_child", queue=QUEUE, max_attempts=5)
    async def crash_child(ctx: trioq.Context, payload: dict[str, int]) -> int:
        await ctx.step("triple", trio.to_thread.run_sync, side_effect_sync, ctx.job.id, "triple")
        return payload["n"] * 3

    @app.task("crash_flow", queue=QUEUE, max_attempts=10)
    async def crash_flow(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
        """A counting step, a durable sleep, an event wait and a child (the kill -9 test)."""
        count = await ctx.step(
            "count", trio.to_thread.run_sync, side_effect_sync, ctx.job.id, "count"
        )
        await ctx.sleep("nap", datetime.timedelta(seconds=payload["nap"]))
        event = await ctx.wait_for_event(payload["key"], timeout=datetime.timedelta(minutes=5))
        child = await ctx.spawn("crash_child", {"n": event["n"]}, delay=payload["child_delay"])
        return {"count": count, "event": event, "child": await ctx.wait_result(child)}

    @app.task("inbox", queue=QUEUE, max_attempts=20)
    async def inbox(ctx: trioq.Context, payload: dict[str, Any]) -> list[Any]:
        """Receive messages of topic `items` until one is "stop"; return the others in order.

        A step after each receive is its next checkpoint. With `pause_first`, attempt 1 logs
        `start` after its first non-empty receive and then hangs there (the kill -9 test
        kills it between the receive and that checkpoint)."""
        got: list[Any] = []
        for n in itertools.count():
            batch = await ctx.receive("items", timeout=datetime.timedelta(minutes=5))
            if batch and payload.get("pause_first") and ctx.job.attempt == 1:
                await log_fast(ctx, "start")  # "received": the log allows start/end only
                await trio.sleep_forever()
            await ctx.set_value("received", len(got) + len(batch))
            await ctx.step(f"ack{n}", lambda batch=batch: len(batch))
            got += batch
            if "stop" in batch:
                return [item for item in got if item != "stop"]
        raise AssertionError("unreachable")

    return app


app = build_app(os.environ.get(SCHEMA_ENV, "trioq"))
