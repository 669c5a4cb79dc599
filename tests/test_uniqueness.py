"""Uniqueness on PostgreSQL: keys free once their job finishes (or after `unique_for`), race-free
release, keys in batches, `{schema}.enqueue(...)` from SQL and from a trigger, and the races
the key table (job_keys) must order: two takers of one key, two retakers, a retry and a taker."""

from __future__ import annotations

import collections
import contextlib
import datetime
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

import trioq
from tests.support import (
    end_unique_window,
    in_thread,
    make_app,
    relabel_final,
    running_worker,
    scalar,
    sql_rows,
    wait_until,
)
from trioq._sql import queries


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
    # The old job keeps the key it was enqueued with; the one it holds (job_records) is gone.
    rows = sql_rows(pg_url, f"SELECT id, state, dedup_key FROM {pg_schema}.job_records ORDER BY id")
    assert rows == [(old.id, "cancelled", None), (created[0].id, "ready", "k")]
    keys = sql_rows(pg_url, f"SELECT key, job_id, task FROM {pg_schema}.job_keys")
    assert keys == [("k", created[0].id, "echo")]


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
        await in_thread(end_unique_window, pg_url, pg_schema, first.id)
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


# --- races on the key table, two sessions ordered by a held transaction ---------------------
# The first session takes what it takes and keeps its transaction open; the second is proven
# to wait for it (pg_stat_activity: waiting on a lock, in a statement on this schema) before
# the first ends. No sleeps order them.


async def _waits_on_a_lock(pg_url: str, pg_schema: str) -> None:
    async def waiting() -> bool:
        count = await scalar(
            pg_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND position(%s in query) > 0",
            (pg_schema,),
        )
        return bool(count)

    with trio.fail_after(30):
        await wait_until(waiting)


def _sql_enqueue(pg_url: str, pg_schema: str, key: str) -> int:
    """The SQL entry point, in a session of its own (run in a thread: it may wait)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        query = sql.SQL("SELECT {}.enqueue('echo', '{{}}', dedup_key => %s)").format(
            sql.Identifier(pg_schema)
        )
        row = conn.execute(query, (key,)).fetchone()
        assert row is not None
        return int(row[0])


class _Rollback(Exception):
    pass


async def _second_enqueue(
    client: trioq.Client, pg_url: str, pg_schema: str, entry: str, key: str
) -> tuple[int, bool | None]:
    """(id, created) of an enqueue of `key` through `entry`; the SQL function does not say
    whether it created the job (None)."""
    if entry == "sql":
        return await trio.to_thread.run_sync(_sql_enqueue, pg_url, pg_schema, key), None
    job = await client.enqueue("echo", {"n": 2}, dedup_key=key)
    return job.id, job.created


@pytest.mark.parametrize("entry", ["client", "sql"])
@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
async def test_an_enqueue_of_a_key_another_transaction_just_took_waits_for_it(
    pg_url: str, pg_schema: str, entry: str, first_ends: str
) -> None:
    """A new key: the second enqueuer waits for the first's transaction, then returns its job
    (created False) though its snapshot began before that job was committed; if the first
    rolled back, the second creates the job."""
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    async with app.client(migrate=True) as client:
        taken, end = trio.Event(), trio.Event()
        first: list[trioq.Job] = []
        second: list[tuple[int, bool | None]] = []

        async def take_and_hold() -> None:
            with contextlib.suppress(_Rollback):
                async with client.transaction() as tx:
                    first.append(await tx.enqueue("echo", {"n": 1}, dedup_key="new"))
                    taken.set()
                    await end.wait()
                    if first_ends == "rollback":
                        raise _Rollback

        async def enqueue_second() -> None:
            await taken.wait()
            second.append(await _second_enqueue(client, pg_url, pg_schema, entry, "new"))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_and_hold)
                nursery.start_soon(enqueue_second)
                await taken.wait()
                await _waits_on_a_lock(pg_url, pg_schema)
                assert second == []
                end.set()
    [(second_id, second_created)] = second
    jobs = sql_rows(pg_url, f"SELECT id FROM {pg_schema}.job_records WHERE dedup_key = 'new'")
    if first_ends == "commit":
        assert second_id == first[0].id and second_created in (False, None)
        assert jobs == [(first[0].id,)]
    else:
        assert second_id != first[0].id and second_created in (True, None)
        assert jobs == [(second_id,)]
    assert sql_rows(pg_url, f"SELECT key, job_id FROM {pg_schema}.job_keys") == [
        ("new", jobs[0][0])
    ]


@pytest.mark.parametrize("entry", ["client", "sql"])
async def test_two_enqueuers_retaking_a_released_key_create_one_job(
    pg_url: str, pg_schema: str, entry: str
) -> None:
    """The key's holder was cancelled (it no longer holds it). The first enqueuer takes it
    over and holds its transaction open; the second waits, then finds the first's job (which
    its snapshot cannot see) holding the key and returns it: one new job, not two."""
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    async with app.client(migrate=True) as client:
        old = await client.enqueue("echo", {"n": 0}, dedup_key="retaken")
        await client.cancel(old.id)
        taken, end = trio.Event(), trio.Event()
        first: list[trioq.Job] = []
        second: list[tuple[int, bool | None]] = []

        async def take_and_hold() -> None:
            async with client.transaction() as tx:
                first.append(await tx.enqueue("echo", {"n": 1}, dedup_key="retaken"))
                taken.set()
                await end.wait()

        async def enqueue_second() -> None:
            await taken.wait()
            second.append(await _second_enqueue(client, pg_url, pg_schema, entry, "retaken"))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_and_hold)
                nursery.start_soon(enqueue_second)
                await taken.wait()
                await _waits_on_a_lock(pg_url, pg_schema)
                assert second == []
                end.set()
    assert first[0].created and first[0].id != old.id
    [(second_id, second_created)] = second
    assert second_id == first[0].id and second_created in (False, None)
    rows = sql_rows(pg_url, f"SELECT id, dedup_key FROM {pg_schema}.job_records ORDER BY id")
    assert rows == [(old.id, None), (first[0].id, "retaken")]


async def test_a_retry_and_an_enqueue_racing_for_the_key_of_a_failed_job_leave_one_holder(
    pg_url: str, pg_schema: str
) -> None:
    """A failed job no longer holds its key. Retried first (transaction held open), it holds
    the key again and the enqueue that waited returns it; enqueued first, the new job takes
    the key and the retry that waited runs the old job without one. Never two holders."""
    app = make_app(pg_url, pg_schema)
    add_echo(app)
    retry = queries(pg_schema)["job_retry"]
    async with app.client(migrate=True) as client:
        failed = [
            await client.enqueue("echo", {"n": n}, dedup_key=f"k{n}", max_attempts=1)
            for n in (1, 2)
        ]
        for job in failed:
            await client.cancel(job.id)
            await in_thread(relabel_final, pg_url, pg_schema, job.id, "failed")

        # Retry first: a session retries k1's job and holds its transaction open.
        with psycopg.connect(pg_url) as holder:
            holder.execute(retry, {"id": failed[0].id})
            enqueued: list[trioq.Job] = []
            async with trio.open_nursery() as nursery:

                async def enqueue_k1() -> None:
                    enqueued.append(await client.enqueue("echo", {"n": 3}, dedup_key="k1"))

                nursery.start_soon(enqueue_k1)
                await _waits_on_a_lock(pg_url, pg_schema)
                assert enqueued == []
                holder.commit()
        assert (enqueued[0].id, enqueued[0].created) == (failed[0].id, False)

        # Enqueue first: k2 is taken by a new job in a held transaction; the retry waits.
        taken, end = trio.Event(), trio.Event()
        new: list[trioq.Job] = []
        retried: list[str] = []

        async def take_and_hold() -> None:
            async with client.transaction() as tx:
                new.append(await tx.enqueue("echo", {"n": 4}, dedup_key="k2"))
                taken.set()
                await end.wait()

        async def retry_k2() -> None:
            await taken.wait()
            retried.append(await client.retry(failed[1].id))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take_and_hold)
                nursery.start_soon(retry_k2)
                await taken.wait()
                await _waits_on_a_lock(pg_url, pg_schema)
                assert retried == []
                end.set()
        assert new[0].created and retried == ["ready"]
    rows = sql_rows(pg_url, f"SELECT id, state, dedup_key FROM {pg_schema}.job_records ORDER BY id")
    assert rows == [
        (failed[0].id, "ready", "k1"),
        (failed[1].id, "ready", None),
        (new[0].id, "ready", "k2"),
    ]
    assert sql_rows(pg_url, f"SELECT key, job_id FROM {pg_schema}.job_keys ORDER BY key") == [
        ("k1", failed[0].id),
        ("k2", new[0].id),
    ]
    # The retried job's own column too: it runs without a key, not with one it does not hold.
    assert sql_rows(
        pg_url, f"SELECT dedup_key FROM {pg_schema}.jobs WHERE id = %s", (failed[1].id,)
    ) == [(None,)]
