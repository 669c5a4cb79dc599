"""An upgrade from the previous release: stop its workers, migrate, start this release's.

This release changes the storage layout (dedup keys move out of the jobs table's unique index
into `job_keys`, and `jobs` is partitioned into unfinished jobs and days of finished ones;
docs/operations.md, "Upgrading"), so the previous release's workers and producers must stop
before this release's `migrate`: its statements name what the migrations remove. The previous
release's code (a pinned commit of this repository, read from git history) migrates a schema
and runs two workers with jobs in every state: ready, delayed, running, keyed, sleeping
workflows, workflows waiting for an event, for a message and for a child, and a per-second
schedule its leader fires. They drain on SIGTERM and exit 0 (a job still running is released
without spending an attempt); this release's `migrate` runs on the stopped schema (the downtime
is its time, printed); this release's workers finish the rest. Every job completes, no handler
that finished runs again, every workflow step has its side effect once, and the schedule fired
by the old leader and then by a new one enqueues no occurrence twice.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.fault_app import QUEUE, build_app, create_exec_log
from tests.procs import fetch, wait_until, worker_group
from tests.releases import extract_previous_release, run_previous_cli, run_previous_python

pytestmark = pytest.mark.slow

LEASE = 2.0
GRACE = 1.0
ALL_SUSPENDED = {"running", "sleeping", "waiting", "scheduled"}


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree (trioq/ and tests/), extracted from this clone's history."""
    return extract_previous_release(tmp_path_factory.mktemp("previous-release"))


def q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


async def enqueue(pg_url: str, schema: str, task: str, payload: Any, **options: Any) -> int:
    """Through the SQL `enqueue()`, the entry point both releases share."""
    named = [sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in options]
    statement = sql.SQL("SELECT {}.enqueue({})").format(
        sql.Identifier(schema),
        sql.SQL(", ").join(
            [sql.Placeholder("task"), sql.Placeholder("payload"), *named],
        ),
    )
    rows = await fetch(pg_url, statement, {"task": task, "payload": Jsonb(payload), **options})
    return int(rows[0][0])


async def enqueue_the_mix(pg_url: str, schema: str) -> dict[str, list[int]]:
    jobs: dict[str, list[int]] = {}

    async def add(kind: str, task: str, payload: Any, **options: Any) -> None:
        job_id = await enqueue(pg_url, schema, task, payload, queue=QUEUE, **options)
        jobs.setdefault(kind, []).append(job_id)

    for _ in range(12):  # more than the old workers' slots: some wait ready, some run
        await add("work", "work", {"seconds": 1.5})
    for n in range(9):
        await add("keyed", "quick", {"seconds": 0.2}, partition_key=f"k{n % 3}")
    # Due well after the old workers' first claims: the state mix is seen once a flow sleeps
    # while work runs, 1.5-3 s after the first claim, and on a loaded machine (load 9: two
    # other suites and a benchmark) the old workers' first claim came more than 6 s after
    # this enqueue, so the delayed jobs, once due at 6 s, were promoted before any flow slept
    # (the mix was never seen at once, 2 runs of 3).
    for _ in range(4):
        await add("delayed", "quick", {}, run_at=await _db_in(pg_url, 15))
    for base in range(4):
        await add("flow", "flow", {"base": base, "sleep": 1.0})
    for n in range(3):
        # crash_flow: a step, a nap, an event wait, then a child it waits for
        await add("crash_flow", "crash_flow", {"nap": 0.2, "key": f"up:{n}", "child_delay": 5})
    await add("inbox", "inbox", {})
    return jobs


async def _db_in(pg_url: str, seconds: float) -> Any:
    rows = await fetch(pg_url, "SELECT now() + make_interval(secs => %s)", (seconds,))
    return rows[0][0]


async def states(pg_url: str, schema: str) -> Counter[str]:
    rows = await fetch(pg_url, q(schema, "SELECT state, count(*) FROM {s}.jobs GROUP BY 1"))
    return Counter({state: n for state, n in rows})


async def schedule_with_the_previous_release(
    previous_release: Path, pg_url: str, schema: str
) -> None:
    """The per-second schedule, created by the previous release's client (its schema is not
    this release's yet)."""
    script = (
        "import sys, trio\n"
        "from tests.fault_app import build_app\n"
        "async def main():\n"
        "    async with build_app(sys.argv[2], sys.argv[1]).client() as client:\n"
        "        await client.schedule('tick', 'quick', cron='* * * * * *', payload={})\n"
        "trio.run(main)\n"
    )
    await trio.to_thread.run_sync(run_previous_python, previous_release, script, pg_url, schema)


async def test_an_upgrade_from_the_previous_release_stops_migrates_and_runs_every_job_once(
    pg_url: str, pg_schema: str, tmp_path: Path, previous_release: Path
) -> None:
    schema = pg_schema
    await trio.to_thread.run_sync(
        run_previous_cli, previous_release, pg_url, "migrate", "--schema", schema
    )
    await trio.to_thread.run_sync(create_exec_log, pg_url, schema)
    app = build_app(schema, pg_url)
    async with worker_group(pg_url, schema, tmp_path) as group:
        old = [
            await group.start(
                f"old{n}", concurrency=4, lease=LEASE, grace=GRACE, source=previous_release
            )
            for n in range(2)
        ]
        jobs = await enqueue_the_mix(pg_url, schema)
        await schedule_with_the_previous_release(previous_release, pg_url, schema)
        # The first workflow's event now: its child (delayed 5 s) is waited for at the upgrade.
        await fetch(pg_url, q(schema, "SELECT {s}.event_emit('up:0', '{{\"n\": 1}}')"))
        await fetch(pg_url, q(schema, "SELECT {s}.send(%s, 'items', '\"a\"')"), (jobs["inbox"][0],))
        await wait_until(
            pg_url,
            q(schema, "SELECT DISTINCT state FROM {s}.jobs"),
            None,
            lambda rows: {state for (state,) in rows} >= ALL_SUSPENDED,
            within=60,
            what="jobs running, sleeping, waiting and scheduled at once",
        )
        await wait_until(
            pg_url,
            q(
                schema,
                "SELECT count(*) FROM {s}.jobs WHERE dedup_key LIKE 'schedule:tick:%%'"
                " AND state = 'completed'",
            ),
            None,
            lambda rows: rows[0][0] >= 1,
            within=30,
            what="a scheduled occurrence run by the old workers",
        )
        assert not [proc.name for proc in old if proc.exited], [p.output() for p in old]
        for proc in old:
            proc.signal(signal.SIGTERM)
        for proc in old:
            assert await proc.wait_exit(GRACE + 20) == 0, proc.output()
            assert "Traceback" not in proc.output(), proc.output()

        before = await states(pg_url, schema)
        started = time.monotonic()
        async with app.client(migrate=True) as client:
            migrate_seconds = time.monotonic() - started
            for n in range(2):
                await group.start(f"new{n}", concurrency=4, lease=LEASE, grace=GRACE)
            for n in (1, 2):
                assert (await client.emit_event(f"up:{n}", {"n": n + 1})).first
            await client.send(jobs["inbox"][0], "items", "b")
            await client.send(jobs["inbox"][0], "items", "stop")
            await wait_until(
                pg_url,
                q(
                    schema,
                    "SELECT count(DISTINCT worker_id) FROM {s}.job_records WHERE task = 'quick'"
                    " AND dedup_key LIKE 'schedule:tick:%%' AND state = 'completed'",
                ),
                None,
                lambda rows: rows[0][0] >= 2,  # run by an old worker and by a new one
                within=60,
                what="scheduled occurrences run by old and new workers",
            )
            await client.unschedule("tick")
            all_ids = [job_id for ids in jobs.values() for job_id in ids]
            await wait_until(
                pg_url,
                q(
                    schema,
                    "SELECT count(*) FROM {s}.job_records WHERE id = ANY(%s)"
                    " AND state = 'completed'",
                ),
                (all_ids,),
                lambda rows: rows[0][0] == len(all_ids),
                within=90,
                what="every job of the mix completed",
            )
            results = {job_id: await client.wait_result(job_id) for job_id in all_ids}

    print(f"migrate of the stopped schema: {migrate_seconds:.2f} s; states then: {dict(before)}")
    assert [results[job_id] for job_id in jobs["flow"]] == [60 + base for base in range(4)]
    assert [results[job_id]["child"] for job_id in jobs["crash_flow"]] == [3, 6, 9]
    assert results[jobs["inbox"][0]] == ["a", "b"]
    # No handler that finished ran again; no step's side effect twice.
    ends = await fetch(
        pg_url,
        q(schema, "SELECT job_id, count(*) FROM {s}.exec_log WHERE event = 'end' GROUP BY 1"),
    )
    logged = [job_id for kind in ("work", "keyed", "delayed") for job_id in jobs[kind]]
    assert sorted(end for end in ends if end[0] in set(logged)) == sorted(
        (job_id, 1) for job_id in logged
    )
    assert all(count == 1 for _, count in ends), ends  # the scheduled ones too
    fired = await fetch(
        pg_url,
        q(
            schema,
            "SELECT dedup_key, count(*) FROM {s}.job_records"
            " WHERE dedup_key LIKE 'schedule:tick:%%' GROUP BY 1",
        ),
    )
    assert len(fired) >= 2 and all(count == 1 for _, count in fired), fired
    steps = await fetch(
        pg_url, q(schema, "SELECT job_id, step, count(*) FROM {s}.wf_effects GROUP BY 1, 2")
    )
    assert sorted(steps) == sorted(
        (job_id, f"s{n}", 1) for job_id in jobs["flow"] for n in range(4)
    )
    effects = await fetch(
        pg_url, q(schema, "SELECT name, count(*) FROM {s}.side_effects GROUP BY name")
    )
    assert sorted(effects) == [("count", 3), ("triple", 3)]
    once = await fetch(
        pg_url,
        q(
            schema,
            "SELECT job_id, name, count(*) FROM {s}.side_effects GROUP BY 1, 2 HAVING count(*) > 1",
        ),
    )
    assert once == []
