"""The SQL entry points (`enqueue()`, `send()`, `event_emit()`) refuse what the Python producers
refuse, with the same text; and a stored value the worker cannot decode (written past them,
straight into a table) fails only the job that waits for it, with a PayloadError."""

from __future__ import annotations

import datetime
import json
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

import trioq
from tests.support import make_app, running_worker, scalar, wait_until
from trioq._core import codec
from trioq._core.errors import PayloadError

DEEP = "[" * 3000 + "]" * 3000  # as a SQL producer could write it


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def python_refusal(value: Any, root: str) -> str:
    with pytest.raises(PayloadError) as refused:
        codec.encode(value, root=root)
    return refused.value.reason


def sql_refusal(conn: psycopg.Connection[Any], query: sql.Composed, params: Any) -> str:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute(query, params)
    return str(refused.value.diag.message_primary)


async def _migrated_job(pg_url: str, pg_schema: str) -> int:
    app = make_app(pg_url, pg_schema)
    async with app.client(migrate=True) as client:
        return (await client.enqueue(trioq.declare_task("noop"), {})).id


def test_sql_entry_points_refuse_a_3000_deep_value_as_python_does(
    pg_url: str, pg_schema: str
) -> None:
    job = trio.run(_migrated_job, pg_url, pg_schema)
    s = sql.Identifier(pg_schema)
    calls = {
        "$": sql.SQL("SELECT {}.enqueue('noop', %s::jsonb)").format(s),
        "payload": sql.SQL("SELECT {}.event_emit('deep-event', %s::jsonb)").format(s),
    }
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for root, query in calls.items():
            assert (
                sql_refusal(conn, query, (DEEP,)) == f"payload {root}: nested deeper than 64 levels"
            )
        send = sql.SQL("SELECT {}.send(%s, 'topic', %s::jsonb)").format(s)
        message = sql_refusal(conn, send, (job, DEEP))
        assert message == "payload payload: nested deeper than 64 levels"
        # The same reason Python gives, and the same boundary: 65 levels pass, 66 do not.
        assert message.endswith(python_refusal(nested(66), "payload"))
        codec.encode(nested(65))
        conn.execute(calls["$"], (json.dumps(nested(65)),))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(calls["$"], (json.dumps(nested(66)),))
        stored = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {}.messages UNION ALL SELECT count(*) FROM {}.events"
            ).format(s, s)
        ).fetchall()
    assert stored == [(0,), (0,)]


def test_sql_events_and_messages_have_the_python_size_limit(pg_url: str, pg_schema: str) -> None:
    """One limit, 1,000,000 bytes of compact JSON, as the Python producers measure it: a value
    PostgreSQL writes longer (a space after each ',' and ':') but that is under it compacted
    passes both."""
    job = trio.run(_migrated_job, pg_url, pg_schema)
    s = sql.Identifier(pg_schema)
    emit = sql.SQL("SELECT emitted_first FROM {}.event_emit(%s, %s::jsonb)").format(s)
    send = sql.SQL("SELECT {}.send(%s, 'topic', %s::jsonb)").format(s)
    enqueue = sql.SQL("SELECT {}.enqueue('noop', %s::jsonb)").format(s)
    too_big = "x" * (codec.MAX_PAYLOAD_BYTES - 1)  # 1,000,001 bytes with its quotes
    expected = python_refusal(too_big, "payload")
    wide = [0] * 499_999  # 999,999 bytes compact; 1,499,998 as PostgreSQL writes it
    codec.encode(wide, root="payload")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for query, params in [
            (emit, ("big-event", json.dumps(too_big))),
            (send, (job, json.dumps(too_big))),
        ]:
            assert sql_refusal(conn, query, params) == f"payload payload: {expected}"
        assert sql_refusal(conn, enqueue, (json.dumps(too_big),)) == (
            f"payload $: {python_refusal(too_big, '$')}"
        )
        assert conn.execute(emit, ("wide-event", json.dumps(wide))).fetchone() == (True,)
        assert conn.execute(send, (job, json.dumps(wide))).fetchone() is not None
        assert conn.execute(enqueue, (json.dumps(wide),)).fetchone() is not None


async def test_an_undecodable_event_or_message_fails_only_the_job_that_waits_for_it(
    pg_url: str, pg_schema: str
) -> None:
    """Written straight into the tables (past the SQL entry points, as a role with INSERT on
    them could): the waiting job fails with a PayloadError through its normal settle; the
    worker and the other jobs go on."""
    app = make_app(pg_url, pg_schema)

    @app.task("on_event", max_attempts=1)
    async def on_event(ctx: trioq.Context, payload: str) -> Any:
        return await ctx.wait_for_event(payload, timeout=datetime.timedelta(hours=1))

    @app.task("on_message", max_attempts=1)
    async def on_message(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("topic", timeout=datetime.timedelta(hours=1))

    @app.task("noop", max_attempts=1)
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "done"

    async with app.client(migrate=True) as client:
        # Stored before the waits start...
        await scalar(
            pg_url,
            f"INSERT INTO {pg_schema}.events (key, payload, emitted_at, created_at) "
            "VALUES ('deep-before', %s::jsonb, now(), now()) RETURNING 1",
            (DEEP,),
        )
        early_event = await client.enqueue("on_event", "deep-before")
        early_message = await client.enqueue("on_message", {})
        await scalar(
            pg_url,
            f"INSERT INTO {pg_schema}.messages (job_id, topic, payload, created_at) "
            "VALUES (%s, 'topic', %s::jsonb, now()) RETURNING 1",
            (early_message.id, DEEP),
        )
        others = await client.enqueue_many("noop", [None] * 10)
        fine_event = await client.enqueue("on_event", "fine")
        await client.emit_event("fine", {"ok": 1})
        async with running_worker(app, concurrency=4) as worker:
            with trio.fail_after(30):
                failures = {}
                for job in (early_event, early_message):
                    with pytest.raises(trioq.JobFailed) as failed:
                        await client.wait_result(job.id)
                    failures[job.id] = str(failed.value.job.error)
                for job in others:
                    assert await client.wait_result(job.id) == "done"
                assert await client.wait_result(fine_event.id) == {"ok": 1}
            assert worker.statistics().loops  # still running
    for error in failures.values():
        assert "PayloadError" in error and "cannot be decoded" in error


async def test_an_undecodable_value_delivered_to_a_suspended_wait_fails_that_job_on_replay(
    pg_url: str, pg_schema: str
) -> None:
    """The event or message resolved a wait that had suspended the job (its history holds
    it): the next execution fails with a PayloadError at that wait; the others complete."""
    app = make_app(pg_url, pg_schema)

    @app.task("on_event", max_attempts=1)
    async def on_event(ctx: trioq.Context, payload: str) -> Any:
        await ctx.step("before", lambda: 1)
        return await ctx.wait_for_event(payload, timeout=datetime.timedelta(hours=1))

    @app.task("on_message", max_attempts=1)
    async def on_message(ctx: trioq.Context, payload: object) -> Any:
        return await ctx.receive("topic", timeout=datetime.timedelta(hours=1))

    @app.task("noop", max_attempts=1)
    async def noop(ctx: trioq.Context, payload: object) -> str:
        return "done"

    async with app.client(migrate=True) as client:
        event_job = await client.enqueue("on_event", "deep-later")
        message_job = await client.enqueue("on_message", {})
        async with running_worker(app, concurrency=4):
            with trio.fail_after(30):
                await wait_until(lambda: _all_waiting(pg_url, pg_schema, 2))
            # What event_emit and send do for a waiting job, with a value they would refuse.
            await scalar(
                pg_url,
                f"""WITH values AS (
                        UPDATE {pg_schema}.checkpoints c
                        SET value = CASE c.kind
                            WHEN 'event' THEN jsonb_build_object('payload', %(deep)s::jsonb)
                            ELSE jsonb_build_object('messages',
                                                    jsonb_build_array(%(deep)s::jsonb)) END
                        WHERE c.kind IN ('event', 'receive') RETURNING c.job_id)
                    UPDATE {pg_schema}.job_rows_legacy j
                    SET phase = 'ready', filed = j.filed + 1, run_at = now(), wait_event_key = NULL,
                        wait_topic = NULL, wait_position = NULL
                    WHERE j.id IN (SELECT job_id FROM values) RETURNING 1""",
                {"deep": DEEP},
            )
            others = await client.enqueue_many("noop", [None] * 10)
            with trio.fail_after(30):
                errors = []
                for job in (event_job, message_job):
                    with pytest.raises(trioq.JobFailed) as failed:
                        await client.wait_result(job.id)
                    errors.append(str(failed.value.job.error))
                for job in others:
                    assert await client.wait_result(job.id) == "done"
    assert all("PayloadError" in error and "cannot be decoded" in error for error in errors)


async def _all_waiting(pg_url: str, pg_schema: str, count: int) -> bool:
    waiting = await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs WHERE state = 'waiting'")
    return bool(waiting == count)
