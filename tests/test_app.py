"""The App: registration rules and how errors leave `app.client()`."""

from __future__ import annotations

import attrs
import psycopg
import pytest
import trio

import trioq
from tests.support import make_app


async def test_error_raised_inside_client_block_leaves_it_unwrapped(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)
    with pytest.raises(KeyError, match="inside"):
        async with app.client(migrate=True):
            raise KeyError("inside")


async def test_migration_error_leaves_client_unwrapped(pg_url: str, pg_schema: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}; CREATE TABLE {pg_schema}.jobs (x int)")
    app = make_app(pg_url, pg_schema)
    with pytest.raises(psycopg.errors.DuplicateTable):
        async with app.client(migrate=True):
            pass


def test_registering_a_task_twice_is_refused() -> None:
    app = trioq.App(schema="x")

    @app.task("same")
    async def first(ctx: trioq.Context, payload: object) -> None:
        return None

    with pytest.raises(ValueError, match="already registered"):

        @app.task("same")
        async def second(ctx: trioq.Context, payload: object) -> None:
            return None


def test_missing_database_url_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIOQ_DATABASE_URL", raising=False)
    with pytest.raises(trioq.ConfigurationError, match="TRIOQ_DATABASE_URL"):
        trioq.App(schema="x").resolve_database_url()


async def test_unmigrated_schema_is_reported_with_the_fix(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    async with app.client() as client:
        with pytest.raises(trioq.SchemaNotMigrated, match="trioq migrate"):
            await client.enqueue("noop", {})
        with pytest.raises(trioq.SchemaNotMigrated):
            await client.queue_status()


@attrs.frozen
class Reply:
    conversation_id: str
    text: str


async def test_payload_that_does_not_fit_the_attrs_class_is_refused_at_enqueue(
    pg_url: str, pg_schema: str
) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("send_reply")
    async def send_reply(ctx: trioq.Context, payload: Reply) -> None:
        return None

    async with app.client(migrate=True) as client:
        with pytest.raises(trioq.PayloadError, match=r"\$\.text"):
            await client.enqueue("send_reply", {"conversation_id": "c1"})
        with pytest.raises(trioq.PayloadError, match=r"\[1\]\.text"):
            await client.enqueue_many("send_reply", [Reply("c1", "a"), {"conversation_id": "c2"}])
        assert sum(status.ready for status in await client.queue_status()) == 0
        job = await client.enqueue("send_reply", {"conversation_id": "c3", "text": "ok"})
        assert job.created


async def test_sibling_tasks_each_get_their_own_client(pg_url: str, pg_schema: str) -> None:
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: object) -> None:
        return None

    first_done = trio.Event()
    clients: list[trioq.Client] = []

    async def short_lived() -> None:
        async with app.client(migrate=True) as client:
            clients.append(client)
        first_done.set()

    async def long_lived() -> None:
        await first_done.wait()
        async with app.client() as client:
            clients.append(client)
            async with app.client() as nested:
                assert nested is client  # nested blocks share the outer pool
            await client.enqueue("noop", {})  # the sibling's exit did not close this pool

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(short_lived)
            nursery.start_soon(long_lived)
    assert clients[0] is not clients[1]
