"""The dashboard's reads and its audit writes: named statements of queries.sql, run through the
client's driver (`client.transaction()`), plus the Client methods the CLI uses.

Every read runs in a READ ONLY transaction with a statement timeout of its own, so a dashboard
left open on a wall screen can neither write nor hold a long query on a loaded database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs

from .._core.states import TERMINAL_IN_ORDER, JobState
from .._seam.driver import Transaction
from .._sql import queries
from ..client import Client

COUNT_CAP = 1_000  # a count stops here; past it the page shows the planner's estimate
THROUGHPUT_CAP = 10_000  # finished rows read for the last hour's chart
SEARCH_WALK = 5_000  # rows read per jobs page when a filter has no index of its own
TEXT_LIMIT = 64_000  # characters of a payload, result or checkpoint value shown
PAGE_SIZE = 50

FINISHED = TERMINAL_IN_ORDER
_FILTERS = ("state", "task", "queue", "partition_key", "created_after", "created_before", "text")
_QUEUE_COLUMNS = ("queue", "ready", "running", "scheduled", "sleeping", "waiting",
                  "due_capped", "sleeping_due", "waiting_due", "overdue_capped",
                  "oldest_due_seconds", "paused_at")  # fmt: skip
_SEARCH_COLUMNS = ("id", "queue", "task", "state", "priority", "run_at", "partition_key",
                   "attempt", "max_attempts", "created_at", "finished_at", "payload_head",
                   "error_message")  # fmt: skip
_JOB_COLUMNS = ("id", "queue", "task", "state", "priority", "run_at", "partition_key",
                "dedup_key", "attempt", "max_attempts", "worker_id", "created_at", "started_at",
                "finished_at", "version", "parent_id", "wait_event_key", "wait_children",
                "checkpoint_count", "cancel_requested", "payload", "payload_length", "result",
                "result_length", "error", "deadline_at", "deadline_source")  # fmt: skip
_WORKFLOW_COLUMNS = ("id", "queue", "task", "state", "run_at", "wait_event_key",
                     "wait_children", "checkpoint_count", "created_at", "last_kind",
                     "last_name", "last_at")  # fmt: skip
_AUDIT_COLUMNS = ("id", "at", "actor", "address", "action", "target", "detail", "outcome")


def _rows(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _health(queues: Sequence[dict[str, Any]], row: Sequence[Any]) -> dict[str, Any]:
    """`trioq status`'s health list: per-queue sums (capped: `capped` names the inexact ones)
    and the statement's own counts."""
    expired, stale, waiting_locks, deadlocks = row
    sums = {
        "ready_backlog": ("ready", False),
        "sleeping_due": ("sleeping_due", True),
        "active_waits": ("waiting", False),
        "due_wait_timeouts": ("waiting_due", True),
    }
    health: dict[str, Any] = {"capped": []}
    for key, (column, overdue) in sums.items():
        health[key] = sum(q[column] for q in queues)
        capped_flag = "overdue_capped" if overdue else "due_capped"
        if any(q[column] >= COUNT_CAP or q[capped_flag] for q in queues):
            health["capped"].append(key)
    health.update(
        expired_ownership=expired,
        stale_running=stale,
        waiting_locks=waiting_locks,
        deadlocks=deadlocks,
    )
    return health


@attrs.frozen
class JobSearch:
    """The jobs page's filters (None: any); validated by the route before they get here."""

    state: str | None = None
    task: str | None = None
    queue: str | None = None
    partition_key: str | None = None
    created_after: Any = None
    created_before: Any = None
    text: str | None = None
    before_id: int | None = None
    before_finished: Any = None  # with a finished state: the keyset is (finished_at, id)
    limit: int = PAGE_SIZE


@attrs.define(eq=False)
class Store:
    """Reads for the pages (on `client`) and the audit trail (on `writer`, default `client`:
    reads may use a read-only role while actions and their audit rows use another)."""

    client: Client
    writer: Client | None = None
    _sql: dict[str, str] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._sql = queries(self.client.driver.schema)

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[Transaction]:
        async with self.client.driver.transaction() as tx:
            await tx.execute(self._sql["dashboard_read_only"])
            yield tx

    async def _fetch(self, tx: Transaction, name: str, **params: Any) -> list[tuple[Any, ...]]:
        return await tx.fetch(self._sql[name], params)

    # --- overview -------------------------------------------------------------------------

    async def overview(self) -> dict[str, Any]:
        async with self._reading() as tx:
            minutes = await self._fetch(tx, "dashboard_throughput", cap=THROUGHPUT_CAP)
            recent_queues = sorted({row[0] for row in minutes})
            queues = _rows(
                _QUEUE_COLUMNS,
                await self._fetch(tx, "dashboard_queue_counts", cap=COUNT_CAP, also=recent_queues),
            )
            estimates = await self._fetch(
                tx, "dashboard_state_estimates", schema_name=self.client.driver.schema
            )
            [health] = await self._fetch(tx, "dashboard_health")
            [(now,)] = await self._fetch(tx, "dashboard_now")
        by_queue: dict[str, dict[str, list[int]]] = {}
        covered: float | None = None
        for queue, minutes_ago, completed, failed, covered_seconds in minutes:
            series = by_queue.setdefault(queue, {"completed": [0] * 60, "failed": [0] * 60})
            series["completed"][59 - minutes_ago] = completed
            series["failed"][59 - minutes_ago] = failed
            covered = covered_seconds if covered_seconds is not None else covered
        estimated: dict[str, dict[str, int]] = {}
        for queue_name, state, estimate in estimates:
            estimated.setdefault(queue_name, {})[state] = estimate
        for queue in queues:
            series = by_queue.get(queue["queue"], {"completed": [0] * 60, "failed": [0] * 60})
            queue["completed_per_minute"] = series["completed"]
            queue["failed_per_minute"] = series["failed"]
            queue["estimates"] = estimated.get(queue["queue"], {})
        return {
            "queues": queues,
            "count_cap": COUNT_CAP,
            "health": _health(queues, health),
            "throughput_covered_seconds": covered,
            "now": now,
        }

    # --- jobs -----------------------------------------------------------------------------

    async def search(self, search: JobSearch) -> dict[str, Any]:
        """One page of jobs. The statement depends on the filter, so that each page reads a
        bounded number of rows (see the three statements' comments in queries.sql)."""
        params: dict[str, Any] = {
            "state": search.state,
            "task": search.task,
            "queue": search.queue,
            "partition_key": search.partition_key,
            "created_after": search.created_after,
            "created_before": search.created_before,
            "text": search.text,
            "before_id": search.before_id,
            "limit": search.limit,
        }
        filtered = any(params[name] is not None for name in _FILTERS)
        if search.state in FINISHED and search.text is None:
            name, walk = "dashboard_job_search_finished", SEARCH_WALK
            params["before_finished"] = search.before_finished
        elif search.state in (JobState.SLEEPING, JobState.WAITING) and search.text is None:
            name, walk = "dashboard_job_search_suspended", search.limit
        elif search.state == JobState.READY and search.text is None:
            name, walk = "dashboard_job_search_ready", search.limit
        elif search.state is not None and search.text is None:
            name, walk = "dashboard_job_search_unfinished", search.limit
        else:
            name, walk = "dashboard_job_search", SEARCH_WALK if filtered else search.limit
        async with self._reading() as tx:
            rows = await self._fetch(tx, name, walk=walk, **params)
        walked_to, walked, walked_to_finished = rows[0][-3:]
        jobs = _rows(_SEARCH_COLUMNS, [row[:-3] for row in rows if row[0] is not None])
        more = walked == walk and walked_to is not None  # the walk stopped at its bound
        return {
            "jobs": jobs,
            "next_before_id": walked_to if more else None,
            "next_before_finished": walked_to_finished if more else None,
            "walked": walked,
        }

    async def job(self, job_id: int) -> dict[str, Any] | None:
        async with self._reading() as tx:
            rows = await self._fetch(tx, "dashboard_job_get", id=job_id, text_limit=TEXT_LIMIT)
            if not rows:
                return None
            job = dict(zip(_JOB_COLUMNS, rows[0], strict=True))
            history = await self._fetch(
                tx, "dashboard_job_history", id=job_id, text_limit=TEXT_LIMIT
            )
            children = await self._fetch(tx, "dashboard_job_children", id=job_id)
        job["wait_children"] = list(job["wait_children"] or [])
        return {
            "job": job,
            "history": _rows(
                ("position", "kind", "name", "value", "created_at", "emitted_at"), history
            ),
            "children": _rows(
                ("id", "task", "state", "parent_position", "created_at", "finished_at"), children
            ),
        }

    async def workflows(self, before_id: int | None, limit: int = PAGE_SIZE) -> dict[str, Any]:
        async with self._reading() as tx:
            rows = await self._fetch(tx, "dashboard_workflows", before_id=before_id, limit=limit)
        workflows = _rows(_WORKFLOW_COLUMNS, rows)
        for workflow in workflows:
            workflow["wait_children"] = list(workflow["wait_children"] or [])
        more = len(workflows) == limit
        return {"workflows": workflows, "next_before_id": workflows[-1]["id"] if more else None}

    # --- audit ----------------------------------------------------------------------------

    async def audit_start(
        self, *, actor: str, address: str, action: str, target: str, detail: dict[str, Any]
    ) -> int:
        """Record an action before it runs; returns the row's id for `audit_finish`."""
        async with (self.writer or self.client).driver.transaction() as tx:
            [(audit_id,)] = await self._fetch(
                tx,
                "dashboard_audit_insert",
                actor=actor[:256],
                address=address[:256],
                action=action,
                target=target[:1024],
                detail=json.dumps(detail, default=str),
            )
        return int(audit_id)

    async def audit_finish(self, audit_id: int, outcome: str) -> None:
        async with (self.writer or self.client).driver.transaction() as tx:
            await tx.execute(
                self._sql["dashboard_audit_finish"], {"id": audit_id, "outcome": outcome[:4096]}
            )

    async def audit(self, before_id: int | None, limit: int = PAGE_SIZE) -> list[dict[str, Any]]:
        async with self._reading() as tx:
            rows = await self._fetch(tx, "dashboard_audit_list", before_id=before_id, limit=limit)
        return _rows(_AUDIT_COLUMNS, rows)
