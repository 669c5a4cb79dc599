"""`trioq explain`: why a job is (not) running, gate by gate in claim order. Pure: the facts
(one read by the driver, `now` included) in, a typed explanation out.

The facts carry rows as mappings of column name to value (`to_jsonb` of the row in Postgres),
so columns that later migrations add (wait keys, handler versions) are used when present.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .limits import Rate
from .states import TERMINAL_STATES, JobState

# A worker whose heartbeat is older than this is treated as gone, when it registered no
# heartbeat interval (workers of versions before migration 0019).
LIVE_HEARTBEAT_SECONDS = 120.0
# A worker silent for more than this many of its own heartbeat intervals is probably dead.
SILENT_INTERVALS = 2.0

Row = Mapping[str, Any]


@attrs.frozen
class ExplainFacts:
    now: datetime.datetime
    job: Row
    key_holder: Row | None = None  # another job of the key that holds it (running/sleeping/waiting)
    key_ahead: Row | None = None  # an earlier ready job of the same key
    workers: tuple[Row, ...] = ()  # registered workers that serve the job's queue
    last_attempt: Row | None = None
    pause: Row | None = None  # the queue's queue_pauses row when it is paused
    # The job's concurrency key: {"running": n, "limit": l, "head_id": the key's next job}, the
    # limit the claim applies (`_core.concurrency.claim_limit`), and with a rate (migration
    # 0028) rate_allowed, rate_period, recent_starts, rate_limited_until (None: it has no key)
    concurrency: Row | None = None
    # The queue's cluster-wide limits against them now (global_limit, running, rate,
    # rate_limited_until), when it has any (Client.explain adds them).
    limits: Row | None = None
    # Registered workers of other queues (queues, task_versions, heartbeat): whether the job's
    # task is served anywhere, when no live worker serves its queue.
    other_workers: tuple[Row, ...] = ()


@attrs.frozen
class Gate:
    name: str
    blocking: bool
    detail: str


@attrs.frozen
class Explanation:
    job_id: int
    state: str
    verdict: str  # the first blocking gate's detail, or why it is claimable
    gates: tuple[Gate, ...]

    @property
    def blocked_by(self) -> str | None:
        return next((gate.name for gate in self.gates if gate.blocking), None)


def when(value: Any) -> datetime.datetime | None:
    """A timestamp from a row (a datetime, or ISO text from JSON)."""
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value))


def _at(value: Any, now: datetime.datetime) -> str:
    moment = when(value)
    if moment is None:
        return "-"
    delta = (moment - now).total_seconds()
    rel = f"in {delta:.0f}s" if delta >= 0 else f"{-delta:.0f}s ago"
    return f"{moment.isoformat(timespec='seconds')} ({rel})"


def explain(facts: ExplainFacts, *, live_seconds: float = LIVE_HEARTBEAT_SECONDS) -> Explanation:
    job, now = facts.job, facts.now
    state = str(job["state"])
    gates = _final_gates(facts) if state in TERMINAL_STATES else []
    if not gates:
        gates = [
            _due_gate(job, now),
            _wait_gate(job, now),
            _lease_gate(job, facts.workers, now, live_seconds),
            _pause_gate(job, facts.pause, now),
            _limits_gate(job, facts.limits, now),
            _key_gate(job, facts, now),
            *_concurrency_gates(job, facts.concurrency, now),
            *_worker_gates(job, facts, now, live_seconds),
        ]
        deadline = when(job.get("deadline_at"))
        if deadline is not None:  # never blocking: it says when the pass will cancel it
            source = job.get("deadline_source") or "set at enqueue"
            passed = "deadline passed" if deadline <= now else "deadline"
            gates.append(Gate("deadline", False, f"{passed} {_at(deadline, now)} ({source})"))
    first = next((gate for gate in gates if gate.blocking), None)
    if first is not None:
        verdict = first.detail
    else:
        waited = (now - (when(job["run_at"]) or now)).total_seconds()
        verdict = (
            f"claimable now (due {waited:.0f}s ago): every gate passes, so the serving "
            "workers' slots are full (or it is about to be claimed)"
        )
    return Explanation(int(job["id"]), state, verdict, tuple(gates))


def _final_gates(facts: ExplainFacts) -> list[Gate]:
    job, state = facts.job, facts.job["state"]
    if state == JobState.COMPLETED:
        return [Gate("final", True, f"completed at {_at(job.get('finished_at'), facts.now)}")]
    if state == JobState.CANCELLED:
        error = job.get("error") or {}
        if error.get("type") == "DeadlineExceeded":  # cancelled by the deadline pass
            at = _at(job.get("finished_at"), facts.now)
            return [Gate("final", True, f"cancelled at {at}: {error.get('message')}")]
        return [Gate("final", True, f"cancelled at {_at(job.get('finished_at'), facts.now)}")]
    error = facts.last_attempt or {}
    err_type = error.get("error_type") or (job.get("error") or {}).get("type")
    message = error.get("error_message") or (job.get("error") or {}).get("message")
    return [
        Gate(
            "final",
            True,
            f"failed: attempts exhausted ({job['attempt']}/{job['max_attempts']}); last error "
            f"{err_type}: {message}",
        )
    ]


def _due_gate(job: Row, now: datetime.datetime) -> Gate:
    run_at = when(job["run_at"])
    state = job["state"]
    if (
        state in (JobState.READY, JobState.SCHEDULED, JobState.SLEEPING)
        and run_at is not None
        and run_at > now
    ):
        verb = "sleeping until" if state == JobState.SLEEPING else "not due until"
        return Gate("due", True, f"{verb} {_at(run_at, now)}")
    return Gate("due", False, "due")


def _wait_gate(job: Row, now: datetime.datetime) -> Gate:
    if job["state"] != JobState.WAITING:
        return Gate("wait", False, "not waiting")
    timeout = f" (times out {_at(job['run_at'], now)})" if job.get("run_at") else ""
    if job.get("wait_event_key"):
        return Gate("wait", True, f"waiting for event {job['wait_event_key']!r}{timeout}")
    children = job.get("wait_children")
    if children:
        ids = ", ".join(str(child) for child in children)
        return Gate("wait", True, f"waiting for child job(s) {ids}{timeout}")
    return Gate("wait", True, f"waiting{timeout}")


def silent_after(
    heartbeat_seconds: float | None, live_seconds: float = LIVE_HEARTBEAT_SECONDS
) -> float:
    """Seconds without a heartbeat after which a worker counts as gone: two of the gaps it
    promised between heartbeats (`WorkerConfig.heartbeat_every`), else `live_seconds`."""
    return SILENT_INTERVALS * heartbeat_seconds if heartbeat_seconds else live_seconds


def silence(heartbeat_age: float | None, heartbeat_seconds: float | None) -> float | None:
    """How long the worker has been silent past its promise (its heartbeat's age), or None
    while it is live."""
    if heartbeat_age is None or heartbeat_age <= silent_after(heartbeat_seconds):
        return None
    return heartbeat_age


def _is_live(worker: Row, now: datetime.datetime, live_seconds: float) -> bool:
    beat = when(worker.get("heartbeat_at"))
    limit = silent_after(worker.get("heartbeat_seconds"), live_seconds)
    return beat is not None and (now - beat).total_seconds() <= limit


def _lease_gate(
    job: Row, workers: Sequence[Row], now: datetime.datetime, live_seconds: float
) -> Gate:
    if job["state"] != JobState.RUNNING:
        return Gate("lease", False, "no lease held")
    worker_id = str(job.get("worker_id"))
    owner = next((w for w in workers if str(w.get("id")) == worker_id), None)
    expires = when(job.get("lease_expires_at"))
    expired = expires is not None and expires <= now
    if owner is None or expired or not _is_live(owner, now, live_seconds):
        return Gate(
            "lease",
            True,
            f"lease held by a dead worker {worker_id} until {_at(expires, now)} (recovered by "
            "the next maintenance pass after that, within about a third of the lease)",
        )
    where = f"{owner.get('hostname')}:{owner.get('pid')}"
    return Gate(
        "lease",
        True,
        f"running on worker {worker_id} ({where}), attempt {job['attempt']}/"
        f"{job['max_attempts']}, lease until {_at(expires, now)}",
    )


def _limits_gate(job: Row, limits: Row | None, now: datetime.datetime) -> Gate:
    # The claim's gate (migration 0023) runs before it looks at any job of the queue.
    queue = job["queue"]
    if limits is None:
        return Gate("limits", False, f"queue {queue!r} has no global or rate limit")
    waiting = job["state"] in (JobState.READY, JobState.SCHEDULED)
    limit, running = limits.get("global_limit"), limits.get("running", 0)
    until = when(limits.get("rate_limited_until"))
    if waiting and limit is not None and running >= limit:
        return Gate(
            "limits", True, f"queue {queue!r} at its global limit {running}/{limit} (all workers)"
        )
    if waiting and until is not None and until > now:
        return Gate(
            "limits",
            True,
            f"queue {queue!r} rate limited until {_at(until, now)} ({limits.get('rate')})",
        )
    parts = [f"global limit {running}/{limit}"] if limit is not None else []
    if limits.get("rate") is not None:
        parts.append(f"rate {limits['rate']}")
    return Gate("limits", False, f"queue {queue!r} under its " + " and ".join(parts))


def _pause_gate(job: Row, pause: Row | None, now: datetime.datetime) -> Gate:
    # The claim statement checks the pause before it looks at any job of the queue.
    queue = job["queue"]
    if pause is None or job["state"] not in (JobState.READY, JobState.SCHEDULED):
        return Gate("paused", False, f"queue {queue!r} is not paused")
    return Gate(
        "paused",
        True,
        f"queue {queue!r} is paused since {_at(pause.get('paused_at'), now)} "
        f"(trioq queue resume {queue})",
    )


def _key_gate(job: Row, facts: ExplainFacts, now: datetime.datetime) -> Gate:
    key = job.get("partition_key")
    if key is None or job["state"] not in (JobState.READY, JobState.SCHEDULED):
        return Gate("partition_key", False, "no partition key to wait for")
    holder = facts.key_holder
    if holder is not None:
        lease = (
            f"lease until {_at(holder.get('lease_expires_at'), now)}"
            if holder.get("state") == JobState.RUNNING
            else f"{holder.get('state')} until {_at(holder.get('run_at'), now)}"
        )
        return Gate(
            "partition_key", True, f"partition key {key!r} held by job {holder['id']} ({lease})"
        )
    if facts.key_ahead is not None:
        return Gate(
            "partition_key",
            True,
            f"partition key {key!r}: job {facts.key_ahead['id']} is ahead of it in key order",
        )
    return Gate("partition_key", False, f"partition key {key!r} is free")


def _concurrency_gates(job: Row, concurrency: Row | None, now: datetime.datetime) -> list[Gate]:
    """Gates only for a job with a concurrency key (most jobs have none): its limit, and its
    rate when the key has one."""
    key = job.get("concurrency_key")
    if key is None or concurrency is None:
        return []
    waiting = job["state"] in (JobState.READY, JobState.SCHEDULED)
    running, limit = int(concurrency["running"]), int(concurrency["limit"])
    head = concurrency.get("head_id")
    # The claim takes one limit per key (`claim_limit`): say so when another job's applies.
    whose = (
        ""
        if head is None or int(head) == int(job["id"])
        else f" (the claim takes the key's limit from its next job, {head}, unless a pattern "
        "sets it)"
    )
    if waiting and running >= limit:
        gates = [Gate("concurrency_key", True, f"key {key} at its limit {running}/{limit}{whose}")]
    else:
        gates = [Gate("concurrency_key", False, f"key {key} runs {running}/{limit}{whose}")]
    if concurrency.get("rate_allowed") is not None:
        gates.append(_key_rate_gate(key, concurrency, waiting, now))
    return gates


def _key_rate_gate(key: str, concurrency: Row, waiting: bool, now: datetime.datetime) -> Gate:
    rate = Rate(int(concurrency["rate_allowed"]), float(concurrency["rate_period"]))
    until = when(concurrency.get("rate_limited_until"))
    if waiting and until is not None and until > now:
        return Gate("key_rate", True, f"rate limited until {_at(until, now)} ({rate}, key {key})")
    recent = concurrency.get("recent_starts", 0)
    return Gate("key_rate", False, f"key {key} under its rate {rate} ({recent} in the window)")


def _worker_gates(
    job: Row, facts: ExplainFacts, now: datetime.datetime, live_seconds: float
) -> list[Gate]:
    if job["state"] not in (JobState.READY, JobState.SCHEDULED):
        return []
    queue, task = job["queue"], job["task"]
    live = [w for w in facts.workers if _is_live(w, now, live_seconds)]
    if not live:
        elsewhere = [w for w in facts.other_workers if _is_live(w, now, live_seconds)]
        return [Gate("workers", True, _unserved_queue(queue, task, elsewhere))]
    slots = [_queue_slots(w, queue) for w in live]
    gates = [
        Gate(
            "workers",
            False,
            f"{len(live)} live worker(s) serve queue {queue!r} with "
            f"{'+'.join(map(str, slots))} slot(s)",
        )
    ]
    serving = live
    if any(w.get("task_versions") for w in live):
        pair = f"{task}@{job.get('version', 1)}"
        serving = [w for w in live if pair in (w.get("task_versions") or ())]
        if not serving:
            detail = f"no live worker serves task {task!r} version {job.get('version', 1)}"
            return [*gates, Gate("version", True, detail)]
        gates.append(Gate("version", False, f"{len(serving)} worker(s) serve {pair}"))
    if all(w.get("state") == "draining" for w in serving):
        return [*gates, Gate("draining", True, f"every worker serving queue {queue!r} is draining")]
    accepting = [w for w in serving if w.get("state") != "draining"]
    gates.append(Gate("draining", False, "a serving worker is accepting work"))
    return [*gates, _admission_gate(queue, accepting, now)]


def _unserved_queue(queue: str, task: str, elsewhere: Sequence[Row]) -> str:
    """Why no worker claims a job whose queue no live worker serves: the queue, unless live
    workers of other queues report their tasks and none has this one (a misspelt task name
    lands on the default queue, so blaming the queue misleads; `trioq status` names the task).
    A worker registers every task of its app, whichever queues it serves."""
    reporting = [w for w in elsewhere if w.get("task_versions")]
    prefix = f"{task}@"
    if not reporting or any(v.startswith(prefix) for w in reporting for v in w["task_versions"]):
        return f"no live worker serves queue {queue!r}"
    return (
        f"no live worker registers task {task!r} (nor serves queue {queue!r}): a misspelt task "
        f"name, or its worker is not running? ({len(reporting)} live worker(s) of other queues "
        "serve other tasks: `trioq status` lists them)"
    )


def _queue_slots(worker: Row, queue: str) -> int:
    """The worker's slots for `queue`: its per-queue figure (migration 0018), else its total."""
    queues, slots = worker.get("queues") or [], worker.get("queue_concurrency")
    if slots and queue in queues and len(slots) == len(queues):
        return int(slots[queues.index(queue)])
    return int(worker.get("concurrency") or 0)


# Reason codes of trioq._core.admission, as explain words them.
_REASON_TEXT = {
    "scheduler_lag": "scheduler lag",
    "lease_renewal_late": "lease renewals running late",
    "db_errors": "database errors",
    "claim_latency": "slow claim statements",
}


def _reduction(worker: Row, queue: str) -> Row | None:
    """The worker's admission entry for `queue` (its row's snapshot), or None at full."""
    snapshot = worker.get("admission") or {}
    entry = snapshot.get(queue)
    return entry if isinstance(entry, Mapping) else None


def _because(entry: Row) -> str:
    reason, cause = str(entry.get("reason")), str(entry.get("cause"))
    cause_text = _REASON_TEXT.get(cause, cause)
    if reason == "recovering":
        return f"it is recovering from {cause_text}"
    return _REASON_TEXT.get(reason, reason)


def _admission_gate(queue: str, accepting: Sequence[Row], now: datetime.datetime) -> Gate:
    reduced = [(w, entry) for w in accepting if (entry := _reduction(w, queue)) is not None]
    if len(reduced) < len(accepting) or not accepting:
        detail = f"{len(accepting) - len(reduced)} accepting worker(s) at full concurrency"
        return Gate("admission", False, detail)
    parts = [
        f"{entry.get('limit')} of {entry.get('concurrency')} because {_because(entry)} "
        f"(worker {w.get('id')} on {w.get('hostname')}:{w.get('pid')}, since "
        f"{_at(entry.get('since'), now)})"
        for w, entry in reduced
    ]
    total = sum(int(entry.get("limit") or 0) for _, entry in reduced)
    if len(parts) == 1:
        return Gate("admission", True, f"admission reduced to {parts[0]}")
    return Gate("admission", True, f"admission reduced to {total}: " + "; ".join(parts))


__all__ = ["ExplainFacts", "Explanation", "Gate", "explain", "silence", "silent_after"]
