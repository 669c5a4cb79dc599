"""Reading a history out of the database for `tests.soak.checker`: the soak's `soak_log`
(`tests.soak.app`) or the fault suite's `exec_log` (`tests.fault_app`), and the `jobs` rows.

`check_history` is the fault suite's form of the check: every acknowledged job final, no
overlapping runs of a job or a partition key; it fails with every violation found.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from psycopg import sql

from tests.procs import fetch
from tests.soak import checker
from tests.soak.model import Facts, History, JobRow, LogRow


def _q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


async def read_jobs(pg_url: str, schema: str) -> dict[int, JobRow]:
    rows = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT id, state, task::text, queue::text, attempt::int, partition_key::text, "
            "concurrency_key::text, concurrency_limit::int, run_at FROM {s}.jobs",
        ),
    )
    return {row[0]: JobRow(*row) for row in rows}


async def read_storage_gaps(pg_url: str, schema: str) -> dict[str, frozenset[int]]:
    """`Facts.orphan_outcomes` and `Facts.unfiled`, read once nothing runs."""
    orphans = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT o.job_id FROM {s}.job_outcomes o"
            " WHERE NOT EXISTS (SELECT FROM {s}.job_rows j WHERE j.id = o.job_id)",
        ),
    )
    unfiled = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT j.id FROM {s}.job_rows j"
            " WHERE NOT EXISTS (SELECT FROM {s}.job_outcomes o WHERE o.job_id = j.id)"
            " AND NOT EXISTS (SELECT FROM {s}.ready_ring r WHERE r.id = j.id)"
            " AND NOT EXISTS (SELECT FROM {s}.ready_keyed k WHERE k.id = j.id)"
            " AND NOT EXISTS (SELECT FROM {s}.job_due d WHERE d.job_id = j.id)"
            " AND NOT EXISTS (SELECT FROM {s}.job_runs u WHERE u.job_id = j.id)",
        ),
    )
    return {
        "orphan_outcomes": frozenset(row[0] for row in orphans),
        "unfiled": frozenset(row[0] for row in unfiled),
    }


async def read_soak_history(pg_url: str, schema: str) -> History:
    rows = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT job_id, run_id, attempt, worker_pid, kind, db_ts, key, value "
            "FROM {s}.soak_log ORDER BY id",
        ),
    )
    return History([LogRow(*row) for row in rows], await read_jobs(pg_url, schema))


async def read_history(pg_url: str, schema: str) -> History:
    """The fault suite's `exec_log`: a run is (job, attempt, worker pid)."""
    rows = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT job_id, attempt, worker_pid, event, db_ts FROM {s}.exec_log ORDER BY id",
        ),
    )
    log = [
        LogRow(job_id, f"{attempt}/{pid}", attempt, pid, event, ts)
        for job_id, attempt, pid, event, ts in rows
    ]
    return History(log, await read_jobs(pg_url, schema))


async def read_recovered(
    pg_url: str, schema: str, worker_pids: Mapping[str, int]
) -> dict[tuple[int, int, int], datetime.datetime]:
    """(job, attempt, worker pid) -> when maintenance recovered that attempt's expired lease;
    `worker_pids` maps each worker id to its pid."""
    rows = await fetch(
        pg_url,
        _q(
            schema,
            "SELECT job_id, attempt, worker_id::text, finished_at "
            "FROM {s}.attempts WHERE outcome = 'lost'",
        ),
    )
    return {
        (job, attempt, worker_pids[worker]): ts
        for job, attempt, worker, ts in rows
        if worker in worker_pids
    }


def assert_runs_never_overlap(
    history: History,
    *,
    died: Mapping[int, datetime.datetime] | None = None,
    recovered: Mapping[tuple[int, int, int], datetime.datetime] | None = None,
) -> None:
    """No two runs of one job overlap; a run ends at its end/cancelled row, its worker's death
    (`died`: pid -> when) or its lease's recovery (`recovered`), whichever is first."""
    facts = Facts(frozenset(), died=died or {}, recovered=recovered or {})
    violations = list(checker.runs_never_overlap(history, facts))
    assert not violations, "\n".join(map(str, violations))


def check_history(
    history: History,
    acknowledged: Iterable[int],
    *,
    died: Mapping[int, datetime.datetime] | None = None,
) -> None:
    """Fail listing every violation; `died` maps a worker pid to when it was killed. Every job
    must be final (the fault tests wait for that)."""
    facts = Facts(frozenset(acknowledged), died=died or {}, pending_ok=frozenset())
    violations = [
        *checker.nothing_lost(history, facts),
        *checker.runs_never_overlap(history, facts),
        *checker.partition_keys_exclusive(history, facts),
    ]
    assert not violations, "\n".join(map(str, violations))
