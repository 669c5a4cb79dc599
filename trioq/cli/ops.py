"""`trioq status` and `trioq explain`: what an operator reads during and after an incident.

Tables are rendered with rich; `--json` prints the same data for machines. `status --watch N`
redraws every N seconds (rich.live) until interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

import attrs
import trio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from .._core.explain import Explanation, silence
from .._seam.admin import (
    ConcurrencyKeyStatus,
    HealthReport,
    KeyRateStatus,
    QueueDemand,
    QueueLimit,
    QueuePause,
    QueueStatus,
    UnroutableJobs,
    WorkerInfo,
)
from ..client import Client


@attrs.frozen
class StatusSnapshot:
    queues: tuple[QueueStatus, ...]
    demand: tuple[QueueDemand, ...]
    workers: tuple[WorkerInfo, ...]
    health: HealthReport
    paused: tuple[QueuePause, ...] = ()
    unroutable: tuple[UnroutableJobs, ...] = ()
    keys: tuple[ConcurrencyKeyStatus, ...] = ()  # concurrency keys with running jobs
    limits: tuple[QueueLimit, ...] = ()
    rated_keys: tuple[KeyRateStatus, ...] = ()  # rated keys with starts in their window


async def read_status(client: Client) -> StatusSnapshot:
    return StatusSnapshot(
        queues=tuple(await client.queue_status()),
        demand=tuple(await client.queue_demand()),
        workers=tuple(await client.workers()),
        health=await client.status_health(),
        paused=tuple(await client.paused_queues()),
        unroutable=tuple(await client.driver.job_unroutable()),
        keys=tuple(await client.key_status()),
        limits=tuple(await client.queue_limits()),
        rated_keys=tuple(await client.key_rate_status()),
    )


def status_json(snapshot: StatusSnapshot) -> str:
    return json.dumps(attrs.asdict(snapshot, recurse=True), default=str, indent=2)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def admission_cell(worker: WorkerInfo) -> str:
    """Reduced effective limits, e.g. `mail 2/8 db_errors 40s` (`full`: none reduced)."""
    return (
        ", ".join(
            f"{a.queue} {a.limit}/{a.concurrency} {a.reason} {a.reduced_for_seconds:.0f}s"
            for a in worker.admission
        )
        or "full"
    )


def queues_cell(worker: WorkerInfo) -> str:
    """The worker's queues with their slots, e.g. `default=25,mail=2`."""
    return ",".join(f"{queue}={worker.slots(queue)}" for queue in worker.queues)


def worker_silence(worker: WorkerInfo) -> float | None:
    """Seconds the worker has been silent, when that is more than two of its heartbeat
    intervals (it is probably dead: killed, or its host gone); None while it beats."""
    return silence(worker.heartbeat_age_seconds, worker.heartbeat_seconds)


def state_cell(worker: WorkerInfo) -> str:
    silent = worker_silence(worker)
    return worker.state if silent is None else f"silent {silent:.0f}s (probably dead)"


def limit_line(limit: QueueLimit) -> str:
    """`queue partner at its global limit 5/5; rate 100/m: 100 started in the window, rate
    limited until 12:00:03`, for `trioq status` and `trioq explain`."""
    parts = []
    if limit.global_limit is not None:
        at = "at its" if limit.running >= limit.global_limit else "under its"
        parts.append(f"{at} global limit {limit.running}/{limit.global_limit}")
    if limit.rate is not None:
        rate = f"rate {limit.rate}: {limit.recent_starts} started in the window"
        if limit.rate_limited_until is not None:
            rate += f", rate limited until {limit.rate_limited_until:%Y-%m-%d %H:%M:%S.%f}"
        parts.append(rate)
    return f"queue {limit.queue} " + "; ".join(parts)


def heartbeat_cell(worker: WorkerInfo) -> str:
    """The last heartbeat's age (database time), e.g. `4s ago`."""
    if worker.heartbeat_age_seconds is None:
        return f"{worker.heartbeat_at:%H:%M:%S}"
    return f"{max(worker.heartbeat_age_seconds, 0.0):.0f}s ago"


def status_tables(snapshot: StatusSnapshot) -> Group:
    demand = {row.queue: row for row in snapshot.demand}
    queues = Table(title="queues", title_justify="left")
    for name in ("queue", "ready", "oldest", "running", "scheduled", "sleeping", "waiting",
                 "due now", "expired", "completed", "failed", "cancelled"):  # fmt: skip
        queues.add_column(name, justify="left" if name == "queue" else "right")
    for q in snapshot.queues:
        d = demand.get(q.queue)
        queues.add_row(
            q.queue, str(q.ready), _age(q.oldest_ready_seconds), str(q.running),
            str(d.scheduled if d else q.scheduled), str(d.sleeping if d else 0),
            str(d.waiting if d else 0), str(d.due_now if d else q.ready),
            str(q.expired_leases), str(q.completed), str(q.failed), str(q.cancelled),
        )  # fmt: skip
    paused = [
        f"queue {p.queue} is PAUSED since {p.paused_at:%Y-%m-%d %H:%M:%S} (trioq queue resume)"
        for p in snapshot.paused
    ]
    # Only the keys at their limit: their next jobs wait (the others are fine).
    paused += [
        f"key {k.key} at its limit {k.running}/{k.limit} (trioq key limit to change it)"
        for k in snapshot.keys
        if k.saturated
    ]
    # Only the rated keys whose window is full: their next start waits for it.
    paused += [
        f"key {k.key} rate {k.rate}: rate limited until "
        f"{k.rate_limited_until:%Y-%m-%d %H:%M:%S.%f} ({k.recent_starts} started in the window)"
        for k in snapshot.rated_keys
        if k.rate_limited_until is not None
    ]
    limited = [limit_line(limit) for limit in snapshot.limits]
    silent = sum(worker_silence(w) is not None for w in snapshot.workers)
    title = f"workers ({len(snapshot.workers)}" + (f", {silent} silent)" if silent else ")")
    workers = Table(title=title, title_justify="left")
    for name in ("id", "host:pid", "state", "queues", "running", "heartbeat", "serves",
                 "admission"):  # fmt: skip
        # A worker serving many tasks wraps its serves cell (between names) instead of cutting it.
        workers.add_column(name, overflow="fold")
    for w in snapshot.workers:
        workers.add_row(
            str(w.id)[:8], f"{w.hostname}:{w.pid}", state_cell(w), queues_cell(w),
            f"{w.running}/{w.concurrency}", heartbeat_cell(w),
            ", ".join(w.task_versions) or "-", admission_cell(w),
        )  # fmt: skip
    unroutable = [
        f"UNROUTABLE: {u.jobs} job(s) of {u.task} version {u.version} on queue {u.queue} "
        f"({', '.join(u.states)}): no live worker serves {u.task}@{u.version}"
        for u in snapshot.unroutable
    ]
    h = snapshot.health
    health = Table(title="health list (after an incident, these should fall to 0)",
                   title_justify="left")  # fmt: skip
    health.add_column("check")
    health.add_column("count", justify="right")
    for label, value in [
        ("ready backlog", h.ready_backlog),
        ("expired ownership (lease expired, not recovered)", h.expired_ownership),
        ("sleeping work due now", h.sleeping_due),
        ("stale running (no live worker)", h.stale_running),
        ("active waits", h.active_waits),
        ("due wait timeouts", h.due_wait_timeouts),
        ("waiting locks", h.waiting_locks),
        ("deadlocks (since stats reset)", h.deadlocks),
    ]:
        health.add_row(label, _dash(value))
    pressure = Table(title="database pressure", title_justify="left")
    pressure.add_column("figure")
    pressure.add_column("value", justify="right")
    backends = ", ".join(f"{state} {n}" for state, n in sorted(h.backends.items())) or "-"
    ratio = "-" if h.cache_hit_ratio is None else f"{h.cache_hit_ratio:.2%}"
    vacuum = "-" if h.last_autovacuum is None else f"{h.last_autovacuum:%Y-%m-%d %H:%M:%S}"
    for label, text in [
        ("backends by state", backends),
        ("backends waiting on a lock", _dash(h.lock_waits)),
        ("cache hit ratio", ratio),
        ("jobs table size", _bytes(h.jobs_table_bytes)),
        ("jobs index size", _bytes(h.jobs_index_bytes)),
        ("jobs dead / live tuples", f"{_dash(h.dead_tuples)} / {_dash(h.live_tuples)}"),
        ("job_runs last autovacuum", vacuum),
    ]:
        pressure.add_row(label, text)
    return Group(queues, *paused, *limited, workers, *unroutable, health, pressure)


async def run_status(client: Client, args: argparse.Namespace, console: Console) -> int:
    if args.json:
        print(status_json(await read_status(client)))
        return 0
    if args.watch is None:
        console.print(status_tables(await read_status(client)))
        return 0
    with Live(status_tables(await read_status(client)), console=console) as live:
        while True:
            await trio.sleep(args.watch)
            live.update(status_tables(await read_status(client)))


def explanation_json(why: Explanation) -> str:
    data: dict[str, Any] = attrs.asdict(why)
    data["blocked_by"] = why.blocked_by
    return json.dumps(data, indent=2)


def print_explanation(why: Explanation, console: Console) -> None:
    console.print(f"job {why.job_id} ({why.state}): [bold]{why.verdict}[/bold]", highlight=False)
    table = Table(title="gates, in claim order", title_justify="left")
    table.add_column("gate")
    table.add_column("")
    table.add_column("detail")
    for gate in why.gates:
        table.add_row(gate.name, "[red]blocks[/red]" if gate.blocking else "ok", gate.detail)
    console.print(table)


def when_text(moment: datetime.datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")


__all__ = ["print_explanation", "read_status", "run_status", "status_tables"]
