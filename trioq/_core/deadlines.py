"""Whole-workflow deadlines (docs/flow-control.md, "Timeouts and deadlines"): which deadline a
new job gets, and who set it (the stored error names them).

Pure, `now` a parameter. The memory driver calls these; the PostgreSQL insert statements apply
the same rule (queries.sql: job_insert_one, job_insert_batch, job_insert_many, job_spawn_many,
schedule_fire_many; the SQL `enqueue()` of migration 0029), and the conformance suite holds
the two together.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import attrs

SET_AT_ENQUEUE = "set at enqueue"
DEADLINE_EXCEEDED = "DeadlineExceeded"  # the stored error's type (deadline_error())


def set_by_task(task: str) -> str:
    return f"set by task {task}"


def inherited_from(job_id: int) -> str:
    return f"inherited from job {job_id}"


@attrs.frozen
class Deadline:
    at: datetime.datetime
    # "set at enqueue", "set by task X", "inherited from job N"; None: the enqueuer's row
    # named none (its error then says "set at enqueue", as deadline_error() does)
    source: str | None


def own_deadline(
    given_at: datetime.datetime | None,
    given_seconds: float | None,
    given_source: str | None,
    task: str,
    task_seconds: float | None,
    now: datetime.datetime,
) -> Deadline | None:
    """A new job's own deadline: the enqueuer's (an absolute time, or seconds from the
    enqueue, with who set it), else the deadline the task's workers registered
    (`task_defaults.deadline_seconds`), counted from the enqueue; None: no deadline."""
    if given_at is not None:
        return Deadline(given_at, given_source)
    if given_seconds is not None:
        return Deadline(_after(now, given_seconds), given_source)
    if task_seconds is not None:
        return Deadline(_after(now, task_seconds), set_by_task(task))
    return None


def child_deadline(
    own: Deadline | None, parent_at: datetime.datetime | None, parent_id: int
) -> Deadline | None:
    """A spawned child's deadline: the earlier of its own and its workflow's, which it
    inherits (on a tie, the workflow's: the child ends with its workflow's reason)."""
    if parent_at is None:
        return own
    if own is None or parent_at <= own.at:
        return Deadline(parent_at, inherited_from(parent_id))
    return own


def describe(at: datetime.datetime | None, source: str | None, error: Any) -> str | None:
    """A job's deadline in one line (`trioq job`): when, who set it, and whether it cancelled
    the job (its stored error is the deadline's); None without a deadline."""
    if at is None:
        return None
    line = f"{at.isoformat()} ({source or SET_AT_ENQUEUE})"
    if isinstance(error, Mapping) and error.get("type") == DEADLINE_EXCEEDED:
        line += f": passed, the job was cancelled ({error.get('message')})"
    return line


def _after(now: datetime.datetime, seconds: float) -> datetime.datetime:
    return now + datetime.timedelta(seconds=seconds)
