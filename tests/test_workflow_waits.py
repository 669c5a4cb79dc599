"""Events and child jobs end to end: real workers on real PostgreSQL, 30 s poll intervals (so
only the wake-ups riding the statements can make these tests finish in time)."""

from __future__ import annotations

import datetime
import functools
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app, running_worker, scalar

POLL = 30.0  # no test here may depend on a poll
FAST_RETRY = trioq.RetryPolicy(base_seconds=0.0, jitter=0.0)


def counting(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


class Once:
    """A side effect that raises the first time it runs (forcing a retry, hence a replay)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("first try fails")
        return "ok"


async def test_event_emitted_before_the_wait_is_returned_without_suspending(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    executions = 0

    @app.task("await_approval")
    async def await_approval(ctx: trioq.Context, payload: dict[str, str]) -> Any:
        nonlocal executions
        executions += 1
        return await ctx.wait_for_event(payload["key"], timeout=datetime.timedelta(hours=1))

    async with app.client(migrate=True) as client:
        assert (await client.emit_event("approval:1", {"ok": True})).first is True
        assert (
            await client.emit_event("approval:1", {"ok": False})
        ).first is False  # first one wins
        job = await client.enqueue("await_approval", {"key": "approval:1"})
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == {"ok": True}
    assert executions == 1  # never suspended


async def test_emit_wakes_every_waiting_workflow_without_a_poll(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    suspended = trio.Event()
    waiting: set[int] = set()

    @app.task("await_approval")
    async def await_approval(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.wait_for_event("approval:2", timeout=datetime.timedelta(hours=1))

    def on_end(job: Any, outcome: str) -> None:
        if outcome == "waiting":
            waiting.add(job.id)
            if len(waiting) == 3:
                suspended.set()

    hooks = trioq.WorkerHooks(on_job_end=on_end)
    async with app.client(migrate=True) as client:
        jobs = await client.enqueue_many("await_approval", [None] * 3)
        async with running_worker(app, poll_interval=POLL, hooks=hooks, concurrency=3):
            with trio.fail_after(10):
                await suspended.wait()
                states = {(await client.get_job(job.id)).state for job in jobs}
                assert states == {"waiting"}
                async with client.transaction() as tx:
                    assert (await tx.emit_event("approval:2", {"by": "ann"})).first is True
                results = [await client.wait_result(job.id) for job in jobs]
    assert results == [{"by": "ann"}] * 3


async def test_event_timeout_is_raised_again_on_replay(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)
    flaky = Once()
    waits = 0

    @app.task("await_or_give_up", retry=FAST_RETRY, max_attempts=2)
    async def await_or_give_up(ctx: trioq.Context, payload: object) -> str:
        nonlocal waits
        try:
            waits += 1
            await ctx.wait_for_event("never", timeout=datetime.timedelta(milliseconds=200))
            outcome = "received"
        except trioq.EventTimeout:
            outcome = "timed out"
        await ctx.step("flaky", flaky)  # fails once: the retry replays the wait
        return outcome

    async with app.client(migrate=True) as client:
        job = await client.enqueue("await_or_give_up")
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(15):
                assert await client.wait_result(job.id) == "timed out"
        assert (await client.emit_event("never", 1)).first is True  # too late: history already says
    assert flaky.calls == 2
    assert waits == 3  # suspended, timed out, then replayed with the same outcome
    kinds = await scalar(
        pg_url,
        f'SELECT array_agg(value::text ORDER BY position) FROM "{pg_schema}".checkpoints '
        "WHERE job_id = %s AND kind = 'event'",
        (job.id,),
    )
    assert kinds == ['{"timeout": true}']


async def test_child_completion_wakes_its_parent_without_a_poll(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    parent_runs = 0

    @app.task("square")
    async def square(ctx: trioq.Context, payload: dict[str, int]) -> int:
        return payload["n"] ** 2

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> int:
        nonlocal parent_runs
        parent_runs += 1
        child = await ctx.spawn("square", {"n": 7})
        return int(await ctx.wait_result(child))

    async with app.client(migrate=True) as client:
        job = await client.enqueue("parent")
        async with running_worker(app, poll_interval=POLL, concurrency=1):
            with trio.fail_after(10):
                assert await client.wait_result(job.id) == 49
    assert parent_runs == 2  # suspended once (concurrency 1: the child needed the slot)
    children = await scalar(
        pg_url, f'SELECT count(*) FROM "{pg_schema}".jobs WHERE parent_id = %s', (job.id,)
    )
    assert children == 1


async def test_gather_failure_cancels_running_siblings_and_raises_the_same_on_replay(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    flaky = Once()
    slow_started = trio.Event()
    slow_cancelled = trio.Event()
    raised: list[int] = []

    @app.task("ok")
    async def ok(ctx: trioq.Context, payload: object) -> str:
        return "fine"

    @app.task("slow")
    async def slow(ctx: trioq.Context, payload: object) -> None:
        slow_started.set()
        try:
            await trio.sleep_forever()
        finally:
            slow_cancelled.set()

    @app.task("boom", max_attempts=1)
    async def boom(ctx: trioq.Context, payload: object) -> None:
        await slow_started.wait()  # fail only once the sibling is running
        raise ValueError("boom")

    @app.task("fan_out", retry=FAST_RETRY, max_attempts=2)
    async def fan_out(ctx: trioq.Context, payload: object) -> dict[str, Any]:
        ids = [await ctx.spawn(task, None) for task in ("ok", "slow", "boom")]
        try:
            await ctx.gather(*ids)
        except trioq.JobFailed as exc:
            raised.append(exc.job.id)  # type: ignore[attr-defined]
            await ctx.step("flaky", flaky)  # fails once: the retry replays the gather
            return {"failed": exc.job.id, "error": exc.error}  # type: ignore[attr-defined]
        return {"failed": None}

    async with app.client(migrate=True) as client:
        job = await client.enqueue("fan_out")
        async with running_worker(app, poll_interval=POLL, concurrency=4):
            with trio.fail_after(15):
                result = await client.wait_result(job.id)
                await slow_cancelled.wait()
        ids = [
            row[0]
            for row in await trio.to_thread.run_sync(
                functools.partial(
                    _rows,
                    pg_url,
                    f'SELECT id FROM "{pg_schema}".jobs WHERE parent_id = %s '
                    "ORDER BY parent_position",
                    (job.id,),
                )
            )
        ]
        states = [(await client.get_job(child)).state for child in ids]
    assert len(ids) == 3  # spawned once each, although the parent ran 3 times
    assert states == ["completed", "cancelled", "failed"]
    assert result["failed"] == ids[2]
    assert result["error"]["message"] == "boom"
    assert raised == [ids[2], ids[2]]  # the same failure, first run and replay
    assert flaky.calls == 2


def _rows(pg_url: str, query: str, params: Any) -> list[tuple[Any, ...]]:
    from tests.support import sql_rows

    return sql_rows(pg_url, query, params)


async def test_cancelling_a_parent_cancels_its_children(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)
    child_started = trio.Event()
    parent_waiting = trio.Event()

    @app.task("slow")
    async def slow(ctx: trioq.Context, payload: object) -> None:
        child_started.set()
        await trio.sleep_forever()

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        running = await ctx.spawn("slow", None)
        await ctx.spawn("slow", None, delay=3600)
        await ctx.wait_result(running)

    def on_end(job: Any, outcome: str) -> None:
        if job.task == "parent" and outcome == "waiting":
            parent_waiting.set()

    hooks = trioq.WorkerHooks(on_job_end=on_end)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("parent")
        async with running_worker(app, poll_interval=POLL, concurrency=2, hooks=hooks):
            with trio.fail_after(15):
                await parent_waiting.wait()
                await child_started.wait()
                assert await client.cancel(job.id) == "waiting"  # until its child is final
                final = await client.wait_final(job.id)
        children = await trio.to_thread.run_sync(
            functools.partial(
                _rows,
                pg_url,
                f'SELECT state FROM "{pg_schema}".jobs WHERE parent_id = %s',
                (job.id,),
            )
        )
    assert final.state == "cancelled"
    assert sorted(state for (state,) in children) == ["cancelled", "cancelled"]


async def test_wait_for_a_job_that_is_not_a_child_fails_the_execution(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("nosy", max_attempts=1)
    async def nosy(ctx: trioq.Context, payload: dict[str, int]) -> None:
        await ctx.wait_result(payload["other"])

    async with app.client(migrate=True) as client:
        other = await client.enqueue("noop")
        job = await client.enqueue("nosy", {"other": other.id})
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10), pytest.raises(trioq.JobFailed) as caught:
                await client.wait_result(job.id)
    assert "must all be children of this job" in caught.value.job.error["message"]  # type: ignore[attr-defined]


async def test_spawn_refuses_bad_options_before_any_sql(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)
    errors: list[str] = []

    @app.task("child")
    async def child(ctx: trioq.Context, payload: object) -> None:
        return None

    @app.task("parent", max_attempts=1)
    async def parent(ctx: trioq.Context, payload: object) -> None:
        for options in ({"dedup_key": "x"}, {"priority": 10**6}, {"partition_key": "p"}):
            try:
                await ctx.spawn("child", None, **options)
            except ValueError as exc:
                errors.append(str(exc).split(":")[0])
        for bad in (None, ""):
            try:
                await ctx.wait_for_event(bad, timeout=datetime.timedelta(1))  # type: ignore[arg-type]
            except ValueError as exc:
                errors.append(str(exc).split(" ")[0])

    async with app.client(migrate=True) as client:
        job = await client.enqueue("parent", partition_key="p")
        async with running_worker(app, poll_interval=POLL):
            with trio.fail_after(10):
                await client.wait_result(job.id)
        with pytest.raises(ValueError, match=r"^key:"):
            await client.emit_event(None, 1)  # type: ignore[arg-type]
    assert errors == ["dedup_key", "priority", "partition_key", "wait_for_event:", "wait_for_event"]


async def test_a_parent_completes_only_after_the_children_it_did_not_await(
    pg_url: str, pg_schema: str
) -> None:
    """Nursery semantics: returning from the handler waits (durably) for unawaited children."""
    app = make_app(pg_url, pg_schema)
    release = trio.Event()
    returned = 0

    @app.task("slow")
    async def slow(ctx: trioq.Context, payload: object) -> str:
        await release.wait()
        return "done"

    @app.task("fire_and_forget")
    async def fire_and_forget(ctx: trioq.Context, payload: object) -> str:
        nonlocal returned
        await ctx.spawn("slow", None)
        returned += 1
        return "parent"

    parent_waits = trio.Event()

    def on_end(job: Any, outcome: str) -> None:
        if job.task == "fire_and_forget" and outcome == "waiting":
            parent_waits.set()

    hooks = trioq.WorkerHooks(on_job_end=on_end)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("fire_and_forget")
        async with running_worker(app, poll_interval=POLL, concurrency=2, hooks=hooks):
            with trio.fail_after(10):
                await parent_waits.wait()  # it returned, and waits for its child
                assert returned == 1
                release.set()
                assert await client.wait_result(job.id) == "parent"
        [(child_state, child_finished, parent_finished)] = await trio.to_thread.run_sync(
            functools.partial(
                _rows,
                pg_url,
                f'SELECT c.state, c.finished_at, p.finished_at FROM "{pg_schema}".jobs c '
                f'JOIN "{pg_schema}".jobs p ON p.id = c.parent_id WHERE p.id = %s',
                (job.id,),
            )
        )
    assert child_state == "completed"
    assert child_finished <= parent_finished
    assert returned == 2  # returned once, waited, replayed
