"""Recovery paths that a lost message or a dead worker leaves behind, built directly in SQL
(Oban's and DBOS's way of testing crash states) and then driven through a real worker."""

from __future__ import annotations

import collections
import datetime
import uuid
from typing import Any

import psycopg
import trio

import trioq
from tests.support import (
    Gate,
    force_running,
    in_thread,
    make_app,
    request_cancel_silently,
    running_worker,
    scalar,
    wait_until,
)
from trioq._pg import Connection


async def test_cancel_whose_notification_was_missed_reaches_the_handler_by_lease_renewal(
    pg_url: str, pg_schema: str
) -> None:
    """A cancel request whose control notification never arrived (set in SQL, no NOTIFY) is
    delivered by the next lease renewal, which returns `cancel_requested`."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("forever")
    async def forever(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await trio.sleep_forever()

    async with (
        app.client(migrate=True) as client,
        running_worker(app, poll_interval=30, lease_seconds=1.5),
    ):
        job = await client.enqueue("forever", {})
        with trio.fail_after(10):
            await gate.wait_entered(1)
            await in_thread(request_cancel_silently, pg_url, pg_schema, job.id)
            record = await client.wait_final(job.id)
        attempts = await client.attempts(job.id)
    assert (record.state, record.attempt) == ("cancelled", 1)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "cancelled")]


async def test_cancel_requested_job_recovered_after_its_worker_died_ends_cancelled(
    pg_url: str, pg_schema: str
) -> None:
    """A job whose cancel was requested while it ran, and whose worker then died, is not run
    again when its lease is recovered and does not end `failed` on its last attempt: it ends
    `cancelled`, with the lost attempt in its history."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("victim", max_attempts=3)
    async def victim(ctx: trioq.Context, payload: object) -> None:
        gate.enter()

    async with app.client(migrate=True) as client:
        first, last = await client.enqueue_many("victim", [{}, {}])
        # The crash state: running under a dead worker, lease long expired, cancel requested;
        # `first` on its first attempt, `last` on its last.
        for job, attempt in ((first, 1), (last, 3)):
            await in_thread(
                force_running,
                pg_url,
                pg_schema,
                [job.id],
                expires_in=datetime.timedelta(hours=-1),
                attempt=attempt,
                worker_id=uuid.uuid4(),
                started_ago=datetime.timedelta(hours=1),
                cancel_requested=True,
            )
        async with running_worker(app, poll_interval=0.1, maintenance_interval=0.1):
            with trio.fail_after(10):
                records = [await client.wait_final(job.id) for job in (first, last)]
        histories = [await client.attempts(job.id) for job in (first, last)]
    assert [(r.state, r.attempt) for r in records] == [("cancelled", 1), ("cancelled", 3)]
    outcomes = [[(a.attempt, a.outcome) for a in h] for h in histories]
    assert outcomes == [[(1, "lost")], [(3, "lost")]]
    assert gate.entered == 0  # never run again


async def test_a_row_lock_on_one_running_job_stalls_no_other_lease_and_costs_no_attempt(
    pg_url: str, pg_schema: str, observer: Connection
) -> None:
    """Another transaction holds one running job's row lock for two leases. Before: the one
    renewal statement waited on that row, every lease of the worker went unconfirmed, and every
    handler was cancelled as lost (a lost attempt each). Now renewals skip the locked row: the
    other job keeps its lease and completes on its first attempt; the locked one is released
    (fenced, attempt restored) once unconfirmed for 90% of its lease, and runs again."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()
    runs: collections.Counter[str] = collections.Counter()
    lease = 1.5

    @app.task("job")
    async def job(ctx: trioq.Context, payload: dict[str, Any]) -> int:
        runs[payload["name"]] += 1
        gate.enter()
        if payload["name"] == "locked" and runs["locked"] == 1:
            await trio.sleep_forever()  # until cancelled: its lease cannot be confirmed
        await trio.sleep(payload["seconds"])
        return ctx.job.attempt

    async with app.client(migrate=True) as client:
        locked = await client.enqueue("job", {"name": "locked", "seconds": 0})
        other = await client.enqueue("job", {"name": "other", "seconds": 3 * lease})
        async with running_worker(app, concurrency=2, lease_seconds=lease, poll_interval=0.2):
            with trio.fail_after(20):
                await gate.wait_entered(2)
                async with observer.transaction():
                    await observer.execute(
                        # The lease is the job's run (migration 0047): its row is what the
                        # renewal locks.
                        f"SELECT 1 FROM {pg_schema}.job_runs WHERE job_id = %s FOR UPDATE",
                        [locked.id],
                    )
                    await trio.sleep(2 * lease)  # the fault: the row stays locked this long
                results = [await client.wait_result(j.id) for j in (locked, other)]
        histories = [await client.attempts(j.id) for j in (locked, other)]
    assert results == [1, 1]  # neither consumed an attempt
    assert histories == [[], []]  # nothing lost, nothing retried
    assert runs == {"locked": 2, "other": 1}


async def test_a_live_worker_pruned_after_a_long_pause_registers_again(
    pg_url: str, pg_schema: str
) -> None:
    """Maintenance prunes worker rows whose heartbeat is stale (a process paused for minutes
    looks dead). The worker learns it from its next renewal and registers again."""
    app = make_app(pg_url, pg_schema)
    gate = Gate()
    done = trio.Event()

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await done.wait()

    async with app.client(migrate=True) as client:
        job = await client.enqueue("hold", {})
        async with running_worker(app, lease_seconds=1.5) as worker:
            with trio.fail_after(10):
                await gate.wait_entered(1)
                # what the maintenance pass does to a worker whose heartbeat is 300 s old
                await scalar(
                    pg_url,
                    f"DELETE FROM {pg_schema}.workers WHERE id = %s RETURNING id",
                    (worker.worker_id,),
                )

                async def registered() -> bool:
                    return [w.id for w in await client.workers()] == [worker.worker_id]

                await wait_until(registered)
                done.set()
                await client.wait_result(job.id)


async def test_a_claim_and_a_flush_the_database_rolls_back_are_sent_again(
    pg_url: str, pg_schema: str
) -> None:
    """A claim or an outcome flush that the server rolls back whole (a statement timeout under
    a pinned horizon, a deadlock) is not a broken schema: the worker goes on, sends it again,
    and the job runs once. A trigger makes the first claim and the first completion fail as a
    statement timeout does (SQLSTATE 57014)."""
    app = make_app(pg_url, pg_schema)
    runs: collections.Counter[int] = collections.Counter()

    @app.task("once")
    async def once(ctx: trioq.Context, payload: object) -> str:
        runs[ctx.job.id] += 1
        return "done"

    async with app.client(migrate=True) as client:
        job = await client.enqueue("once", {})
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # The claim inserts the run (migration 0047); the flush appends the outcome
            # (migration 0049).
            for name, table, event, when in (
                ("claim_fault", "job_runs", "INSERT", "true"),
                ("flush_fault", "job_outcomes", "INSERT", "new.state = 'completed'"),
            ):
                conn.execute(f"CREATE SEQUENCE {pg_schema}.{name}_calls")
                conn.execute(
                    f"CREATE FUNCTION {pg_schema}.{name}() RETURNS trigger LANGUAGE plpgsql AS $$"
                    f" BEGIN IF nextval('{pg_schema}.{name}_calls') = 1 THEN"
                    " RAISE EXCEPTION 'canceling statement due to statement timeout'"
                    " USING ERRCODE = 'query_canceled'; END IF; RETURN NEW; END $$"
                )
                conn.execute(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {pg_schema}.{table} FOR EACH ROW"
                    f" WHEN ({when})"
                    f" EXECUTE FUNCTION {pg_schema}.{name}()"
                )
        with trio.fail_after(30):
            async with running_worker(app, poll_interval=0.2):
                assert await client.wait_result(job.id, timeout=20) == "done"
    assert runs == {job.id: 1}
    for name in ("claim_fault", "flush_fault"):
        calls = await scalar(pg_url, f"SELECT last_value FROM {pg_schema}.{name}_calls")
        assert calls >= 2  # failed once, then went through
