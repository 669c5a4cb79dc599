"""Multi-process fault tests: kill -9, SIGSTOP past the lease, SIGTERM drain, partitions, status.

Worker processes run `trioq worker tests.fault_app:app` (see `tests/procs.py`); every handler run
writes `start` / `end` / `cancelled` rows with the database clock into `exec_log`, and the
invariants are checked from the database afterwards by `tests/soak/checker.py` (the Jepsen method
of `../shared/research/reliability.md` (d)). "Two overlapping runs" means two runs of the same job
whose intervals overlap, where a run ends at its `end`/`cancelled` row, at the moment its worker
was killed, or when maintenance recovered its expired lease, whichever comes first (a stale run
past its lease is fenced: it can no longer change the job).

Synchronisation is by polling the database (or the worker's output) for an observable condition
under `trio.fail_after`; no sleep stands in for a condition.
"""

from __future__ import annotations

import datetime
import itertools
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg import sql

import trioq
from tests.fault_app import QUEUE, build_app, create_exec_log
from tests.procs import REPO_ROOT, WorkerProc, db_now, fetch, wait_until, worker_group
from tests.soak.history import assert_runs_never_overlap, read_history, read_recovered
from tests.support import running_worker

# Slow tier: worker subprocesses killed, paused and signalled; `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

LEASE = 2.0  # seconds; renewed every LEASE / 3
POLL = 0.5
MAINTENANCE = 0.5  # the worker jitters it by up to +20 %
GRACE = 1.0
SECOND = datetime.timedelta(seconds=1)


# --- helpers ----------------------------------------------------------------------------------


def q(schema: str, template: str) -> sql.Composed:
    """`template` with `{s}` replaced by the quoted test schema."""
    return sql.SQL(template).format(s=sql.Identifier(schema))


@asynccontextmanager
async def producer(pg_url: str, pg_schema: str) -> AsyncIterator[trioq.Client]:
    """A client of the fault app on the test schema (migrated), plus the exec_log table."""
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        yield client


async def recovered_runs(
    pg_url: str, schema: str, workers: Iterable[WorkerProc]
) -> dict[tuple[int, int, int], datetime.datetime]:
    """(job, attempt, worker pid) -> when maintenance recovered that attempt's expired lease."""
    pids = {proc.worker_id: proc.pid for proc in workers if proc.worker_id}
    return await read_recovered(pg_url, schema, pids)


async def job_rows(pg_url: str, schema: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Everything a fenced write could change on the job rows."""
    rows = await fetch(
        pg_url,
        q(
            schema,
            """
        SELECT id, state, attempt, result, error, finished_at, started_at, worker_id::text,
               lease_token, lease_expires_at, run_at, cancel_requested
        FROM {s}.jobs WHERE id = ANY(%s) ORDER BY id""",
        ),
        (ids,),
    )
    names = (
        "id",
        "state",
        "attempt",
        "result",
        "error",
        "finished_at",
        "started_at",
        "worker_id",
        "lease_token",
        "lease_expires_at",
        "run_at",
        "cancel_requested",
    )
    return {row[0]: dict(zip(names, row, strict=True)) for row in rows}


async def attempts_of(
    pg_url: str, schema: str, ids: list[int]
) -> dict[int, list[tuple[int, str, str | None]]]:
    rows = await fetch(
        pg_url,
        q(
            schema,
            "SELECT job_id, attempt, outcome, worker_id::text "
            "FROM {s}.attempts WHERE job_id = ANY(%s) ORDER BY id",
        ),
        (ids,),
    )
    found: dict[int, list[tuple[int, str, str | None]]] = {job_id: [] for job_id in ids}
    for job_id, attempt, outcome, worker in rows:
        found[job_id].append((attempt, outcome, worker))
    return found


def started_by(schema: str, pid: int) -> tuple[sql.Composed, tuple[int]]:
    return q(
        schema, "SELECT job_id, attempt FROM {s}.exec_log WHERE event = 'start' AND worker_pid = %s"
    ), (pid,)


def count_is(n: int) -> Callable[[list[tuple[Any, ...]]], bool]:
    """A `wait_until` predicate: exactly `n` rows."""
    return lambda rows: len(rows) == n


async def trioq_status(pg_url: str, schema: str, *extra: str) -> str:
    """Run `trioq status` as a separate process and return its output."""
    with trio.fail_after(20):
        result = await trio.run_process(
            [
                sys.executable,
                "-m",
                "trioq.cli",
                "status",
                "--schema",
                schema,
                "--database-url",
                pg_url,
                *extra,
            ],
            cwd=REPO_ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


async def status_json(pg_url: str, schema: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(await trioq_status(pg_url, schema, "--json"))
    return status


# --- 1. kill -9 -------------------------------------------------------------------------------


async def test_kill_9_worker_holding_25_jobs_another_worker_completes_them(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    n = 25
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start("A", concurrency=n, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        b = await group.start("B", concurrency=n, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        b.signal(signal.SIGSTOP)  # so that A, alone, claims all 25
        ids = [job.id for job in await client.enqueue_many("work", [{"seconds": 3.0}] * n)]
        await wait_until(
            pg_url,
            *started_by(pg_schema, a.pid),
            count_is(n),
            within=10,
            what="A to start all 25 jobs",
        )
        held = await fetch(
            pg_url,
            q(
                pg_schema,
                "SELECT count(*) FROM {s}.jobs WHERE state = 'running' AND worker_id = %s",
            ),
            (a.worker_id,),
        )
        assert held == [(n,)]
        b.signal(signal.SIGCONT)

        a.signal(signal.SIGKILL)
        killed_at = await db_now(pg_url)
        assert await a.wait_exit(10) == -signal.SIGKILL
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'completed'"),
            None,
            count_is(n),
            within=LEASE + MAINTENANCE + POLL + 3 + 10,
            what="all 25 jobs completed",
        )

        history = await read_history(pg_url, pg_schema)
        runs = history.runs
        rows = await job_rows(pg_url, pg_schema, ids)
        attempts = await attempts_of(pg_url, pg_schema, ids)
        lost = await recovered_runs(pg_url, pg_schema, group.procs)

    assert all(row["state"] == "completed" for row in rows.values())  # none lost
    # exactly one re-claim each (if not, the attempts say which worker lost which lease)
    assert {row["attempt"] for row in rows.values()} == {2}, (attempts, lost)
    assert all(
        row["result"] == {"job": job_id, "attempt": 2, "pid": b.pid} for job_id, row in rows.items()
    )
    assert attempts == {job_id: [(1, "lost", a.worker_id)] for job_id in ids}
    a_runs = {run.job_id: run for run in runs if run.pid == a.pid}
    b_runs = {run.job_id: run for run in runs if run.pid == b.pid}
    assert set(a_runs) == set(b_runs) == set(ids)
    assert all(run.attempt == 1 and run.end is None for run in a_runs.values())
    assert all(run.attempt == 2 and run.end_kind == "end" for run in b_runs.values())
    # Each job restarts within lease + poll + maintenance interval (+ its jitter) + 1 s.
    bound = datetime.timedelta(seconds=LEASE + POLL + MAINTENANCE * 1.2 + 1)
    delays = sorted(run.start - killed_at for run in b_runs.values())
    assert delays[0] > datetime.timedelta(0)
    assert delays[-1] <= bound, delays
    assert_runs_never_overlap(history, died={a.pid: killed_at}, recovered=lost)


# --- 2. SIGSTOP past the lease: fencing -------------------------------------------------------


async def test_worker_paused_past_its_lease_is_fenced_and_its_handler_cancelled(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start(
            "A", concurrency=5, lease=LEASE, poll=POLL, grace=GRACE, maintenance=MAINTENANCE
        )
        b = await group.start(
            "B", concurrency=5, lease=LEASE, poll=POLL, grace=GRACE, maintenance=MAINTENANCE
        )
        b.signal(signal.SIGSTOP)  # A claims both jobs
        # J: attempt 1 runs long, so A's handler is still running when A resumes.
        j = (await client.enqueue("work", {"seconds": 0.5, "first_seconds": 60})).id
        # K: attempt 1 ignores cancellation and returns after A resumes, so A really sends a
        # stale completion for it.
        k = (
            await client.enqueue(
                "work", {"seconds": 0.5, "first_seconds": 3, "stubborn_first": True}
            )
        ).id
        await wait_until(
            pg_url, *started_by(pg_schema, a.pid), count_is(2), within=10, what="A to start J and K"
        )
        a.signal(signal.SIGSTOP)
        b.signal(signal.SIGCONT)
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'completed'"),
            None,
            count_is(2),
            within=LEASE + 10,
            what="B to re-claim and complete J and K",
        )
        before = await job_rows(pg_url, pg_schema, [j, k])

        resumed_at = await db_now(pg_url)
        a.signal(signal.SIGCONT)
        await wait_until(
            pg_url,
            q(
                pg_schema,
                "SELECT job_id, event FROM {s}.exec_log "
                "WHERE worker_pid = %s AND event <> 'start' ORDER BY job_id",
            ),
            (a.pid,),
            lambda rows: rows == sorted([(j, "cancelled"), (k, "end")]),
            within=10,
            what="A's stale handlers: J cancelled, K returned",
        )
        # Drain A: it exits only once every result it holds has been written (or refused).
        a.signal(signal.SIGTERM)
        assert await a.wait_exit(GRACE + 10) == 0, a.output()
        after = await job_rows(pg_url, pg_schema, [j, k])
        history = await read_history(pg_url, pg_schema)
        runs = history.runs
        attempts = await attempts_of(pg_url, pg_schema, [j, k])
        lost = await recovered_runs(pg_url, pg_schema, group.procs)

    assert after == before  # the stale worker's writes changed nothing
    for job_id in (j, k):
        assert after[job_id]["state"] == "completed"
        assert after[job_id]["attempt"] == 2
        assert after[job_id]["result"] == {"job": job_id, "attempt": 2, "pid": b.pid}
        assert after[job_id]["worker_id"] == b.worker_id
        assert attempts[job_id] == [(1, "lost", a.worker_id)]
    a_runs = {run.job_id: run for run in runs if run.pid == a.pid}
    b_runs = {run.job_id: run for run in runs if run.pid == b.pid}
    # J completed exactly once (B's run); A's handler was cancelled within one renewal
    # interval of resuming, without ever writing `end`.
    assert [run.end_kind for run in runs if run.job_id == j].count("end") == 1
    assert b_runs[j].end_kind == "end"
    assert a_runs[j].end_kind == "cancelled"
    assert a_runs[j].end is not None
    assert a_runs[j].end - resumed_at <= datetime.timedelta(seconds=LEASE / 3 + 1)
    assert_runs_never_overlap(history, recovered=lost)


# --- 3. a long partition does not delay other keys --------------------------------------------


async def test_long_partition_does_not_delay_other_keys(pg_url: str, pg_schema: str) -> None:
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        big = [
            job.id
            for job in await client.enqueue_many(
                "work", [{"seconds": 3.0}] + [{"seconds": 0.05}] * 3, partition_key="big"
            )
        ]
        small: list[int] = []
        for key in range(20):
            small += [
                job.id
                for job in await client.enqueue_many(
                    "work", [{"seconds": 0.05}] * 2, partition_key=f"key-{key}"
                )
            ]
        async with running_worker(app, [QUEUE], concurrency=4, poll_interval=POLL):
            await wait_until(
                pg_url,
                q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'completed'"),
                None,
                count_is(len(big) + len(small)),
                within=20,
                what="every job completed",
            )
    runs = {run.job_id: run for run in (await read_history(pg_url, pg_schema)).runs}
    assert set(runs) == set(big) | set(small)
    assert all(run.attempt == 1 and run.end is not None for run in runs.values())
    long_run = runs[big[0]]
    assert long_run.end is not None
    # Every other key finished while the long job of "big" was running.
    outside = [
        runs[job_id]
        for job_id in small
        if not long_run.start < runs[job_id].end < long_run.end  # type: ignore[operator]
    ]
    assert not outside, (long_run, outside)
    # The jobs of "big" ran one at a time, in enqueue order.
    for earlier, later in itertools.pairwise(big):
        assert runs[later].start >= runs[earlier].end  # type: ignore[operator]


# --- 4. SIGTERM drains: short jobs finish, long ones are released -----------------------------


async def test_sigterm_drains_short_jobs_and_releases_long_ones_to_another_worker(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    lease = 30.0  # a pickup after lease expiry would take 30 s: the release must be immediate
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start(
            "A", concurrency=10, lease=lease, poll=POLL, grace=GRACE, maintenance=MAINTENANCE
        )
        b = await group.start(
            "B", concurrency=20, lease=lease, poll=POLL, grace=GRACE, maintenance=MAINTENANCE
        )
        b.signal(signal.SIGSTOP)  # A takes the first 10 jobs; B stays out until A drains
        long = [job.id for job in await client.enqueue_many("work", [{"seconds": 30.0}] * 5)]
        short = [job.id for job in await client.enqueue_many("work", [{"seconds": 0.6}] * 5)]
        await wait_until(
            pg_url,
            *started_by(pg_schema, a.pid),
            count_is(10),
            within=10,
            what="A to start 10 jobs",
        )
        # Ready work A could take once its short jobs free their slots: it must not.
        extra = [job.id for job in await client.enqueue_many("work", [{"seconds": 0.2}] * 5)]

        a.signal(signal.SIGTERM)
        signalled = trio.current_time()
        signalled_at = await db_now(pg_url)
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT job_id FROM {s}.exec_log WHERE event = 'end' AND worker_pid = %s"),
            (a.pid,),
            count_is(5),
            within=5,
            what="A's short jobs to finish during the drain",
        )
        b.signal(signal.SIGCONT)
        code = await a.wait_exit(GRACE + 10)
        exit_seconds = trio.current_time() - signalled
        await wait_until(
            pg_url,
            *started_by(pg_schema, b.pid),
            count_is(10),
            within=10,
            what="B to start the 5 released and the 5 extra jobs",
        )
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE id = ANY(%s) AND state = 'completed'"),
            (extra,),
            count_is(5),
            within=10,
            what="the extra jobs completed",
        )
        history = await read_history(pg_url, pg_schema)
        runs = history.runs
        rows = await job_rows(pg_url, pg_schema, long + short + extra)
        attempts = await attempts_of(pg_url, pg_schema, long + short + extra)

    assert code == 0, a.output()
    # Waiting for the long jobs would take their 30 s; the drain ends after the grace period.
    assert exit_seconds < 30.0, exit_seconds
    a_runs = {run.job_id: run for run in runs if run.pid == a.pid}
    b_runs = {run.job_id: run for run in runs if run.pid == b.pid}
    # No claim by the draining worker after the signal.
    assert set(a_runs) == set(long) | set(short)
    assert all(run.start < signalled_at for run in a_runs.values())
    # Short jobs finished within the grace period and completed.
    for job_id in short:
        assert a_runs[job_id].end_kind == "end"
        assert rows[job_id]["state"] == "completed"
        assert rows[job_id]["result"] == {"job": job_id, "attempt": 1, "pid": a.pid}
    assert any(a_runs[job_id].end > signalled_at for job_id in short)  # type: ignore[operator]
    # Long jobs were cancelled after the grace period and released without using an attempt:
    # B ran them as attempt 1 again, no attempt row, no error, within poll + 1 s.
    for job_id in long:
        released = a_runs[job_id]
        assert released.end_kind == "cancelled"
        assert released.end is not None
        assert b_runs[job_id].attempt == 1
        assert b_runs[job_id].start - released.end <= datetime.timedelta(seconds=POLL + 1)
        assert rows[job_id]["state"] == "running"
        assert rows[job_id]["attempt"] == 1
        assert rows[job_id]["error"] is None
        assert rows[job_id]["worker_id"] == b.worker_id
    assert all(not history for history in attempts.values()), attempts
    assert set(extra) <= set(b_runs)
    assert_runs_never_overlap(history)


# --- 5. trioq status --------------------------------------------------------------------------


async def test_status_lists_workers_and_their_jobs_and_expired_leases_after_kill(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start("A", concurrency=5, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        ids = [job.id for job in await client.enqueue_many("work", [{"seconds": 60.0}] * 3)]
        await wait_until(
            pg_url, *started_by(pg_schema, a.pid), count_is(3), within=10, what="A to start 3 jobs"
        )

        status = await status_json(pg_url, pg_schema)
        workers = {w["pid"]: w for w in status["workers"]}
        assert set(workers) == {a.pid}
        assert workers[a.pid]["id"] == a.worker_id
        assert (workers[a.pid]["running"], workers[a.pid]["concurrency"]) == (3, 5)
        assert workers[a.pid]["state"] == "running"
        (queue,) = status["queues"]
        assert (queue["queue"], queue["running"], queue["expired_leases"]) == (QUEUE, 3, 0)
        text = await trioq_status(pg_url, pg_schema)
        [row] = [line for line in text.splitlines() if f":{a.pid} " in line]  # the workers table
        assert [cell.strip() for cell in row.strip("│ ").split("│")][2:5] == [
            "running",
            f"{QUEUE}=5",  # each queue with its slots
            "3/5",
        ]

        a.signal(signal.SIGKILL)
        assert await a.wait_exit(10) == -signal.SIGKILL
        # With no live worker, nobody recovers the jobs: their leases expire and status says so.
        await wait_until(
            pg_url,
            q(
                pg_schema,
                "SELECT id FROM {s}.jobs WHERE state = 'running' "
                "AND lease_expires_at < clock_timestamp()",
            ),
            None,
            count_is(3),
            within=LEASE + 5,
            what="A's leases to expire",
        )
        status = await status_json(pg_url, pg_schema)
        assert status["queues"][0]["expired_leases"] == 3
        assert status["queues"][0]["running"] == 3

        b = await group.start("B", concurrency=5, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'running' AND worker_id = %s"),
            (b.worker_id,),
            count_is(3),
            within=10,
            what="B's maintenance to recover A's jobs and B to re-claim them",
        )
        status = await status_json(pg_url, pg_schema)
        attempts = await attempts_of(pg_url, pg_schema, ids)

    workers = {w["pid"]: w for w in status["workers"]}
    assert workers[b.pid]["id"] == b.worker_id
    assert workers[b.pid]["running"] == 3
    assert workers.get(a.pid, {"running": 0})["running"] == 0  # the dead worker holds nothing
    (queue,) = status["queues"]
    assert (queue["running"], queue["expired_leases"], queue["ready"]) == (3, 0, 0)
    assert attempts == {job_id: [(1, "lost", a.worker_id)] for job_id in ids}


# --- 6. a drain does not reorder a partition --------------------------------------------------


async def test_job_released_by_a_drain_keeps_its_place_in_its_partition(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """A release is not a retry (no attempt is consumed): the released head of a key must still
    run before the later jobs of that key."""
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start("A", concurrency=5, lease=30, poll=POLL, grace=GRACE)
        jobs = await client.enqueue_many(
            "work", [{"seconds": 30.0}, {"seconds": 0.1}, {"seconds": 0.1}], partition_key="k"
        )
        ids = [job.id for job in jobs]
        await wait_until(
            pg_url, *started_by(pg_schema, a.pid), count_is(1), within=10, what="A to start"
        )
        a.signal(signal.SIGTERM)
        assert await a.wait_exit(GRACE + 10) == 0, a.output()
        released = await job_rows(pg_url, pg_schema, ids)
        b = await group.start("B", concurrency=5, lease=30, poll=POLL, grace=GRACE)
        rows = await wait_until(
            pg_url,
            q(
                pg_schema,
                "SELECT job_id FROM {s}.exec_log WHERE event = 'start' "
                "AND worker_pid = %s ORDER BY id",
            ),
            (b.pid,),
            lambda rows: len(rows) >= 1,
            within=10,
            what="B to start a job of key k",
        )
        history = await read_history(pg_url, pg_schema)
        runs = history.runs

    assert [run.job_id for run in runs if run.pid == a.pid] == [ids[0]]
    assert released[ids[0]]["state"] == "ready"
    assert released[ids[0]]["attempt"] == 0
    assert released[ids[0]]["error"] is None
    # B must start the released head first (it then holds the key for 30 s).
    assert rows[0] == (ids[0],), (
        f"B ran job {rows[0][0]} of key k before the released head {ids[0]}; run_at after the "
        f"release: { {i: r['run_at'] for i, r in released.items()} }"
    )
    assert_runs_never_overlap(history)


# --- the completer: outcomes not yet written --------------------------------------------------


@asynccontextmanager
async def rows_share_locked(pg_url: str, ids: list[int], schema: str) -> AsyncIterator[None]:
    """Hold FOR SHARE locks on the jobs' runs (their leases, migration 0047) from another
    session: every fenced write to them (the completer's flush) waits until the block ends,
    and lease renewals and recovery skip them."""
    import psycopg

    conn = await trio.to_thread.run_sync(psycopg.connect, pg_url)
    try:
        await trio.to_thread.run_sync(
            conn.execute,
            q(schema, "SELECT job_id FROM {s}.job_runs WHERE job_id = ANY(%s) FOR SHARE"),
            (ids,),
        )
        yield
    finally:
        await trio.to_thread.run_sync(conn.commit)
        await trio.to_thread.run_sync(conn.close)


def ended_by(schema: str, pid: int) -> tuple[sql.Composed, tuple[int]]:
    return q(
        schema, "SELECT job_id, attempt FROM {s}.exec_log WHERE event = 'end' AND worker_pid = %s"
    ), (pid,)


BLOCKED_WRITES = (
    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    "AND backend_type = 'client backend' AND datname = current_database()"
)


async def test_outcomes_unwritten_at_a_kill_9_are_recovered_and_run_again_without_overlap(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """A's handlers return and hand their outcomes to its completer, whose flush is held back
    by a lock; A is killed before the flush commits. The rows stay running under A's lease
    (its key, its lease, nothing written), are recovered once the lease expires, and B runs
    them again: every job completed, none run twice at once."""
    n = 5
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start("A", concurrency=n, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        b = await group.start("B", concurrency=n, lease=LEASE, poll=POLL, maintenance=MAINTENANCE)
        b.signal(signal.SIGSTOP)
        ids = [job.id for job in await client.enqueue_many("work", [{"seconds": 0.5}] * n)]
        await wait_until(
            pg_url, *started_by(pg_schema, a.pid), count_is(n), within=10, what="A starts all"
        )
        async with rows_share_locked(pg_url, ids, pg_schema):
            await wait_until(
                pg_url, *ended_by(pg_schema, a.pid), count_is(n), within=10, what="A's handlers end"
            )
            await wait_until(pg_url, BLOCKED_WRITES, None, bool, within=10, what="a held flush")
            rows = await job_rows(pg_url, pg_schema, ids)
            assert {row["state"] for row in rows.values()} == {"running"}  # nothing written
            a.signal(signal.SIGKILL)
            killed_at = await db_now(pg_url)
            assert await a.wait_exit(10) == -signal.SIGKILL
            # A dead client's statement still waiting on a lock would run once it is free
            # (the server reads the closed socket only afterwards): end it as a crashed host's
            # connection ends.
            await fetch(pg_url, f"SELECT pg_terminate_backend(pid) FROM ({BLOCKED_WRITES}) AS b")
        b.signal(signal.SIGCONT)
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'completed'"),
            None,
            count_is(n),
            within=LEASE + MAINTENANCE + POLL + 3 + 10,
            what="all jobs completed",
        )
        history = await read_history(pg_url, pg_schema)
        runs = history.runs
        rows = await job_rows(pg_url, pg_schema, ids)
        attempts = await attempts_of(pg_url, pg_schema, ids)
        lost = await recovered_runs(pg_url, pg_schema, group.procs)
    assert {(row["state"], row["attempt"]) for row in rows.values()} == {("completed", 2)}
    assert attempts == {job_id: [(1, "lost", a.worker_id)] for job_id in ids}
    assert sorted((run.pid, run.end_kind) for run in runs) == sorted(
        [(a.pid, "end")] * n + [(b.pid, "end")] * n
    )
    assert_runs_never_overlap(history, died={a.pid: killed_at}, recovered=lost)


async def test_a_flush_whose_connection_is_cut_is_sent_again_and_each_job_runs_once(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """The completer's flush waits on a lock and its connection is terminated under it (as is
    every other write waiting there): the flush is sent again and commits once the lock goes;
    each job ran once and completed with its first attempt."""
    n = 5
    async with (
        producer(pg_url, pg_schema) as client,
        worker_group(pg_url, pg_schema, tmp_path) as group,
    ):
        a = await group.start("A", concurrency=n, lease=30.0, poll=POLL, maintenance=MAINTENANCE)
        ids = [job.id for job in await client.enqueue_many("work", [{"seconds": 0.5}] * n)]
        await wait_until(
            pg_url, *started_by(pg_schema, a.pid), count_is(n), within=10, what="A starts all"
        )
        async with rows_share_locked(pg_url, ids, pg_schema):
            await wait_until(
                pg_url, *ended_by(pg_schema, a.pid), count_is(n), within=10, what="A's handlers end"
            )
            [(blocked,), *_] = await wait_until(
                pg_url, BLOCKED_WRITES, None, bool, within=10, what="a held flush"
            )
            await fetch(pg_url, "SELECT pg_terminate_backend(%s)", (blocked,))
            await wait_until(
                pg_url,
                BLOCKED_WRITES,
                None,
                lambda found: any(pid != blocked for (pid,) in found),
                within=10,
                what="the flush sent again",
            )
        await wait_until(
            pg_url,
            q(pg_schema, "SELECT id FROM {s}.jobs WHERE state = 'completed'"),
            None,
            count_is(n),
            within=10,
            what="all jobs completed",
        )
        history = await read_history(pg_url, pg_schema)
        runs = history.runs
        rows = await job_rows(pg_url, pg_schema, ids)
        attempts = await attempts_of(pg_url, pg_schema, ids)
    assert {(row["state"], row["attempt"]) for row in rows.values()} == {("completed", 1)}
    assert attempts == {job_id: [] for job_id in ids}
    assert sorted((run.job_id, run.attempt, run.end_kind) for run in runs) == [
        (job_id, 1, "end") for job_id in sorted(ids)
    ]
