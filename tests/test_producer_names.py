"""Producers and task names they have no declaration for; `emit_event`'s one return type."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
import trio

import trioq
from tests.support import make_app, running_worker, sql_rows
from trioq.producer import AsyncProducer, SyncProducer


def ready_tasks(pg_url: str, pg_schema: str) -> list[str]:
    return [row[0] for row in sql_rows(pg_url, f"SELECT task FROM {pg_schema}.jobs ORDER BY id")]


async def migrated(pg_url: str, pg_schema: str) -> trioq.App:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True):
        pass
    return app


async def test_a_name_no_worker_serves_warns_once_with_the_fix(pg_url: str, pg_schema: str) -> None:
    await migrated(pg_url, pg_schema)

    def web_request() -> list[warnings.WarningMessage]:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                producer.enqueue("sned_reply", {"n": 1})
                producer.enqueue("sned_reply", {"n": 2})
                producer.enqueue_many("sned_reply", [{"n": 3}])
            return caught

    caught = await trio.to_thread.run_sync(web_request)
    assert [w.category for w in caught] == [trioq.UnservedTaskWarning]
    message = str(caught[0].message)
    assert "'sned_reply'" in message and "no live worker serves it" in message
    assert "a misspelt name?" in message and "TaskDeclaration" in message
    assert caught[0].filename == __file__  # points at the caller's enqueue
    assert ready_tasks(pg_url, pg_schema) == ["sned_reply"] * 3  # a warning, not a refusal


async def test_strict_producer_refuses_an_unserved_name_before_writing(
    pg_url: str, pg_schema: str
) -> None:
    await migrated(pg_url, pg_schema)

    async def fastapi_handler() -> None:
        async with AsyncProducer(pg_url, schema=pg_schema, strict=True) as producer:
            await producer.enqueue("sned_reply", {})

    with pytest.raises(trioq.UnknownTask, match=r"'sned_reply': no declaration .* no live worker"):
        await trio.to_thread.run_sync(asyncio.run, fastapi_handler())
    assert ready_tasks(pg_url, pg_schema) == []


async def test_a_name_a_live_worker_serves_needs_no_declaration(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("send_reply", queue="replies")
    async def send_reply(ctx: trioq.Context, payload: Any) -> None:
        return None

    def web_request() -> int:
        with SyncProducer(pg_url, schema=pg_schema, strict=True) as producer:
            return producer.enqueue("send_reply", {}, queue="replies").id

    async with app.client(migrate=True) as client, running_worker(app, ["replies"]):
        job_id = await trio.to_thread.run_sync(web_request)
        record = await client.wait_final(job_id, timeout=20)
    assert record.state == "completed"


async def test_emit_event_returns_one_type_from_client_producers_and_sql(
    pg_url: str, pg_schema: str
) -> None:
    app = await migrated(pg_url, pg_schema)

    def sync_emits() -> list[trioq.EventOutcome]:
        with SyncProducer(pg_url, schema=pg_schema) as producer:
            return [producer.emit_event("e:sync", 1), producer.emit_event("e:sync", 2)]

    async def asyncio_emits() -> list[trioq.EventOutcome]:
        async with AsyncProducer(pg_url, schema=pg_schema) as producer:
            return [await producer.emit_event("e:aio", 1), await producer.emit_event("e:aio", 2)]

    async with app.client() as client:
        from_client = [await client.emit_event("e:trio", 1), await client.emit_event("e:trio", 2)]
    outcomes = [
        from_client,
        await trio.to_thread.run_sync(sync_emits),
        await trio.to_thread.run_sync(asyncio.run, asyncio_emits()),
    ]
    for first, again in outcomes:
        assert (first, again) == (trioq.EventOutcome(True, 0), trioq.EventOutcome(False, 0))
    with pytest.raises(TypeError, match=r"test \.first"):
        bool(from_client[0])  # `if await client.emit_event(...)` cannot silently mean "always"
    [row] = sql_rows(pg_url, f"SELECT * FROM {pg_schema}.event_emit('e:sql', '1')")
    assert row == (True, 0)  # the same two fields: emitted_first, woken_count
