"""trioq.testing's public helpers, used the way an application's own tests would use them."""

from __future__ import annotations

import textwrap
from typing import Any

import attrs
import pytest

import trioq
from trioq.testing import assert_enqueued, drain, enqueued_jobs, refute_enqueued, run_job


@attrs.frozen
class Invoice:
    customer: str
    cents: int


class Flaky(Exception):
    pass


def build_app(schema: str = "helpers", url: str | None = None) -> trioq.App:
    app = trioq.App(url, schema=schema)

    @app.task("bill", max_attempts=3, retry=trioq.RetryPolicy(base_seconds=0.01, max_seconds=0.01))
    async def bill(ctx: trioq.Context, payload: Invoice) -> dict[str, Any]:
        if payload.customer == "flaky" and ctx.job.attempt == 1:
            raise Flaky("first attempt fails")
        if payload.customer == "broken":
            raise ValueError("card declined")
        async with app.client() as client:  # the worker's client: a follow-up job
            await client.enqueue("receipt", {"customer": payload.customer}, queue="mail")
        return {"charged": payload.cents, "attempt": ctx.job.attempt}

    @app.task("receipt", queue="mail")
    async def receipt(ctx: trioq.Context, payload: dict[str, Any]) -> str:
        return f"sent to {payload['customer']}"

    return app


async def test_run_job_returns_the_result_without_a_database() -> None:
    result = await run_job(build_app(), "bill", {"customer": "ada", "cents": 500})
    assert result == {"charged": 500, "attempt": 1}


async def test_run_job_retries_with_the_tasks_policy() -> None:
    result = await run_job(build_app(), "bill", Invoice("flaky", 1))
    assert result == {"charged": 1, "attempt": 2}


async def test_run_job_raises_job_failed_with_the_handlers_error_and_traceback() -> None:
    with pytest.raises(trioq.JobFailed) as caught:
        await run_job(build_app(), "bill", {"customer": "broken", "cents": 1})
    assert "ended failed: builtins.ValueError: card declined" in str(caught.value)
    assert any("card declined" in note for note in caught.value.__notes__)
    assert caught.value.job.attempt == 3


async def test_run_job_refuses_a_bad_payload_before_running_anything() -> None:
    with pytest.raises(trioq.PayloadError, match="expected int"):
        await run_job(build_app(), "bill", {"customer": "ada", "cents": "500"})


async def test_drain_runs_jobs_and_the_jobs_they_enqueue_then_assert_enqueued(
    pg_url: str, pg_schema: str
) -> None:
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await client.enqueue("bill", Invoice("ada", 100))
        await client.enqueue("bill", Invoice("bob", 200))
        await assert_enqueued(client, "bill", payload={"customer": "ada"}, count=1)
        await refute_enqueued(client, "receipt")
        first = await drain(app, "default")
        await assert_enqueued(client, "receipt", queue="mail", count=2)
        await assert_enqueued(client, "receipt", payload={"customer": "bob"})
        second = await drain(app)  # every queue of the app's tasks
        await refute_enqueued(client, "receipt")
        done = await enqueued_jobs(client, "receipt", states=["completed"])
    assert len(first.completed) == 2 and not first.failed
    assert len(second.completed) == 2
    assert sorted(job.result for job in done) == ["sent to ada", "sent to bob"]


async def test_assert_enqueued_failure_lists_what_was_enqueued() -> None:
    app = build_app()
    async with app.client(driver=trioq.testing.MemoryDriver()) as client:
        await client.enqueue("bill", Invoice("ada", 100))
        with pytest.raises(AssertionError) as caught:
            await assert_enqueued(client, "bill", payload={"customer": "zed"})
    assert "found 0" in str(caught.value)
    assert "bill queue=default {'customer': 'ada', 'cents': 100}" in str(caught.value)


def test_pytest_plugin_gives_a_user_style_test_a_migrated_app(
    pytester: pytest.Pytester, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's project: its app module, `trioq_app = ...` in its ini, a test that enqueues a
    reference workflow and drains it on the plugin's throwaway schema."""
    monkeypatch.setenv("TRIOQ_DATABASE_URL", pg_url)
    pytester.makeini(
        "[pytest]\ntrio_mode = true\ntrioq_app = workflows.demo:app\nfilterwarnings = error\n"
    )
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            import trioq
            from trioq.testing import assert_enqueued, drain, enqueued_jobs

            async def test_reply_is_sent(trioq_app):
                async with trioq_app.client() as client:
                    job = await client.enqueue(
                        "send_reply", {"conversation_id": "c1", "text": "Done."}
                    )
                    await assert_enqueued(client, "send_reply", payload={"conversation_id": "c1"})
                    result = await drain(trioq_app, "default")
                    [record] = await enqueued_jobs(client, "send_reply", states=["completed"])
                assert result.completed == (job.id,)
                assert record.result["conversation_id"] == "c1"
                assert trioq_app.schema.startswith("test_")
            """
        )
    )
    outcome = pytester.runpytest("-q", "-p", "no:cacheprovider")
    outcome.assert_outcomes(passed=1)
