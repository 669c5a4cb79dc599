"""Metrics you can alert on: database-wide gauges from the leader only, every known queue with
zeros, the listener and process metrics, and an exact checkpoint count."""

from __future__ import annotations

import datetime

import trio
from prometheus_client.parser import text_string_to_metric_families

import trioq
from tests.support import make_app, running_worker, scalar, wait_until
from trioq._runtime.services.health import render_metrics
from trioq._runtime.services.metrics import DEMAND_KINDS

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def samples_of(worker: trioq.Worker) -> Samples:
    text = (await render_metrics(worker)).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def demand(samples: Samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["queue"], dict(labels)["kind"]): value
        for (name, labels), value in samples.items()
        if name == "trioq_queue_demand"
    }


async def test_queue_demand_comes_from_the_leader_only_and_an_emptied_queue_reads_zero(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("mail_task", queue="mail")
    async def mail_task(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, ["default"]) as leader:
        with trio.fail_after(10):
            await wait_until(lambda: _is_leader(leader))
        leader.metrics.demand_reads.max_age = 0.0  # every scrape reads afresh
        before = await samples_of(leader)
        # Before any job: every kind of the served queue, at 0 (no missing series).
        assert demand(before) == {("default", kind): 0 for kind in DEMAND_KINDS}
        assert before[("trioq_leader", ())] == 1
        assert before[("trioq_queue_oldest_ready_seconds", (("queue", "default"),))] == 0
        jobs = [await client.enqueue("mail_task", {}) for _ in range(3)]  # nobody serves mail
        busy = demand(await samples_of(leader))
        assert (busy[("mail", "ready")], busy[("mail", "due_now")]) == (3, 3)
        for job in jobs:
            await client.cancel(job.id)
        emptied = demand(await samples_of(leader))
        assert {kind: emptied[("mail", kind)] for kind in DEMAND_KINDS} == dict.fromkeys(
            DEMAND_KINDS, 0
        )
        # A worker that is not the leader exports none of the database-wide gauges.
        follower = app.worker(["default"])
        assert not follower.statistics().leader
        other = await samples_of(follower)
        assert demand(other) == {}
        assert other[("trioq_leader", ())] == 0
        assert not [key for key in other if key[0] == "trioq_queue_oldest_ready_seconds"]


async def _is_leader(worker: trioq.Worker) -> bool:
    return worker.statistics().leader


def _demand_reads(worker: trioq.Worker) -> int:
    return worker.driver.statistics().calls.get("queue_demand", 0)


async def test_concurrent_scrapes_of_the_leader_share_one_queue_demand_read_per_window(
    pg_url: str, pg_schema: str
) -> None:
    """/metrics may be reachable by anyone: 40 scrapes at once, then 40 more within the cache
    window, cost one `queue_demand()` scan, and every scrape exports its values."""
    app = make_app(pg_url, pg_schema)

    @app.task("mail_task", queue="mail")
    async def mail_task(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, ["default"]) as leader:
        with trio.fail_after(10):
            await wait_until(lambda: _is_leader(leader))
        await client.enqueue("mail_task", {})  # nobody serves mail
        reads_before = _demand_reads(leader)
        scraped: list[dict[tuple[str, str], float]] = []

        async def scrape() -> None:
            scraped.append(demand(await samples_of(leader)))

        with trio.fail_after(10):
            for _ in range(2):
                async with trio.open_nursery() as nursery:
                    for _ in range(40):
                        nursery.start_soon(scrape)
        assert _demand_reads(leader) - reads_before == 1
        assert len(scraped) == 80
        assert all(one[("mail", "ready")] == 1 for one in scraped)


async def test_the_leaders_demand_read_does_not_wait_for_the_main_pool(
    pg_url: str, pg_schema: str
) -> None:
    """With every connection of the main pool borrowed (handlers in long transactions, say),
    a scrape still reads the demand: the scan has a connection of its own."""
    app = make_app(pg_url, pg_schema, pool_size=2)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True) as client, running_worker(app, ["default"]) as leader:
        with trio.fail_after(10):
            await wait_until(lambda: _is_leader(leader))
        pool = client.driver._pool  # type: ignore[attr-defined]
        with trio.fail_after(10):
            async with pool.connection(), pool.connection():
                samples = await samples_of(leader)
        assert demand(samples) == {("default", kind): 0 for kind in DEMAND_KINDS}


async def test_listener_process_and_platform_metrics_are_exported(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client(migrate=True), running_worker(app) as worker:
        with trio.fail_after(10):
            await worker._probe_done.wait()
        samples = await samples_of(worker)
    assert samples[("trioq_listener_connected", ())] == 1
    assert samples[("trioq_listener_state", (("state", "ok"),))] == 1
    assert samples[("trioq_listener_state", (("state", "down"),))] == 0
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in samples
    assert any(name == "python_info" for name, _ in samples)


async def test_checkpoints_written_equals_the_checkpoint_rows_of_workflows(
    pg_url: str, pg_schema: str
) -> None:
    """Steps, a sleep, an event wait, spawns and a gather each write history through their
    own statement; the counter counts every row (it used to count the step writer's only)."""
    app = make_app(pg_url, pg_schema)

    @app.task("child")
    async def child(ctx: trioq.Context, payload: int) -> int:
        return payload * 2

    @app.task("flow")
    async def flow(ctx: trioq.Context, payload: object) -> int:
        one = await ctx.step("one", lambda: 1)
        await ctx.sleep("nap", datetime.timedelta(0))
        event = await ctx.wait_for_event(f"go:{ctx.job.id}", timeout=datetime.timedelta(hours=1))
        ids = [await ctx.spawn("child", n) for n in (1, 2)]
        doubled = await ctx.gather(*ids)
        return int(one + event["n"] + sum(doubled))

    async with app.client(migrate=True) as client, running_worker(app) as worker:
        jobs = [await client.enqueue("flow", {}) for _ in range(3)]
        for job in jobs:
            await client.emit_event(f"go:{job.id}", {"n": 1})  # emitted before the wait
        with trio.fail_after(20):
            results = [await client.wait_result(job.id) for job in jobs]
        rows = await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.checkpoints")
        counted = worker.metrics.registry.get_sample_value("trioq_checkpoints_written_total")
    assert results == [8, 8, 8]
    assert rows == 3 * 6  # step, sleep, event, two spawns, gather
    assert counted == rows
