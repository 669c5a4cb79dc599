"""The app the soak's worker subprocesses load (`tests.soak.app:app`), and the side-effect log its
handlers write.

Every handler run logs to `<schema>.soak_log` (the model `tests.soak.checker` reads): `start`
when it begins, `end` when it returns or raises (a suspension too: the run is over), `cancelled`
when it is cancelled or loses its lease (written under a shield), and inside its steps `step`,
`message` (a received batch, under the receive's position) and `event_woken`. A run (one claim:
one call of the handler) is named by a fresh uuid, held in a context variable for its steps.
Rows go through the fault app's reconnecting writer (a row survives a PostgreSQL restart) and
carry the host clock at the moment of the event, not the time the write landed: every process of
a soak runs on one host, and a write delayed by an outage must not stretch its run.

The server comes from `TRIOQ_DATABASE_URL`; the schema is trioq's default, on the soak's own
cluster.
"""

from __future__ import annotations

import contextvars
import datetime
import itertools
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import trio
from psycopg import sql
from psycopg.types.json import Jsonb

import trioq
from tests.fault_app import exec_log
from trioq._runtime.job.run import LeaseLost

SCHEMA = "trioq"
WORK, LIMITED, RATED, FLOWS = "soak", "soak_limited", "soak_rated", "soak_flows"
QUEUES = (WORK, LIMITED, RATED, FLOWS)
QUEUE_LIMITS = {LIMITED: 3}
QUEUE_RATES = {RATED: (20, 60.0)}  # 20 starts a minute
TENANT_LIMIT = 2
DEADLINE = datetime.timedelta(seconds=3)
CRON_TASK = "tick"

SOAK_LOG_DDL = """
CREATE TABLE IF NOT EXISTS {}.soak_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    run_id     text        NOT NULL,  -- one per handler call (a claim)
    attempt    integer     NOT NULL,
    worker_pid integer     NOT NULL,
    kind       text        NOT NULL,
    key        text,
    value      jsonb,
    db_ts      timestamptz NOT NULL,  -- the host clock when it happened (see the module doc)
    token      uuid        NOT NULL UNIQUE  -- a retried write lands once
)
"""


def create_soak_log(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(SOAK_LOG_DDL).format(sql.Identifier(SCHEMA)))


current_run: contextvars.ContextVar[str] = contextvars.ContextVar("current_run")

_INSERT = sql.SQL(
    "INSERT INTO {}.soak_log (job_id, run_id, attempt, worker_pid, kind, key, value, db_ts, token)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (token) DO NOTHING"
).format(sql.Identifier(SCHEMA))


def build_app(database_url: str | None = None) -> trioq.App:
    app = trioq.App(
        database_url,
        schema=SCHEMA,
        pool_size=6,
        queue_limits=QUEUE_LIMITS,
        queue_rates={queue: f"{n}/m" for queue, (n, _) in QUEUE_RATES.items()},
    )

    async def log(ctx: trioq.Context, kind: str, key: str | None = None, value: Any = None) -> None:
        job = ctx.job
        params = (job.id, current_run.get(), job.attempt, os.getpid(), kind, key)
        params += (Jsonb(value), datetime.datetime.now(datetime.UTC), uuid.uuid4())
        writer = exec_log(app.resolve_database_url(), SCHEMA)
        await trio.to_thread.run_sync(writer.run, _INSERT, params)

    async def log_end(ctx: trioq.Context, kind: str, value: Any = None) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(90):
            await log(ctx, kind, value=value)

    Body = Callable[[trioq.Context, Any], Awaitable[Any]]

    def logged(name: str, **options: Any) -> Callable[[Body], Body]:
        """Register `body` as task `name`, its runs logged from start to end."""

        def register(body: Body) -> Body:
            @app.task(name, **options)
            async def handler(ctx: trioq.Context, payload: Any) -> Any:
                current_run.set(str(uuid.uuid4()))
                await log(ctx, "start")
                try:
                    result = await body(ctx, payload)
                except (trio.Cancelled, LeaseLost):
                    await log_end(ctx, "cancelled")
                    raise
                except BaseException as exc:  # a failure, or a suspension (SuspendExecution)
                    await log_end(ctx, "end", type(exc).__name__)
                    raise
                await log_end(ctx, "end")
                return result

            return body

        return register

    def effect(
        ctx: trioq.Context, name: str, kind: str = "step", value: Any = None
    ) -> Callable[[], Awaitable[str]]:
        """A step's side effect: one log row per execution of the step function."""

        async def run() -> str:
            await log(ctx, kind, name, value)
            return name

        return run

    @logged("noop", queue=WORK)
    async def noop(ctx: trioq.Context, payload: Any) -> int:
        return ctx.job.id

    @logged("slow", queue=WORK, max_attempts=5)
    async def slow(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        await trio.sleep(payload.get("seconds", 1.0))
        return ctx.job.attempt

    @logged("flaky", queue=WORK, retry=trioq.RetryPolicy(0.2, 1.0, max_attempts=6))
    async def flaky(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        """Fails its first `fail` attempts, then succeeds; `fail` >= 6 fails for good."""
        if ctx.job.attempt <= payload["fail"]:
            raise RuntimeError(f"attempt {ctx.job.attempt} fails, as asked")
        return ctx.job.attempt

    @logged("keyed", queue=WORK, max_attempts=10)
    async def keyed(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        await trio.sleep(payload.get("seconds", 0.2))  # the enqueue gives the partition key

    @logged(
        "tenant",
        queue=WORK,
        max_attempts=10,
        concurrency_key="tenant:{tenant}",
        concurrency_limit=TENANT_LIMIT,
    )
    async def tenant(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        await trio.sleep(payload.get("seconds", 0.3))

    @logged("limited", queue=LIMITED, max_attempts=10)
    async def limited(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        await trio.sleep(payload.get("seconds", 0.3))

    @logged("rated", queue=RATED, max_attempts=10)
    async def rated(ctx: trioq.Context, payload: Any) -> None:
        return None

    @logged("late", queue=WORK, max_attempts=10, deadline=DEADLINE)
    async def late(ctx: trioq.Context, payload: dict[str, Any]) -> None:
        """Sleeps `seconds`: past the task's deadline the job is cancelled."""
        await trio.sleep(payload["seconds"])

    @logged(CRON_TASK, queue=WORK)
    async def tick(ctx: trioq.Context, payload: Any) -> None:
        return None

    app.periodic("tick", cron="* * * * * */5", task=CRON_TASK)

    @logged("child", queue=FLOWS, max_attempts=10)
    async def child(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        await ctx.step("triple", effect(ctx, "triple"))
        return int(payload["n"]) * 3

    @logged("flow", queue=FLOWS, max_attempts=20)
    async def flow(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
        """Steps around a durable sleep, an event wait and a child; `gens` continue-as-new
        generations. Step names carry the generation (a new one starts a fresh history)."""
        gen = payload.get("gen", 0)
        await ctx.step(f"{gen}:s0", effect(ctx, f"{gen}:s0"))
        await ctx.sleep("nap", datetime.timedelta(seconds=payload.get("nap", 0.5)))
        await ctx.step(f"{gen}:s1", effect(ctx, f"{gen}:s1"))
        event = None
        if payload.get("event"):
            key = payload["event"]
            event = await ctx.wait_for_event(key, timeout=datetime.timedelta(minutes=10))
            await ctx.step("woken", effect(ctx, key, "event_woken", event))
        if payload.get("child"):
            child_id = await ctx.spawn("child", {"n": gen + 1})
            await ctx.wait_result(child_id)
        await ctx.step(f"{gen}:s2", effect(ctx, f"{gen}:s2"))
        if gen < payload.get("gens", 0):
            await log(ctx, "continue")
            await ctx.continue_as_new({**payload, "gen": gen + 1, "event": None})
        return {"gen": gen, "event": event}

    @logged("inbox", queue=FLOWS, max_attempts=20)
    async def inbox(ctx: trioq.Context, payload: Any) -> int:
        """Receive `items` until "stop"; each batch is logged in a step, under its position."""
        received = 0
        for n in itertools.count():
            batch = await ctx.receive("items", timeout=datetime.timedelta(minutes=10))
            await ctx.step(f"got{n}", effect(ctx, f"0:{n}", "message", batch))
            received += len(batch)
            if any(str(item).startswith("stop") for item in batch):
                return received
        raise AssertionError("unreachable")

    return app


app = build_app()
