"""The claim loop and worker against a real PostgreSQL: capacity, wake-ups, polling, retries."""

from __future__ import annotations

import attrs
import pytest
import trio

import trioq
import trioq.client
from tests.support import Gate, make_app, running_worker, scalar, wait_until


async def test_job_runs_and_its_result_is_returned(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("double")
    async def double(ctx: trioq.Context, payload: dict[str, int]) -> dict[str, int]:
        return {"value": payload["value"] * 2, "attempt": ctx.job.attempt}

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("double", {"value": 21})
        with trio.fail_after(10):
            assert await client.wait_result(job.id) == {"value": 42, "attempt": 1}


def claim_rounds(client: trioq.Client) -> int:
    """Claim statements run so far (either form: plain or full)."""
    calls = client.driver.statistics().calls
    forms = ("job_claim", "job_claim_rated", "job_claim_plain")
    return sum(calls.get(name, 0) for name in forms)


async def test_idle_queue_polls_once_per_interval_not_per_slot(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with (
        app.client(migrate=True) as client,
        running_worker(app, ["a", "b"], concurrency=25, poll_interval=0.1),
    ):
        before = claim_rounds(client)
        started = trio.current_time()
        await trio.sleep(1.0)  # the workload: one idle second
        claims = claim_rounds(client) - before
        intervals = (trio.current_time() - started) / 0.1
    # Per slot it would be 25 polls a queue per interval; the exact count (one a queue per
    # interval) is tested in virtual time (test_runtime_virtual_time.py). A loaded machine may
    # wake late, so only the per-queue ceiling is asserted here.
    assert 2 <= claims <= 2 * (intervals + 2), (claims, intervals)


async def test_free_slot_refills_without_waiting_for_poll_interval(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    starts: list[float] = []
    ends: list[float] = []

    @app.task("short")
    async def short(ctx: trioq.Context, payload: object) -> None:
        starts.append(trio.current_time())
        await trio.sleep(0.05)
        ends.append(trio.current_time())

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("short", [{}] * 6)
        async with running_worker(app, concurrency=1, poll_interval=60):
            with trio.fail_after(10):  # a poll-driven refill would take 60 s per job
                for job in jobs:
                    await client.wait_result(job.id)
    gaps = [start - end for start, end in zip(starts[1:], ends, strict=False)]
    assert len(starts) == 6
    assert max(gaps) < 60, gaps  # no job waited for a poll; virtual time has the exact gaps


async def test_enqueue_wakes_an_idle_worker_without_waiting_for_poll(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "ok"

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=60):
        for _ in range(3):
            job = await client.enqueue("noop", {})
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == "ok"


async def test_saturated_worker_never_runs_more_than_its_slot_limit(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    running = 0
    peak = 0

    @app.task("busy")
    async def busy(ctx: trioq.Context, payload: dict[str, int]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(0.001 * (payload["n"] % 7))
        running -= 1

    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("busy", [{"n": n} for n in range(300)])
        async with running_worker(app, concurrency=7):
            with trio.fail_after(60):
                for job in jobs:
                    await client.wait_final(job.id)
    assert peak == 7


async def test_worker_never_runs_more_handlers_than_slots_nor_owns_more_than_its_bound(
    pg_url: str, pg_schema: str
) -> None:
    """Checked at every handler start, while wake-ups race (notifications from concurrent
    enqueuers and opening slots): handlers running <= slots, and the rows the worker owns in
    the database (running handlers, and outcomes the completer has not written yet) <= slots +
    the completer's capacity."""
    app = make_app(pg_url, pg_schema)
    observed: list[int] = []
    handlers: list[int] = []
    running = 0
    all_ran = trio.Event()

    @app.task("probe")
    async def probe(ctx: trioq.Context, payload: object) -> None:
        nonlocal running
        running += 1
        handlers.append(running)
        try:
            observed.append(
                await scalar(
                    pg_url,
                    f"SELECT count(*) FROM {pg_schema}.jobs WHERE state = 'running' "
                    "AND worker_id = %s",
                    (ctx.worker_id,),
                )
            )
        finally:
            running -= 1
        if len(observed) == 60:
            all_ran.set()

    async with (
        app.client(migrate=True) as client,
        running_worker(app, concurrency=3, poll_interval=0.05) as worker,
    ):
        [loop] = worker.loops.values()
        async with trio.open_nursery() as producers:
            for _ in range(4):
                producers.start_soon(client.enqueue_many, "probe", [{}] * 15)
        with trio.fail_after(60):
            await all_ran.wait()
    assert max(handlers) == 3  # never more than the slots, and the slots were in fact used
    assert 3 <= max(observed) <= 3 + loop.completer.capacity


async def test_one_busy_queue_does_not_block_another(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)
    gate = Gate()

    @app.task("blocker", queue="slow")
    async def blocker(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        await gate.release.wait()

    @app.task("quick", queue="fast")
    async def quick(ctx: trioq.Context, payload: object) -> str:
        return "done"

    async with app.client(migrate=True) as client:
        await client.enqueue_many("blocker", [{}] * 6)
        async with running_worker(app, ["slow", "fast"], concurrency=2):
            with trio.fail_after(10):
                await gate.wait_entered(2)
                job = await client.enqueue("quick", {})
                assert await client.wait_result(job.id) == "done"
            assert gate.entered == 2  # the slow queue is still saturated
            gate.release.set()


async def test_failing_job_retries_with_backoff_then_fails_keeping_every_error(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("flaky", max_attempts=3, retry=trioq.RetryPolicy(base_seconds=0.01, jitter=0))
    async def flaky(ctx: trioq.Context, payload: object) -> None:
        raise RuntimeError(f"boom on attempt {ctx.job.attempt}")

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=0.05):
        job = await client.enqueue("flaky", {})
        with trio.fail_after(10):
            record = await client.wait_final(job.id)
        attempts = await client.attempts(job.id)
    assert record.state == "failed"
    assert record.attempt == 3
    assert [a.outcome for a in attempts] == ["retried", "retried", "failed"]
    assert [a.error_message for a in attempts] == [f"boom on attempt {n}" for n in (1, 2, 3)]
    assert all(a.error_type == "builtins.RuntimeError" for a in attempts)
    assert "Traceback" in (attempts[0].traceback or "")


async def test_handler_that_raises_is_a_job_failure_not_a_worker_failure(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("bad", max_attempts=1)
    async def bad(ctx: trioq.Context, payload: object) -> None:
        raise KeyError("missing")

    @app.task("good")
    async def good(ctx: trioq.Context, payload: object) -> str:
        return "fine"

    async with app.client(migrate=True) as client, running_worker(app):
        failed = await client.enqueue("bad", {})
        with trio.fail_after(10):
            assert (await client.wait_final(failed.id)).state == "failed"
            job = await client.enqueue("good", {})
            assert await client.wait_result(job.id) == "fine"


async def test_result_that_is_not_json_fails_the_attempt(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("returns_set", max_attempts=1)
    async def returns_set(ctx: trioq.Context, payload: object) -> object:
        return {"ids": {1, 2}}

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("returns_set", {})
        with trio.fail_after(10):
            record = await client.wait_final(job.id)
    assert record.state == "failed"
    assert "result.ids" in record.error["message"]


async def test_unknown_task_is_not_claimed_by_a_worker_that_cannot_run_it(
    pg_url: str, pg_schema: str
) -> None:
    producer = make_app(pg_url, pg_schema)
    consumer = make_app(pg_url, pg_schema)

    @producer.task("mystery")
    async def mystery(ctx: trioq.Context, payload: object) -> None:
        return None

    @consumer.task("known")
    async def known(ctx: trioq.Context, payload: object) -> str:
        return "known"

    async with producer.client(migrate=True) as client:
        orphan = await client.enqueue("mystery", {})
    async with consumer.client() as client, running_worker(consumer, poll_interval=0.05):
        job = await client.enqueue("known", {})
        with trio.fail_after(10):
            assert await client.wait_result(job.id) == "known"
        record = await client.get_job(orphan.id)
    assert (record.state, record.attempt) == ("ready", 0)


@attrs.frozen
class Reply:
    conversation_id: str
    text: str


async def test_attrs_payload_is_structured_for_the_handler(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)
    seen: list[Reply] = []

    @app.task("send_reply")
    async def send_reply(ctx: trioq.Context, payload: Reply) -> None:
        seen.append(payload)

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("send_reply", Reply("c1", "Done."))
        with trio.fail_after(10):
            await client.wait_result(job.id)
    assert seen == [Reply("c1", "Done.")]


async def test_delayed_job_waits_for_its_run_at_by_database_time(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("later")
    async def later(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=0.05):
        job = await client.enqueue("later", {}, delay=0.5)
        with trio.fail_after(10):
            record = await client.wait_final(job.id)
    assert record.started_at is not None
    assert (record.started_at - record.created_at).total_seconds() >= 0.5


async def test_worker_relistens_after_its_listener_is_terminated(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "ok"

    # The listener's session: the one whose last statement was a LISTEN on this schema's channels.
    listener_session = "FROM pg_stat_activity WHERE query LIKE %s"
    pattern = f'LISTEN "{pg_schema}\\_%'

    async def relistened() -> bool:
        connected = worker.statistics().listener_connected
        return (
            connected
            and await scalar(pg_url, f"SELECT count(*) {listener_session}", (pattern,)) == 1
        )

    async with (
        app.client(migrate=True) as client,
        running_worker(app, poll_interval=60) as worker,
    ):
        assert worker.statistics().listener_connected
        terminated = await scalar(
            pg_url,
            f"SELECT count(pg_terminate_backend(pid)) {listener_session}",
            (pattern,),
        )
        assert terminated == 1
        with trio.fail_after(10):
            await wait_until(relistened)
            job = await client.enqueue("noop", {})
            assert await client.wait_result(job.id) == "ok"  # woken by NOTIFY, not the 60 s poll


async def test_handlers_filling_the_pool_do_not_starve_lease_renewal(
    pg_url: str, pg_schema: str
) -> None:
    """Every pooled connection is held by a handler's transaction for longer than the lease;
    renewals run on their own reserved connection, so no lease expires and nothing reruns."""
    app = make_app(pg_url, pg_schema, pool_size=2)
    outcomes: list[str] = []

    @app.task("hold")
    async def hold(ctx: trioq.Context, payload: object) -> int:
        async with client.transaction() as tx:
            await tx.execute("SELECT 1")
            await trio.sleep(3.0)  # the workload: a transaction spanning 1.5 leases
        return ctx.job.attempt

    hooks = trioq.WorkerHooks(on_job_end=lambda job, outcome: outcomes.append(outcome))
    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("hold", [{}, {}])
        async with running_worker(app, concurrency=2, lease_seconds=2, hooks=hooks):
            with trio.fail_after(20):
                results = [await client.wait_result(job.id) for job in jobs]
        attempts = [await client.attempts(job.id) for job in jobs]
    assert results == [1, 1]
    assert outcomes == ["completed", "completed"]
    assert attempts == [[], []]


async def test_results_with_quotes_backslashes_and_braces_round_trip(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    tricky = {
        "quote": 'say "hi"',
        "backslash": "C:\\path\\to\\file",
        "braces": "{a,b}",
        "unicode": "żółw 🐢",
        "nested": [{"x": '}\\",{'}],
        "empty": "",
    }

    @app.task("echo")
    async def echo(ctx: trioq.Context, payload: object) -> object:
        return payload

    async with app.client(migrate=True) as client, running_worker(app):
        jobs = await client.enqueue_many("echo", [tricky, "plain", None, 7])
        with trio.fail_after(10):
            assert [await client.wait_result(job.id) for job in jobs] == [tricky, "plain", None, 7]


async def test_handler_waiting_for_a_result_shares_the_workers_listen_connection(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented budget is one LISTEN connection per process: a handler calling
    `wait_result` through `app.client()` borrows the worker's instead of opening a second."""
    monkeypatch.setattr(trioq.client, "RESULT_POLL_SECONDS", 60.0)  # only a NOTIFY can wake it
    app = make_app(pg_url, pg_schema)
    listen_sessions = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s"
    pattern = f'LISTEN "{pg_schema}\\_%'

    @app.task("child")
    async def child(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["n"] * 2

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: dict[str, int]) -> tuple[int, int]:
        async with app.client() as inner:
            job = await inner.enqueue("child", payload)
            doubled = await inner.wait_result(job.id, timeout=None)
        return doubled, await scalar(pg_url, listen_sessions, (pattern,))

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=60):
        job = await client.enqueue("parent", {"n": 21})
        with trio.fail_after(10):
            doubled, listeners = await client.wait_result(job.id)
        assert (doubled, listeners) == (42, 1)
        assert client._watcher.statistics() == trioq.client.ResultWatcherStatistics(
            own_listener=False, borrowed_listener=True
        )
