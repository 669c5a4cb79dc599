"""The App: registration rules and how errors leave `app.client()`."""

from __future__ import annotations

import psycopg
import pytest

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


def test_sync_handler_is_refused_at_registration() -> None:
    app = trioq.App(schema="x")
    with pytest.raises(TypeError, match="async"):

        @app.task("sync")
        def handler(ctx: trioq.Context, payload: object) -> None:  # type: ignore[type-var]
            return None


def test_missing_database_url_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIOQ_DATABASE_URL", raising=False)
    with pytest.raises(trioq.ConfigurationError, match="TRIOQ_DATABASE_URL"):
        trioq.App(schema="x").resolve_database_url()
