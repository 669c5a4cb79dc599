"""Which max_attempts wins: the enqueue's own, then the declaration the enqueuer passed, then the
worker's task declaration (docs/producers.md, "Which option wins"); and a declaration that
gives two different numbers is refused where it is written."""

from __future__ import annotations

import pytest
import trio

import trioq
from tests.support import make_app, running_worker, scalar
from trioq.producer import SyncProducer, TaskDeclaration, declare_task


def flaky_app(pg_url: str, pg_schema: str) -> tuple[trioq.App, list[int]]:
    """An app whose `flaky` task (declared with 2 attempts) always fails; it records each run."""
    app = make_app(pg_url, pg_schema)
    runs: list[int] = []

    @app.task("flaky", max_attempts=2, retry=trioq.RetryPolicy(base_seconds=0, jitter=0))
    async def flaky(ctx: trioq.Context, payload: object) -> None:
        runs.append(ctx.job.max_attempts)
        raise RuntimeError("always")

    return app, runs


async def produce(pg_url: str, pg_schema: str, task: str | TaskDeclaration, **options: int) -> int:
    """Enqueue from a SyncProducer that declares nothing (in a thread: it blocks). No worker
    runs yet, so a task named only by a string draws the producer's unserved-name warning."""

    def enqueue() -> int:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            if not isinstance(task, str):
                return producer.enqueue(task, {}, **options).id
            with pytest.warns(trioq.UnservedTaskWarning, match=repr(task)):
                return producer.enqueue(task, {}, **options).id

    return await trio.to_thread.run_sync(enqueue)


async def attempts_of(pg_url: str, pg_schema: str, job_id: int) -> int:
    return int(
        await scalar(
            pg_url, f"SELECT count(*) FROM {pg_schema}.attempts WHERE job_id = %s", [job_id]
        )
    )


async def test_a_job_enqueued_by_name_runs_the_attempts_its_worker_declares(
    pg_url: str, pg_schema: str
) -> None:
    """A producer that knows the task only by name, and plain SQL, store no max_attempts: the
    worker's `@app.task(max_attempts=2)` applies (it used to be the producer's default, 5)."""
    app, runs = flaky_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        by_name = await produce(pg_url, pg_schema, "flaky")
        from_sql = await scalar(pg_url, f"SELECT {pg_schema}.enqueue('flaky')")
        # ::int: an array of the column's domain (migration 0032) has no client-side loader.
        stored = await scalar(
            pg_url,
            f"SELECT array_agg(max_attempts::int) FROM {pg_schema}.jobs WHERE id IN (%s, %s)",
            [by_name, from_sql],
        )
        assert stored == [None, None]
        async with running_worker(app):
            with trio.fail_after(20):
                for job_id in (by_name, from_sql):
                    await client.wait_final(job_id)
        for job_id in (by_name, from_sql):
            record = await client.get_job(job_id)
            assert record is not None
            assert (record.state, record.attempt, record.max_attempts) == ("failed", 2, 2)
            assert await attempts_of(pg_url, pg_schema, job_id) == 2
    assert runs == [2, 2, 2, 2]  # ctx.job.max_attempts says the same


async def test_the_enqueue_option_and_the_enqueuers_declaration_win_over_the_workers(
    pg_url: str, pg_schema: str
) -> None:
    app, _ = flaky_app(pg_url, pg_schema)
    three = declare_task("flaky", max_attempts=3)
    async with app.client(migrate=True) as client:
        declared = await produce(pg_url, pg_schema, three)
        explicit = await produce(pg_url, pg_schema, three, max_attempts=1)
        own_app = (await client.enqueue("flaky", {})).id  # the app's own task: the worker's
        async with running_worker(app):
            with trio.fail_after(20):
                for job_id in (declared, explicit, own_app):
                    await client.wait_final(job_id)
        counts = [
            await attempts_of(pg_url, pg_schema, job_id) for job_id in (declared, explicit, own_app)
        ]
    assert counts == [3, 1, 2]


def test_max_attempts_and_a_retry_policys_max_attempts_that_disagree_are_refused() -> None:
    app = trioq.App()
    with pytest.raises(ValueError, match=r"task 'a': max_attempts = 5 and retry=RetryPolicy"):
        app.task("a", max_attempts=5, retry=trioq.RetryPolicy(max_attempts=2))
    declaration = declare_task("b", max_attempts=4)
    with pytest.raises(ValueError, match=r"TaskDeclaration's max_attempts = 4 disagree"):
        app.task(declaration, retry=trioq.RetryPolicy(max_attempts=2))
    assert app.tasks == {}


def test_the_task_attempts_come_from_whichever_declaration_gives_them() -> None:
    app = trioq.App()

    async def handler(ctx: trioq.Context, payload: object) -> None:
        return None

    app.task("retry_only", retry=trioq.RetryPolicy(max_attempts=2))(handler)
    app.task("agree", max_attempts=3, retry=trioq.RetryPolicy(max_attempts=3))(handler)
    app.task(declare_task("shared", max_attempts=4))(handler)
    app.task(declare_task("overridden", max_attempts=4), max_attempts=6)(handler)
    app.task("nothing")(handler)
    attempts = {name: spec.max_attempts for name, spec in app.tasks.items()}
    assert attempts == {"retry_only": 2, "agree": 3, "shared": 4, "overridden": 6, "nothing": 5}
