"""Status and explain judge liveness by each worker's own heartbeat interval; `trioq jobs`
counts a workflow's executions."""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

import pytest
import trio
from rich.console import Console

import trioq
from tests.support import make_app, running_worker, scalar, wait_until
from trioq.cli import admin, commands
from trioq.cli.ops import read_status, status_tables


def make(pg_url: str, pg_schema: str) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task("work")
    async def work(ctx: trioq.Context, payload: Any) -> None:
        return None

    @app.task("approval")
    async def approval(ctx: trioq.Context, payload: Any) -> Any:
        return await ctx.wait_for_event("approved", timeout=datetime.timedelta(hours=1))

    return app


async def add_worker(pg_url: str, pg_schema: str, *, silent_for: float) -> uuid.UUID:
    """A worker row as a process killed `silent_for` seconds after its last heartbeat leaves
    it (built in SQL: nothing behind it), with the default 14 s heartbeat interval."""
    worker_id = uuid.uuid4()
    await scalar(
        pg_url,
        f"INSERT INTO {pg_schema}.workers (id, hostname, pid, queues, concurrency, started_at, "
        "heartbeat_at, heartbeat_seconds) VALUES (%s, 'host-k', 4242, '{default}', 5, "
        "now() - interval '1 hour', now() - %s * interval '1 second', 14) RETURNING 1",
        (worker_id, silent_for),
    )
    return worker_id


def rendered(tables: Any) -> str:
    console = Console(record=True, width=220)
    console.print(tables)
    return console.export_text()


async def test_status_shows_heartbeat_ages_and_a_silent_worker_as_probably_dead(
    pg_url: str, pg_schema: str
) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client, running_worker(app) as worker:
        await add_worker(pg_url, pg_schema, silent_for=45)
        snapshot = await read_status(client)
        text = rendered(status_tables(snapshot))
    live = next(w for w in snapshot.workers if w.id == worker.worker_id)
    assert live.heartbeat_seconds == pytest.approx(14.0)  # 1.4 x the 10 s maintenance interval
    assert "workers (2, 1 silent)" in text
    assert re.search(r"host-k:4242[\s│]+silent 4[5-9]s \(probably dead\)", text), text
    assert re.search(r"4[5-9]s ago", text)  # its heartbeat as an age, not a clock time
    live_line = next(line for line in text.splitlines() if f":{live.pid} " in line)
    assert " running " in live_line and re.search(r" \ds ago ", live_line), live_line


async def test_explain_does_not_count_a_silent_worker_as_live(pg_url: str, pg_schema: str) -> None:
    app = make(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("work", {})
        await add_worker(pg_url, pg_schema, silent_for=45)  # 45 s > 2 x 14 s: probably dead
        only_dead = await client.explain(job.id)
        await add_worker(pg_url, pg_schema, silent_for=1)
        one_live = await client.explain(job.id)
    assert only_dead.blocked_by == "workers"
    assert only_dead.verdict == "no live worker serves queue 'default'"
    workers = next(gate for gate in one_live.gates if gate.name == "workers")
    assert workers.detail.startswith("1 live worker(s) serve queue 'default'"), workers.detail


async def is_waiting(client: trioq.Client, job_id: int) -> bool:
    return (await client.get_job(job_id)).state == "waiting"


async def test_jobs_lists_a_workflows_executions(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = make(pg_url, pg_schema)
    args = commands.build_parser().parse_args(
        ["jobs", "--database-url", pg_url, "--schema", pg_schema]
    )
    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("approval", {})
        with trio.fail_after(20):
            await wait_until(lambda: is_waiting(client, job.id))
        await admin.cmd_jobs(args)
        waiting = capsys.readouterr().out
        await client.emit_event("approved", True)
        assert await client.wait_result(job.id, timeout=20) is True
        await admin.cmd_jobs(args)
        done = capsys.readouterr().out
    assert re.search(r"\bruns\s+try\b", waiting)
    assert re.search(rf"{job.id} waiting\s+approval\s+default\s+1\s+0/5 ", waiting), waiting
    assert re.search(rf"{job.id} completed\s+approval\s+default\s+2\s+1/5 ", done), done
