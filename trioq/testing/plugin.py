"""trioq's pytest plugin (registered through the `pytest11` entry point).

Fixtures, all lazy (a test that uses none of them starts nothing):

- `trioq_database_url` (session): `TRIOQ_DATABASE_URL` when set, otherwise an embedded
  PostgreSQL cluster started once for the session (`trioq.embedded`).
- `trioq_schema`: a fresh schema name; the schema is dropped after the test.
- `trioq_app`: your app (named by the `trioq_app` ini option, `module:attribute`) bound to that
  schema and migrated; open `trioq_app.client()` in the test. Override the fixture to build the
  app yourself.

Needs pytest-trio (`trio_mode = true`) for the async fixture.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

from ..app import DATABASE_URL_ENV, App

APP_OPTION = "trioq_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(APP_OPTION, "module:attribute of the trioq.App the trioq_app fixture uses")


@pytest.fixture(scope="session")
def trioq_database_url() -> Iterator[str]:
    external = os.environ.get(DATABASE_URL_ENV)
    if external:
        yield external
        return
    from ..embedded import EmbeddedPostgres

    with EmbeddedPostgres() as cluster:
        yield cluster.conninfo


@pytest.fixture
def trioq_schema(trioq_database_url: str) -> Iterator[str]:
    name = f"test_{secrets.token_hex(6)}"
    yield name
    from .._pg.admin import drop_schema

    drop_schema(trioq_database_url, name)


@pytest.fixture
async def trioq_app(
    request: pytest.FixtureRequest, trioq_database_url: str, trioq_schema: str
) -> AsyncIterator[App]:
    path = request.config.getini(APP_OPTION)
    if not path:
        raise pytest.UsageError(
            f"trioq_app: set `{APP_OPTION} = module:attribute` under [tool.pytest.ini_options] "
            "(or override the trioq_app fixture)"
        )
    from ..app import load_app

    app = load_app(str(path)).with_database(trioq_database_url, trioq_schema)
    async with app.client(migrate=True):
        pass
    yield app
