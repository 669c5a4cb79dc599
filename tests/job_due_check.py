"""job_due's invariant (migration 0044): it holds exactly the job records' scheduled, sleeping
and waiting rows (jobs_live's before migration 0049, job_rows' since), each with the row's
queue, state and run_at. `job_due_mismatches` reads both
tables in one statement (one snapshot: the triggers write both in the writer's transaction, so
the invariant holds at every commit, whatever runs alongside); `DueCheckedDriver` checks it
after every call that may write a job."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import psycopg
from psycopg import sql

from tests.checked_driver import CheckedAfterWrites
from trioq._core.identifiers import quote_ident

_MISMATCHES = """
SELECT 'missing' AS kind, j.id, j.queue::text, j.{phase}, j.run_at
FROM {schema}.{table} j
WHERE j.{phase} IN ('scheduled', 'sleeping', 'waiting')
  AND NOT EXISTS (SELECT 1 FROM {schema}.job_due d
                  WHERE d.job_id = j.id AND d.queue = j.queue AND d.state = j.{phase}
                    AND d.run_at IS NOT DISTINCT FROM j.run_at)
UNION ALL
SELECT 'stale', d.job_id, d.queue, d.state, d.run_at
FROM {schema}.job_due d
WHERE NOT EXISTS (SELECT 1 FROM {schema}.{table} j
                  WHERE j.id = d.job_id AND j.queue = d.queue AND j.{phase} = d.state
                    AND j.run_at IS NOT DISTINCT FROM d.run_at)
ORDER BY 2
"""


def mismatches_query(schema: str, phase: str = "phase", table: str = "job_rows") -> str:
    """`phase`: the row's column of its state as last written (`state` before migration
    0047, which renames it); `table`: the records (`jobs_live` before migration 0049)."""
    return (
        _MISMATCHES.replace("{schema}", quote_ident(schema))
        .replace("{phase}", phase)
        .replace("{table}", table)
    )


def job_due_mismatches(target: psycopg.Connection[Any] | str, schema: str) -> list[Any]:
    """The rows on which job_due and the records' due rows differ (none when exact)."""
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            return _mismatches(conn, schema)
    return _mismatches(target, schema)


def _mismatches(conn: psycopg.Connection[Any], schema: str) -> list[Any]:
    [[records, renamed]] = conn.execute(
        "SELECT to_regclass(format('%%I.job_rows', %s::text)) IS NOT NULL,"
        " EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = %s"
        " AND table_name = 'jobs_live' AND column_name = 'phase')",
        (schema, schema),
    ).fetchall()
    if records:
        query = mismatches_query(schema)
    else:
        query = mismatches_query(schema, "phase" if renamed else "state", "jobs_live")
    return conn.execute(sql.SQL(query)).fetchall()  # type: ignore[arg-type]


def due_rows(target: str, schema: str) -> list[tuple[Any, ...]]:
    """job_due's rows, in id order."""
    query = sql.SQL("SELECT job_id, queue, state, run_at FROM {}.job_due ORDER BY 1").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(target, autocommit=True) as conn:
        return conn.execute(query).fetchall()


class JobDueMismatch(AssertionError):
    """job_due differed from the records' due rows after a driver call."""


@attrs.define(eq=False)
class DueCheckedDriver(CheckedAfterWrites):
    """job_due compared to the records (tests/checked_driver.py)."""

    table: ClassVar[str] = "job_due"
    mismatch: ClassVar[type[AssertionError]] = JobDueMismatch

    def mismatches_query(self) -> str:
        return mismatches_query(self.pg.schema)
