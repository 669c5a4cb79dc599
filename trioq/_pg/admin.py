"""Blocking administrative statements for tools outside the runtime (the pytest plugin)."""

from __future__ import annotations

import psycopg

from .._sql import queries


def drop_schema(conninfo: str, schema: str) -> None:
    """Drop `schema` and everything in it (the `schema_drop` block)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(queries(schema)["schema_drop"])
