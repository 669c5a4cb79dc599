"""Invariants over a fault test's whole history (the Jepsen method): the execution log written by
the handlers of `tests.fault_app` plus the final job rows.

Checked: no acknowledged job lost (every id the producer got back exists and is final); no two
overlapping runs of one job; at most one running job per partition key at any instant; every
job in a final state. A run ends at its `end` / `cancelled` row, or when its worker process
died, whichever is first; a run with neither is still going (and overlaps everything after it).
"""

from __future__ import annotations

import collections
import datetime
import itertools
from collections.abc import Iterable, Mapping

import attrs
from psycopg import sql

from tests.procs import fetch

FAR = datetime.datetime.max.replace(tzinfo=datetime.UTC)
FINAL = frozenset({"completed", "failed", "cancelled"})


@attrs.frozen
class Run:
    job_id: int
    attempt: int
    pid: int
    partition_key: str | None
    start: datetime.datetime
    end: datetime.datetime | None
    end_event: str | None


@attrs.frozen
class History:
    runs: list[Run]
    states: dict[int, str]  # job id -> state

    def duplicates(self) -> int:
        """Runs beyond the first of each job (at-least-once re-executions)."""
        return len(self.runs) - len({run.job_id for run in self.runs})


async def read_history(pg_url: str, schema: str) -> History:
    def q(template: str) -> sql.Composed:
        return sql.SQL(template).format(s=sql.Identifier(schema))

    rows = await fetch(
        pg_url,
        q(
            "SELECT job_id, attempt, worker_pid, event, db_ts, partition_key "
            "FROM {s}.exec_log ORDER BY id"
        ),
    )
    starts: dict[tuple[int, int, int], tuple[datetime.datetime, str | None]] = {}
    ends: dict[tuple[int, int, int], tuple[str, datetime.datetime]] = {}
    for job_id, attempt, pid, event, ts, key in rows:
        run_key = (job_id, attempt, pid)
        if event == "start":
            assert run_key not in starts, f"run {run_key} started twice"
            starts[run_key] = (ts, key)
        else:
            assert run_key in starts and run_key not in ends, f"unpaired {event} for {run_key}"
            ends[run_key] = (event, ts)
    runs = [
        Run(job, attempt, pid, key, start, *reversed(ends.get((job, attempt, pid), (None, None))))
        for (job, attempt, pid), (start, key) in starts.items()
    ]
    states = dict(await fetch(pg_url, q("SELECT id, state FROM {s}.jobs")))
    return History(runs, states)


def check_history(
    history: History,
    acknowledged: Iterable[int],
    *,
    died: Mapping[int, datetime.datetime] | None = None,
) -> None:
    """Assert every invariant; `died` maps a worker pid to when it was killed."""
    died = died or {}
    acknowledged = set(acknowledged)
    missing = acknowledged - set(history.states)
    assert not missing, f"acknowledged jobs lost: {sorted(missing)[:20]}"
    not_final = {job: state for job, state in history.states.items() if state not in FINAL}
    assert not not_final, f"jobs not final: {dict(itertools.islice(not_final.items(), 20))}"

    def end_of(run: Run) -> datetime.datetime:
        return min((t for t in (run.end, died.get(run.pid)) if t is not None), default=FAR)

    def assert_sequential(runs: list[Run], what: str) -> None:
        runs.sort(key=lambda run: run.start)
        for earlier, later in itertools.pairwise(runs):
            assert later.start >= end_of(earlier), (
                f"{what}: {later} started before {earlier} ended ({end_of(earlier)})"
            )

    by_job: dict[int, list[Run]] = collections.defaultdict(list)
    by_key: dict[str, list[Run]] = collections.defaultdict(list)
    for run in history.runs:
        by_job[run.job_id].append(run)
        if run.partition_key is not None:
            by_key[run.partition_key].append(run)
    for job_id, runs in by_job.items():
        assert_sequential(runs, f"job {job_id}")
    for key, runs in by_key.items():
        assert_sequential(runs, f"partition key {key!r}")
