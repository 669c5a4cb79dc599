"""The history the soak's checker reads (tests/soak/checker.py): the side-effect log's rows, the
`jobs` rows, the runs they make up, and the facts the driver knows; and what the check returns.

The log is written by the handlers (one row per event of a run, stamped with the host clock at
the event: tests/soak/app.py), or by the fault suite's handlers (`exec_log`, tests/fault_app.py).
A *run* is one call of a handler, for one claim: it starts at its `start` row and ends at its
`end` / `cancelled` row (a suspension: see `_run_of`), at its worker process's death or at its
lease's recovery, whichever is first; a run with none of these is still going. Log intervals lie
inside the claims they record (the `start` row is written after the claim, the `end` row before
the release), so an overlap in the log is an overlap in the database too.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import attrs

FAR = datetime.datetime.max.replace(tzinfo=datetime.UTC)
FINAL = frozenset({"completed", "failed", "cancelled"})
PENDING = frozenset({"scheduled", "sleeping", "waiting"})  # legitimately unfinished at the end
SUSPENDED = "SuspendExecution"  # the value of a suspended run's end row
Interval = tuple[datetime.datetime, datetime.datetime]


@attrs.frozen
class LogRow:
    """One row of the side-effect log. `run_id` names the run (one handler call, one claim)."""

    job_id: int
    run_id: str
    attempt: int
    pid: int
    kind: str  # start, end, cancelled, continue, step, message, event_woken
    ts: datetime.datetime
    key: str | None = None
    value: Any = None


@attrs.frozen
class JobRow:
    id: int
    state: str
    task: str = "task"
    queue: str = "default"
    attempt: int = 0
    partition_key: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    run_at: datetime.datetime | None = None


@attrs.frozen
class Run:
    job_id: int
    run_id: str
    attempt: int
    pid: int
    start: datetime.datetime
    end: datetime.datetime | None  # its end or cancelled row (see _run_of for a suspension)
    end_kind: str | None  # end, cancelled, suspended
    rows: tuple[LogRow, ...]


@attrs.frozen
class History:
    rows: Sequence[LogRow]  # in log order (id)
    jobs: Mapping[int, JobRow]

    @cached_property
    def runs(self) -> list[Run]:
        by_run: dict[tuple[int, str], list[LogRow]] = collections.defaultdict(list)
        for row in self.rows:
            by_run[row.job_id, row.run_id].append(row)
        runs = [_run_of(job_id, run_id, rows) for (job_id, run_id), rows in by_run.items()]
        return sorted(runs, key=lambda run: run.start)

    @cached_property
    def _rows_by_job(self) -> dict[int, list[LogRow]]:
        by_job: dict[int, list[LogRow]] = collections.defaultdict(list)
        for row in self.rows:
            by_job[row.job_id].append(row)
        return by_job

    def rows_of(self, job_id: int) -> list[LogRow]:
        return self._rows_by_job.get(job_id, [])

    @property
    def states(self) -> dict[int, str]:
        return {job.id: job.state for job in self.jobs.values()}

    def duplicates(self) -> int:
        """Runs beyond the first of each job (at-least-once re-executions, suspensions)."""
        return len(self.runs) - len({run.job_id for run in self.runs})


def _run_of(job_id: int, run_id: str, rows: list[LogRow]) -> Run:
    """A suspended run ends at its last row before its end row: a primitive that writes its own
    suspension (wait_for_event, receive, wait_result, continue_as_new) releases the job before
    it raises, so the resumed run may start, even on the same worker, while this one unwinds.
    A suspended run is one whose end row says SuspendExecution, or that logged `continue` just
    before its end (a reclaim by the same worker can cancel a continued run as it unwinds).
    Ending it earlier can only hide overlaps of that unwinding. A run whose last row is
    `continue` and that has no end row (its worker stopped as it unwound) is suspended there
    too."""
    start = next((row for row in rows if row.kind == "start"), rows[0])
    index, end = next(
        ((n, row) for n, row in enumerate(rows) if row.kind in ("end", "cancelled")), (0, None)
    )
    ts: datetime.datetime | None
    if end is None:
        ts, kind = (rows[-1].ts, "suspended") if rows[-1].kind == "continue" else (None, None)
    elif end.value == SUSPENDED or (index > 0 and rows[index - 1].kind == "continue"):
        ts, kind = (rows[index - 1].ts, "suspended") if index > 0 else (end.ts, end.kind)
    else:
        ts, kind = end.ts, end.kind
    return Run(job_id, run_id, start.attempt, start.pid, start.ts, ts, kind, tuple(rows))


@attrs.frozen
class Sent:
    """A message the driver sent; `certain`: the send returned (else its outcome is unknown)."""

    item: Any
    certain: bool = True


@attrs.frozen
class Facts:
    """What the driver knows: the ids it got back, the faults it made, what it saw and sent."""

    acknowledged: frozenset[int]
    died: Mapping[int, datetime.datetime] = attrs.field(factory=dict)  # pid -> when it died
    killed: frozenset[int] = frozenset()  # pids killed -9: their lost jobs are timed
    # (job, attempt, pid) -> when maintenance recovered that run's expired lease (it ends there)
    recovered: Mapping[tuple[int, int, int], datetime.datetime] = attrs.field(factory=dict)
    outages: Sequence[Interval] = ()  # the database was down (restarts)
    pending_ok: frozenset[str] = PENDING
    queue_limits: Mapping[str, int] = attrs.field(factory=dict)
    queue_rates: Mapping[str, tuple[int, float]] = attrs.field(factory=dict)  # (n, seconds)
    rate_tolerance: float = 1.0  # seconds between a claim and its start row, at most
    messages: Mapping[int, Sequence[Sent]] = attrs.field(factory=dict)  # job -> in send order
    event_waiters: Mapping[str, frozenset[int]] = attrs.field(factory=dict)
    emitted: frozenset[str] = frozenset()  # event keys whose emit returned
    cron_tasks: frozenset[str] = frozenset()
    observations: Sequence[tuple[datetime.datetime, int, str]] = ()  # (when, job, state)
    redriven: Mapping[int, Sequence[datetime.datetime]] = attrs.field(factory=dict)
    recovery_bound: float = float("inf")  # seconds: lease + poll + 1
    # Read from the tables once the workers have stopped (`history.read_storage_gaps`): jobs
    # with an outcome and no record (retention counts the records without an outcome as the
    # records less the outcomes), and unfinished jobs in none of the tables the claims and the
    # leader find them in (the ring, ready_keyed, job_due, job_runs: never claimed again).
    orphan_outcomes: frozenset[int] = frozenset()
    unfiled: frozenset[int] = frozenset()


@attrs.frozen
class Violation:
    rule: str
    job_ids: tuple[int, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: jobs {list(self.job_ids)[:20]}: {self.detail}"


@attrs.frozen
class Report:
    violations: list[Violation]
    recoveries: dict[int, float]  # job id -> seconds from its worker's death to its next start

    @property
    def worst_recovery(self) -> float | None:
        return max(self.recoveries.values(), default=None)
