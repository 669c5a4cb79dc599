"""The otel extra: the enqueuer's trace context is stored with the job, the handler runs in a
span linked to it, and the failure line names the trace; without it nothing is imported."""

from __future__ import annotations

import logging
import subprocess
import sys

import opentelemetry.trace as trace
import psycopg
import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import trioq
from tests.support import expire_lease, in_thread, make_app, running_worker, scalar
from trioq._runtime.services.logs import JOB_LOGGER
from trioq._seam.services import MaintenancePass


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """A real SDK tracer provider for this test only (the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(trace, "get_tracer", provider.get_tracer)
    return exporter


async def test_handler_span_links_to_the_enqueuers_trace(
    pg_url: str, pg_schema: str, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("work", max_attempts=2, retry=trioq.RetryPolicy(base_seconds=0.01, jitter=0))
    async def work(ctx: trioq.Context, payload: object) -> str:
        with trace.get_tracer("handler").start_as_current_span("inside"):
            if ctx.job.attempt == 1:
                raise ValueError("first attempt fails")
        return "ok"

    caplog.set_level(logging.INFO, logger=JOB_LOGGER)
    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        with trace.get_tracer("producer").start_as_current_span("request") as request:
            job = await client.enqueue("work", {})
        stored = await client.driver.job_trace_context(job.id)
        with trio.fail_after(10):
            assert await client.wait_result(job.id) == "ok"
        attempts = await client.attempts(job.id)
    producer = request.get_span_context()
    assert stored is not None and stored.startswith(f"00-{producer.trace_id:032x}-")
    runs = [s for s in spans.get_finished_spans() if s.name == "trioq.job work"]
    assert len(runs) == 2  # one span per attempt
    for run in runs:
        assert run.kind == trace.SpanKind.CONSUMER
        assert [link.context.span_id for link in run.links] == [producer.span_id]
        assert run.attributes is not None and run.attributes["trioq.job.id"] == job.id
    inside = [s for s in spans.get_finished_spans() if s.name == "inside"]
    assert {s.parent.span_id for s in inside if s.parent} == {r.context.span_id for r in runs}
    [line] = [r for r in caplog.records if r.name == JOB_LOGGER]
    failed_run = next(r for r in runs if r.attributes and r.attributes["trioq.job.attempt"] == 1)
    assert line.trace_id == f"{failed_run.context.trace_id:032x}"  # type: ignore[attr-defined]
    # The attempt's history row stores the same trace id as the log line.
    [attempt] = attempts
    assert (attempt.outcome, attempt.trace_id) == ("retried", line.trace_id)  # type: ignore[attr-defined]


async def test_sql_enqueue_stores_the_callers_traceparent_and_refuses_a_malformed_one(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with app.client(migrate=True) as client:
        job_id = await scalar(
            pg_url, f"SELECT {pg_schema}.enqueue('work', traceparent => %s)", [traceparent]
        )
        assert await client.driver.job_trace_context(job_id) == traceparent
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="traceparent: "):
            await scalar(pg_url, f"SELECT {pg_schema}.enqueue('work', traceparent => 'x-y')")


def test_without_the_extra_configured_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys, trioq, trioq.cli, trioq._runtime.services.worker, trioq._enqueue.rows;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_jobs_run_untraced_when_no_tracer_provider_is_configured(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("work")
    async def work(ctx: trioq.Context, payload: object) -> str:
        return "ok"

    async with app.client(migrate=True) as client, running_worker(app, ["default"]):
        job = await client.enqueue("work", {})
        with trio.fail_after(10):
            assert await client.wait_result(job.id) == "ok"
        assert await client.driver.job_trace_context(job.id) is None
        # Only the line above read it: the worker fetched no trace context for its handler.
        assert client.driver.statistics().calls["job_trace_context"] == 1


async def test_a_lost_attempt_stores_the_trace_id_of_the_span_that_lost_it(
    pg_url: str, pg_schema: str, spans: InMemorySpanExporter
) -> None:
    """Lease recovery never sees a dead worker's span, yet the lost attempt's row names its
    trace: the span's trace id is the lease token, which the recovery writes."""
    app = make_app(pg_url, pg_schema)
    ended = trio.Event()

    @app.task("stalls", max_attempts=1)
    async def stalls(ctx: trioq.Context, payload: object) -> None:
        # The worker "dies" for the database: its lease runs out and the leader recovers it.
        await in_thread(expire_lease, pg_url, pg_schema, [ctx.job.id])
        report = await ctx_client.driver.maintenance_pass(MaintenancePass())
        assert report.recovered == ((ctx.job.id, "failed"),)

    hooks = trioq.WorkerHooks(on_job_end=lambda job, outcome: ended.set())
    async with (
        app.client(migrate=True) as ctx_client,
        running_worker(app, hooks=hooks, lease_seconds=60),
    ):
        job = await ctx_client.enqueue("stalls", {})
        with trio.fail_after(10):
            await ended.wait()
        attempts = await ctx_client.attempts(job.id)
    [run] = [s for s in spans.get_finished_spans() if s.name == "trioq.job stalls"]
    [attempt] = attempts
    assert attempt.outcome == "lost"
    assert attempt.trace_id == f"{run.context.trace_id:032x}"
