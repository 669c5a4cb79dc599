"""A whole-workflow `deadline=`: validated at enqueue, stored on the row, inherited by
children, and enforced by the leader's deadline pass (the job and its children end cancelled,
the stored error naming the deadline and who set it)."""

from __future__ import annotations

import datetime
import json

import psycopg
import pytest
import trio
import trio.testing

import trioq
from tests.support import in_thread, pass_deadline, running_worker, scalar, sql_rows
from trioq import cli
from trioq._core.explain import explain
from trioq._memory import MemoryDriver
from trioq._seam.admin import JobFilter
from trioq._seam.services import MaintenancePass
from trioq.producer import SyncProducer, declare_task

FOREVER = declare_task("forever")


def deadline_app(database_url: str, schema: str) -> tuple[trioq.App, trio.Event]:
    app = trioq.App(database_url=database_url, schema=schema)
    started = trio.Event()

    @app.task("forever", max_attempts=5)
    async def forever(ctx: trioq.Context, payload: object) -> None:
        started.set()
        await trio.sleep(3600)

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        await ctx.spawn("forever", {})
        await ctx.sleep("nap", datetime.timedelta(hours=1))

    @app.task("bounded", deadline=datetime.timedelta(minutes=5))
    async def bounded(ctx: trioq.Context, payload: object) -> None:
        return None

    return app, started


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime.datetime(2030, 1, 1), "deadline: datetime.datetime(2030, 1, 1, 0, 0) is naive"),
        (datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), "has passed"),
        (datetime.timedelta(seconds=-1), "is not positive"),
        (5, "is not a datetime or timedelta"),
    ],
)
async def test_a_bad_deadline_is_refused_before_anything_is_written(
    pg_url: str, pg_schema: str, value: object, message: str
) -> None:
    app, _ = deadline_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        with pytest.raises(ValueError, match=r"^deadline: ") as refused:
            await client.enqueue("forever", {}, deadline=value)  # type: ignore[arg-type]
        assert message in str(refused.value)
        assert "aware datetime in the future or a positive timedelta" in str(refused.value)
        assert await client.driver.job_list(trioq_states()) == []


def trioq_states() -> JobFilter:
    return JobFilter()


async def test_a_running_job_past_its_deadline_is_cancelled_not_retried_on_postgres(
    pg_url: str, pg_schema: str
) -> None:
    app, started = deadline_app(pg_url, pg_schema)
    async with (
        app.client(migrate=True) as client,
        running_worker(app, ["default"], maintenance_interval=0.2),
    ):
        job = await client.enqueue("forever", {}, deadline=datetime.timedelta(seconds=1))
        with trio.fail_after(30):
            await started.wait()
            with pytest.raises(trioq.JobFailed):
                await client.wait_result(job.id, timeout=30)
        row = await client.driver.job_get(job.id)
        attempts = await client.driver.job_attempts(job.id)
    assert row is not None and row.state == "cancelled"
    assert row.error is not None and row.error["type"] == "DeadlineExceeded"
    assert row.error["message"].startswith("deadline passed at ")
    assert row.error["message"].endswith("(set at enqueue)")
    assert [a.outcome for a in attempts] == ["cancelled"]


async def test_a_sleeping_workflow_past_its_deadline_is_cancelled_with_its_child_on_postgres(
    pg_url: str, pg_schema: str
) -> None:
    app, started = deadline_app(pg_url, pg_schema)
    async with (
        app.client(migrate=True) as client,
        running_worker(app, ["default"], maintenance_interval=0.2),
    ):
        job = await client.enqueue("parent", {}, deadline=datetime.timedelta(seconds=1))
        with trio.fail_after(30):
            await started.wait()
            with pytest.raises(trioq.JobFailed):
                await client.wait_result(job.id, timeout=30)
        parent = await client.driver.job_get(job.id)
        [child] = [j for j in await client.driver.job_list(trioq_states()) if j.id != job.id]
    assert parent is not None and parent.state == "cancelled"
    assert parent.error is not None and "(set at enqueue)" in parent.error["message"]
    assert child.state == "cancelled"


async def test_a_task_deadline_is_stored_and_a_pass_cancels_a_ready_job(
    pg_url: str, pg_schema: str
) -> None:
    app, _ = deadline_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("bounded", {})
        async with client.transaction() as tx:
            [(at, source)] = await tx.fetch(
                f"SELECT deadline_at - created_at, deadline_source FROM {pg_schema}.jobs"
            )
            assert (at, source) == (datetime.timedelta(minutes=5), "set by task bounded")
        await in_thread(pass_deadline, pg_url, pg_schema, [job.id])
        report = await client.driver.maintenance_pass(MaintenancePass())
        row = await client.driver.job_get(job.id)
    assert report.deadlines_passed == 1
    assert row is not None and row.state == "cancelled"
    assert row.error is not None and row.error["message"].endswith("(set by task bounded)")


def memory_app() -> tuple[trioq.App, dict[str, trio.Event]]:
    app = trioq.App(schema="deadlines")
    started = {name: trio.Event() for name in ("running", "sleeping", "waiting", "child")}

    @app.task("running")
    async def running(ctx: trioq.Context, payload: object) -> None:
        started["running"].set()
        await trio.sleep(3600)

    @app.task("sleeping")
    async def sleeping(ctx: trioq.Context, payload: object) -> None:
        started["sleeping"].set()
        await ctx.sleep("nap", datetime.timedelta(hours=1))

    @app.task("waiting")
    async def waiting(ctx: trioq.Context, payload: object) -> None:
        started["waiting"].set()
        await ctx.wait_for_event("never", timeout=datetime.timedelta(hours=1))

    @app.task("child")
    async def child(ctx: trioq.Context, payload: object) -> None:
        started["child"].set()
        await trio.sleep(3600)

    @app.task("parent")
    async def parent(ctx: trioq.Context, payload: object) -> None:
        await ctx.spawn("child", {})
        await ctx.sleep("nap", datetime.timedelta(hours=1))

    return app, started


@pytest.mark.parametrize("task", ["running", "sleeping", "waiting", "parent"])
async def test_a_deadline_cancels_the_workflow_wherever_it_is_under_virtual_time(
    autojump_clock: trio.testing.MockClock, task: str
) -> None:
    app, started = memory_app()
    async with (
        app.client(driver=MemoryDriver()) as client,
        running_worker(app, ["default"], maintenance_interval=5),
    ):
        job = await client.enqueue(task, {}, deadline=datetime.timedelta(minutes=1))
        begun = trio.current_time()
        await started["child" if task == "parent" else task].wait()
        with pytest.raises(trioq.JobFailed):
            await client.wait_result(job.id, timeout=600)
        elapsed = trio.current_time() - begun
        rows = await client.driver.job_list(JobFilter())
    assert {row.state for row in rows} == {"cancelled"}  # the child too, for the parent
    [row] = [row for row in rows if row.id == job.id]
    assert row.error is not None and row.error["type"] == "DeadlineExceeded"
    assert row.error["message"].endswith("(set at enqueue)")
    if task == "parent":
        [child] = [row for row in rows if row.id != job.id]
        assert child.error is None or "DeadlineExceeded" in str(child.error)
    assert 60 <= elapsed < 600  # at the deadline (plus a maintenance interval), not the hour


async def test_explain_shows_the_deadline_and_says_when_it_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, _ = memory_app()
    async with app.client(driver=MemoryDriver()) as client:
        job = await client.enqueue("running", {}, deadline=datetime.timedelta(minutes=1))
        facts = await client.driver.job_explain(job.id)
        assert facts is not None
        [gate] = [gate for gate in explain(facts).gates if gate.name == "deadline"]
        assert gate.detail.startswith("deadline ") and gate.detail.endswith("(set at enqueue)")
        await trio.sleep(61)
        await client.driver.maintenance_pass(MaintenancePass())
        facts = await client.driver.job_explain(job.id)
        assert facts is not None
    verdict = explain(facts).verdict
    assert verdict.startswith("cancelled at ") and "deadline passed at " in verdict


async def test_the_sql_enqueue_takes_a_deadline_and_refuses_a_passed_one(
    pg_url: str, pg_schema: str
) -> None:
    app, _ = deadline_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        async with client.transaction() as tx:
            [(job_id,)] = await tx.fetch(
                f"SELECT {pg_schema}.enqueue('forever', "
                f"deadline => {pg_schema}.db_now() + interval '1 minute')"
            )
            [(left, source)] = await tx.fetch(
                f"SELECT deadline_at - created_at, deadline_source FROM {pg_schema}.jobs "
                "WHERE id = %s",
                [job_id],
            )
        assert (left, source) == (datetime.timedelta(minutes=1), "set at enqueue")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"deadline: .* has passed"):
            async with client.transaction() as tx:
                await tx.execute(
                    f"SELECT {pg_schema}.enqueue('forever', "
                    f"deadline => {pg_schema}.db_now() - interval '1 second')"
                )
        assert len(await client.driver.job_list(JobFilter())) == 1


async def test_the_sync_producer_stores_a_deadline_and_refuses_a_naive_one(
    pg_url: str, pg_schema: str
) -> None:
    app, _ = deadline_app(pg_url, pg_schema)

    def produce() -> int:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            with pytest.raises(ValueError, match=r"^deadline: .* is naive"):
                producer.enqueue(FOREVER, {}, deadline=datetime.datetime(2099, 1, 1))
            return producer.enqueue(FOREVER, {}, deadline=datetime.timedelta(hours=2)).id

    async with app.client(migrate=True):
        job_id = await trio.to_thread.run_sync(produce)
    assert sql_rows(
        pg_url, f"SELECT id, deadline_at - created_at, deadline_source FROM {pg_schema}.jobs"
    ) == [(job_id, datetime.timedelta(hours=2), "set at enqueue")]


BOUNDED = declare_task("bounded")  # the deadline is the worker's declaration, not this one's


async def deadlines_stored(pg_url: str, pg_schema: str) -> dict[int, tuple[object, object]]:
    rows = await trio.to_thread.run_sync(
        sql_rows,
        pg_url,
        f"SELECT id, deadline_at - created_at, deadline_source FROM {pg_schema}.jobs",
    )
    return {job_id: (left, source) for job_id, left, source in rows}


async def test_a_tasks_deadline_reaches_the_jobs_enqueued_by_name_on_postgres(
    pg_url: str, pg_schema: str
) -> None:
    """A producer that does not declare the deadline (one job, a batch, a keyed batch), the
    SQL enqueue(), and another app's client: each job gets its enqueue time plus the deadline
    the task's worker registered; a job enqueued before any worker registered it gets none,
    and so does one from an app that registers the task itself without a deadline (its own
    declaration decides)."""
    app, _ = deadline_app(pg_url, pg_schema)
    other_app = trioq.App(database_url=pg_url, schema=pg_schema)  # declares no task
    own_app = trioq.App(database_url=pg_url, schema=pg_schema)

    @own_app.task("bounded")  # another deploy's declaration: no deadline
    async def bounded(ctx: trioq.Context, payload: object) -> None:
        return None

    def produce() -> list[int]:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            return [
                producer.enqueue(BOUNDED, {}).id,
                *(job.id for job in producer.enqueue_many(BOUNDED, [{}, {}])),
                producer.enqueue(BOUNDED, {}, dedup_key="once").id,
            ]

    async with app.client(migrate=True), other_app.client() as other, own_app.client() as mine:
        before = (await other.enqueue(BOUNDED, {})).id
        async with running_worker(app, ["elsewhere"]):  # registers its tasks, claims nothing
            pass
        by_name = await trio.to_thread.run_sync(produce)
        from_sql = await scalar(pg_url, f"SELECT {pg_schema}.enqueue('bounded')")
        from_other = (await other.enqueue(BOUNDED, {})).id
        own = (await other.enqueue(BOUNDED, {}, deadline=datetime.timedelta(minutes=1))).id
        registered = (await mine.enqueue("bounded", {})).id
    stored = await deadlines_stored(pg_url, pg_schema)
    task_deadline = (datetime.timedelta(minutes=5), "set by task bounded")
    assert {job_id: stored[job_id] for job_id in [*by_name, from_sql, from_other]} == {
        job_id: task_deadline for job_id in [*by_name, from_sql, from_other]
    }
    assert stored[own] == (datetime.timedelta(minutes=1), "set at enqueue")
    assert stored[before] == (None, None)
    assert stored[registered] == (None, None)


async def test_a_spawned_child_whose_task_has_a_shorter_deadline_ends_at_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The child's task deadline (1 minute) is earlier than its workflow's (1 hour): the child
    is cancelled at its own, saying so, and its parent sees the failure and completes."""
    app = trioq.App(schema="deadlines")

    @app.task("short", deadline=datetime.timedelta(minutes=1))
    async def short(ctx: trioq.Context, payload: object) -> None:
        await ctx.sleep("nap", datetime.timedelta(hours=2))

    @app.task("workflow")
    async def workflow(ctx: trioq.Context, payload: object) -> str:
        child = await ctx.spawn("short", {})
        try:
            await ctx.wait_result(child)
        except trioq.JobFailed as failed:
            assert isinstance(failed.error, dict)
            return str(failed.error["message"])
        return "the child completed"

    async with (
        app.client(driver=MemoryDriver()) as client,
        running_worker(app, ["default"], maintenance_interval=5),
    ):
        job = await client.enqueue("workflow", {}, deadline=datetime.timedelta(hours=1))
        with trio.fail_after(600):
            message = await client.wait_result(job.id, timeout=600)
        [child] = [row for row in await client.driver.job_list(JobFilter()) if row.id != job.id]
    assert child.state == "cancelled"
    assert child.deadline_source == "set by task short"
    assert message.startswith("deadline passed at ") and message.endswith("(set by task short)")


def limited_app(database_url: str | None, schema: str) -> tuple[trioq.App, trio.Event, list[str]]:
    app = trioq.App(database_url=database_url, schema=schema)
    started, finished = trio.Event(), []

    @app.task("stuck", concurrency_key="tenant:{tenant}")
    async def stuck(ctx: trioq.Context, payload: dict[str, str]) -> None:
        started.set()
        await trio.sleep(3600)

    @app.task("next", concurrency_key="tenant:{tenant}")
    async def next_(ctx: trioq.Context, payload: dict[str, str]) -> None:
        finished.append(payload["tenant"])

    return app, started, finished


async def run_limited(client: trioq.Client, app: trioq.App, started: trio.Event) -> list[int]:
    """A queue limit of 1 and a key limit of 1: the stuck job holds both until its deadline
    cancels it; then the next job of the key starts. Returns both jobs' ids."""
    await client.set_queue_limit("default", 1)
    async with running_worker(app, ["default"], maintenance_interval=0.2):
        stuck = await client.enqueue(
            "stuck", {"tenant": "a"}, deadline=datetime.timedelta(seconds=2)
        )
        with trio.fail_after(60):
            await started.wait()
        following = await client.enqueue("next", {"tenant": "a"})
        with trio.fail_after(60):
            await client.wait_final(following.id)
    return [stuck.id, following.id]


async def test_a_deadline_frees_the_queue_limit_and_key_slots_on_postgres(
    pg_url: str, pg_schema: str
) -> None:
    app, started, finished = limited_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        stuck, following = await run_limited(client, app, started)
        stuck_row, following_row = await client.get_job(stuck), await client.get_job(following)
    assert stuck_row is not None and stuck_row.state == "cancelled"
    assert stuck_row.error is not None and stuck_row.error["type"] == "DeadlineExceeded"
    assert following_row is not None and following_row.state == "completed"
    assert finished == ["a"]


async def test_a_deadline_frees_the_queue_limit_and_key_slots_under_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, started, finished = limited_app(None, "deadlines")
    async with app.client(driver=MemoryDriver()) as client:
        stuck, following = await run_limited(client, app, started)
        stuck_row, following_row = await client.get_job(stuck), await client.get_job(following)
    assert stuck_row is not None and stuck_row.state == "cancelled"
    assert following_row is not None and following_row.state == "completed"
    assert finished == ["a"]


def test_trioq_job_shows_the_deadline_and_the_reason_it_cancelled_the_job(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--database-url", pg_url, "--schema", pg_schema]
    assert cli.main(["migrate", *base]) == 0
    with SyncProducer(pg_url, schema=pg_schema) as producer:
        ahead = producer.enqueue(FOREVER, {}, deadline=datetime.timedelta(hours=2)).id
        passed = producer.enqueue(FOREVER, {}, deadline=datetime.timedelta(hours=1)).id
    pass_deadline(pg_url, pg_schema, [passed])
    assert sql_rows(pg_url, f"SELECT {pg_schema}.job_deadline_pass(10, 'unused')") == [(1,)]
    capsys.readouterr()
    assert cli.main(["job", *base, str(ahead), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["job"]
    assert shown["deadline_source"] == "set at enqueue" and shown["deadline_at"] is not None
    assert cli.main(["job", *base, str(ahead)]) == 0
    text = capsys.readouterr().out
    assert "\ndeadline: " in text and "(set at enqueue)\n" in text and "passed" not in text
    assert cli.main(["job", *base, str(passed)]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("deadline")]
    assert "(set at enqueue): passed, the job was cancelled (deadline passed at " in line
