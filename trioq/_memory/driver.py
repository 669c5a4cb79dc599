"""MemoryDriver: the Driver protocol in memory, with the semantics of `_sql/queries.sql`.

It exists for model-based tests and for runtime tests under virtual time. What holds:

- Each method is one atomic "statement": it checkpoints first (so it can be cancelled, and then
  changes nothing), then runs to completion without yielding, like a statement that commits.
- Time is `clock()` seconds after a fixed UTC epoch; the default clock is `trio.current_time`,
  so under `trio.testing.MockClock` run_at and leases move in virtual time.
- Claims take ready, due jobs of the caller's tasks in (priority, run_at, id) order; a keyed job
  is claimable only when no job of its (queue, key) runs and it heads the key's ready, due jobs,
  and only from the `key_window` keys visited round-robin after the caller's `key_cursor`.
- Every write after a claim is fenced on (id, attempt, lease_token, state='running').
- Notifications go to the listeners subscribed to a channel only when the change commits, with
  duplicates within one commit collapsed (as Postgres does), in commit order per listener.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .._core.channels import control_channel, schedules_channel
from .._core.errors import DedupKeyConflict, dedup_key_conflict_message
from .._core.explain import ExplainFacts
from .._core.identifiers import validate_schema
from .._core.limits import Rate
from .._core.outcomes import rule_of, settled_state
from .._core.retention import expired
from .._core.schedule import fire_dedup_key
from .._core.states import TERMINAL_IN_ORDER
from .._seam.admin import (
    AttemptRecord,
    CancelJob,
    CancelOutcome,
    ConcurrencyKeyStatus,
    ConcurrencyLimit,
    ConcurrencyRate,
    Descendant,
    HealthReport,
    JobFilter,
    JobPurge,
    KeyRateStatus,
    QueueDemand,
    QueueLimit,
    QueueLimitSet,
    QueuePause,
    QueueStatus,
    TaskHistoryKind,
    TaskStatus,
    UnroutableJobs,
    WorkerInfo,
    WorkflowFilter,
    WorkflowRecord,
)
from .._seam.driver import (
    Claim,
    ClaimedJob,
    ClaimResult,
    DriverStatistics,
    EmitEvent,
    EmitOutcome,
    InsertedJob,
    JobRecord,
    MessageSend,
    NewJob,
    NotifyCallback,
    Settlement,
    SettleResult,
    ValueRead,
    WorkflowValue,
)
from .._seam.lease import Lease
from .._seam.schedules import (
    FiredOccurrence,
    NewSchedule,
    ScheduleDue,
    ScheduleFireDue,
    ScheduleFireReport,
    ScheduleRecord,
)
from .._seam.services import (
    LeaderElect,
    LeaderResign,
    LeadershipReport,
    MaintenancePass,
    MaintenanceReport,
    QueueProbe,
    RenewalResult,
    RenewedLease,
    RenewLeases,
    WorkerRegistration,
)
from .._seam.workflow import (
    CancelChildren,
    Checkpoint,
    CheckpointWrite,
    ChildrenWaitOutcome,
    ContinueAsNew,
    EventWaitOutcome,
    Receive,
    ReceiveOutcome,
    SendOutcome,
    Spawn,
    SpawnOutcome,
    ValueSet,
    WaitChildren,
    WaitEvent,
    WrittenCheckpoint,
)
from .._sql import migrations
from . import concurrency, limits, messages, reads, waits
from .state import (
    FINISHED_STATES,
    SECOND,
    SUSPENDED_OR_SCHEDULED,
    LeaderSeat,
    MemoryListener,
    MemoryState,
    Outbox,
    Row,
    Worker,
    before,
    before_or_at,
    deadline_error,
    loads,
    new_row,
    validate_new_job,
)

_LEASE_EXPIRED_ERROR = '{"type":"LeaseExpired","message":"worker lost: lease expired"}'


@attrs.define(eq=False)
class MemoryTransaction:
    """A transaction on the memory driver: enqueues are buffered and applied at commit.

    Ids are drawn at once (like a sequence, never reused after a rollback); a dedup key stays
    reserved until the transaction ends, so another enqueue of that key waits for the outcome,
    as it would on Postgres. There is no SQL in memory: `execute` and `fetch` raise.
    """

    _driver: MemoryDriver
    _rows: list[Row] = attrs.field(factory=list)
    _settlements: list[Settlement] = attrs.field(factory=list)
    _events: list[EmitEvent] = attrs.field(factory=list)
    _ended: trio.Event = attrs.field(factory=trio.Event)

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> None:
        await trio.lowlevel.checkpoint()
        raise NotImplementedError("the memory driver runs no SQL")

    async def fetch(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        await trio.lowlevel.checkpoint()
        raise NotImplementedError("the memory driver runs no SQL")

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]:
        if self._ended.is_set():
            raise RuntimeError("this transaction has already ended")
        return await self._driver._insert(jobs, self)

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """Fenced now, applied at commit (fenced again then, as the row lock would hold it)."""
        if self._ended.is_set():
            raise RuntimeError("this transaction has already ended")
        now = await self._driver._state.statement("job_settle_many")
        held = [s for s in settlements if self._driver._holds(s.lease)]
        self._settlements.extend(held)
        # the state each rule leaves the job in when not due at once (applied at commit)
        return SettleResult(
            settled=tuple((s.lease.id, rule_of(s.kind).state) for s in held), now=now
        )

    async def event_emit(self, params: EmitEvent) -> EmitOutcome:
        """Buffered like the enqueues: stored and its waiters woken only at commit. The
        outcome is the one the emit would have now."""
        if self._ended.is_set():
            raise RuntimeError("this transaction has already ended")
        await self._driver._state.statement("event_emit")
        json.loads(params.payload_json)
        self._events.append(params)
        emitted_at = (
            self._driver._state.events[params.key].emitted_at
            if params.key in self._driver._state.events
            else None
        )
        first = emitted_at is None and params.key not in {e.key for e in self._events[:-1]}
        return EmitOutcome(first=first, woken=0)


@attrs.define(eq=False)
class MemoryDriver:
    """The Driver protocol in memory (see the module docstring for what it guarantees).

    The leader seat is elected as in SQL (several workers may share one driver). `clock`
    returns seconds since `EPOCH`; it defaults to `trio.current_time`.
    """

    schema: str = "trioq"
    clock: Callable[[], float] = trio.current_time
    _state: MemoryState = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        validate_schema(self.schema)
        self._state = MemoryState(self.schema, self.clock)

    def statistics(self) -> DriverStatistics:
        return DriverStatistics(calls=dict(self._state.calls))

    async def migrate(self) -> list[int]:
        """Nothing to create; reports the schema versions once, like a first migration."""
        await trio.lowlevel.checkpoint()
        if self._state.migrated:
            return []
        self._state.migrated = True
        return [migration.version for migration in migrations(self.schema)]

    # --- enqueue --------------------------------------------------------------------------

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]:
        """Insert a batch; a dedup key already taken returns that job with created=False."""
        return await self._insert(jobs, None)

    async def _insert(
        self, jobs: Sequence[NewJob], transaction: MemoryTransaction | None
    ) -> list[InsertedJob]:
        now = await self._state.statement("job_insert_many")
        for job in jobs:
            validate_new_job(job)
        while (blocker := self._reservation_blocking(jobs, transaction)) is not None:
            await blocker.wait()  # Postgres waits for the other inserter of the key the same way
        results: list[InsertedJob] = []
        created: list[Row] = []
        batch_keys: dict[str, int] = {}
        batch_tasks: dict[int, str] = {}
        for job in jobs:
            self._release_key(job.dedup_key, now)
            existing = self._existing_for_key(job.dedup_key, transaction, batch_keys)
            if existing is not None:
                holder_task = self._task_of(existing, transaction, batch_tasks)
                if job.dedup_key is not None and holder_task != job.task:
                    # As PostgreSQL's statement: refused whole, nothing of the batch written.
                    raise DedupKeyConflict(
                        dedup_key_conflict_message(job.dedup_key, job.task, existing, holder_task)
                    )
                results.append(InsertedJob(id=existing, created=False))
                continue
            row = new_row(next(self._state.ids), job, now, self._state.task_deadline(job))
            if row.dedup_key is not None:
                batch_keys[row.dedup_key] = row.id
                batch_tasks[row.id] = row.task
            created.append(row)
            results.append(InsertedJob(id=row.id, created=True))
        if transaction is None:
            self._state.commit_rows(created)
        else:
            for row in created:
                if row.dedup_key is not None:
                    self._state.reserved[row.dedup_key] = (transaction._ended, row.id)
            transaction._rows.extend(created)
        return results

    def _reservation_blocking(
        self, jobs: Sequence[NewJob], transaction: MemoryTransaction | None
    ) -> trio.Event | None:
        for job in jobs:
            holder = self._state.reserved.get(job.dedup_key) if job.dedup_key is not None else None
            if holder is not None and (transaction is None or holder[0] is not transaction._ended):
                return holder[0]
        return None

    def _release_key(self, key: str | None, now: datetime.datetime) -> None:
        """A finished job that no longer holds its key gives it up to this enqueue."""
        holder = self._state.rows.get(self._state.dedup[key]) if key in self._state.dedup else None
        if key is not None and holder is not None and not holder.holds_key(now):
            del self._state.dedup[key]
            holder.dedup_key = None

    def _task_of(
        self, job_id: int, transaction: MemoryTransaction | None, batch: dict[int, str]
    ) -> str:
        """The task of the job holding a key: committed, this transaction's, or this batch's."""
        if job_id in batch:
            return batch[job_id]
        row = self._state.rows.get(job_id)
        if row is None and transaction is not None:
            row = next((mine for mine in transaction._rows if mine.id == job_id), None)
        assert row is not None, f"no job {job_id} holds the key"
        return row.task

    def _existing_for_key(
        self, key: str | None, transaction: MemoryTransaction | None, batch: dict[str, int]
    ) -> int | None:
        if key is None:
            return None
        if key in self._state.dedup:
            return self._state.dedup[key]
        reserved = self._state.reserved.get(key)
        if reserved is not None and transaction is not None and reserved[0] is transaction._ended:
            return reserved[1]
        return batch.get(key)

    def _end_transaction(self, transaction: MemoryTransaction, commit: bool) -> None:
        for row in transaction._rows:
            if row.dedup_key is not None:
                self._state.reserved.pop(row.dedup_key, None)
        if commit:
            self._state.commit_rows(transaction._rows)
            self._commit_settlements(transaction._settlements, self._state.now())
            outbox = Outbox()
            for event in transaction._events:
                waits.emit(self._state, event, self._state.now(), outbox)
            self._state.deliver(outbox)
        transaction._rows.clear()
        transaction._settlements.clear()
        transaction._events.clear()
        transaction._ended.set()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        """Commit the buffered enqueues on success; drop them on any exception (or cancel).

        The commit itself cannot be cancelled: once the body has finished, it is applied.
        """
        await trio.lowlevel.checkpoint()
        transaction = MemoryTransaction(self)
        try:
            yield transaction
        except BaseException:
            self._end_transaction(transaction, commit=False)
            raise
        self._end_transaction(transaction, commit=True)
        await trio.lowlevel.cancel_shielded_checkpoint()

    # --- claim and the fenced writes ------------------------------------------------------

    def is_connection_lost(self, exc: BaseException) -> bool:
        """The memory driver has no connection; tests inject `ConnectionError` to stand for a
        lost one (anything else is a bug, as on Postgres)."""
        return isinstance(exc, ConnectionError)

    def is_transient(self, exc: BaseException) -> bool:
        """No statement here times out, waits for a lock or deadlocks."""
        return False

    async def job_claim(self, params: Claim) -> ClaimResult:
        """Promote due work, and claim up to `limit` ready jobs.

        Like the SQL statement, the claim sees the state before the promotion: a job promoted
        here is claimable from the next call (unkeyed due rows are claimed at once). Keyed jobs
        come from at most `key_window` keys visited round-robin after `key_cursor`; a key whose
        lock is held is skipped unless its holder is ready again (woken from a suspension),
        which is then the key's only candidate. `Claim.plain` changes nothing here (one
        algorithm serves both of PgDriver's claim forms)."""
        if params.limit < 0:
            raise ValueError("limit must not be negative")
        now = await self._state.statement("job_claim")
        gated = limits.gate(self._state, params.queue, params.limit, now) if params.limit else None
        if gated is not None:  # a limited queue: its gate's count, no early claims
            self._state.calls["queue_limit_gate"] += 1
            params = attrs.evolve(params, limit=gated.allowed, lookahead_seconds=0.0)
        early = now + params.lookahead_seconds * SECOND
        due = self._due_rows(params.queue, early, params.promote_limit)
        claimable = [
            row
            for row in due
            if before_or_at(row.run_at, now) or row.state in ("sleeping", "scheduled")
        ]
        rated: list[concurrency.RatedKey] = []
        candidates, key_cursor, keys_visited, concurrency_cursor = self._claim_candidates(
            params, now, claimable, rated
        )
        due = [row for row in due if row not in candidates and before_or_at(row.run_at, now)]
        outbox = Outbox()
        for row in due:
            row.state = "ready"
        if due:
            outbox.add(self._state.ready_channel(params.queue), params.queue)
        claimed = tuple(self._claim(row, params, now) for row in candidates)
        key_rate_limited_until = concurrency.rate_spend(self._state, rated, candidates, now)
        self._state.deliver(outbox)
        rate_limited_until = None
        if gated is not None:
            rate_limited_until = (
                limits.spend(self._state, params.queue, len(claimed), now)
                if claimed
                else None
                if gated.allowed
                else gated.next_start_at
            )
        next_due = self._next_due(params.queue, now)  # rows claimed early are running now
        return ClaimResult(
            rate_limited_until=rate_limited_until,
            at_global_limit=gated is not None and gated.at_global_limit,
            claimed=claimed,
            now=now,
            next_due=next_due,
            promoted=len(due),
            key_cursor=key_cursor,
            keys_visited=keys_visited,
            concurrency_cursor=concurrency_cursor,
            key_rate_limited_until=key_rate_limited_until,
            plain_next=(
                keys_visited == 0
                and not due
                and (next_due is None or next_due > now + params.lookahead_seconds * SECOND)
            ),
        )

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """Record finished executions' outcomes, fenced (the SQL statement's rules: keys
        released, history written, waiters and parents woken, ready rows' queues notified)."""
        for settlement in settlements:
            for text in (settlement.result_json, settlement.error_json):
                if text is not None:
                    json.loads(text)
        now = await self._state.statement("job_settle_many")
        outbox = Outbox()
        settled_rows = [
            row
            for settlement in settlements
            if (row := self._settle(settlement, now, outbox)) is not None
        ]
        waits.children_finished(self._state, settled_rows, now, outbox)
        self._state.announce_results(settled_rows, outbox)
        self._state.deliver(outbox)
        self._discard(settlements, settled_rows)
        suspended = [
            row.run_at
            for row in settled_rows
            if row.state in SUSPENDED_OR_SCHEDULED and row.run_at is not None
        ]
        return SettleResult(
            settled=tuple((row.id, row.state) for row in settled_rows),
            now=now,
            next_due=min(suspended, default=None),
        )

    def _settle(self, settlement: Settlement, now: datetime.datetime, outbox: Outbox) -> Row | None:
        row = self._state.rows.get(settlement.lease.id)
        if row is None or not row.holds(settlement.lease):
            return None
        if settlement.kind == "cancel" and not row.cancel_requested:
            return None  # recorded only for a stored request, as in the SQL
        rule = rule_of(settlement.kind)  # the one rule every driver applies (_core/outcomes)
        if rule.moves_run_at:
            if settlement.kind == "retry":
                row.run_at = now + (settlement.delay_seconds or 0.0) * SECOND
            else:
                row.run_at = settlement.wake_at
        row.attempt += rule.attempt_change
        row.result_json = settlement.result_json if rule.stores_result else None
        row.error_json = settlement.error_json if rule.stores_error else None
        if settlement.kind == "cancel" and before_or_at(row.deadline_at, now):
            row.error_json = deadline_error(row)  # cancelled by the deadline pass
        if rule.clears_worker:
            row.worker_id = None
            row.started_at = None
        state = settled_state(rule, row.run_at, now)
        if rule.final:
            self._state.finish(row, state, now)
        else:
            row.end_lease()
            row.state = state
            if rule.releases_key:
                self._state.unlock_partition(row)
        if rule.history is not None:
            self._record_attempt(row, rule.history, settlement.error_json or "null", now)
        if row.state == "ready":
            outbox.add(self._state.ready_channel(row.queue), row.queue)
        return row

    def _holds(self, lease: Lease) -> bool:
        row = self._state.rows.get(lease.id)
        return row is not None and row.holds(lease)

    def _commit_settlements(
        self, settlements: Sequence[Settlement], now: datetime.datetime
    ) -> None:
        outbox = Outbox()
        settled = [row for s in settlements if (row := self._settle(s, now, outbox)) is not None]
        self._state.announce_results(settled, outbox)
        self._state.deliver(outbox)
        self._discard(settlements, settled)

    def _discard(self, settlements: Sequence[Settlement], settled: Sequence[Row]) -> None:
        """job_complete_discard: completions their task keeps nothing of are deleted (after
        their waiters were told, as its NOTIFY goes with the DELETE's commit)."""
        discarded = {s.lease.id for s in settlements if not s.keep}
        for row in settled:
            if row.id in discarded:
                self._delete(row)

    def _due_rows(self, queue: str, now: datetime.datetime, limit: int) -> list[Row]:
        due = [
            row
            for row in map(self._state.rows.__getitem__, self._state.open_by_queue.get(queue, ()))
            if row.state in SUSPENDED_OR_SCHEDULED and before_or_at(row.run_at, now)
        ]
        return sorted(due, key=lambda row: (row.run_at, row.id))[:limit]

    def _next_due(self, queue: str, now: datetime.datetime) -> datetime.datetime | None:
        later = [
            row.run_at
            for row in map(self._state.rows.__getitem__, self._state.open_by_queue.get(queue, ()))
            if row.state in SUSPENDED_OR_SCHEDULED and row.run_at is not None and row.run_at > now
        ]
        return min(later, default=None)

    def _claim_candidates(
        self,
        params: Claim,
        now: datetime.datetime,
        due_rows: Sequence[Row] = (),
        rated: list[concurrency.RatedKey] | None = None,
    ) -> tuple[list[Row], str | None, int, str | None]:
        """The jobs to claim, in claim order, the last partition key visited, how many keys
        were visited (the larger of the two kinds) and the last concurrency key visited.
        `due_rows` (scheduled or suspended rows whose run_at has passed, locked for
        promotion) are candidates too when unkeyed, as in the SQL."""
        if params.limit == 0 or params.queue in self._state.paused:
            return [], None, 0, None
        open_rows = [
            self._state.rows[job_id] for job_id in self._state.open_by_queue.get(params.queue, ())
        ]
        ready = [row for row in open_rows if row.state == "ready"]
        keys = sorted({row.partition_key for row in ready if row.partition_key is not None})
        visited = _visit_keys(keys, params.key_cursor, params.key_window)
        due = [row for row in ready if before_or_at(row.run_at, now)]  # ready means due
        heads: dict[str, Row] = {}
        for row in sorted(due, key=lambda row: row.claim_order):
            if row.partition_key is not None:
                heads.setdefault(row.partition_key, row)
        keyed = []
        for key in visited:
            holder_id = self._state.key_locks.get((params.queue, key))
            if holder_id is None:
                head = heads.get(key)
            else:
                holder = self._state.rows[holder_id]
                head = holder if holder in due else None
            if head is not None and _serves(params, head):
                keyed.append(head)
        concurrency_keys = sorted(
            {row.concurrency_key for row in ready if row.concurrency_key is not None}
        )
        concurrency_visited = _visit_keys(
            concurrency_keys, params.concurrency_cursor, params.key_window
        )
        keyed += concurrency.concurrency_candidates(
            self._state,
            ready,
            due,
            concurrency_visited,
            lambda row: _serves(params, row),
            params.limit,
            now,
            rated,
        )
        unkeyed = [row for row in due + list(due_rows) if _unkeyed(row) and _serves(params, row)]
        candidates = sorted(keyed + unkeyed, key=lambda row: row.claim_order)[: params.limit]
        return (
            candidates,
            visited[-1] if visited else None,
            max(len(visited), len(concurrency_visited)),
            concurrency_visited[-1] if concurrency_visited else None,
        )

    def _claim(self, row: Row, params: Claim, now: datetime.datetime) -> ClaimedJob:
        row.state = "running"
        row.attempt += 1
        row.executions += 1
        row.lease_token = uuid.uuid4()
        row.traced = params.traced
        row.lease_expires_at = now + params.lease_seconds * SECOND
        row.worker_id = params.worker_id
        assert row.run_at is not None  # a claimable row is due (or due within the lookahead)
        row.started_at = max(now, row.run_at)
        row.error_json = None
        if row.partition_key is not None:
            self._state.key_locks[(row.queue, row.partition_key)] = row.id
        assert row.run_at is not None  # a ready row is due
        history = self._state.checkpoints.get(row.id, {})
        return ClaimedJob(
            id=row.id,
            queue=row.queue,
            task=row.task,
            payload=json.loads(row.payload_json),
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            lease_token=row.lease_token,
            partition_key=row.partition_key,
            priority=row.priority,
            run_at=row.run_at,
            created_at=row.created_at,
            cancel_requested=row.cancel_requested,
            version=row.version,
            history=tuple(
                Checkpoint(position, kind, name, loads(value))
                for position, (kind, name, value) in sorted(history.items())
            ),
            parent_id=row.parent_id,
            concurrency_key=row.concurrency_key,
        )

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]:
        """Record checkpoints of running jobs, fenced by their leases; a position already taken
        keeps (and returns) its stored value."""
        for write in writes:
            if write.value_json is not None:
                json.loads(write.value_json)
        now = await self._state.statement("checkpoint_insert_many")
        outbox = Outbox()
        written: list[WrittenCheckpoint] = []
        for write in writes:
            row = self._state.rows.get(write.lease.id)
            if row is None or not row.holds(write.lease):
                continue
            history = self._state.checkpoints.setdefault(row.id, {})
            if write.position not in history:
                value_json = write.value_json
                if write.wake_in_seconds is not None:
                    value = json.loads(value_json) if value_json is not None else {}
                    wake_at = now + write.wake_in_seconds * SECOND
                    value["wake_at"] = wake_at.isoformat()
                    value_json = json.dumps(value)
                history[write.position] = (write.kind, write.name, value_json)
            row.checkpoint_count = max(row.checkpoint_count, write.position + 1)
            if write.values:
                messages.write_values(self._state, row.id, write.values, now, outbox)
            written.append(
                WrittenCheckpoint(row.id, write.position, loads(history[write.position][2]))
            )
        self._state.deliver(outbox)
        return written

    def _record_attempt(
        self,
        row: Row,
        outcome: str,
        error_json: str,
        now: datetime.datetime,
        trace_id: str | None = None,
    ) -> None:
        error = json.loads(error_json)
        self._state.attempts.setdefault(row.id, []).append(
            AttemptRecord(
                attempt=row.attempt,
                outcome=outcome,
                error_type=_json_text_field(error, "type"),
                error_message=_json_text_field(error, "message"),
                traceback=_json_text_field(error, "traceback"),
                worker_id=row.worker_id,
                started_at=row.started_at,
                finished_at=now,
                trace_id=trace_id or _json_text_field(error, "trace_id"),
            )
        )

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        """Extend every lease still owned (expired but unrecovered ones too) and heartbeat.

        Leases not returned are lost; `cancel_requested` carries a pending cancellation. There
        are no row locks here, so every returned lease is confirmed.
        """
        now = await self._state.statement("lease_renew_many")
        worker = self._state.workers.get(params.worker_id)
        if worker is not None:
            worker.heartbeat_at = now
            worker.state = params.worker_state
            worker.admission = {
                a.queue: {
                    "limit": a.limit,
                    "concurrency": a.concurrency,
                    "reason": a.reason,
                    "cause": a.cause,
                    "since": now - a.reduced_for_seconds * SECOND,
                }
                for a in params.admission
            } or None
        renewed: dict[int, RenewedLease] = {}
        for lease in params.leases:
            row = self._state.rows.get(lease.id)
            if row is None or not row.holds(lease):
                continue
            row.lease_expires_at = now + params.lease_seconds * SECOND
            renewed[row.id] = RenewedLease(id=row.id, cancel_requested=row.cancel_requested)
        return RenewalResult(leases=tuple(renewed.values()), registered=worker is not None)

    # --- maintenance ----------------------------------------------------------------------

    async def ready_sweep(self) -> int:
        """Nothing to sweep: the memory driver's ready jobs leave nothing behind."""
        await self._state.statement("ready_sweep")
        return 0

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport:
        """Recover expired leases, prune stale workers and old finished jobs, while
        `params.leader_id` holds the leader seat (or with no leader_id); heartbeat, probe.

        A recovered job goes back to ready (keeping run_at, so its place in its partition) or,
        on its last attempt, to failed, or to cancelled if its cancel was requested; each gets a
        'lost' attempts entry. Each sweep is
        bounded by its limit.
        """
        now = await self._state.statement("maintenance_pass")
        leader = params.leader_id is None or self._elect(
            params.leader_id, params.scheduler, params.ttl_seconds, now
        )
        registered = self._heartbeat(params.leader_id, now)
        probes = self._probe(params.queues, now)
        schedules = self._state.schedules.next_due(now)
        if not leader:
            return MaintenanceReport(
                leader=False, registered=registered, now=now, probes=probes, schedules=schedules
            )
        report = self._sweep(params, now)
        return attrs.evolve(
            report, registered=registered, now=now, probes=probes, schedules=schedules
        )

    async def leader_elect(self, params: LeaderElect) -> LeadershipReport:
        """Take the leader seat when free, expired, or held by a leader without the scheduler
        while this candidate runs it; extend it when held by this candidate."""
        now = await self._state.statement("leader_elect")
        return LeadershipReport(
            leader=self._elect(params.worker_id, params.scheduler, params.ttl_seconds, now),
            registered=self._heartbeat(params.worker_id, now),
            now=now,
            probes=self._probe(params.queues, now),
        )

    async def leader_resign(self, params: LeaderResign) -> bool:
        await self._state.statement("leader_resign")
        if self._state.leader is None or self._state.leader.leader_id != params.worker_id:
            return False
        self._state.leader = None
        outbox = Outbox()
        outbox.add(control_channel(self.schema), "leader")
        self._state.deliver(outbox)
        return True

    def _elect(
        self, candidate: uuid.UUID, scheduler: bool, ttl: float, now: datetime.datetime
    ) -> bool:
        seat = self._state.leader
        if not (
            seat is None
            or seat.leader_id == candidate
            or seat.expires_at < now
            or (scheduler and not seat.scheduler)
        ):
            return False
        elected_at = seat.elected_at if seat is not None and seat.leader_id == candidate else now
        self._state.leader = LeaderSeat(candidate, scheduler, elected_at, now + ttl * SECOND)
        return True

    def _heartbeat(self, worker_id: uuid.UUID | None, now: datetime.datetime) -> bool:
        worker = self._state.workers.get(worker_id) if worker_id is not None else None
        if worker is not None:
            worker.heartbeat_at = now
        return worker is not None

    def _probe(self, queues: Sequence[str], now: datetime.datetime) -> tuple[QueueProbe, ...]:
        """queue_probe() (migration 0010): is work due, and the first future due time."""
        probes = []
        for queue in sorted(queues):
            rows = list(map(self._state.rows.__getitem__, self._state.open_by_queue.get(queue, ())))
            due = any(
                row.state == "ready"
                or (row.state in SUSPENDED_OR_SCHEDULED and before_or_at(row.run_at, now))
                for row in rows
            )
            probes.append(QueueProbe(queue, due, self._next_due(queue, now)))
        return tuple(probes)

    def _sweep(self, params: MaintenancePass, now: datetime.datetime) -> MaintenanceReport:
        outbox = Outbox()
        recovered = self._recover_expired(params.recover_limit, now, outbox)
        stale_before = now - params.worker_stale_seconds * SECOND
        stale = [
            w
            for w, worker in self._state.workers.items()
            if worker.heartbeat_at < stale_before and w != params.leader_id
        ]
        for worker_id in stale:
            del self._state.workers[worker_id]
        passed = self._deadline_pass(params.deadline_limit, now, outbox)
        pruned = self._prune_finished(now - params.retention_seconds * SECOND)
        waits.prune_events(self._state, now - params.retention_seconds * SECOND, params.prune_limit)
        self._state.deliver(outbox)
        return MaintenanceReport(
            leader=True,
            recovered=recovered,
            pruned_jobs=pruned,
            pruned_workers=len(stale),
            deadlines_passed=passed,
        )

    def _deadline_pass(self, limit: int, now: datetime.datetime, outbox: Outbox) -> int:
        """job_deadline_pass (migration 0021): cancel, with their trees, at most `limit`
        unfinished jobs whose deadline has passed, in deadline order; no retry."""
        passed = sorted(
            (
                row
                for row in self._state.rows.values()
                if before_or_at(row.deadline_at, now)
                and not row.cancel_requested
                and row.state not in FINISHED_STATES
            ),
            key=lambda row: (row.deadline_at, row.id),
        )[:limit]
        for row in passed:
            row.error_json = deadline_error(row)
        if passed:
            waits.cancel_tree(
                self._state, [row.id for row in passed], now, outbox, control_channel(self.schema)
            )
        return len(passed)

    def _recover_expired(
        self, limit: int, now: datetime.datetime, outbox: Outbox
    ) -> tuple[tuple[int, str], ...]:
        expired = sorted(
            (
                row
                for ids in self._state.open_by_queue.values()
                for row in map(self._state.rows.__getitem__, ids)
                if row.state == "running" and before(row.lease_expires_at, now)
            ),
            key=lambda row: (row.lease_expires_at, row.id),
        )[:limit]
        for row in expired:
            row.error_json = _LEASE_EXPIRED_ERROR
            # A traced execution's span took its trace id from the lease token (_seam/tracing.py).
            trace_id = row.lease_token.hex if row.traced and row.lease_token else None
            if row.cancel_requested:  # not run again, whatever attempts it had left
                self._state.finish(row, "cancelled", now)
            elif row.attempt >= self._state.max_attempts(row):
                self._state.finish(row, "failed", now)
            else:
                row.state = "ready"
                row.end_lease()
                self._state.unlock_partition(row)
                outbox.add(self._state.ready_channel(row.queue), row.queue)
            self._record_attempt(row, "lost", _LEASE_EXPIRED_ERROR, now, trace_id)
        final = [row for row in expired if row.state != "ready"]
        self._state.announce_results(final, outbox)
        waits.children_finished(self._state, final, now, outbox)
        return tuple((row.id, row.state) for row in expired)

    def _prune_finished(self, finished_before: datetime.datetime) -> int:
        """Retention by finish day, as satellite_epochs_rotate() applies it to each ended epoch
        (migration 0049): every finished job whose UTC day ended before `finished_before`,
        however many (no batch limit)."""
        old = [
            row
            for row in self._state.rows.values()
            if row.state in FINISHED_STATES
            and row.finished_at is not None
            and expired(row.finished_at, finished_before)
        ]
        for row in old:
            self._delete(row)
        return len(old)

    def _delete(self, row: Row) -> None:
        """Delete a finished row with its attempts (ON DELETE CASCADE), its checkpoints
        (jobs_checkpoints_delete) and its key."""
        del self._state.rows[row.id]
        self._state.attempts.pop(row.id, None)
        self._state.checkpoints.pop(row.id, None)
        self._state.messages.forget(row.id)
        if row.dedup_key is not None and self._state.dedup.get(row.dedup_key) == row.id:
            del self._state.dedup[row.dedup_key]

    # --- cancel and reads (logic in reads.py) ---------------------------------------------

    async def job_cancel(self, job_id: int) -> CancelOutcome | None:
        """Cancel a job and its descendants (job_cancel_tree): not running -> cancelled at once;
        running -> flagged, its worker told (control channel); a parent with a running
        descendant waits for its children, flagged. A finished job is left alone (its state is
        returned twice); None if no such job."""
        now = await self._state.statement("job_cancel")
        outbox = Outbox()
        outcomes = waits.cancel_tree(
            self._state, [job_id], now, outbox, control_channel(self.schema)
        )
        self._state.deliver(outbox)
        return outcomes.get(job_id)

    # --- events and children (logic in waits.py) ------------------------------------------

    async def event_emit(self, params: EmitEvent) -> EmitOutcome:
        now = await self._state.statement("event_emit")
        outbox = Outbox()
        outcome = waits.emit(self._state, params, now, outbox)
        self._state.deliver(outbox)
        return outcome

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome:
        now = await self._state.statement("job_wait_event")
        return waits.wait_event(self._state, params, now)

    async def job_spawn_many(self, spawns: Sequence[Spawn]) -> list[SpawnOutcome]:
        now = await self._state.statement("job_spawn_many")
        outcomes = []
        for spawn in spawns:
            outcome, child = waits.spawn(self._state, spawn, now)
            if child is not None:
                self._state.commit_rows([child])
            outcomes.append(outcome)
        return outcomes

    async def job_wait_children(self, params: WaitChildren) -> ChildrenWaitOutcome:
        await self._state.statement("job_wait_children")
        return waits.wait_children(self._state, params)

    async def job_cancel_children(self, params: CancelChildren) -> bool:
        now = await self._state.statement("job_cancel_children")
        outbox = Outbox()
        accepted = waits.cancel_children(
            self._state, params, now, outbox, control_channel(self.schema)
        )
        self._state.deliver(outbox)
        return accepted

    async def job_get(self, job_id: int) -> JobRecord | None:
        await self._state.statement("job_get")
        return reads.job_get(self._state, job_id)

    async def job_result_watch(self, job_id: int) -> None:
        """Set the row's result_watched flag (final or unknown jobs: nothing); a ready or due
        row wakes its queue, as PostgreSQL's does for a claim that skipped the locked row."""
        now = await self._state.statement("job_result_watch")
        row = self._state.rows.get(job_id)
        if row is None or row.result_watched or row.state in FINISHED_STATES:
            return
        row.result_watched = True
        if row.state == "ready" or (row.state != "running" and before_or_at(row.run_at, now)):
            outbox = Outbox()
            outbox.add(self._state.ready_channel(row.queue), row.queue)
            self._state.deliver(outbox)

    async def job_explain(self, job_id: int) -> ExplainFacts | None:
        now = await self._state.statement("job_explain")
        return reads.job_explain(self._state, now, job_id)

    async def checkpoint_list(self, job_id: int) -> list[Checkpoint]:
        await self._state.statement("checkpoint_list")
        return reads.checkpoint_list(self._state, job_id)

    async def job_list(self, params: JobFilter) -> list[JobRecord]:
        now = await self._state.statement("job_list")
        return reads.job_list(self._state, now, params)

    async def job_retry(self, job_id: int) -> CancelOutcome | None:
        """Redrive a failed or cancelled job (see the job_retry block); others are left alone."""
        now = await self._state.statement("job_retry")
        row = self._state.rows.get(job_id)
        if row is None:
            return None
        previous = row.state
        if previous in ("failed", "cancelled"):
            row.state, row.run_at, row.cancel_requested = "ready", now, False
            if self._state.max_attempts(row) <= row.attempt:
                row.max_attempts = row.attempt + 1
            row.result_json = row.error_json = None
            row.finished_at = row.started_at = row.worker_id = None
            self._state.open_by_queue.setdefault(row.queue, set()).add(row.id)
            outbox = Outbox()
            outbox.add(self._state.ready_channel(row.queue), row.queue)
            self._state.deliver(outbox)
        return CancelOutcome(previous, row.state)

    async def job_purge(self, params: JobPurge) -> int:
        now = await self._state.statement("job_purge")
        cutoff = now - params.older_than_seconds * SECOND
        days = self._prune_finished(cutoff) if params.whole_days else 0
        doomed = sorted(
            (
                row
                for row in self._state.rows.values()
                if row.state in FINISHED_STATES
                and row.state in params.states
                and before(row.finished_at, cutoff)
                and (params.tasks is None or row.task in params.tasks)
                and (params.queues is None or row.queue in params.queues)
            ),
            key=lambda row: (row.finished_at, row.id),
        )[: params.limit]
        for row in doomed:
            self._delete(row)
        return days + len(doomed)

    async def queue_pause(self, queue: str) -> bool:
        now = await self._state.statement("queue_pause")
        if queue in self._state.paused:
            return False
        self._state.paused[queue] = now
        return True

    async def queue_resume(self, queue: str) -> bool:
        await self._state.statement("queue_resume")
        if self._state.paused.pop(queue, None) is None:
            return False
        outbox = Outbox()
        outbox.add(self._state.ready_channel(queue), queue)
        self._state.deliver(outbox)
        return True

    async def queue_limit_set(self, params: QueueLimitSet) -> None:
        await self._state.statement("queue_limit_set")
        limits.change(self._state, params)
        outbox = Outbox()  # a raised limit may free slots: wake the queue's workers
        outbox.add(self._state.ready_channel(params.queue), params.queue)
        self._state.deliver(outbox)

    def queue_limits_changed(self, queue: str | None) -> None:
        """Nothing is cached: every claim reads the limits from the state."""

    def queue_limits_notified(self, live: bool) -> None:
        """Nothing is polled for: see queue_limits_changed."""

    async def queue_limit_list(self) -> list[QueueLimit]:
        now = await self._state.statement("queue_limit_list")
        return limits.listing(self._state, now)

    async def queue_pause_list(self) -> list[QueuePause]:
        await self._state.statement("queue_pause_list")
        return [QueuePause(queue, at) for queue, at in sorted(self._state.paused.items())]

    async def concurrency_limit_set(self, pattern: str, max_running: int | None) -> bool:
        now = await self._state.statement("concurrency_limit_set")
        return concurrency.set_limit(self._state, pattern, max_running, now)

    async def concurrency_limit_list(self) -> list[ConcurrencyLimit]:
        await self._state.statement("concurrency_limit_list")
        return [limit for _, limit in sorted(self._state.concurrency_limits.items())]

    async def concurrency_key_status(
        self, keys: Sequence[str] | None = None
    ) -> list[ConcurrencyKeyStatus]:
        await self._state.statement("concurrency_key_status")
        return concurrency.key_status(self._state, keys)

    async def concurrency_rate_set(self, pattern: str, rate: Rate | None) -> bool:
        now = await self._state.statement("concurrency_rate_set")
        return concurrency.set_rate(self._state, pattern, rate, now)

    async def concurrency_rate_list(self) -> list[ConcurrencyRate]:
        await self._state.statement("concurrency_rate_list")
        return [rate for _, rate in sorted(self._state.concurrency_rates.items())]

    async def concurrency_rate_status(self) -> list[KeyRateStatus]:
        now = await self._state.statement("concurrency_rate_status")
        return concurrency.rate_status(self._state, now)

    async def job_attempts(self, job_id: int) -> list[AttemptRecord]:
        await self._state.statement("job_attempts")
        return list(self._state.attempts.get(job_id, ()))

    # --- workers and status ---------------------------------------------------------------

    async def worker_register(self, params: WorkerRegistration) -> None:
        now = await self._state.statement("worker_register")
        if params.worker_id in self._state.workers:
            raise ValueError(f"worker {params.worker_id} is already registered")
        self._state.workers[params.worker_id] = Worker(params, started_at=now, heartbeat_at=now)
        for task, version, max_attempts, deadline in params.task_defaults:
            self._state.task_defaults[(task, version)] = max_attempts
            if deadline is None:
                self._state.task_deadlines.pop((task, version), None)
            else:
                self._state.task_deadlines[(task, version)] = deadline

    async def worker_unregister(self, worker_id: uuid.UUID) -> None:
        await self._state.statement("worker_unregister")
        self._state.workers.pop(worker_id, None)

    async def queue_status(self) -> list[QueueStatus]:
        now = await self._state.statement("queue_status")
        return reads.queue_status(self._state, now)

    async def job_trace_context(self, job_id: int) -> str | None:
        await self._state.statement("job_trace_context")
        row = self._state.rows.get(job_id)
        return None if row is None else row.trace_context

    async def notify_send(self, channel: str, payload: str) -> None:
        await self._state.statement("notify_send")
        outbox = Outbox()
        outbox.add(channel, payload)
        self._state.deliver(outbox)

    async def status_health(self) -> HealthReport:
        now = await self._state.statement("status_health")
        return reads.status_health(self._state, now)

    async def queue_demand(self) -> list[QueueDemand]:
        now = await self._state.statement("queue_demand")
        return reads.queue_demand(self._state, now)

    async def worker_list(self) -> list[WorkerInfo]:
        now = await self._state.statement("worker_list")
        return reads.worker_list(self._state, now)

    async def ready_channels(self, queues: Sequence[str]) -> list[str]:
        await self._state.statement("ready_channels")
        return [self._state.ready_channel(queue) for queue in queues]

    async def task_history_kinds(self) -> list[TaskHistoryKind]:
        await self._state.statement("task_history_kinds")
        return reads.task_history_kinds(self._state)

    async def job_unroutable(self, stale_seconds: float = 120.0) -> list[UnroutableJobs]:
        now = await self._state.statement("job_unroutable")
        return reads.job_unroutable(self._state, now, stale_seconds)

    async def task_status(self) -> list[TaskStatus]:
        await self._state.statement("task_status")
        return reads.task_status(self._state)

    # --- schedules ------------------------------------------------------------------------

    async def schedule_upsert_many(self, schedules: Sequence[NewSchedule]) -> list[str]:
        now = await self._state.statement("schedule_upsert_many")
        created = [s.name for s in schedules if self._state.schedules.upsert(s, now)]
        if schedules:
            self._notify_schedules()
        return created

    async def schedule_delete(self, name: str) -> bool:
        await self._state.statement("schedule_delete")
        deleted = self._state.schedules.delete(name)
        if deleted:
            self._notify_schedules()
        return deleted

    async def schedule_list(self) -> list[ScheduleRecord]:
        await self._state.statement("schedule_list")
        return self._state.schedules.listing()

    async def schedule_next_due(self) -> ScheduleDue:
        return self._state.schedules.next_due(await self._state.statement("schedule_next_due"))

    async def schedule_fire_due(self, params: ScheduleFireDue) -> ScheduleFireReport:
        """One tick (always the leader: single process). The plan runs without yielding, so
        the tick is atomic like the leader's transaction."""
        now = await self._state.statement("scheduler_lead")
        self._state.calls["schedule_due_lock"] += 1
        due = self._state.schedules.due(now, params.limit)
        advances = params.plan(due, now)
        if not advances:
            return ScheduleFireReport(leader=True, now=now, due=len(due))
        self._state.calls["schedule_fire_many"] += 1
        by_name = {row.name: row for row in self._state.schedules.advance(advances)}
        created: list[Row] = []
        fired: list[FiredOccurrence] = []
        for plan in advances:
            schedule = by_name.get(plan.name)
            if schedule is None:
                continue  # fenced out: advanced or re-timed since the plan was made
            for fire_at in plan.fires:
                row = self._occurrence_row(schedule, fire_at, now)
                if row is not None:
                    created.append(row)
                    fired.append(FiredOccurrence(plan.name, fire_at, row.id))
        self._state.commit_rows(created)
        fired.sort(key=lambda occurrence: (occurrence.fire_at, occurrence.schedule))
        return ScheduleFireReport(leader=True, now=now, due=len(due), fired=tuple(fired))

    # --- messages and workflow values (logic in messages.py) ------------------------------

    async def message_send(self, params: MessageSend) -> SendOutcome:
        now = await self._state.statement("message_send")
        outbox = Outbox()
        outcome = messages.send(self._state, params, now, outbox)
        self._state.deliver(outbox)
        return outcome

    async def job_receive(self, params: Receive) -> ReceiveOutcome:
        now = await self._state.statement("job_receive")
        outbox = Outbox()
        outcome = messages.receive(self._state, params, now, outbox)
        self._state.deliver(outbox)
        return outcome

    async def job_value_set_many(self, params: ValueSet) -> bool:
        now = await self._state.statement("job_value_set_many")
        outbox = Outbox()
        written = messages.set_values(self._state, params, now, outbox)
        self._state.deliver(outbox)
        return written

    async def job_value_get(self, job_id: int, key: str) -> ValueRead:
        await self._state.statement("job_value_get")
        return messages.get_value(self._state, job_id, key)

    async def job_values(self, job_id: int) -> list[WorkflowValue]:
        await self._state.statement("job_values")
        return messages.job_values(self._state, job_id)

    async def workflow_list(self, params: WorkflowFilter) -> list[WorkflowRecord]:
        await self._state.statement("workflow_list")
        return messages.workflows(self._state, params)

    def _occurrence_row(
        self, schedule: ScheduleRecord, fire_at: datetime.datetime, now: datetime.datetime
    ) -> Row | None:
        """The job of one occurrence, or None when its dedup key is taken (DO NOTHING)."""
        key = fire_dedup_key(schedule.name, fire_at)
        if key in self._state.dedup or key in self._state.reserved:
            return None
        job = NewJob(
            queue=schedule.queue,
            task=schedule.task,
            payload_json=json.dumps(schedule.payload),
            run_at=fire_at,
            dedup_key=key,
            max_attempts=schedule.max_attempts,
            unique_states=TERMINAL_IN_ORDER,
        )
        return new_row(next(self._state.ids), job, now, self._state.task_deadline(job))

    def _notify_schedules(self) -> None:
        outbox = Outbox()
        outbox.add(schedules_channel(self.schema), "schedules")
        self._state.deliver(outbox)

    # --- notifications --------------------------------------------------------------------

    @asynccontextmanager
    async def open_listener(
        self, on_notify: NotifyCallback, on_reconnect: Callable[[], None]
    ) -> AsyncIterator[MemoryListener]:
        """A listener whose callbacks run in a task of its own, in commit order."""
        send, receive = trio.open_memory_channel[tuple[str, str]](math.inf)
        listener = MemoryListener(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, receive, on_notify)
            self._state.listeners.add(listener)
            try:
                yield listener
            finally:
                self._state.listeners.discard(listener)
                nursery.cancel_scope.cancel()

    # --- continue-as-new and cancellation policies -----------------------------------------

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        now = await self._state.statement("job_continue_as_new")
        json.loads(params.payload_json)
        row = self._state.rows.get(params.lease.id)
        if row is None or not row.holds(params.lease):
            return "lost"
        if row.cancel_requested:
            return "cancelling"
        row.payload_json = params.payload_json
        row.checkpoint_count = row.children_settled = row.attempt = 0
        row.state, row.run_at = "ready", now
        row.end_lease()
        row.worker_id = row.started_at = None
        row.wait_children = row.wait_event_key = None
        self._state.checkpoints.pop(row.id, None)
        for child in self._state.rows.values():
            if child.parent_id == row.id:
                child.parent_position = None
        outbox = Outbox()
        outbox.add(self._state.ready_channel(row.queue), row.queue)
        self._state.deliver(outbox)
        return "continued"

    async def job_cancel_with(self, params: CancelJob) -> CancelOutcome | None:
        now = await self._state.statement("job_cancel_with")
        outbox = Outbox()
        outcomes = waits.cancel_tree(
            self._state, [params.id], now, outbox, control_channel(self.schema), tree=params.tree
        )
        self._state.deliver(outbox)
        return outcomes.get(params.id)

    async def job_descendants(self, job_id: int) -> list[Descendant]:
        await self._state.statement("job_descendants")
        return reads.job_descendants(self._state, job_id)


async def _pump(
    receive: trio.MemoryReceiveChannel[tuple[str, str]], on_notify: NotifyCallback
) -> None:
    async with receive:
        async for channel, payload in receive:
            on_notify(channel, payload)


def _visit_keys(keys: Sequence[str], cursor: str, window: int) -> list[str]:
    """Round-robin over sorted partition `keys`: those after `cursor`, then from the start up
    to and including `cursor`; at most `window` of them (and at least one)."""
    after = [key for key in keys if key > cursor]
    return (after + [key for key in keys if key <= cursor])[: max(window, 1)]


def _unkeyed(row: Row) -> bool:
    return row.partition_key is None and row.concurrency_key is None


def _serves(params: Claim, row: Row) -> bool:
    """The claim's task filter: the task, and its (task, version) pair when one is given."""
    if row.task not in params.tasks:
        return False
    return params.task_versions is None or f"{row.task}@{row.version}" in params.task_versions


def _json_text_field(value: Any, key: str) -> str | None:
    """Postgres `value ->> key`: text of a string field, JSON text of others, else NULL."""
    if not isinstance(value, dict) or value.get(key) is None:
        return None
    field = value[key]
    return field if isinstance(field, str) else json.dumps(field)
