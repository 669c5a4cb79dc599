"""The producer side against a real PostgreSQL: transactional enqueue, batches, dedup keys,
validation before any SQL, wait_result, cancel, and cancellation of the caller."""

from __future__ import annotations

import collections
import datetime
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from psycopg import sql

import trioq
import trioq.client
from tests.support import Gate, make_app, running_worker, scalar
from trioq._core import codec
from trioq._seam.driver import Claim


class RollBack(Exception):
    """Raised by a test inside `client.transaction()` to roll it back."""


def add_counting_task(app: trioq.App, calls: collections.Counter[Any]) -> None:
    @app.task("count")
    async def count(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
        calls[payload.get("n")] += 1
        return {"n": payload.get("n"), "attempt": ctx.job.attempt}


async def job_count(pg_url: str, schema: str, where: str = "true", params: Any = None) -> int:
    return int(await scalar(pg_url, f"SELECT count(*) FROM {schema}.jobs WHERE {where}", params))


def insert_calls(client: trioq.Client) -> int:
    return client.driver.statistics().calls.get("job_insert_many", 0)


@contextmanager
def listening(pg_url: str, channels: list[str]) -> Iterator[psycopg.Connection[Any]]:
    """A separate session LISTENing on `channels` (to see which notifications were sent)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for channel in set(channels):
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        yield conn


def notifications_until(conn: psycopg.Connection[Any], payload: str) -> list[str]:
    """Payloads received in order, up to and including the first equal to `payload`."""
    seen: list[str] = []
    for notify in conn.notifies(timeout=10):
        seen.append(notify.payload)
        if notify.payload == payload:
            return seen
    raise AssertionError(f"no notification {payload!r} within 10 s; got {seen}")


# --- transactional enqueue -------------------------------------------------------------------


async def test_rolled_back_or_cancelled_enqueue_leaves_no_job_and_sends_no_wakeup(
    pg_url: str, pg_schema: str
) -> None:
    """Rollback by exception and cancellation before COMMIT both leave nothing; the committed
    enqueue runs exactly once. Notifications are delivered in commit order, so a wake-up leaked
    by either aborted transaction would arrive before the committed one's."""
    app = make_app(pg_url, pg_schema)
    calls: collections.Counter[Any] = collections.Counter()
    add_counting_task(app, calls)

    async with app.client(migrate=True) as client:
        channels = await client.driver.ready_channels(["rolled", "cancelled", "committed"])
        with listening(pg_url, channels) as listener:
            async with running_worker(app, ["rolled", "cancelled", "committed"], poll_interval=30):
                with pytest.raises(RollBack):
                    async with client.transaction() as tx:
                        await tx.enqueue("count", {"n": "rolled"}, queue="rolled")
                        raise RollBack
                with trio.CancelScope() as scope:
                    async with client.transaction() as tx:
                        await tx.enqueue("count", {"n": "cancelled"}, queue="cancelled")
                        scope.cancel()
                        await trio.sleep_forever()
                assert scope.cancelled_caught
                async with client.transaction() as tx:
                    job = await tx.enqueue("count", {"n": "committed"}, queue="committed")
                with trio.fail_after(10):
                    assert await client.wait_result(job.id) == {"n": "committed", "attempt": 1}
                seen = await trio.to_thread.run_sync(notifications_until, listener, "committed")
        record = await client.get_job(job.id)
        attempts = await client.attempts(job.id)
    assert seen == ["committed"]
    assert dict(calls) == {"committed": 1}
    assert (record.state, record.attempt, attempts) == ("completed", 1, [])
    assert await job_count(pg_url, pg_schema) == 1


async def test_job_enqueued_in_open_transaction_is_invisible_to_other_sessions_until_commit(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    calls: collections.Counter[Any] = collections.Counter()
    add_counting_task(app, calls)

    async with app.client(migrate=True) as client:
        async with client.transaction() as tx:
            job = await tx.enqueue("count", {"n": 1})
            assert await job_count(pg_url, pg_schema, "id = %s", (job.id,)) == 0
            # The claim statement a worker runs, on another pooled connection, finds nothing.
            claim = await client.driver.job_claim(
                Claim(
                    queue="default",
                    tasks=("count",),
                    limit=10,
                    lease_seconds=30,
                    worker_id=uuid.uuid4(),
                )
            )
            assert claim.claimed == ()
        assert await job_count(pg_url, pg_schema, "id = %s", (job.id,)) == 1
        async with running_worker(app):
            with trio.fail_after(10):
                await client.wait_result(job.id)
    assert dict(calls) == {1: 1}


async def test_callers_sql_and_enqueue_commit_or_roll_back_together(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())
    orders = f"{pg_schema}.orders"

    async with app.client(migrate=True) as client:
        async with client.transaction() as tx:
            await tx.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY, job_id bigint)")
            job = await tx.enqueue("count", {"n": 1})
            await tx.execute(f"INSERT INTO {orders} VALUES (1, %s)", (job.id,))
            assert await tx.fetch(f"SELECT id FROM {orders}") == [(1,)]
        assert await scalar(pg_url, f"SELECT job_id FROM {orders} WHERE id = 1") == job.id
        assert await job_count(pg_url, pg_schema) == 1

        with pytest.raises(RollBack):
            async with client.transaction() as tx:
                await tx.execute(f"INSERT INTO {orders} VALUES (2, NULL)")
                await tx.enqueue("count", {"n": 2})
                raise RollBack
        # The caller's own statement fails after the enqueue: both are rolled back.
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with client.transaction() as tx:
                await tx.enqueue_many("count", [{"n": 3}, {"n": 4}])
                await tx.execute(f"INSERT INTO {orders} VALUES (1, NULL)")
        # A DDL rollback takes the enqueue with it too.
        with pytest.raises(RollBack):
            async with client.transaction() as tx:
                await tx.execute(f"CREATE TABLE {pg_schema}.invoices (id int)")
                await tx.enqueue("count", {"n": 5})
                raise RollBack
    assert await scalar(pg_url, f"SELECT count(*) FROM {orders}") == 1
    assert await scalar(pg_url, "SELECT to_regclass(%s)", (f"{pg_schema}.invoices",)) is None
    assert await job_count(pg_url, pg_schema) == 1


# --- batches ---------------------------------------------------------------------------------


async def test_enqueue_many_is_one_statement_and_returns_jobs_in_payload_order(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())
    # Varied payloads (sizes, shapes) so an order mix-up could not go unnoticed.
    payloads = [{"n": i, "pad": "x" * (i * 37 % 101), "odd": [i] * (i % 3)} for i in range(250)]

    async with app.client(migrate=True) as client:
        before = insert_calls(client)
        jobs = await client.enqueue_many("count", payloads, priority=3)
        assert insert_calls(client) == before + 1
        async with client.transaction() as tx:
            tx_jobs = await tx.enqueue_many("count", payloads[:7], queue="other")
        assert insert_calls(client) == before + 2
        assert await client.enqueue_many("count", []) == []
        assert insert_calls(client) == before + 2  # an empty batch sends nothing

    assert len(jobs) == len(payloads)
    assert len({job.id for job in jobs}) == len(payloads)
    assert all(job.created and job.task == "count" and job.queue == "default" for job in jobs)
    assert [job.queue for job in tx_jobs] == ["other"] * 7
    stored = dict(
        await scalar(
            pg_url,
            f"SELECT array_agg(array[id::text, payload::text]) FROM {pg_schema}.jobs",
        )
    )
    for job, payload in zip([*jobs, *tx_jobs], [*payloads, *payloads[:7]], strict=True):
        assert codec.decode(stored[str(job.id)]) == payload
    priorities = await scalar(pg_url, f"SELECT array_agg(DISTINCT priority) FROM {pg_schema}.jobs")
    assert sorted(priorities) == [0, 3]


# --- dedup keys ------------------------------------------------------------------------------


async def test_second_enqueue_with_same_dedup_key_returns_the_existing_job(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client:
        first = await client.enqueue("count", {"n": 1}, dedup_key="order:7")
        second = await client.enqueue("count", {"n": 2}, dedup_key="order:7")
        async with client.transaction() as tx:
            third = await tx.enqueue("count", {"n": 3}, dedup_key="order:7")
        other = await client.enqueue("count", {"n": 4}, dedup_key="order:8")
        record = await client.get_job(first.id)
    assert first.created
    assert (second.id, second.created) == (first.id, False)
    assert (third.id, third.created) == (first.id, False)
    assert other.created and other.id != first.id
    assert record.payload == {"n": 1}  # the existing job is returned, not overwritten
    assert await job_count(pg_url, pg_schema, "dedup_key = 'order:7'") == 1
    assert await job_count(pg_url, pg_schema) == 2


async def test_concurrent_enqueues_of_one_dedup_key_make_exactly_one_job(
    pg_url: str, pg_schema: str
) -> None:
    """50 tasks, one key; 10 enqueue inside transactions that roll back, each holding the key
    until another session is provably waiting on it (pg_stat_activity 'Lock')."""
    app = make_app(pg_url, pg_schema, pool_size=20)
    add_counting_task(app, collections.Counter())
    key = "conversation:42"
    go = trio.Event()
    committers_left = 40
    committers_done = trio.Event()
    committed: list[trioq.Job] = []
    rolled_back: list[trioq.Job] = []
    contended = 0

    async def lock_waiters() -> int:
        return int(
            await scalar(
                pg_url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND position(%s in query) > 0",
                (f'"{pg_schema}".jobs',),
            )
        )

    async def commit_one(client: trioq.Client, n: int) -> None:
        nonlocal committers_left
        await go.wait()
        if n % 2:
            committed.append(await client.enqueue("count", {"n": n}, dedup_key=key))
        else:
            async with client.transaction() as tx:
                job = await tx.enqueue("count", {"n": n}, dedup_key=key)
            committed.append(job)
        committers_left -= 1
        if committers_left == 0:
            committers_done.set()

    async def roll_back_one(client: trioq.Client, n: int) -> None:
        nonlocal contended
        await go.wait()
        with pytest.raises(RollBack):
            async with client.transaction() as tx:
                rolled_back.append(await tx.enqueue("count", {"n": n}, dedup_key=key))
                while not committers_done.is_set():
                    if await lock_waiters():
                        contended += 1
                        break
                    await trio.sleep(0.01)
                raise RollBack

    async with app.client(migrate=True) as client:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(50):
                    task = roll_back_one if n % 5 == 0 else commit_one
                    nursery.start_soon(task, client, n)
                go.set()
        # A key whose only enqueue rolled back is free: the next enqueue creates the job.
        with pytest.raises(RollBack):
            async with client.transaction() as tx:
                ghost = await tx.enqueue("count", {"n": "ghost"}, dedup_key="rolled-back-key")
                raise RollBack
        again = await client.enqueue("count", {"n": "again"}, dedup_key="rolled-back-key")
        record = await client.get_job(again.id)

    assert len(committed) == 40 and len(rolled_back) == 10
    rows = await scalar(
        pg_url, f"SELECT array_agg(id) FROM {pg_schema}.jobs WHERE dedup_key = %s", (key,)
    )
    assert len(rows) == 1
    assert {job.id for job in committed} == {rows[0]}
    assert sum(job.created for job in committed) == 1
    assert contended >= 1  # the rolled-back holders really did block other enqueuers
    assert again.created and again.id != ghost.id
    assert (record.payload, record.dedup_key) == ({"n": "again"}, "rolled-back-key")
    assert await job_count(pg_url, pg_schema) == 2


# --- validation before any SQL ---------------------------------------------------------------


class Pickled:
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (print, ("never called",))


def deeply_nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"d": value}
    return value


BAD_PAYLOADS: list[tuple[Any, str]] = [
    ({"a": {"b": [0, 1, 2, set()]}}, "$.a.b[3]"),
    ({"a": object()}, "$.a"),
    ({"x": float("nan")}, "$.x"),
    ({"x": [1.0, float("inf")]}, "$.x[1]"),
    ({"text": "\ud800"}, "$.text"),
    ({"text": "nul\x00"}, "$.text"),
    ({"a": {1: "int key"}}, "$.a"),
    ({"raw": b"bytes"}, "$.raw"),
    (deeply_nested(codec.MAX_DEPTH + 1), "$" + ".d" * (codec.MAX_DEPTH + 1)),
    ({"blob": "x" * codec.MAX_PAYLOAD_BYTES}, "$"),
    ({"obj": Pickled()}, "$.obj"),
    (Pickled(), "$"),
    (set(), "$"),
]


async def test_bad_payloads_are_rejected_before_any_sql_naming_the_path(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client:
        await client.enqueue("count", {"n": 0})
        before = insert_calls(client)
        for payload, path in BAD_PAYLOADS:
            with pytest.raises(trioq.PayloadError) as caught:
                await client.enqueue("count", payload)
            assert caught.value.path == path
            assert f"payload {path}: " in str(caught.value)
            # In a batch the element's index leads the path; the good first element is not
            # written either.
            with pytest.raises(trioq.PayloadError) as caught:
                await client.enqueue_many("count", [{"n": 1}, payload])
            assert caught.value.path == "[1]" + path[1:]
        assert insert_calls(client) == before
    assert await job_count(pg_url, pg_schema) == 1


async def test_transaction_stays_usable_after_a_rejected_payload_or_option(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client, client.transaction() as tx:
        await tx.execute(f"CREATE TABLE {pg_schema}.notes (body text)")
        await tx.execute(f"INSERT INTO {pg_schema}.notes VALUES ('kept')")
        with pytest.raises(trioq.PayloadError, match=r"\$\.when"):
            await tx.enqueue("count", {"when": datetime.datetime.now()})
        with pytest.raises(trioq.PayloadError, match=r"\[2\]"):
            await tx.enqueue_many("count", [{}, {}, {"bad": float("nan")}])
        with pytest.raises(ValueError, match="priority"):
            await tx.enqueue("count", {}, priority=10**6)
        with pytest.raises(ValueError, match="delay"):
            await tx.enqueue("count", {}, delay=1e300)  # would be "interval out of range"
        with pytest.raises(trioq.UnknownTask):
            await tx.enqueue("nope", {})
        job = await tx.enqueue("count", {"n": "after"})
    assert await scalar(pg_url, f"SELECT array_agg(body) FROM {pg_schema}.notes") == ["kept"]
    assert await job_count(pg_url, pg_schema) == 1
    assert await scalar(
        pg_url, f"SELECT payload FROM {pg_schema}.jobs WHERE id = %s", (job.id,)
    ) == {"n": "after"}


NAIVE = datetime.datetime(2030, 1, 1)
AWARE = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)

BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"queue": ""}, "queue"),
    ({"queue": "has space"}, "queue"),
    ({"queue": "'; DROP TABLE jobs; --"}, "queue"),
    ({"queue": "q" * 129}, "queue"),
    ({"queue": ".leading"}, "queue"),
    ({"priority": 32768}, "priority"),
    ({"priority": -32769}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"delay": -1}, "delay"),
    ({"delay": math.nan}, "delay"),
    ({"delay": math.inf}, "delay"),
    ({"delay": 1e300}, "delay"),
    ({"delay": datetime.timedelta(seconds=-1)}, "delay"),
    ({"delay": datetime.timedelta(days=999_999)}, "delay"),
    ({"run_at": NAIVE}, "run_at"),
    ({"run_at": AWARE, "delay": 5}, "run_at, delay"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": -1}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"),
    ({"partition_key": ""}, "partition_key"),
    ({"partition_key": "k" * 513}, "partition_key"),
    ({"partition_key": "nul\x00"}, "partition_key"),
    ({"partition_key": "\ud800"}, "partition_key"),
    ({"dedup_key": ""}, "dedup_key"),
    ({"dedup_key": "k" * 513}, "dedup_key"),
    ({"dedup_key": "nul\x00"}, "dedup_key"),
    ({"dedup_key": "\udfff"}, "dedup_key"),
    ({"concurrency_key": ""}, "concurrency_key"),
    ({"concurrency_key": "k" * 513}, "concurrency_key"),
    ({"concurrency_key": "k", "partition_key": "p"}, "concurrency_key"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": -3}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 10001}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 2.5}, "concurrency_limit"),
    ({"unique_for": 60}, "unique_for"),
    ({"dedup_key": "k", "unique_for": -1}, "unique_for"),
    ({"dedup_key": "k", "unique_for": "1h"}, "unique_for"),
    ({"unique_states": ["completed"]}, "unique_states"),
    ({"dedup_key": "k", "unique_states": "completed"}, "unique_states"),
    ({"dedup_key": "k", "unique_states": ["done"]}, "unique_states"),
    ({"deadline": NAIVE}, "deadline"),
    ({"deadline": datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)}, "deadline"),
    ({"deadline": datetime.timedelta(seconds=-1)}, "deadline"),
    ({"deadline": datetime.timedelta(0)}, "deadline"),
    ({"deadline": 60}, "deadline"),
]


async def test_bad_options_are_rejected_naming_the_field_and_nothing_is_written(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client:
        before = insert_calls(client)
        for options, field in BAD_OPTIONS:
            with pytest.raises(ValueError) as caught:
                await client.enqueue("count", {}, **options)
            assert str(caught.value).startswith(f"{field}: "), (options, caught.value)
        for options, field in BAD_OPTIONS:
            if "dedup_key" in options:
                continue  # enqueue_many takes no dedup key
            with pytest.raises(ValueError, match=rf"^{field}: "):
                await client.enqueue_many("count", [{}, {}], **options)
        with pytest.raises(trioq.UnknownTask, match=r"^task: 'missing'"):
            await client.enqueue("missing", {})
        with pytest.raises(trioq.UnknownTask):
            await client.enqueue_many("missing", [{}])
        assert insert_calls(client) == before
        # The limits themselves are accepted.
        edge = [
            await client.enqueue(
                "count",
                {},
                priority=-32768,
                max_attempts=1000,
                partition_key="k" * 512,
                dedup_key="d" * 512,
                queue="q" * 128,
            ),
            await client.enqueue("count", {}, priority=32767, delay=0, max_attempts=1),
            await client.enqueue("count", {}, run_at=AWARE),
            await client.enqueue("count", {}, delay=datetime.timedelta(days=365)),
        ]
    assert all(job.created for job in edge)
    assert await job_count(pg_url, pg_schema) == len(edge)


# --- wait_result -----------------------------------------------------------------------------


async def test_wait_result_returns_result_or_raises_job_failed(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("ok")
    async def ok(ctx: trioq.Context, payload: dict[str, int]) -> dict[str, Any]:
        return {"sum": payload["a"] + payload["b"], "list": [None, True, 1.5]}

    @app.task("broken", max_attempts=1)
    async def broken(ctx: trioq.Context, payload: object) -> None:
        raise RuntimeError("handler exploded")

    async with app.client(migrate=True) as client, running_worker(app):
        good = await client.enqueue("ok", {"a": 40, "b": 2})
        bad = await client.enqueue("broken", {})
        with trio.fail_after(10):
            assert await client.wait_result(good.id) == {"sum": 42, "list": [None, True, 1.5]}
            with pytest.raises(trioq.JobFailed, match="handler exploded") as caught:
                await client.wait_result(bad.id)
    assert caught.value.job.state == "failed"
    assert caught.value.job.id == bad.id


async def test_wait_result_raises_result_timeout_and_leaves_the_job_alone(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client:
        job = await client.enqueue("count", {})
        with trio.fail_after(5), pytest.raises(trioq.ResultTimeout, match="still ready"):
            await client.wait_result(job.id, timeout=0.2)
        with pytest.raises(TimeoutError):  # ResultTimeout is a TimeoutError
            await client.wait_result(job.id, timeout=0)
        assert (await client.get_job(job.id)).state == "ready"
        with pytest.raises(trioq.JobNotFound):
            await client.wait_result(job.id + 1000, timeout=1)


async def test_wait_result_is_woken_by_the_result_notification(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the safety-net poll at 60 s and the worker's poll at 30 s, only the notifications
    (ready -> worker, result -> waiter) can finish this within 5 s."""
    monkeypatch.setattr(trioq.client, "RESULT_POLL_SECONDS", 60.0)
    app = make_app(pg_url, pg_schema)
    release = trio.Event()

    @app.task("slowish")
    async def slowish(ctx: trioq.Context, payload: object) -> str:
        await release.wait()
        return "woken"

    async with app.client(migrate=True) as client, running_worker(app, poll_interval=30):
        job = await client.enqueue("slowish", {})
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def waiter() -> None:
                    result.append(await client.wait_result(job.id, timeout=None))

                reads = client.driver.statistics().calls.get("job_get", 0)
                nursery.start_soon(waiter)
                # Let the waiter read the job (not final yet) and block on its event.
                await trio.testing.wait_all_tasks_blocked(cushion=0.1)
                release.set()
        assert result == ["woken"]
        # The first read (running), then one read on the wake-up: no poll in between.
        assert client.driver.statistics().calls["job_get"] - reads == 2


# --- cancel ----------------------------------------------------------------------------------


async def test_cancelling_a_ready_job_makes_it_cancelled_and_it_never_runs(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    calls: collections.Counter[Any] = collections.Counter()
    add_counting_task(app, calls)

    async with app.client(migrate=True) as client:
        doomed = await client.enqueue("count", {"n": "doomed"})
        assert await client.cancel(doomed.id) == "cancelled"
        assert await client.cancel(doomed.id) == "cancelled"  # idempotent
        with pytest.raises(trioq.JobNotFound):
            await client.cancel(doomed.id + 1000)
        async with running_worker(app, poll_interval=0.05):
            later = await client.enqueue("count", {"n": "later"})
            with trio.fail_after(10):
                await client.wait_result(later.id)
                with pytest.raises(trioq.JobFailed, match="cancelled"):
                    await client.wait_result(doomed.id)
        record = await client.get_job(doomed.id)
    assert (record.state, record.attempt) == ("cancelled", 0)
    assert record.finished_at is not None
    assert dict(calls) == {"later": 1}


async def test_cancelling_a_running_job_cancels_its_handler_and_records_cancelled(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    gate = Gate()
    handler_cancelled = trio.Event()

    @app.task("forever")
    async def forever(ctx: trioq.Context, payload: object) -> None:
        gate.enter()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            handler_cancelled.set()
            raise

    # Lease renewal (every lease/3) would also deliver the cancel; with 60 s leases and a 5 s
    # bound only the control notification can.
    async with (
        app.client(migrate=True) as client,
        running_worker(app, poll_interval=30, lease_seconds=60),
    ):
        job = await client.enqueue("forever", {})
        with trio.fail_after(5):
            await gate.wait_entered(1)
            assert await client.cancel(job.id) == "running"  # the request; the worker finishes it
            await handler_cancelled.wait()
            record = await client.wait_final(job.id)
        attempts = await client.attempts(job.id)
    assert (record.state, record.attempt) == ("cancelled", 1)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "cancelled")]
    assert gate.entered == 1  # not retried


# --- cancelling the caller -------------------------------------------------------------------


async def sessions(pg_url: str, where: str) -> int:
    return int(
        await scalar(
            pg_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            f"AND application_name = 'trioq' AND pid <> pg_backend_pid() AND {where}",
        )
    )


async def cancel_when_running(scope: trio.CancelScope, pg_url: str, fragment: str) -> None:
    """Cancel `scope` once a trioq session is seen running a query containing `fragment`."""
    with trio.fail_after(10):
        while True:
            if await sessions(pg_url, f"state = 'active' AND position('{fragment}' in query) > 0"):
                break
            await trio.sleep(0.01)  # polling another session's state: there is no event
    scope.cancel()


async def test_cancelled_caller_leaks_no_connection_and_no_open_transaction(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema, pool_size=3)
    add_counting_task(app, collections.Counter())

    async with app.client(migrate=True) as client:
        pool = client.driver._pool  # no public path to the PgDriver's pool statistics
        for _ in range(3):
            # Mid-query: cancelled while the server runs pg_sleep inside the transaction.
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as scope:
                    nursery.start_soon(cancel_when_running, scope, pg_url, "pg_sleep(5")
                    with trio.fail_after(4):  # far less than pg_sleep(5): it was interrupted
                        async with client.transaction() as tx:
                            await tx.enqueue("count", {"n": "mid-query"})
                            await tx.execute("SELECT pg_sleep(5)")
                assert scope.cancelled_caught
            # Mid-transaction: cancelled between statements.
            with trio.CancelScope() as scope:
                async with client.transaction() as tx:
                    await tx.enqueue("count", {"n": "mid-transaction"})
                    scope.cancel()
                    await trio.sleep_forever()

        assert await sessions(pg_url, "state LIKE 'idle in transaction%'") == 0
        assert await sessions(pg_url, "position('pg_sleep' in query) > 0 AND state = 'active'") == 0
        stats = pool.statistics()
        assert stats.in_use == 0
        assert stats.idle == stats.opened_total - stats.replaced_total
        assert 1 <= stats.idle <= 3
        # ...and the pool still works.
        job = await client.enqueue("count", {"n": "after"})
        assert (await client.get_job(job.id)).state == "ready"
    assert await job_count(pg_url, pg_schema) == 1


def test_bad_options_table_covers_every_enqueue_option() -> None:
    covered = {name for options, _ in BAD_OPTIONS for name in options}
    assert covered == {f.name for f in trioq.client.EnqueueOptions.__attrs_attrs__}
