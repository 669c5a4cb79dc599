"""PgDriver: the Driver protocol on PostgreSQL, one method per named statement in queries.sql.

This module holds the statements of a job's life (insert, claim, settle; docs/life-of-a-job.md)
and how their parameters are encoded; each other concern's statements are a base class of
`PgDriver` in a module of its own (`workflow.py`, `services.py`, `schedules.py`, `operator.py`,
`migrations.py`), all running through `statements.py`'s `PgStatements`.

Connection-lost errors on idempotent statements (reads, fenced writes that a retry cannot
apply twice) are retried with backoff by `_retrying`; an enqueue is not retried (its outcome
after a lost COMMIT is unknown, and the caller decides).
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs

from .._core.codec import Undecodable
from .._core.outcomes import rule_of
from .._seam.driver import (
    Claim,
    ClaimedJob,
    ClaimResult,
    EmitEvent,
    EmitOutcome,
    InsertedJob,
    JobRecord,
    NewJob,
    NotifyCallback,
    Settlement,
    SettleResult,
)
from .._seam.workflow import (
    Checkpoint,
)
from . import (
    Connection,
    ConnectOptions,
    Listener,
    PollingListener,
    is_connection_lost,
    open_listener,
    open_pool,
)
from .errors import is_transient
from .inserts import NATIVE_INSERTS, insert_statement, inserted_jobs
from .inserts import text_array as _text_array
from .migrations import PgMigrations
from .operator import PgOperatorStatements
from .replies import (
    Claimed,
    ClaimedRow,
    CompletePlain,
    EventEmitted,
    JobStateRow,
    PlainClaimed,
    QueueLimited,
    QueueLimitGate,
    QueueLimitSpent,
    Settled,
    TraceContext,
)
from .schedules import PgScheduleStatements
from .services import PgServiceStatements
from .statements import (
    QUOTED_NULL,
    Params,
    array_element,
    lease_arrays,
    results_element,
    timedelta_of,
)
from .workflow import PgWorkflowStatements

# A claimed row's column positions (`ClaimedRow`) as module constants: the claim reads 16 per
# claimed row, and a global is the cheapest index on Python 3.11 (125 ns for the 16; class
# attributes cost twice that).
_ID = ClaimedRow.id
_QUEUE = ClaimedRow.queue
_TASK = ClaimedRow.task
_PAYLOAD = ClaimedRow.payload
_ATTEMPT = ClaimedRow.attempt
_MAX_ATTEMPTS = ClaimedRow.max_attempts
_LEASE_TOKEN = ClaimedRow.lease_token
_PARTITION_KEY = ClaimedRow.partition_key
_PRIORITY = ClaimedRow.priority
_RUN_AT = ClaimedRow.run_at
_CREATED_AT = ClaimedRow.created_at
_CANCEL_REQUESTED = ClaimedRow.cancel_requested
_VERSION = ClaimedRow.version
_HISTORY = ClaimedRow.history
_PARENT_ID = ClaimedRow.parent_id
_CONCURRENCY_KEY = ClaimedRow.concurrency_key


def _claimed_job(row: Sequence[Any]) -> ClaimedJob:
    """A claimed job from a round's row (`ClaimedRow`): its columns, its history (NULL: none),
    its parent id, its concurrency key. Read in place (a slice per claimed row copied its
    columns first)."""
    history = row[_HISTORY]
    payload = row[_PAYLOAD]
    if history is None:
        entries: tuple[Checkpoint, ...] = ()
    elif type(history) is Undecodable:
        # A value in the history too deep to decode (an event or a message written by SQL
        # into a waiting job's checkpoint): the history arrives as one JSON array, so none of
        # it can be read. The job fails with a PayloadError naming its history, through the
        # payload's load (before its handler), and the rest of the round goes on.
        entries, payload = (), Undecodable(history.reason, path="history")
    else:
        entries = tuple(
            Checkpoint(position, kind, name, value) for position, kind, name, value in history
        )
    return ClaimedJob(
        row[_ID],
        row[_QUEUE],
        row[_TASK],
        payload,
        row[_ATTEMPT],
        row[_MAX_ATTEMPTS],
        row[_LEASE_TOKEN],
        row[_PARTITION_KEY],
        row[_PRIORITY],
        row[_RUN_AT],
        row[_CREATED_AT],
        row[_CANCEL_REQUESTED],
        row[_VERSION],
        entries,
        row[_PARENT_ID],
        row[_CONCURRENCY_KEY],
    )


def _claimed_jobs(rows: Sequence[Sequence[Any]]) -> tuple[ClaimedJob, ...]:
    """The claimed jobs of a claim's reply (either form: `Claimed`, `PlainClaimed`)."""
    return tuple([_claimed_job(row) for row in rows if row[_ID] is not None])


def _full(rated: bool) -> str:
    """The full claim statement: with key rates (some key has one) or without."""
    return "job_claim_rated" if rated else "job_claim"


def _split_kept(
    settlements: Sequence[Settlement],
) -> tuple[Sequence[Settlement], list[Settlement]]:
    """(the settlements to record, the completions to delete): nearly every batch keeps all."""
    for settlement in settlements:  # a loop: a hot path, and nearly always nothing to split
        if not settlement.keep:
            break
    else:
        return settlements, []
    return [s for s in settlements if s.keep], [s for s in settlements if not s.keep]


def _all_plain(settlements: Sequence[Settlement]) -> bool:
    """Every outcome a completion of a job without a partition key or a parent."""
    for settlement in settlements:  # a loop, not all(genexpr): a hot path
        if not settlement.plain or settlement.kind != "complete":
            return False
    return True


def _nullable_array(values: Sequence[object | None]) -> str:
    """An array literal of text, numbers or datetimes (cast in SQL) with NULL for None:
    psycopg dumps a list of 25 strings element by element in Python (60 us per claim round
    here), this is one join."""
    return (
        "{"
        + ",".join(["NULL" if value is None else array_element(value) for value in values])
        + "}"
    )


def _results_array(settlements: Sequence[Settlement]) -> str:
    """The results of completions as a text[] literal (`_nullable_array`), with the no-op
    handler's "null" answered without quoting: most jobs of a drain return None."""
    return (
        "{"
        + ",".join(
            [
                QUOTED_NULL if (r := s.result_json) == "null" else results_element(r)
                for s in settlements
            ]
        )
        + "}"
    )


@functools.lru_cache(maxsize=64)
def _cached_text_array(values: tuple[str, ...]) -> str:
    """A worker's task list, the same tuple every round: quoted once."""
    return _text_array(values)


def complete_plain_params(settlements: Sequence[Settlement]) -> Params:
    """The parameters of job_complete_plain (the completer's common flush): the fences and
    the results, nothing the full statement's rules need."""
    return {
        **lease_arrays([settlement.lease for settlement in settlements]),
        "results": _results_array(settlements),
    }


def _nulls(count: int) -> str:
    """An array literal of `count` NULLs."""
    return "{" + ",".join(["NULL"] * count) + "}"


@functools.lru_cache(maxsize=512)
def _rule_arrays(kinds: tuple[str, ...]) -> Params:
    """The values the outcome rules (trioq/_core/outcomes.py) decide for a batch of these
    kinds, as the array literals job_settle_many applies. Cached: a drain sends the same
    few shapes (25 completions) again and again."""
    rules = [rule_of(kind) for kind in kinds]

    def flags(values: Iterable[bool]) -> str:
        return "{" + ",".join(["t" if value else "f" for value in values]) + "}"

    return {
        "states": "{" + ",".join([rule.state.value for rule in rules]) + "}",
        "ready_when_due": flags(rule.ready_when_due for rule in rules),
        "moves_run_at": flags(rule.moves_run_at for rule in rules),
        "attempt_changes": "{" + ",".join([str(rule.attempt_change) for rule in rules]) + "}",
        "releases_key": flags(rule.releases_key for rule in rules),
        "histories": _nullable_array([rule.history for rule in rules]),
        "finals": flags(rule.final for rule in rules),
        "clears_worker": flags(rule.clears_worker for rule in rules),
    }


def settle_params(settlements: Sequence[Settlement]) -> Params:
    """The named parameters of job_settle_many (tests that run it by hand use these too).

    The common batch is all completions: their error, delay and wake-up arrays are all NULL
    and are written without looking at each settlement again; kinds are bare words (one of
    SETTLE_KINDS, checked when each Settlement was built), which need no quoting."""
    count = len(settlements)
    kinds = tuple([settlement.kind for settlement in settlements])
    if all(kind == "complete" for kind in kinds):
        errors = delays = wake_ats = _nulls(count)
        results = _results_array(settlements)
    else:
        pairs = [(settlement, rule_of(settlement.kind)) for settlement in settlements]
        results = _nullable_array([s.result_json if r.stores_result else None for s, r in pairs])
        errors = _nullable_array([s.error_json if r.stores_error else None for s, r in pairs])
        delays = _nullable_array([settlement.delay_seconds for settlement in settlements])
        wake_ats = _nullable_array([settlement.wake_at for settlement in settlements])
    return {
        **lease_arrays([settlement.lease for settlement in settlements]),
        **_rule_arrays(kinds),
        "results": results,
        "errors": errors,
        "delays": delays,
        "wake_ats": wake_ats,
    }


def claim_params(params: Claim) -> Params:
    """The named parameters of job_claim, job_claim_rated and job_claim_plain (tests that run
    them by hand use these too)."""
    return {
        "queue": params.queue,
        "tasks": _cached_text_array(params.tasks),  # a literal: psycopg's list dumper is Python
        "limit": params.limit,
        "lease_seconds": params.lease_seconds,
        "worker_id": params.worker_id,
        "key_cursor": params.key_cursor,
        "key_window": params.key_window,
        "concurrency_cursor": params.concurrency_cursor,
        "task_versions": (
            None if params.task_versions is None else _cached_text_array(params.task_versions)
        ),
        "promote_limit": params.promote_limit,
        "lookahead": params.lookahead_seconds,
        "traced": params.traced,
    }


@attrs.define(eq=False)
class PgTransaction:
    """The caller's transaction on one pooled connection (see `PgDriver.transaction`)."""

    _driver: PgDriver
    _conn: Connection

    async def execute(self, sql: str, params: Any = None) -> None:
        await self._conn.execute(sql, params)

    async def fetch(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return await self._conn.fetch(sql, params)

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]:
        return await self._driver._insert(self._conn, jobs)

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """The completer's settle statement, on this transaction."""
        return await self._driver._settle(self._conn, settlements)

    async def event_emit(self, params: EmitEvent) -> EmitOutcome:
        return await self._driver._emit(self._conn, params)


@attrs.define(eq=False)
class PgDriver(
    PgWorkflowStatements,
    PgServiceStatements,
    PgScheduleStatements,
    PgOperatorStatements,
    PgMigrations,
):
    """The `Driver` on PostgreSQL. This class holds the statements of a job's life (insert,
    claim, settle, emit, read back; docs/life-of-a-job.md); each base holds one concern's."""

    # --- jobs -----------------------------------------------------------------------------

    async def _insert(self, conn: Connection, jobs: Sequence[NewJob]) -> list[InsertedJob]:
        self._calls["job_insert_many"] += 1
        name, params = insert_statement(jobs)
        with self._schema_required():
            rows = await self._query(conn, name, params)  # native, as every statement
        return inserted_jobs(name, rows)

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]:
        self._calls["job_insert_many"] += 1
        name, params = insert_statement(jobs)
        with self._schema_required():
            if name in NATIVE_INSERTS:  # the enqueue hot path: no thread hop, no pool context
                statement = self._positional[name]
                rows = await self._pool.fetch_native(statement.text, statement.values(params))
            else:
                async with self._pool.connection() as conn:
                    rows = await self._query(conn, name, params)
        return inserted_jobs(name, rows)

    def is_connection_lost(self, exc: BaseException) -> bool:
        return is_connection_lost(exc)

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    async def job_claim(self, params: Claim) -> ClaimResult:
        """Not retried here: a claim whose reply was lost may have committed (its rows then
        wait for lease recovery); the claim loop claims again at its next wake-up.
        A claim of a queue with cluster-wide limits goes through its gate (`_gated_claim`)."""
        if await self._limited.limited(params.queue, self._queue_limited):
            return await self._gated_claim(params)
        async with self._pool.connection() as conn:
            return await self._claim(conn, params)

    async def _key_rated(self, conn: Connection) -> bool:
        """Whether some key has a rate (cached for a second), asked on the claim's own
        connection: a claim holding one never waits for another."""

        async def read(_: str) -> bool:
            self._calls["key_rated"] += 1
            [[rated]] = await self._query(conn, "key_rated", None)
            return bool(rated)

        return await self._rated.limited("", read)

    async def _queue_limited(self, queue: str) -> bool:
        [row] = await self._fetch("queue_limited", {"queue": queue})
        return bool(row[QueueLimited.limited])

    async def _gated_claim(self, params: Claim) -> ClaimResult:
        """A limited queue's claim, in one transaction: the gate (it locks the queue's limits
        row until COMMIT and says how many jobs may start), the claim of at most that many,
        and the claimed rows' start time and rate log entries (queue_limit_spend; the
        migration says why the start time is the gate's). Rows due within the lookahead are
        not claimed early here: a start is counted when it is recorded, at the claim."""
        queue = params.queue
        async with self._pool.connection() as conn, conn.transaction():
            self._calls["queue_limit_gate"] += 1
            [gate] = await self._query(
                conn, "queue_limit_gate", {"queue": queue, "requested": params.limit}
            )
            allowed, running = gate[QueueLimitGate.allowed], gate[QueueLimitGate.running]
            global_limit = gate[QueueLimitGate.global_limit]
            rate_allowed = gate[QueueLimitGate.rate_allowed]
            next_start_at = gate[QueueLimitGate.next_start_at]
            started_at = gate[QueueLimitGate.started_at]
            self._limited.note(queue, global_limit is not None or rate_allowed is not None)
            result = await self._claim(
                conn, attrs.evolve(params, limit=allowed, lookahead_seconds=0.0)
            )
            if result.claimed and started_at is not None:
                self._calls["queue_limit_spend"] += 1
                claimed = [job.id for job in result.claimed]
                [spent] = await self._query(
                    conn,
                    "queue_limit_spend",
                    {"queue": queue, "claimed": claimed, "started_at": started_at},
                )
                next_start_at = spent[QueueLimitSpent.next_start_at]
            elif allowed:
                next_start_at = None  # nothing started: the window is not full
        return attrs.evolve(
            result,
            rate_limited_until=next_start_at,
            at_global_limit=global_limit is not None and running + allowed >= global_limit,
        )

    async def _claim(self, conn: Connection, params: Claim) -> ClaimResult:
        """One claim on `conn`: job_claim_plain when the caller asks for it (`Claim.plain`)
        and it finds neither keyed nor due work; else the full job_claim (job_claim_rated
        while some key has a rate; whether one has is read only for a full claim, at most once
        a second). A plain claim that finds such work claims nothing and the full statement
        claims at once on the same connection, so the claim takes what the full statement
        alone would have (queries.sql, job_claim_plain)."""
        claim = claim_params(params)
        with self._schema_required():
            if params.plain:
                self._calls["job_claim_plain"] += 1
                rows = await self._query(conn, "job_claim_plain", claim)
                first = rows[0]
                if not first[PlainClaimed.blocked]:
                    return ClaimResult(
                        claimed=_claimed_jobs(rows),
                        now=rows[-1][PlainClaimed.now],
                        next_due=first[PlainClaimed.next_due],
                        replied_at=conn.replied_at,
                        plain_next=True,
                    )
            rated = bool(params.limit) and await self._key_rated(conn)
            name = _full(rated)
            self._calls[name] += 1
            rows = await self._query(conn, name, claim)
        first = rows[0]
        next_due, now = first[Claimed.next_due], rows[-1][Claimed.now]
        return ClaimResult(
            claimed=_claimed_jobs(rows),
            key_cursor=first[Claimed.key_cursor],
            keys_visited=first[Claimed.keys_visited],
            concurrency_cursor=first[Claimed.concurrency_cursor],
            promoted=first[Claimed.promoted],
            # `now` is read per row as the row is produced: the last row's is the latest, after
            # every claimed row and its history (200 rows with history: ~6 ms after the first).
            now=now,
            next_due=next_due,
            replied_at=conn.replied_at,
            key_rate_limited_until=first[-1] if rated else None,
            # The next claim may be plain when this one saw no ready keyed row, promoted
            # nothing (a promotion may have left more due rows) and the next due row is beyond
            # the lookahead.
            plain_next=(
                first[Claimed.keys_visited] == 0
                and first[Claimed.promoted] == 0
                and (next_due is None or next_due > now + timedelta_of(params.lookahead_seconds))
            ),
        )

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        async with self._pool.connection() as conn:
            return await self._settle(conn, settlements)

    async def _settle(self, conn: Connection, settlements: Sequence[Settlement]) -> SettleResult:
        """job_complete_plain when every outcome is a completion of a job without a partition
        key or a parent (`Settlement.plain`: the completer's common flush), else
        job_settle_many; completions their task keeps nothing of (`Settlement.keep` False) go
        to job_complete_discard; on `conn` (pooled, or a caller's transaction)."""
        kept, discarded = _split_kept(settlements)
        settled: tuple[tuple[int, str], ...] = ()
        now = next_due = None
        with self._schema_required():
            if discarded:
                self._calls["job_complete_discard"] += 1
                [row] = await self._query(
                    conn, "job_complete_discard", lease_arrays([s.lease for s in discarded])
                )
                settled = tuple(zip(row[CompletePlain.ids], row[CompletePlain.states], strict=True))
                now = row[CompletePlain.now]
            if kept or not discarded:  # (an empty batch still answers with the time)
                if _all_plain(kept):
                    self._calls["job_complete_plain"] += 1
                    [row] = await self._query(
                        conn, "job_complete_plain", complete_plain_params(kept)
                    )
                    ids, states = row[CompletePlain.ids], row[CompletePlain.states]
                    now = row[CompletePlain.now]
                else:
                    self._calls["job_settle_many"] += 1
                    [row] = await self._query(conn, "job_settle_many", settle_params(kept))
                    ids, states, now = row[Settled.ids], row[Settled.states], row[Settled.now]
                    next_due = row[Settled.next_due]
                settled += tuple(zip(ids, states, strict=True))
        assert now is not None
        return SettleResult(settled=settled, now=now, next_due=next_due, replied_at=conn.replied_at)

    async def job_get(self, job_id: int) -> JobRecord | None:
        rows = await self._retrying("job_get", {"id": job_id})
        return JobRecord(*rows[0]) if rows else None

    async def job_result_watch(self, job_id: int) -> None:
        # Setting a flag: idempotent. Two statements, each its own transaction (the record's,
        # then the run's: queries.sql, job_result_watch says why).
        await self._retrying("job_result_watch", {"id": job_id})
        await self._retrying("job_result_watch_run", {"id": job_id})

    # --- events ---------------------------------------------------------------------------

    async def _emit(self, conn: Connection, params: EmitEvent) -> EmitOutcome:
        self._calls["event_emit"] += 1
        with self._schema_required():
            rows = await conn.fetch(
                self._sql["event_emit"], {"key": params.key, "payload": params.payload_json}
            )
        return _emitted(rows)

    async def event_emit(self, params: EmitEvent) -> EmitOutcome:
        """Retried when the connection drops: a second emit of the same key changes nothing."""
        rows = await self._retrying(
            "event_emit", {"key": params.key, "payload": params.payload_json}
        )
        return _emitted(rows)

    def queue_limits_changed(self, queue: str | None) -> None:
        self._limited.forget(queue)

    def queue_limits_notified(self, live: bool) -> None:
        self._limited.follow_notifications(live)

    # --- traces and notifications ---------------------------------------------------------

    async def job_trace_context(self, job_id: int) -> str | None:
        rows = await self._retrying("job_trace_context", {"id": job_id})
        return rows[0][TraceContext.trace_context] if rows else None

    async def notify_send(self, channel: str, payload: str) -> None:
        await self._retrying("notify_send", {"channel": channel, "payload": payload})

    # --- transactions and the listener ----------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgTransaction]:
        """BEGIN on a pooled connection; COMMIT on success, ROLLBACK on any exception.

        The caller's SQL runs under the server's statement timeouts, not trioq's."""
        async with self._pool.connection() as conn, conn.transaction(trioq_timeouts=False):
            yield PgTransaction(self, conn)

    @asynccontextmanager
    async def open_listener(
        self, on_notify: NotifyCallback, on_reconnect: Callable[[], None]
    ) -> AsyncIterator[Listener | PollingListener]:
        """The LISTEN connection (see `open_pg_driver`), or a `PollingListener` that delivers
        nothing when there is nowhere to LISTEN: waiters then find results by their poll."""
        if self._listen_conninfo is None:
            yield PollingListener()
            return
        async with open_listener(
            self._listen_conninfo,
            on_notify=on_notify,
            on_reconnect=on_reconnect,
            **self._listen_options,
        ) as listener:
            yield listener


def _emitted(rows: Sequence[Sequence[Any]]) -> EmitOutcome:
    return EmitOutcome(
        first=rows[0][EventEmitted.emitted_first], woken=rows[0][EventEmitted.woken_count]
    )


async def read_job_states(driver: PgDriver) -> dict[int, str]:
    """Every job's id and state, read on a pooled connection of its own and not counted in
    `statistics()` (the transition checker of trioq.testing reads it around each call)."""
    async with driver._pool.connection() as conn:
        rows = await conn.fetch(driver._sql["job_states"])
    return {row[JobStateRow.id]: row[JobStateRow.state] for row in rows}


def pooler_options(prepared_statements: str) -> ConnectOptions:
    """The connection options of a `prepared_statements` setting: "off" (a transaction pooler
    in front: PgBouncer, RDS Proxy, Supavisor) means unnamed statements only, no startup
    options and no session settings (see `connect`); "auto" changes nothing."""
    if prepared_statements == "off":
        return ConnectOptions(prepare_threshold=None, transaction_pooler=True)
    return ConnectOptions()


@asynccontextmanager
async def open_pg_driver(
    conninfo: str,
    schema: str,
    *,
    pool_size: int = 10,
    prepared_statements: str = "auto",
    listen_conninfo: str | None = None,
    **connect_kwargs: Any,
) -> AsyncIterator[PgDriver]:
    """Open the pools and yield a PgDriver for `schema` (closing the pools on exit).

    Connections: `pool_size` for statements, one reserved for lease renewals, one for
    database-wide scans (opened on first use), and one more for
    the LISTEN session of each listener opened (a worker opens one), on `listen_conninfo`
    (None: `conninfo`, or nowhere with `prepared_statements="off"`, see `pooler_options`).
    """
    options = {**connect_kwargs, **pooler_options(prepared_statements)}
    if listen_conninfo is None and prepared_statements != "off":
        listen_conninfo = conninfo
    async with (
        open_pool(conninfo, size=pool_size, **options) as pool,
        # No ping before a renewal: lease_renew_many is idempotent and retried on a lost
        # connection, so a dead pooled connection costs one retry, not a ping per renewal.
        open_pool(conninfo, size=1, ping_idle_after=math.inf, **options) as renewal_pool,
        open_pool(conninfo, size=1, open_first=False, **options) as scan_pool,
    ):
        yield PgDriver(
            schema=schema,
            pool=pool,
            renewal_pool=renewal_pool,
            scan_pool=scan_pool,
            conninfo=conninfo,
            listen_conninfo=listen_conninfo,
            listen_options=options,
        )
