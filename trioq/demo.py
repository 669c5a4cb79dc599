"""`trioq demo`: the reference workflows end to end, with a live progress line and a summary.

With no database URL (flag or TRIOQ_DATABASE_URL) it starts an embedded PostgreSQL in a
temporary directory and removes it afterwards.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from collections.abc import Iterator

import trio

from ._enqueue import Job
from .app import DATABASE_URL_ENV, App, load_app
from .client import Client


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[str]:
    url = url or os.environ.get(DATABASE_URL_ENV)
    if url:
        yield url
        return
    from .embedded import EmbeddedPostgres

    print("starting an embedded PostgreSQL (no TRIOQ_DATABASE_URL set) ...", flush=True)
    with EmbeddedPostgres() as cluster:
        yield cluster.conninfo


async def run_demo(*, database_url: str | None, app_path: str, scale: int, concurrency: int) -> int:
    app = load_app(app_path)
    module = sys.modules[app_path.partition(":")[0]]
    with _database(database_url) as url:
        app.database_url = url
        return await _run(app, module, scale, concurrency)


async def _run(app: App, module: object, scale: int, concurrency: int) -> int:
    queues = tuple(getattr(module, "QUEUES", ("default",)))
    async with app.client(migrate=True) as client:
        started = time.perf_counter()
        jobs: list[Job] = await module.enqueue_demo_jobs(client, scale)  # type: ignore[attr-defined]
        unique = {job.id: job for job in jobs}
        print(
            f"enqueued {len(jobs)} jobs ({len(unique)} distinct; a dedup key returned an "
            f"existing job) in {time.perf_counter() - started:.2f}s",
            flush=True,
        )
        async with trio.open_nursery() as nursery:
            worker = await nursery.start(
                lambda task_status: app.run_worker(
                    queues, concurrency, poll_interval=0.2, task_status=task_status
                )
            )
            run_started = time.perf_counter()
            await _show_progress(client, len(unique))
            elapsed = time.perf_counter() - run_started
            worker.request_drain()
        await _summary(client, list(unique.values()), elapsed)
    return 0


async def _show_progress(client: Client, total: int) -> None:
    interactive = sys.stdout.isatty()
    last_print = 0.0
    while True:
        statuses = await client.queue_status()
        done = sum(s.completed + s.failed + s.cancelled for s in statuses)
        running = sum(s.running for s in statuses)
        waiting = sum(s.ready + s.scheduled for s in statuses)
        line = (
            f"  finished {done:>5}/{total}  running {running:>3}  waiting {waiting:>5}  "
            f"failed {sum(s.failed for s in statuses)}"
        )
        now = time.perf_counter()
        if interactive:
            print("\r" + line, end="", flush=True)
        elif now - last_print >= 1.0 or done >= total:
            print(line, flush=True)
            last_print = now
        if done >= total:
            if interactive:
                print()
            return
        await trio.sleep(0.2)


async def _summary(client: Client, jobs: list[Job], elapsed: float) -> None:
    by_task: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    retried = 0
    for job in jobs:
        record = await client.get_job(job.id)
        by_task[job.task][record.state] += 1
        retried += record.attempt > 1
    print(
        f"\nall {len(jobs)} jobs finished in {elapsed:.2f}s "
        f"({len(jobs) / elapsed:.0f} jobs/s, including handler latency)"
    )
    for task, states in sorted(by_task.items()):
        print(f"  {task:<16} " + "  ".join(f"{state}={n}" for state, n in sorted(states.items())))
    print(
        f"  {retried} jobs succeeded after a retry (their failed attempts are in "
        f"the attempts table)"
    )
    sample = next((job for job in jobs if job.task == "send_reply"), None)
    if sample is not None:
        print(f"  result of job {sample.id}: {await client.wait_result(sample.id)}")
