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


# --- job ids ------------------------------------------------------------------------------------

NOT_JOB_IDS: list[Any] = ["1; DROP TABLE jobs", "x", "1", None, 1.5, True, 0, -1, 2**63, [1]]


async def test_wrong_typed_job_ids_raise_a_clear_error_before_any_sql(
    pg_url: str, pg_schema: str
) -> None:
    # Before: psycopg's "invalid input syntax for type bigint", a TypeError from int(None)
    # inside the result watcher, or a NumericValueOutOfRange from the server.
    app = make_app(pg_url, pg_schema)

    @app.task("noop")
    async def noop(ctx: trioq.Context, payload: Any) -> None:
        return None

    async with app.client(migrate=True) as client:
        job = await client.enqueue("noop", {})
        calls = dict(client.driver.statistics().calls)
        for bad in NOT_JOB_IDS:
            for call in (
                client.get_job,
                client.attempts,
                client.cancel,
                lambda job_id: client.wait_result(job_id, timeout=0),
                lambda job_id: client.wait_final(job_id, timeout=0),
            ):
                with pytest.raises(ValueError, match=r"^job_id: .* is not a job id"):
                    await call(bad)
        assert dict(client.driver.statistics().calls) == calls
        assert (await client.get_job(job.id)).state == "ready"
        with pytest.raises(ValueError, match=r"^timeout: "):
            await client.wait_result(job.id, timeout=float("nan"))


def test_cli_json_nested_10000_levels_is_a_usage_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trioq.cli import main

    deep = "[" * 10_000 + "]" * 10_000
    assert main(["enqueue", "tests.fault_app:app", "work", deep]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trioq: JSON: nested too deeply") and err.count("\n") == 1
    assert main(["enqueue", "tests.fault_app:app", "work", "{not json"]) == 2
    assert capsys.readouterr().err.startswith("trioq: JSON: not valid JSON")
