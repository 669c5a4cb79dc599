"""Handler versions on real Postgres: routing by (task, version), several versions in one
worker, and a deploy that drops a version while its jobs are still waiting."""

from __future__ import annotations

import datetime

import pytest
import trio

import trioq
from tests.support import running_worker


def versioned_app(pg_url: str, schema: str, *versions: int) -> trioq.App:
    app = trioq.App(pg_url, schema=schema)
    for version in versions:

        async def approve(ctx: trioq.Context, payload: dict, version: int = version) -> dict:
            if payload.get("nap"):
                await ctx.sleep("nap", datetime.timedelta(seconds=payload["nap"]))
            return {"handled_by": version, "job_version": ctx.job.version}

        app.task("approve", version=version)(approve)
    return app


async def test_version_is_recorded_and_the_highest_registered_is_the_default(
    pg_url: str, pg_schema: str
) -> None:
    app = versioned_app(pg_url, pg_schema, 2, 1, 3)
    assert app.tasks["approve"].version == 3
    assert sorted(app.versions) == [("approve", 1), ("approve", 2), ("approve", 3)]
    with pytest.raises(ValueError, match="task: 'approve' version 2 is already registered"):
        app.task("approve", version=2)(app.versions[("approve", 2)].handler)
    with pytest.raises(ValueError, match="version must be an integer >= 1"):
        app.task("other", version=0)(app.versions[("approve", 2)].handler)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("approve", {})
        [status] = await client.driver.task_status()
    assert (job.task, status.version) == ("approve", 3)


async def test_a_v1_job_is_never_claimed_by_a_v2_worker_and_is_by_one_serving_both(
    pg_url: str, pg_schema: str
) -> None:
    old, new, both = (versioned_app(pg_url, pg_schema, *v) for v in ((1,), (2,), (1, 2)))
    async with old.client(migrate=True) as old_client:
        v1_jobs = await old_client.enqueue_many("approve", [{"n": n} for n in range(3)])
    async with new.client() as client, running_worker(new, concurrency=5, poll_interval=0.1):
        # Enqueued after the v1 jobs, so behind them in claim order: it completing proves
        # the v2 worker claimed past them.
        v2_job = await client.enqueue("approve", {"n": 99})
        assert await client.wait_result(v2_job.id, timeout=20) == {
            "handled_by": 2,
            "job_version": 2,
        }
        states = [(await client.get_job(job.id)).state for job in v1_jobs]
        assert states == ["ready"] * 3
        [workers] = [await client.workers()]
        assert [w.task_versions for w in workers] == [("approve@2",)]
        [unroutable] = await client.driver.job_unroutable()
        assert (unroutable.task, unroutable.version, unroutable.jobs) == ("approve", 1, 3)
    async with both.client() as client, running_worker(both, concurrency=5, poll_interval=0.1):
        results = [await client.wait_result(job.id, timeout=20) for job in v1_jobs]
        assert results == [{"handled_by": 1, "job_version": 1}] * 3
        assert await client.driver.job_unroutable() == []


async def test_deploy_dropping_v1_while_v1_workflows_sleep_shows_them_unroutable_until_v1_is_back(
    pg_url: str, pg_schema: str
) -> None:
    old, new = versioned_app(pg_url, pg_schema, 1), versioned_app(pg_url, pg_schema, 2)
    async with old.client(migrate=True) as client:
        asleep = trio.Event()
        hooks = trioq.WorkerHooks(
            on_job_end=lambda job, outcome: asleep.set() if outcome == "sleeping" else None
        )
        sleeper = await client.enqueue("approve", {"nap": 1.0})
        async with running_worker(old, concurrency=2, poll_interval=0.1, hooks=hooks):
            with trio.fail_after(20):
                await asleep.wait()
    async with new.client() as client, running_worker(new, concurrency=2, poll_interval=0.1):
        [unroutable] = await client.driver.job_unroutable()
        assert (unroutable.version, unroutable.jobs, unroutable.states) == (1, 1, ("sleeping",))
        # A v2 job due after the sleeper's wake time: once it ran, the v1 workflow was due
        # and passed over by the v2 worker.
        after = await client.enqueue("approve", {"n": 2}, delay=1.2)
        assert (await client.wait_result(after.id, timeout=20))["handled_by"] == 2
        assert (await client.get_job(sleeper.id)).state != "completed"
        [unroutable] = await client.driver.job_unroutable()
        assert unroutable.version == 1
    async with old.client() as client, running_worker(old, concurrency=2, poll_interval=0.1):
        assert await client.wait_result(sleeper.id, timeout=20) == {
            "handled_by": 1,
            "job_version": 1,
        }
        assert await client.driver.job_unroutable() == []
