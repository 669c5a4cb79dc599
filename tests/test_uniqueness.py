"""Uniqueness on PostgreSQL: keys free once their job finishes (or after `unique_for`), race-free
release, keys in batches, and `{schema}.enqueue(...)` from SQL and from a trigger."""

from __future__ import annotations

import collections
import datetime
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq
from tests.support import make_app, running_worker, scalar, sql_rows


def add_echo(app: trioq.App, done: collections.Counter[Any] | None = None) -> None:
    @app.task("echo")
    async def echo(ctx: trioq.Context, payload: Any) -> Any:
        if done is not None:
            done[ctx.job.id] += 1
        return payload


async def test_concurrent_enqueues_of_a_released_key_make_exactly_one_job(
    pg_url: str, pg_schema: str
) -> None:
    """The key's holder has finished: 30 racing enqueues each try to release it; one wins."""
    app = make_app(pg_url, pg_schema, pool_size=15)
    add_echo(app)
    async with app.client(migrate=True) as client:
        old = await client.enqueue("echo", {"n": "old"}, dedup_key="k")
        await client.cancel(old.id)
        results: list[trioq.Job] = []

        async def enqueue_one(n: int) -> None:
            results.append(await client.enqueue("echo", {"n": n}, dedup_key="k"))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(30):
                    nursery.start_soon(enqueue_one, n)
    created = [job for job in results if job.created]
    assert len(created) == 1
    assert {job.id for job in results} == {created[0].id}
    rows = sql_rows(pg_url, f"SELECT id, state, dedup_key FROM {pg_schema}.jobs ORDER BY id")
    assert rows == [(old.id, "cancelled", None), (created[0].id, "ready", "k")]


async def test_enqueue_many_takes_a_key_per_payload_and_reports_which_were_created(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    async with app.client(migrate=True) as client:
        [held] = await client.enqueue_many("echo", [{"n": 0}], dedup_keys=["a"])
        jobs = await client.enqueue_many(
            "echo", [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}], dedup_keys=["a", "b", None, "b"]
        )
    assert [job.created for job in jobs] == [False, True, True, False]
    assert jobs[0].id == held.id and jobs[3].id == jobs[1].id
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.jobs") == 3


async def test_completed_job_within_unique_for_returns_it_and_frees_after(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    async with app.client(migrate=True) as client:
        first = await client.enqueue(
            "echo", {"n": 1}, dedup_key="digest", unique_for=datetime.timedelta(hours=1)
        )
        async with running_worker(app):
            await client.wait_result(first.id, timeout=10)
        again = await client.enqueue(
            "echo", {"n": 2}, dedup_key="digest", unique_for=datetime.timedelta(hours=1)
        )
        # Move the first job's window into the past, as an hour passing would.
        await scalar(
            pg_url,
            f"UPDATE {pg_schema}.jobs SET unique_until = now() - interval '1 s' "
            "WHERE id = %s RETURNING id",
            (first.id,),
        )
        later = await client.enqueue(
            "echo", {"n": 3}, dedup_key="digest", unique_for=datetime.timedelta(hours=1)
        )
    assert (again.id, again.created) == (first.id, False)
    assert later.created and later.id != first.id


async def test_sql_enqueue_function_enqueues_from_a_trigger_in_the_same_transaction(
    pg_url: str, pg_schema: str
) -> None:
    """An INSERT into the application's own table enqueues a job through a trigger; rolled
    back, there is no job; committed, a worker runs it."""
    app = make_app(pg_url, pg_schema)
    done: collections.Counter[Any] = collections.Counter()
    add_echo(app, done)
    schema = sql.Identifier(pg_schema)
    async with app.client(migrate=True) as client:
        with psycopg.connect(pg_url) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {s}.signups (email text PRIMARY KEY);"
                    "CREATE FUNCTION {s}.signup_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN PERFORM {s}.enqueue('echo', jsonb_build_object('email', NEW.email),"
                    " dedup_key => 'welcome:' || NEW.email); RETURN NEW; END $$;"
                    "CREATE TRIGGER signup_enqueue AFTER INSERT ON {s}.signups"
                    " FOR EACH ROW EXECUTE FUNCTION {s}.signup_enqueue();"
                ).format(s=schema)
            )
            conn.commit()
            conn.execute(sql.SQL("INSERT INTO {}.signups VALUES ('lost@x')").format(schema))
            conn.rollback()
            conn.execute(sql.SQL("INSERT INTO {}.signups VALUES ('ada@x')").format(schema))
            conn.commit()
        rows = sql_rows(pg_url, f"SELECT id, payload, dedup_key, state FROM {pg_schema}.jobs")
        assert [row[1:] for row in rows] == [({"email": "ada@x"}, "welcome:ada@x", "ready")]
        async with running_worker(app):
            result = await client.wait_result(rows[0][0], timeout=10)
    assert result == {"email": "ada@x"}
    assert done == {rows[0][0]: 1}


async def test_sql_enqueue_function_returns_the_holder_of_a_taken_key(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    async with app.client(migrate=True) as client:
        job = await client.enqueue("echo", {"n": 1}, dedup_key="once")
    call = f"SELECT {pg_schema}.enqueue('echo', '{{}}', queue => 'other', dedup_key => %s)"
    assert await scalar(pg_url, call, ("once",)) == job.id
    fresh = await scalar(pg_url, call, ("twice",))
    assert fresh != job.id
    assert sql_rows(pg_url, f"SELECT queue FROM {pg_schema}.jobs WHERE id = %s", (fresh,)) == [
        ("other",)
    ]
