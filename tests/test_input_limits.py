"""Limits and wrong-typed input at the public entry points: one payload limit that the database
agrees with, and clear errors (never driver internals) for job ids that are not job ids."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

import trioq
from tests.support import make_app, scalar
from trioq._core import codec
from trioq._sql import migrations


def encoded_size(payload: Any) -> int:
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def at_the_limit(make: Callable[[int], Any]) -> tuple[Any, Any]:
    """(the largest `make(n)` whose JSON fits MAX_PAYLOAD_BYTES, `make(n + 1)` which does not).

    `make(n)` must grow by the same number of bytes per step (a list of n equal elements)."""
    base, step = encoded_size(make(1)), encoded_size(make(2)) - encoded_size(make(1))
    count = 1 + (codec.MAX_PAYLOAD_BYTES - base) // step
    assert encoded_size(make(count)) <= codec.MAX_PAYLOAD_BYTES < encoded_size(make(count + 1))
    return make(count), make(count + 1)


# The shapes whose jsonb is largest for their JSON text (measured: 6x and 5x; empty lists
# 2.7x, strings 1.3x, null 0.8x).
WORST_SHAPES: dict[str, Callable[[int], Any]] = {
    "digits": lambda n: {"k": [1] * n},
    "nested-digits": lambda n: [[7]] * n,
}


def test_the_tables_payload_check_is_the_jsonb_size_of_the_limit() -> None:
    sql = next(m.sql for m in migrations("trioq") if m.version == 6)
    match = re.search(r"pg_column_size\(payload\) <= (\d+)", sql)
    assert match is not None
    bound = int(match.group(1))
    assert bound == (
        codec.JSONB_BYTES_PER_TEXT_BYTE * codec.MAX_PAYLOAD_BYTES + codec.JSONB_OVERHEAD_BYTES
    )


@pytest.mark.parametrize("shape", WORST_SHAPES)
async def test_payload_at_the_limit_is_stored_inside_the_callers_transaction(
    pg_url: str, pg_schema: str, shape: str
) -> None:
    # Before: 998,001 bytes of single digits passed trioq's check and then failed the table's
    # CHECK (4,000,000 bytes of jsonb), aborting the caller's transaction.
    app = make_app(pg_url, pg_schema)

    @app.task("big")
    async def big(ctx: trioq.Context, payload: Any) -> None:
        return None

    payload, one_over = at_the_limit(WORST_SHAPES[shape])
    assert encoded_size(payload) > codec.MAX_PAYLOAD_BYTES - 10
    async with app.client(migrate=True) as client:
        async with client.transaction() as tx:
            await tx.execute(f"CREATE TABLE {pg_schema}.notes (body text)")
            job = await tx.enqueue("big", payload)
            await tx.execute(f"INSERT INTO {pg_schema}.notes VALUES ('kept')")
        with pytest.raises(trioq.PayloadError, match="more than the limit"):
            await client.enqueue("big", one_over)
    assert await scalar(pg_url, f"SELECT count(*) FROM {pg_schema}.notes") == 1
    stored = await scalar(pg_url, f"SELECT payload FROM {pg_schema}.jobs WHERE id = %s", (job.id,))
    assert stored == payload
