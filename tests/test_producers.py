"""Producers outside trio against a real PostgreSQL: the sync producer inside the caller's
psycopg transaction, the asyncio producer under plain asyncio, enqueue by task name."""

from __future__ import annotations

import asyncio
import collections
import datetime
from typing import Any

import attrs
import psycopg
import pytest
import trio

import trioq
import trioq.producer
from tests.support import make_app, running_worker, sql_rows, wait_until
from trioq._enqueue.rows import EnqueueOptions, build_jobs
from trioq.producer import AsyncProducer, SyncProducer, declare_task


@attrs.frozen
class Reply:
    conversation_id: str
    text: str


REPLY = declare_task("send_reply", queue="replies", payload_type=Reply)


def worker_app(pg_url: str, pg_schema: str, runs: collections.Counter[Any]) -> trioq.App:
    app = make_app(pg_url, pg_schema)

    @app.task(REPLY)
    async def send_reply(ctx: trioq.Context, payload: Reply) -> dict[str, Any]:
        runs[payload.conversation_id] += 1
        return {"sent": payload.text}

    return app


async def test_sync_producer_in_a_rolled_back_transaction_leaves_no_job_and_committed_runs(
    pg_url: str, pg_schema: str
) -> None:
    runs: collections.Counter[Any] = collections.Counter()
    app = worker_app(pg_url, pg_schema, runs)

    def web_request() -> tuple[int, Any]:
        """What a Django/Flask view does: its own transaction, trioq's enqueue inside it."""
        with SyncProducer(pg_url, schema=pg_schema, tasks=[REPLY]) as producer:
            with psycopg.connect(pg_url) as conn:  # not autocommit: one transaction
                conn.execute(f"CREATE TABLE IF NOT EXISTS {pg_schema}.replies (text text)")
                conn.commit()
                conn.execute(f"INSERT INTO {pg_schema}.replies VALUES ('lost')")
                producer.enqueue(REPLY, {"conversation_id": "lost", "text": "x"}, conn=conn)
                conn.rollback()
                conn.execute(f"INSERT INTO {pg_schema}.replies VALUES ('kept')")
                job = producer.enqueue(REPLY, Reply("c1", "Done."), conn=conn)
                conn.commit()
            return job.id, producer.wait_result(job.id, timeout=20)

    async with app.client(migrate=True), running_worker(app, ["replies"]):
        with trio.fail_after(30):
            job_id, result = await trio.to_thread.run_sync(web_request)
    assert result == {"sent": "Done."}
    assert runs == {"c1": 1}
    assert sql_rows(pg_url, f"SELECT text FROM {pg_schema}.replies") == [("kept",)]
    assert sql_rows(pg_url, f"SELECT id, queue FROM {pg_schema}.jobs") == [(job_id, "replies")]


async def test_asyncio_producer_under_plain_asyncio_enqueues_and_waits_for_the_result(
    pg_url: str, pg_schema: str
) -> None:
    runs: collections.Counter[Any] = collections.Counter()
    app = worker_app(pg_url, pg_schema, runs)

    async def fastapi_handler() -> tuple[list[trioq.Job], Any, str]:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            # By name, no declaration: the queue is given.
            jobs = await producer.enqueue_many(
                "send_reply",
                [{"conversation_id": f"c{n}", "text": "hi"} for n in range(3)],
                queue="replies",
                dedup_keys=["a", "b", "a"],
            )
            result = await producer.wait_result(jobs[1].id, timeout=20)
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                later = await producer.enqueue(
                    "send_reply", {"conversation_id": "x", "text": "-"}, queue="q2", conn=conn
                )
                await conn.rollback()
            with pytest.raises(trioq.JobNotFound):
                await producer.get_job(later.id)
            state = await producer.cancel(jobs[0].id)
            return jobs, result, state

    async with app.client(migrate=True), running_worker(app, ["replies"]):
        with trio.fail_after(30):
            jobs, result, state = await trio.to_thread.run_sync(asyncio.run, fastapi_handler())
    assert [job.created for job in jobs] == [True, True, False]
    assert result == {"sent": "hi"}
    assert state in ("completed", "cancelled", "running")


async def test_asyncio_producer_emits_the_event_a_waiting_workflow_resumes_with(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("approve", queue="approvals")
    async def approve(ctx: trioq.Context, payload: dict[str, Any]) -> Any:
        key = f"approval:{payload['n']}"
        return await ctx.wait_for_event(key, timeout=datetime.timedelta(seconds=60))

    async def fastapi_handler() -> tuple[Any, Any]:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            first = await producer.emit_event("approval:1", {"approved": True})
            again = await producer.emit_event("approval:1", {"approved": False})
            return first, again

    async with app.client(migrate=True) as client, running_worker(app, ["approvals"]):
        job = await client.enqueue("approve", {"n": 1})
        with trio.fail_after(30):
            await wait_until(lambda: _state_is(client, job.id, "waiting"))
            first, again = await trio.to_thread.run_sync(asyncio.run, fastapi_handler())
            result = await client.wait_result(job.id, timeout=20)
    assert (first.first, first.woken) == (True, 1)
    assert (again.first, again.woken) == (False, 0)  # the first emit of a key wins
    assert result == {"approved": True}


async def _state_is(client: trioq.Client, job_id: int, state: str) -> bool:
    return (await client.get_job(job_id)).state == state


def test_producer_refuses_bad_input_before_any_sql(pg_url: str, pg_schema: str) -> None:
    with SyncProducer(pg_url, schema=pg_schema, tasks=[REPLY]) as producer:
        with pytest.raises(trioq.PayloadError, match=r"extra fields found \(txt\) @ \$"):
            producer.enqueue("send_reply", {"conversation_id": "c", "text": "t", "txt": 1})
        with pytest.raises(ValueError, match=r"^priority: "):
            producer.enqueue("anything", {}, priority=99999)
        with pytest.raises(ValueError, match=r"^job_id: "):
            producer.get_job("7")  # type: ignore[arg-type]
        with pytest.raises(trioq.SchemaNotMigrated, match="run `trioq migrate"):
            producer.enqueue("anything", {})


def test_producer_without_a_database_url_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIOQ_DATABASE_URL", raising=False)
    with pytest.raises(trioq.producer.ProducerError, match="TRIOQ_DATABASE_URL is not set"):
        SyncProducer()


def test_a_declaration_names_the_handler_version_its_jobs_are_for() -> None:
    v2 = declare_task("approve", queue="q", version=2)
    [job] = build_jobs(v2, [{}], EnqueueOptions(), single=True)
    assert job.version == 2
    app = trioq.App(schema="decl_versions")

    @app.task(v2)
    async def approve(ctx: trioq.Context, payload: Any) -> None: ...

    assert (app.tasks["approve"].version, app.tasks["approve"].queue) == (2, "q")
    with pytest.raises(ValueError, match=r"^version: "):
        declare_task("approve", version=0)


async def test_a_schema_older_than_this_trioq_says_run_trioq_migrate_not_undefined_column(
    pg_url: str, pg_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A producer, client or command of a newer release pointed at a schema nobody migrated:
    a column (or function) of a later migration is missing. Built here by dropping one."""
    from trioq.cli.commands import main as cli_main

    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        job = await client.enqueue(declare_task("anything", queue="default"), {})
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # The schema as the release before the job_records view left it.
            conn.execute(f"DROP VIEW {pg_schema}.job_records")
        older = rf"schema '{pg_schema}' is older than this trioq \(relation .*job_records"
        fix = rf"run `trioq migrate --schema {pg_schema}` with this release"
        with pytest.raises(trioq.SchemaNotMigrated, match=f"{older}.*{fix}"):
            await client.get_job(job.id)

    with (
        SyncProducer(pg_url, schema=pg_schema) as producer,
        pytest.raises(trioq.SchemaNotMigrated, match=f"{older}.*{fix}"),
    ):
        producer.get_job(job.id)

    async def from_asyncio() -> None:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            with pytest.raises(trioq.SchemaNotMigrated, match=f"{older}.*{fix}"):
                await producer.get_job(job.id)

    await trio.to_thread.run_sync(asyncio.run, from_asyncio())
    argv = ["job", str(job.id), "--database-url", pg_url, "--schema", pg_schema]
    assert await trio.to_thread.run_sync(cli_main, argv) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "is older than this trioq" in line and "trioq migrate" in line


def test_a_missing_function_of_a_later_migration_is_the_same_line(pg_url: str) -> None:
    from trioq._pg.errors import schema_problem

    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.UndefinedFunction) as raised,
    ):
        conn.execute("SELECT pg_catalog.trioq_no_such_function(1)")
    line = schema_problem(raised.value, "trioq")
    assert line is not None and line.startswith("schema 'trioq' is older than this trioq (")
    assert line.endswith("run `trioq migrate --schema trioq` with this release")
