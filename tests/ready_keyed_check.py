"""ready_keyed's invariant (migration 0048): it holds exactly the records' ready rows with a
partition key or a concurrency key, each entry with its row's queue, kind of key, key,
priority, run_at, filed, task, version and concurrency limit. `ready_keyed_mismatches` reads
both tables in one statement (one snapshot: the triggers and the claim write both in the
writer's transaction, so the invariant holds at every commit); `KeyedCheckedDriver` checks it
after every call that may write a job, as tests/job_due_check.py does for job_due."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import psycopg

from tests.checked_driver import CheckedAfterWrites
from trioq._core.identifiers import quote_ident

_ROWS = """
SELECT j.queue::text AS queue,
       (CASE WHEN j.partition_key IS NOT NULL THEN 'p' ELSE 'c' END)::"char" AS kind,
       coalesce(j.partition_key, j.concurrency_key)::text AS key, j.priority, j.run_at, j.id,
       j.filed, j.task::text AS task, j.version::int AS version,
       j.concurrency_limit::int AS concurrency_limit
FROM {schema}.{table} j
WHERE j.phase = 'ready' AND (j.partition_key IS NOT NULL OR j.concurrency_key IS NOT NULL)
"""

_ENTRIES = """
SELECT e.queue, e.kind, e.key, e.priority, e.run_at, e.id, e.filed, e.task, e.version,
       e.concurrency_limit
FROM {schema}.ready_keyed e
"""

_MISMATCHES = f"""
WITH rows AS ({_ROWS}), entries AS ({_ENTRIES})
(SELECT 'missing' AS kind, * FROM (SELECT * FROM rows EXCEPT ALL SELECT * FROM entries) AS m)
UNION ALL
(SELECT 'stale', * FROM (SELECT * FROM entries EXCEPT ALL SELECT * FROM rows) AS s)
ORDER BY 7
"""


def mismatches_query(schema: str, table: str = "job_rows") -> str:
    """`table`: the records (`jobs_live` before migration 0049)."""
    return _MISMATCHES.replace("{schema}", quote_ident(schema)).replace("{table}", table)


def ready_keyed_mismatches(target: psycopg.Connection[Any] | str, schema: str) -> list[Any]:
    """The entries on which ready_keyed and the records' ready keyed rows differ (none when
    exact)."""
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            return _mismatches(conn, schema)
    return _mismatches(target, schema)


def _mismatches(conn: psycopg.Connection[Any], schema: str) -> list[Any]:
    [[records]] = conn.execute(
        "SELECT to_regclass(format('%%I.job_rows', %s::text)) IS NOT NULL", (schema,)
    ).fetchall()
    query = mismatches_query(schema, "job_rows" if records else "jobs_live")
    return conn.execute(query).fetchall()  # type: ignore[arg-type]


def entries(target: str, schema: str) -> list[tuple[Any, ...]]:
    """ready_keyed's entries, in id order."""
    query = _ENTRIES.replace("{schema}", quote_ident(schema)) + " ORDER BY e.id"
    with psycopg.connect(target, autocommit=True) as conn:
        return conn.execute(query).fetchall()  # type: ignore[arg-type]


class ReadyKeyedMismatch(AssertionError):
    """ready_keyed differed from the records' ready keyed rows after a driver call."""


@attrs.define(eq=False)
class KeyedCheckedDriver(CheckedAfterWrites):
    """ready_keyed compared to the records (tests/checked_driver.py)."""

    table: ClassVar[str] = "ready_keyed"
    mismatch: ClassVar[type[AssertionError]] = ReadyKeyedMismatch

    def mismatches_query(self) -> str:
        return mismatches_query(self.pg.schema)
