"""The small SQL functions the hot statements call per row are inlined by the planner, as
their files say: a call that is not inlined runs the SQL-function executor once per row (a
drain's completions paid 6.4 us a job for job_lane() (gone since migration 0049), each enqueue
25 us for ready_slot() in
the ring's trigger; bench/RESULTS.md, "SQL functions that were never inlined").

PostgreSQL inlines an IMMUTABLE SQL function only if every function in its body is immutable
too; a STABLE one inside (date_part of a timestamptz) keeps it a call, silently. EXPLAIN
VERBOSE shows which: an inlined call's output is its body's expression, not its name."""

from __future__ import annotations

import psycopg
import pytest

from tests.support import make_app

# Function -> a call of it on a column of jobs, as the statements call it.
CALLS = {
    "ready_slot": "{schema}.ready_slot(j.created_at)",
    "db_now": "{schema}.db_now()",
    "ready_channel": "{schema}.ready_channel(j.queue)",
    "result_channel": "{schema}.result_channel(j.id)",
}


async def migrated(pg_url: str, pg_schema: str) -> None:
    async with make_app(pg_url, pg_schema).client(migrate=True):
        pass


@pytest.mark.parametrize("function", sorted(CALLS))
async def test_the_per_row_functions_are_inlined(
    pg_url: str, pg_schema: str, function: str
) -> None:
    await migrated(pg_url, pg_schema)
    call = CALLS[function].format(schema=pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        plan = "\n".join(
            row[0]
            for row in conn.execute(f"EXPLAIN (VERBOSE) SELECT {call} FROM {pg_schema}.jobs j")
        )
    outputs = [line for line in plan.splitlines() if "Output:" in line]
    assert outputs, plan
    assert not any(f"{function}(" in line for line in outputs), plan


async def test_ready_slot_keeps_its_values(pg_url: str, pg_schema: str) -> None:
    """The immutable body gives the numbers the earlier one did: the 5-second slot mod 4, at and
    around slot boundaries, before 1970 too (job_lane(), the UTC day, went with the day
    partitions in migration 0049)."""
    await migrated(pg_url, pg_schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'America/New_York'")  # the day is UTC's, not the session's
        rows = conn.execute(
            f"""
            SELECT t, {pg_schema}.ready_slot(t),
                   (floor(date_part('epoch', t) / 5)::bigint % 4)::smallint
            FROM unnest(ARRAY[
                '2026-12-06 00:00:00+00', '2026-12-05 23:59:59.999999+00',
                '2026-12-06 00:00:00.000001+00', '2026-12-06 23:59:55+00',
                '2026-12-06 13:45:04.999999+00', '2026-12-06 13:45:05+00',
                '1970-01-01 00:00:00+00', '1969-12-31 23:59:59+00', '2038-01-19 03:14:08+00'
            ]::timestamptz[]) AS t
            """
        ).fetchall()
    for at, slot, expected_slot in rows:
        assert slot == expected_slot, at
