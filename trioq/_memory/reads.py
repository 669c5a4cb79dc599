"""The read-only statements of the memory driver: job records, `explain`'s facts, queue and
task status, health, demand, workers and the unroutable jobs, as functions over a `MemoryState`.

Each is called from one `MemoryDriver` method after its statement checkpoint, with that
statement's `now`; none changes a table.
"""

from __future__ import annotations

import collections
import datetime
import json
from collections.abc import Sequence
from typing import Any

import attrs

from .._core.explain import ExplainFacts, silent_after
from .._seam.admin import (
    Descendant,
    HealthReport,
    JobFilter,
    QueueDemand,
    QueueStatus,
    TaskHistoryKind,
    TaskStatus,
    UnroutableJobs,
    WorkerInfo,
)
from .._seam.driver import JobRecord
from .._seam.services import QueueAdmission
from .._seam.workflow import Checkpoint
from . import concurrency
from .state import (
    FINISHED_STATES,
    SECOND,
    MemoryState,
    Row,
    Worker,
    before,
    before_or_at,
    loads,
)


def job_get(db: MemoryState, job_id: int) -> JobRecord | None:
    row = db.rows.get(job_id)
    return None if row is None else _job_record(row, db.max_attempts(row))


def job_descendants(db: MemoryState, job_id: int) -> list[Descendant]:
    """job_descendants: every descendant of the job, by id."""
    found: list[Descendant] = []
    parents = {job_id}
    while parents:
        children = [row for row in db.rows.values() if row.parent_id in parents]
        found.extend(Descendant(row.id, row.state) for row in children)
        parents = {row.id for row in children}
    return sorted(found, key=lambda member: member.id)


def job_explain(db: MemoryState, now: datetime.datetime, job_id: int) -> ExplainFacts | None:
    row = db.rows.get(job_id)
    if row is None:
        return None
    same_key = [
        other
        for other in db.rows.values()
        if other.id != row.id
        and row.partition_key is not None
        and (other.queue, other.partition_key) == (row.queue, row.partition_key)
    ]
    holders = sorted(
        (o for o in same_key if o.state in ("running", "sleeping", "waiting")),
        key=lambda o: o.id,
    )
    ahead = sorted(
        (
            o
            for o in same_key
            if o.state == "ready"
            and before_or_at(o.run_at, now)
            and o.claim_order < row.claim_order
        ),
        key=lambda o: o.claim_order,
    )
    workers = sorted(
        (w for w in db.workers.values() if row.queue in w.registration.queues),
        key=lambda w: w.started_at,
    )
    attempts = db.attempts.get(job_id, ())
    return ExplainFacts(
        now=now,
        job={**_explain_row(row), "max_attempts": db.max_attempts(row)},
        key_holder=_explain_row(holders[0]) if holders else None,
        key_ahead=_explain_row(ahead[0]) if ahead else None,
        workers=tuple(_explain_worker(w) for w in workers),
        last_attempt=attrs.asdict(attempts[-1]) if attempts else None,
        pause=(
            {"queue": row.queue, "paused_at": db.paused[row.queue]}
            if row.queue in db.paused
            else None
        ),
        concurrency=_concurrency_facts(db, row, now),
        other_workers=tuple(
            _explain_worker(w)
            for w in db.workers.values()
            if row.queue not in w.registration.queues
        ),
    )


def _concurrency_facts(db: MemoryState, row: Row, now: datetime.datetime) -> dict[str, Any] | None:
    key = row.concurrency_key
    if key is None:
        return None
    running = len(concurrency.running_per_key(db).get(key, ()))
    applied = concurrency.queue_key_limit(db, row.queue, key, row.concurrency_limit)
    return {
        "running": running,
        "limit": applied.limit,
        "head_id": applied.head_id,
        **concurrency.rate_facts(db, key, now),
    }


def checkpoint_list(db: MemoryState, job_id: int) -> list[Checkpoint]:
    history = db.checkpoints.get(job_id, {})
    return [
        Checkpoint(position, kind, name, loads(value))
        for position, (kind, name, value) in sorted(history.items())
    ]


def job_list(db: MemoryState, now: datetime.datetime, params: JobFilter) -> list[JobRecord]:
    found = [
        _job_record(row, db.max_attempts(row))
        for row in sorted(db.rows.values(), key=lambda row: -row.id)
        if _matches(row, params, now)
    ]
    return found[: params.limit]


def queue_status(db: MemoryState, now: datetime.datetime) -> list[QueueStatus]:
    by_queue: dict[str, list[Row]] = collections.defaultdict(list)
    for row in db.rows.values():
        by_queue[row.queue].append(row)
    return [_queue_status(queue, by_queue[queue], now) for queue in sorted(by_queue)]


def status_health(db: MemoryState, now: datetime.datetime) -> HealthReport:
    live = {
        worker_id
        for worker_id, worker in db.workers.items()
        if (now - worker.heartbeat_at).total_seconds()
        < silent_after(worker.registration.heartbeat_seconds)
    }
    rows = list(db.rows.values())
    return HealthReport(
        ready_backlog=sum(r.state == "ready" and before_or_at(r.run_at, now) for r in rows),
        expired_ownership=sum(
            r.state == "running" and before(r.lease_expires_at, now) for r in rows
        ),
        sleeping_due=sum(r.state == "sleeping" and before_or_at(r.run_at, now) for r in rows),
        stale_running=sum(r.state == "running" and r.worker_id not in live for r in rows),
        active_waits=sum(r.state == "waiting" for r in rows),
        due_wait_timeouts=sum(r.state == "waiting" and before_or_at(r.run_at, now) for r in rows),
    )


def queue_demand(db: MemoryState, now: datetime.datetime) -> list[QueueDemand]:
    by_queue: dict[str, list[Row]] = collections.defaultdict(list)
    for row in db.rows.values():
        if row.state not in FINISHED_STATES:
            by_queue[row.queue].append(row)
    return [_queue_demand(queue, by_queue[queue], now) for queue in sorted(by_queue)]


def worker_list(db: MemoryState, now: datetime.datetime) -> list[WorkerInfo]:
    running = collections.Counter(
        row.worker_id
        for ids in db.open_by_queue.values()
        for row in map(db.rows.__getitem__, ids)
        if row.state == "running"
    )
    workers = sorted(db.workers.values(), key=lambda worker: worker.started_at)
    return [_worker_info(worker, running[worker.registration.worker_id], now) for worker in workers]


def task_history_kinds(db: MemoryState) -> list[TaskHistoryKind]:
    jobs: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for job_id, history in db.checkpoints.items():
        row = db.rows.get(job_id)
        if row is None:
            continue  # pruned with its job
        for kind, _, _ in history.values():
            jobs[(row.task, kind)].add(job_id)
    return [TaskHistoryKind(task, kind, len(jobs[(task, kind)])) for task, kind in sorted(jobs)]


def job_unroutable(
    db: MemoryState, now: datetime.datetime, stale_seconds: float = 120.0
) -> list[UnroutableJobs]:
    live = [
        worker.registration
        for worker in db.workers.values()
        if (now - worker.heartbeat_at).total_seconds()
        < silent_after(worker.registration.heartbeat_seconds, stale_seconds)
        and worker.state != "stopped"
    ]
    groups: dict[tuple[str, str, int], set[str]] = collections.defaultdict(set)
    counts: collections.Counter[tuple[str, str, int]] = collections.Counter()
    for row in db.rows.values():
        if row.state in FINISHED_STATES or row.state == "running":
            continue
        pair = f"{row.task}@{row.version}"
        if any(row.queue in w.queues and pair in w.task_versions for w in live):
            continue
        groups[(row.queue, row.task, row.version)].add(row.state)
        counts[(row.queue, row.task, row.version)] += 1
    return [
        UnroutableJobs(*group, counts[group], tuple(sorted(groups[group])))
        for group in sorted(groups)
    ]


def task_status(db: MemoryState) -> list[TaskStatus]:
    groups: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
    retried: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
    for row in db.rows.values():
        group = (row.queue, row.task, row.version, row.state)
        groups[group] += 1
        retried[group] += row.attempt > 1
    return [TaskStatus(*group, groups[group], retried[group]) for group in sorted(groups)]


def _matches(row: Row, params: JobFilter, now: datetime.datetime) -> bool:
    return (
        (params.states is None or row.state in params.states)
        and (params.tasks is None or row.task in params.tasks)
        and (params.queues is None or row.queue in params.queues)
        and (params.partition_key is None or row.partition_key == params.partition_key)
        and (
            params.older_than_seconds is None
            or row.created_at < now - params.older_than_seconds * SECOND
        )
        and (params.before_id is None or row.id < params.before_id)
    )


def _explain_row(row: Row) -> dict[str, Any]:
    """A row as `to_jsonb(row)` gives it (the columns `trioq explain` reads)."""
    return {
        "id": row.id,
        "queue": row.queue,
        "task": row.task,
        "version": row.version,
        "state": row.state,
        "priority": row.priority,
        "run_at": row.run_at,
        "partition_key": row.partition_key,
        "concurrency_key": row.concurrency_key,
        "attempt": row.attempt,
        "max_attempts": row.max_attempts,
        "lease_expires_at": row.lease_expires_at,
        "worker_id": None if row.worker_id is None else str(row.worker_id),
        "error": loads(row.error_json),
        "finished_at": row.finished_at,
        "deadline_at": row.deadline_at,
        "deadline_source": row.deadline_source,
    }


def _explain_worker(worker: Worker) -> dict[str, Any]:
    registration = worker.registration
    return {
        "id": str(registration.worker_id),
        "hostname": registration.hostname,
        "pid": registration.pid,
        "queues": list(registration.queues),
        "concurrency": registration.concurrency,
        "queue_concurrency": list(registration.queue_concurrency) or None,
        "task_versions": list(registration.task_versions),
        "state": worker.state,
        "heartbeat_at": worker.heartbeat_at,
        "heartbeat_seconds": registration.heartbeat_seconds,
        "admission": worker.admission,
    }


# JobRecord's fields a row holds under the same name (the rest are decoded or resolved in
# `_job_record`): a field added to both is read without a line here.
_RECORD_AS_STORED = tuple(
    field.name
    for field in attrs.fields(JobRecord)
    if field.name in attrs.fields_dict(Row)
    and field.name not in {"payload", "result", "error", "max_attempts"}
)


def _job_record(row: Row, max_attempts: int) -> JobRecord:
    return JobRecord(
        **{name: getattr(row, name) for name in _RECORD_AS_STORED},
        payload=json.loads(row.payload_json),
        result=loads(row.result_json),
        error=loads(row.error_json),
        max_attempts=max_attempts,
    )


def _queue_status(queue: str, rows: Sequence[Row], now: datetime.datetime) -> QueueStatus:
    states = collections.Counter(row.state for row in rows)
    due = [row.run_at for row in rows if row.state == "ready" and row.run_at is not None]
    oldest = (now - min(due)).total_seconds() if due else None
    return QueueStatus(
        queue=queue,
        ready=states["ready"],
        scheduled=states["scheduled"],
        running=states["running"],
        expired_leases=sum(
            row.state == "running" and before(row.lease_expires_at, now) for row in rows
        ),
        completed=states["completed"],
        failed=states["failed"],
        cancelled=states["cancelled"],
        oldest_ready_seconds=oldest,
        sleeping=states["sleeping"],
        waiting=states["waiting"],
    )


def _queue_demand(queue: str, rows: Sequence[Row], now: datetime.datetime) -> QueueDemand:
    states = collections.Counter(row.state for row in rows)
    due = [
        row.run_at
        for row in rows
        if row.state == "ready" and row.run_at is not None and row.run_at <= now
    ]
    future = ("scheduled", "sleeping", "waiting")
    return QueueDemand(
        queue=queue,
        ready=len(due),
        oldest_ready_seconds=(now - min(due)).total_seconds() if due else None,
        running=states["running"],
        scheduled=states["scheduled"] + states["ready"] - len(due),
        sleeping=states["sleeping"],
        waiting=states["waiting"],
        due_now=len(due)
        + sum(row.state in future and before_or_at(row.run_at, now) for row in rows),
    )


def _worker_info(worker: Worker, running: int, now: datetime.datetime) -> WorkerInfo:
    registration = worker.registration
    admission = tuple(
        QueueAdmission(
            queue,
            entry["limit"],
            entry["concurrency"],
            entry["reason"],
            entry["cause"],
            (now - entry["since"]).total_seconds(),
        )
        for queue, entry in sorted((worker.admission or {}).items())
    )
    return WorkerInfo(
        id=registration.worker_id,
        hostname=registration.hostname,
        pid=registration.pid,
        queues=tuple(registration.queues),
        concurrency=registration.concurrency,
        state=worker.state,
        started_at=worker.started_at,
        heartbeat_at=worker.heartbeat_at,
        running=running,
        task_versions=tuple(registration.task_versions),
        admission=admission,
        queue_concurrency=tuple(registration.queue_concurrency),
        heartbeat_seconds=registration.heartbeat_seconds,
        heartbeat_age_seconds=(now - worker.heartbeat_at).total_seconds(),
    )
