"""Recovery paths that a lost message or a dead worker leaves behind, built directly in SQL
(Oban's and DBOS's way of testing crash states) and then driven through a real worker."""

from __future__ import annotations

import trio

import trioq
from tests.support import Gate, make_app, running_worker, scalar


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
            await scalar(
                pg_url,
                f"UPDATE {pg_schema}.jobs SET cancel_requested = true WHERE id = %s RETURNING id",
                (job.id,),
            )
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
        await scalar(
            pg_url,
            f"UPDATE {pg_schema}.jobs SET state = 'running', lease_token = gen_random_uuid(), "
            "lease_expires_at = now() - interval '1 hour', worker_id = gen_random_uuid(), "
            "started_at = now() - interval '1 hour', cancel_requested = true, "
            "attempt = CASE WHEN id = %s THEN 1 ELSE 3 END WHERE id = ANY(%s) RETURNING id",
            (first.id, [first.id, last.id]),
        )
        async with running_worker(app, poll_interval=0.1, maintenance_interval=0.1):
            with trio.fail_after(10):
                records = [await client.wait_final(job.id) for job in (first, last)]
        histories = [await client.attempts(job.id) for job in (first, last)]
    assert [(r.state, r.attempt) for r in records] == [("cancelled", 1), ("cancelled", 3)]
    outcomes = [[(a.attempt, a.outcome) for a in h] for h in histories]
    assert outcomes == [[(1, "lost")], [(3, "lost")]]
    assert gate.entered == 0  # never run again
