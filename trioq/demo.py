"""`trioq demo`: the reference workflows end to end, with a live display and a summary table.

With no database URL (flag or TRIOQ_DATABASE_URL) it starts an embedded PostgreSQL in a
temporary directory and removes it afterwards. The run:

1. enqueues the reference app's workload (`enqueue_demo_jobs`) and adds a cron schedule that
   fires every 2 seconds for the digest (removed at the end);
2. starts worker 1, and once a third of the work is done stops it hard (cancelled with jobs
   running, as if its process died), and starts worker 2 at once: the jobs worker 1 held come
   back when their (short, 2 s) leases expire and are re-run;
3. runs the app's `drive_demo(client, scale)` alongside, if it has one (the reference app's
   approver emits the events that release waiting approvals);
4. shows per-workflow progress live (rich) until everything is final, then a summary table:
   completed, retried, failed (with the stored reason), slept, waited, children;
5. serves the read-only web dashboard on a free loopback port while it runs (its URL printed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import attrs
import trio
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from ._core.states import TERMINAL_IN_ORDER, JobState
from ._runtime.services.worker import Worker
from ._seam.admin import JobFilter, TaskStatus
from .app import DATABASE_URL_ENV, App, load_app
from .client import Client

FINAL = TERMINAL_IN_ORDER
DEMO_SCHEDULE = "demo-digest"
# Short leases so the jobs of the worker stopped hard come back within seconds, not 30 s.
DEMO_WORKER_OPTIONS: dict[str, Any] = {
    "poll_interval": 0.2,
    "lease_seconds": 2.0,
    "maintenance_interval": 0.5,
    "grace_seconds": 1.0,
}


@contextlib.contextmanager
def _database(url: str | None, console: Console) -> Iterator[str]:
    url = url or os.environ.get(DATABASE_URL_ENV)
    if url:
        yield url
        return
    from .embedded import EmbeddedPostgres

    console.print("starting an embedded PostgreSQL (no TRIOQ_DATABASE_URL set) ...")
    with EmbeddedPostgres() as cluster:
        yield cluster.conninfo


async def run_demo(*, database_url: str | None, app_path: str, scale: int, concurrency: int) -> int:
    app = load_app(app_path)
    module = sys.modules[app_path.partition(":")[0]]
    console = Console()
    with _database(database_url, console) as url:
        app.database_url = url
        return await _run(app, module, scale, concurrency, console)


@attrs.define(eq=False)
class _Run:
    """What the demo did, for the display and the summary."""

    total: int
    started: float = attrs.field(factory=time.perf_counter)
    phase: str = "worker 1 running"
    killed_running: int = 0
    worker_slots: int = 0
    notes: list[str] = attrs.field(factory=list)  # the app's own lines (`demo_notes`)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


async def _run(app: App, module: Any, scale: int, concurrency: int, console: Console) -> int:
    queues = tuple(getattr(module, "QUEUES", ("default",)))
    async with app.client(migrate=True) as client:
        jobs = await module.enqueue_demo_jobs(client, scale)
        digest_task = getattr(module, "DIGEST_TASK", None)
        if digest_task is not None:
            await client.schedule(
                DEMO_SCHEDULE,
                digest_task,
                cron="* * * * * */2",
                payload={"team": "demo"},
                misfire="skip",
            )
        run = _Run(total=len({job.id for job in jobs}))
        console.print(
            f"enqueued {len(jobs)} jobs ({run.total} distinct) on queues "
            f"{', '.join(queues)}; worker concurrency {concurrency} per queue"
        )
        run.worker_slots = concurrency * len(queues)
        async with trio.open_nursery() as nursery:
            await _start_dashboard(nursery, client, console)
            nursery.start_soon(_workers, app, queues, concurrency, client, run)
            drive = getattr(module, "drive_demo", None)  # the people: events, approvals
            if drive is not None:
                nursery.start_soon(drive, client, scale)
            await _show(client, run, console)
            nursery.cancel_scope.cancel()
        if digest_task is not None:
            await client.unschedule(DEMO_SCHEDULE)
        notes = getattr(module, "demo_notes", None)  # what the app wants shown (values)
        if notes is not None:
            run.notes = await notes(client)
        await _summary(client, run, console)
    return 0


async def _start_dashboard(nursery: trio.Nursery, client: Client, console: Console) -> None:
    """The read-only dashboard on a free loopback port, open while the demo runs; a machine
    where it cannot bind runs the demo without it."""
    from .dashboard.app import DashboardConfig, serve_dashboard
    from .dashboard.store import Store

    try:
        port = await nursery.start(serve_dashboard, DashboardConfig(port=0), Store(client))
    except OSError as exc:
        console.print(f"dashboard not started ({exc.strerror or exc}); the demo runs without it")
        return
    console.print(f"dashboard (read-only, open while the demo runs): http://127.0.0.1:{port}/")


async def _workers(
    app: App, queues: tuple[str, ...], concurrency: int, client: Client, run: _Run
) -> None:
    """Worker 1 until a third of the work is final, stopped hard; then worker 2 to the end."""
    async with trio.open_nursery() as nursery:
        first = trio.CancelScope()

        async def worker_one(task_status: trio.TaskStatus[Worker]) -> None:
            with first:
                await app.run_worker(
                    queues, concurrency, **DEMO_WORKER_OPTIONS, task_status=task_status
                )

        await nursery.start(worker_one)
        while True:  # the database's state: polled, like the display
            statuses = await client.driver.task_status()
            running = sum(s.jobs for s in statuses if s.state == JobState.RUNNING)
            done = _done(statuses)
            if (done >= run.total / 3 and running) or done >= run.total:
                break
            await trio.sleep(0.02)
        run.killed_running = running
        first.cancel()  # a hard stop: handlers cancelled, leases left to expire
        run.phase = (
            f"worker 1 stopped hard with {run.killed_running} jobs running; worker 2 "
            f"re-runs them when their leases expire"
        )
        await app.run_worker(queues, concurrency, **DEMO_WORKER_OPTIONS)


def _done(statuses: list[TaskStatus]) -> int:
    return sum(s.jobs for s in statuses if s.state in FINAL)


async def _show(client: Client, run: _Run, console: Console) -> None:
    """Refresh the live table until every job is final (and the schedule fired twice)."""
    with Live(console=console, refresh_per_second=8, transient=not console.is_terminal) as live:
        while True:
            statuses = await client.driver.task_status()
            schedules = [s for s in await client.schedules() if s.name == DEMO_SCHEDULE]
            live.update(_progress(statuses, schedules, run))
            fired = schedules[0].fired if schedules else 2
            unfinished = sum(s.jobs for s in statuses if s.state not in FINAL)
            if unfinished == 0 and _done(statuses) >= run.total and fired >= 2:
                return
            await trio.sleep(0.125)


def _by_task(statuses: list[TaskStatus]) -> dict[str, Counter[str]]:
    by_task: dict[str, Counter[str]] = defaultdict(Counter)
    for status in statuses:
        by_task[status.task][status.state] += status.jobs
        by_task[status.task]["retried"] += status.retried
    return by_task


def _progress(statuses: list[TaskStatus], schedules: list[Any], run: _Run) -> Group:
    table = Table(title=f"trioq demo - {run.elapsed():.1f}s - {run.phase}", title_justify="left")
    for column in (
        "workflow",
        "progress",
        "done",
        "ready",
        "running",
        "sleeping",
        "waiting",
        "retried",
        "failed",
    ):
        table.add_column(column, justify="left" if column in ("workflow", "progress") else "right")
    running = 0
    for task, states in sorted(_by_task(statuses).items()):
        total = sum(n for state, n in states.items() if state != "retried")
        done = sum(states[state] for state in FINAL)
        running += states[JobState.RUNNING]
        table.add_row(
            task,
            ProgressBar(total=max(total, 1), completed=done, width=24),
            f"{done}/{total}",
            str(states[JobState.READY] + states[JobState.SCHEDULED]),
            str(states[JobState.RUNNING]),
            str(states[JobState.SLEEPING]),
            str(states[JobState.WAITING]),
            str(states["retried"]),
            str(states[JobState.FAILED]),
        )
    footer = f"running slots {running}/{run.worker_slots}"
    if schedules:
        footer += f"   cron '{schedules[0].cron}': fired {schedules[0].fired}"
    return Group(table, footer)


# Checkpoint kinds counted by the summary: jobs that slept, waited for an event, spawned
# children (docs/workflows.md lists the kinds).
_HISTORY_COLUMNS = {
    "slept": ("sleep",),
    "waited": ("event", "receive"),
    "children": ("spawn",),
}


async def _summary(client: Client, run: _Run, console: Console) -> None:
    statuses = await client.driver.task_status()
    history: dict[str, Counter[str]] = defaultdict(Counter)
    for kind in await client.driver.task_history_kinds():
        for column, prefixes in _HISTORY_COLUMNS.items():
            if kind.kind in prefixes:
                history[kind.task][column] += kind.jobs
    table = Table(
        title=f"summary: {_done(statuses)} jobs final in {run.elapsed():.1f}s",
        title_justify="left",
    )
    columns = ("workflow", "completed", "retried", "failed", *_HISTORY_COLUMNS)
    for column in columns:
        table.add_column(column, justify="left" if column == "workflow" else "right")
    for task, states in sorted(_by_task(statuses).items()):
        counts = [states["completed"], states["retried"], states["failed"]]
        counts += [history[task][column] for column in _HISTORY_COLUMNS]
        table.add_row(task, *map(str, counts))
    console.print(table)
    failed = await client.driver.job_list(JobFilter(states=(JobState.FAILED,), limit=5))
    for job in failed:
        reason = job.error or {}
        console.print(
            f"  failed: job {job.id} ({job.task}) after {job.attempt} attempts: "
            f"{reason.get('type')}: {reason.get('message')}"
        )
    console.print(f"  {run.phase}")
    for line in run.notes:
        console.print(f"  {line}")
    console.print(
        f"  cron schedule {DEMO_SCHEDULE!r} (every 2 s) enqueued each fire time once; "
        f"retried jobs keep their failed attempts in the attempts table"
    )
