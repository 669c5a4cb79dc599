"""Messages and readable workflow state end to end: real workers on real PostgreSQL, 30 s poll
intervals (only the wake-ups riding the send statements can make these tests finish in time)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import psycopg
import pytest
import trio

import trioq
from tests.support import make_app, running_worker, scalar, sql_scalar, wait_until
from trioq.producer import AsyncProducer, SyncProducer

POLL = 30.0
FAST_RETRY = trioq.RetryPolicy(base_seconds=0.0, jitter=0.0)
HOUR = datetime.timedelta(hours=1)


def waiting_hook(expected: int) -> tuple[trioq.WorkerHooks, trio.Event, list[int]]:
    suspended = trio.Event()
    waits: list[int] = []

    def on_end(job: Any, outcome: str) -> None:
        if outcome in ("waiting", "sleeping"):
            waits.append(job.id)
            if len(waits) >= expected:
                suspended.set()

    return trioq.WorkerHooks(on_job_end=on_end), suspended, waits


async def test_messages_sent_before_the_receive_are_taken_at_once_in_send_order(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    executions = 0

    @app.task("review")
    async def review(ctx: trioq.Context, payload: object) -> Any:
        nonlocal executions
        executions += 1
        return await ctx.receive("review", timeout=HOUR)

    async with app.client(migrate=True) as client:
        job = await client.enqueue("review", None)
        for n in range(3):
            await client.send(job.id, "review", {"n": n})
        await client.send(job.id, "other", "not for this receive")
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == [{"n": 0}, {"n": 1}, {"n": 2}]
        [(kind, name, value)] = [(c.kind, c.name, c.value) for c in await client.history(job.id)]
        assert (kind, name) == ("receive", "review")
        assert value == {"messages": [{"n": 0}, {"n": 1}, {"n": 2}]}
        left = await scalar(
            pg_url, f"SELECT array_agg(topic) FROM {pg_schema}.messages WHERE job_id = %s", [job.id]
        )
        assert left == ["other"]  # taken messages are gone; the other topic's stays queued
    assert executions == 1


async def test_a_burst_of_sends_wakes_a_waiting_workflow_once_and_is_received_in_one_claim(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(pg_url, pg_schema)
    executions = 0
    receives = _count_receive_statements(monkeypatch)

    @app.task("approve")
    async def approve(ctx: trioq.Context, payload: object) -> Any:
        nonlocal executions
        executions += 1
        got: list[Any] = []
        while len(got) < 5:
            got += await ctx.receive("decision", timeout=HOUR)
        return got

    hooks, suspended, _ = waiting_hook(1)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("approve", None)
        async with running_worker(app, poll_interval=POLL, hooks=hooks):
            with trio.fail_after(10):
                await suspended.wait()
                async with client.transaction() as tx:  # one commit: the burst
                    for n in range(5):
                        await tx.execute(
                            f"SELECT {pg_schema}.send(%s, 'decision', %s::jsonb)",
                            [job.id, f'{{"n": {n}}}'],
                        )
                assert await client.wait_result(job.id) == [{"n": n} for n in range(5)]
        history = await client.history(job.id)
    assert executions == 2  # suspended once, woken once
    # The first send wrote itself into the suspended receive (replayed without a statement);
    # the rest were queued and the next receive took them in one statement, not suspending.
    assert [entry.value for entry in history] == [
        {"messages": [{"n": 0}]},
        {"messages": [{"n": n} for n in range(1, 5)]},
    ]
    assert receives == [0, 1]  # the suspending receive, then the one that took the rest


def _count_receive_statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions of the job_receive statements the worker sends, in order."""
    from trioq._pg.driver import PgDriver

    positions: list[int] = []
    original = PgDriver.job_receive

    async def counted(self: PgDriver, params: Any) -> Any:
        positions.append(params.position)
        return await original(self, params)

    monkeypatch.setattr(PgDriver, "job_receive", counted)
    return positions


async def test_the_send_that_wakes_a_receive_is_its_checkpoint_and_the_replay_runs_no_statement(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(pg_url, pg_schema)
    receives = _count_receive_statements(monkeypatch)

    @app.task("approve")
    async def approve(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("decision", timeout=HOUR)

    hooks, suspended, _ = waiting_hook(1)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("approve", None)
        async with running_worker(app, poll_interval=POLL, hooks=hooks):
            with trio.fail_after(10):
                await suspended.wait()
                pending = [entry.value for entry in await client.history(job.id)]
                assert list(pending[0]) == ["deadline"]
                first = await client.send(job.id, "decision", "yes")
                assert await client.wait_result(job.id) == ["yes"]
        history = await client.history(job.id)
        queued = await scalar(
            pg_url, f"SELECT count(*) FROM {pg_schema}.messages WHERE job_id = %s", [job.id]
        )
        second = await client.send((await client.enqueue("approve", None)).id, "decision", "queued")
    assert [entry.value for entry in history] == [{"messages": ["yes"]}]
    assert queued == 0  # delivered into the checkpoint, never queued
    assert receives == [0]  # only the receive that suspended: the woken one replayed history
    assert second > first  # a delivered message takes its id from the queue's: send order


async def test_a_receive_suspended_before_wait_position_existed_is_woken_and_takes_the_queue(
    pg_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that suspended in a receive before migration 0025 has no wait_position: the send
    queues the message and wakes the job as before, and the woken receive takes it."""
    app = make_app(pg_url, pg_schema)
    receives = _count_receive_statements(monkeypatch)

    @app.task("approve")
    async def approve(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("decision", timeout=HOUR)

    hooks, suspended, _ = waiting_hook(1)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("approve", None)
        async with running_worker(app, poll_interval=POLL, hooks=hooks):
            with trio.fail_after(10):
                await suspended.wait()
                await scalar(
                    pg_url,
                    f"UPDATE {pg_schema}.job_rows_legacy SET wait_position = NULL WHERE id = %s "
                    "RETURNING wait_topic",
                    [job.id],
                )
                await client.send(job.id, "decision", "old row")
                assert await client.wait_result(job.id) == ["old row"]
        history = await client.history(job.id)
    assert [entry.value for entry in history] == [{"messages": ["old row"]}]
    assert receives == [0, 0]  # the woken receive took the message from the queue


async def test_receive_times_out_with_an_empty_list_and_replays_the_same(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    calls = 0

    @app.task("poll", retry=FAST_RETRY, max_attempts=2)
    async def poll(ctx: trioq.Context, payload: object) -> Any:
        nonlocal calls
        got = await ctx.receive("late", timeout=datetime.timedelta(0))
        calls += 1
        if calls == 1:
            await ctx.client.send(ctx.job.id, "late", "after the timeout")
            raise RuntimeError("crash after the receive: the retry replays it")
        return got

    async with app.client(migrate=True) as client:
        job = await client.enqueue("poll", None)
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == []  # the replay: still timed out
    assert calls == 2


async def test_sending_to_an_unknown_or_final_job_is_a_clear_error(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("quick")
    async def quick(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client:
        with pytest.raises(trioq.JobNotFound, match="no job 999999"):
            await client.send(999_999, "topic", 1)
        job = await client.enqueue("quick", None)
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10):
                await client.wait_result(job.id)
        with pytest.raises(trioq.JobFinished, match=f"job {job.id} is completed"):
            await client.send(job.id, "topic", 1)
        with pytest.raises(ValueError, match="topic"):
            await client.send(job.id, "", 1)
        with pytest.raises(trioq.PayloadError, match="payload"):
            await client.send(job.id, "topic", {1, 2})
        query = f"SELECT {pg_schema}.send(%s, 't', '1')"
        with pytest.raises(Exception, match=f"job {job.id} is completed"):
            await trio.to_thread.run_sync(sql_scalar, pg_url, query, [job.id])
        with pytest.raises(Exception, match="send: no job 999999"):
            await trio.to_thread.run_sync(sql_scalar, pg_url, query, [999_999])


async def test_set_value_is_readable_while_the_workflow_waits_and_after_it_ends(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("progress")
    async def progress(ctx: trioq.Context, payload: object) -> Any:
        await ctx.set_value("stage", "started")
        await ctx.set_value("stage", "waiting for approval")  # the newest value wins
        decision = await ctx.receive("approval", timeout=HOUR)
        await ctx.set_value("stage", "approved")
        await ctx.step("ship", lambda: "shipped")  # carries the value: no statement of its own
        await ctx.set_value("done", True)  # no checkpoint follows: written with the completion
        return decision

    hooks, suspended, _ = waiting_hook(1)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("progress", None)
        with pytest.raises(trioq.ValueNotSet, match="'stage'"):
            await client.get_value(job.id, "stage")
        async with running_worker(app, poll_interval=POLL, hooks=hooks):
            with trio.fail_after(10):
                await suspended.wait()
                assert await client.get_value(job.id, "stage") == "waiting for approval"
                async with trio.open_nursery() as nursery:
                    done: list[Any] = []

                    async def wait_done() -> None:
                        done.append(await client.get_value(job.id, "done", wait=10))

                    nursery.start_soon(wait_done)
                    await client.send(job.id, "approval", "yes")
                assert done == [True]
                assert await client.wait_result(job.id) == ["yes"]
        assert await client.get_value(job.id, "stage") == "approved"
        values = {value.key: value.value for value in await client.values(job.id)}
        assert values == {"stage": "approved", "done": True}
        with pytest.raises(trioq.ValueNotSet, match="'missing'"):
            await client.get_value(job.id, "missing", wait=5)  # final: no waiting
        with pytest.raises(trioq.JobNotFound):
            await client.get_value(999_999, "stage")


async def test_workflows_lists_what_each_workflow_waits_on(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("on_message")
    async def on_message(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("go", timeout=HOUR)

    @app.task("on_event")
    async def on_event(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.wait_for_event("ev:1", timeout=HOUR)

    @app.task("napper")
    async def napper(ctx: trioq.Context, payload: object) -> None:
        await ctx.sleep("nap", HOUR)

    @app.task("child")
    async def child(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("go", timeout=HOUR)

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> Any:
        ids = [await ctx.spawn("child", n) for n in range(2)]
        return await ctx.gather(*ids)

    hooks, suspended, _ = waiting_hook(6)
    async with app.client(migrate=True) as client:
        jobs = {
            task: (await client.enqueue(task, None)).id
            for task in ("on_message", "on_event", "napper", "parent")
        }
        async with running_worker(app, poll_interval=POLL, hooks=hooks, concurrency=6):
            with trio.fail_after(10):
                await suspended.wait()

                async def napper_sleeps() -> bool:
                    return (await client.get_job(jobs["napper"])).state == "sleeping"

                # on_job_end fires when the sleep is handed to the completer, before it commits.
                await wait_until(napper_sleeps)
                views = {view.id: view for view in await client.workflows()}
                assert views[jobs["on_message"]].waits_on.startswith("message 'go' (until ")
                assert views[jobs["on_event"]].waits_on.startswith("event 'ev:1'")
                assert views[jobs["napper"]].state == "sleeping"
                assert views[jobs["napper"]].waits_on.startswith("sleeping until ")
                assert views[jobs["parent"]].waits_on == "children 0/2 done"
                children = sorted(v.id for v in views.values() if v.task == "child")
                assert len(children) == 2
                await client.send(children[0], "go", 1)
                await client.wait_result(children[0])
                # The parent woke? No: it waits for both; its view counts one done.
                [parent_view] = [
                    v for v in await client.workflows(task="parent") if v.id == jobs["parent"]
                ]
                assert parent_view.waits_on == "children 1/2 done"
                sleeping = await client.workflows(states=["sleeping"])
                assert [view.id for view in sleeping] == [jobs["napper"]]
            with pytest.raises(ValueError, match="states"):
                await client.workflows(states=["completed"])
            await client.send(children[1], "go", 2)
            with trio.fail_after(10):
                assert await client.wait_result(jobs["parent"]) == [[1], [2]]


async def test_producers_send_in_the_callers_transaction_and_refuse_final_jobs(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("collect")
    async def collect(ctx: trioq.Context, payload: object) -> Any:
        got: list[Any] = []
        while len(got) < 3:
            got += await ctx.receive("items", timeout=HOUR)
        return got

    def django_view(job_id: int) -> None:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            with psycopg.connect(pg_url) as conn:  # not autocommit: the caller's transaction
                producer.send(job_id, "items", "rolled back", conn=conn)
                conn.rollback()
                producer.send(job_id, "items", 1, conn=conn)
                conn.commit()
            producer.send(job_id, "items", 2)

    async def fastapi_handler(job_id: int) -> None:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            await producer.send(job_id, "items", 3)

    async def after_the_end(job_id: int) -> None:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            with pytest.raises(trioq.JobFinished, match=f"job {job_id} is completed"):
                await producer.send(job_id, "items", 4)
            with pytest.raises(trioq.JobNotFound):
                await producer.send(999_999, "items", 4)

    async with app.client(migrate=True) as client:
        job = await client.enqueue("collect", None)
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(30):
                await trio.to_thread.run_sync(django_view, job.id)
                await trio.to_thread.run_sync(asyncio.run, fastapi_handler(job.id))
                assert await client.wait_result(job.id) == [1, 2, 3]
        await trio.to_thread.run_sync(asyncio.run, after_the_end(job.id))


async def test_a_ready_job_the_claim_skipped_while_a_send_held_its_row_starts_at_the_commit(
    pg_url: str, pg_schema: str
) -> None:
    # A claim locks with FOR UPDATE SKIP LOCKED; send() holds the job row until the caller's
    # transaction ends. The round that runs meanwhile skips the job: the send's commit must
    # wake the queue, or the job waits for the 30 s poll.
    app = make_app(pg_url, pg_schema)

    @app.task("collect")
    async def collect(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("items", timeout=HOUR)

    first_round = trio.Event()
    claimed: list[int] = []

    def on_round(queue: str, requested: int, got: int) -> None:
        claimed.append(got)
        first_round.set()

    async with app.client(migrate=True) as client:
        job = await client.enqueue("collect", None)
        # The send's transaction (on `conn`) stays open while the worker's first round runs.
        with SyncProducer(pg_url, schema=pg_schema) as producer, psycopg.connect(pg_url) as conn:
            await trio.to_thread.run_sync(lambda: producer.send(job.id, "items", 1, conn=conn))
            hooks = trioq.WorkerHooks(on_round=on_round)
            async with running_worker(app, poll_interval=POLL, hooks=hooks):
                with trio.fail_after(10):
                    await first_round.wait()
                    assert claimed[0] == 0  # the row was locked: skipped
                    await trio.to_thread.run_sync(conn.commit)
                    assert await client.wait_result(job.id) == [1]


async def test_producers_read_a_workflows_values(pg_url: str, pg_schema: str) -> None:
    """A Django view or a FastAPI handler shows the progress a workflow publishes."""
    app = make_app(pg_url, pg_schema)

    @app.task("progress")
    async def progress(ctx: trioq.Context, payload: object) -> Any:
        await ctx.set_value("stage", "waiting")
        await ctx.receive("go", timeout=HOUR)
        await ctx.set_value("stage", "shipped")
        await ctx.set_value("done", True)
        return "ok"

    def django_view(job_id: int) -> None:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            assert producer.get_value(job_id, "stage", wait=20) == "waiting"
            with pytest.raises(trioq.ValueNotSet, match="'done'"):
                producer.get_value(job_id, "done")
            producer.send(job_id, "go", None)
            assert producer.get_value(job_id, "done", wait=20) is True
            values = {value.key: value.value for value in producer.values(job_id)}
            assert values == {"stage": "shipped", "done": True}
            with pytest.raises(trioq.JobNotFound):
                producer.get_value(999_999, "stage")
            with pytest.raises(ValueError, match="key"):
                producer.get_value(job_id, "")

    async def fastapi_handler(job_id: int) -> None:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            assert await producer.get_value(job_id, "stage") == "shipped"
            values = {value.key: value.value for value in await producer.values(job_id)}
            assert values == {"stage": "shipped", "done": True}
            with pytest.raises(trioq.ValueNotSet, match="'missing'"):
                await producer.get_value(job_id, "missing", wait=5)  # final: no waiting
            with pytest.raises(trioq.JobNotFound):
                await producer.get_value(999_999, "stage", wait=1)

    async with app.client(migrate=True) as client:
        job = await client.enqueue("progress", None)
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(30):
                await trio.to_thread.run_sync(django_view, job.id)
                assert await client.wait_result(job.id) == "ok"
        with trio.fail_after(30):
            await trio.to_thread.run_sync(asyncio.run, fastapi_handler(job.id))
