"""`@app.task(keep=False)`: a job that completes is deleted in the statement that would have
marked it completed (no result, attempts or history kept); failed jobs and a workflow's
children are kept."""

from __future__ import annotations

import pytest
import trio

import trioq
from tests.support import make_app, running_worker, scalar, wait_until


async def rows(pg_url: str, pg_schema: str, where: str = "true") -> int:
    return int(await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs WHERE {where}"))


async def test_jobs_of_a_task_that_keeps_nothing_leave_no_row_and_failures_stay(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("ephemeral", keep=False, max_attempts=1)
    async def ephemeral(ctx: trioq.Context, payload: dict[str, bool]) -> str:
        if payload["fail"]:
            raise RuntimeError("kept for a look")
        return "gone"

    @app.task("kept")
    async def kept(ctx: trioq.Context, payload: object) -> str:
        return "here"

    async with app.client(migrate=True) as client:
        await client.enqueue_many("ephemeral", [{"fail": False}] * 30)
        failing = await client.enqueue("ephemeral", {"fail": True})
        keyed = await client.enqueue("ephemeral", {"fail": False}, partition_key="p")
        also_keyed = await client.enqueue("ephemeral", {"fail": False}, partition_key="p")
        other = await client.enqueue("kept", None)
        async with running_worker(app):
            with trio.fail_after(30):
                assert await client.wait_result(other.id) == "here"
                await wait_until(lambda: _only_left(pg_url, pg_schema))
        with pytest.raises(trioq.JobNotFound):
            await client.get_job(keyed.id)
        assert (await client.get_job(failing.id)).state == "failed"
        assert await rows(pg_url, pg_schema) == 2
        assert await rows(pg_url, pg_schema, f"id = {also_keyed.id}") == 0


async def _only_left(pg_url: str, pg_schema: str) -> bool:
    return await rows(pg_url, pg_schema, "task = 'ephemeral' AND state <> 'failed'") == 0


async def test_a_workflow_that_keeps_nothing_goes_with_its_history_and_keeps_its_children(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("child", keep=False)
    async def child(ctx: trioq.Context, payload: int) -> int:
        return payload * 2

    @app.task("parent", keep=False)
    async def parent(ctx: trioq.Context, payload: int) -> int:
        base = await ctx.step("base", lambda: payload)
        [doubled] = await ctx.gather(await ctx.spawn("child", base))
        return int(doubled)

    async with app.client(migrate=True) as client:
        job = await client.enqueue("parent", 21)
        async with running_worker(app):
            with trio.fail_after(30):
                await wait_until(lambda: _gone(pg_url, pg_schema, job.id))
        history = f"SELECT count(*) FROM {pg_schema}.checkpoints WHERE job_id = {job.id}"
        assert await scalar(pg_url, history) == 0
        # The child's outcome was its parent's to read: kept, as every child is.
        [(state, result)] = [(r.state, r.result) for r in await client.jobs(task="child", limit=10)]
        assert (state, result) == ("completed", 42)


async def _gone(pg_url: str, pg_schema: str, job_id: int) -> bool:
    return await rows(pg_url, pg_schema, f"id = {job_id}") == 0


async def test_waiting_for_the_result_of_a_job_that_keeps_nothing_finds_no_job(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    started = trio.Event()
    go = trio.Event()

    @app.task("ephemeral", keep=False)
    async def ephemeral(ctx: trioq.Context, payload: object) -> str:
        started.set()
        await go.wait()
        return "gone"

    async with app.client(migrate=True) as client, running_worker(app):
        job = await client.enqueue("ephemeral", None)
        with trio.fail_after(30):
            await started.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_release_soon, go)
                with pytest.raises(trioq.JobNotFound):
                    await client.wait_result(job.id, timeout=20)


async def _release_soon(go: trio.Event) -> None:
    await trio.lowlevel.checkpoint()
    go.set()


def test_keep_must_be_a_bool() -> None:
    app = trioq.App("postgresql://unused", schema="anything")
    with pytest.raises(ValueError, match="keep: 'no' must be True or False"):
        app.task("t", keep="no")  # type: ignore[arg-type]
