"""PgDriver: the Driver protocol on PostgreSQL, one method per named statement in queries.sql.

Connection-lost errors on idempotent statements (reads, fenced writes that a retry cannot
apply twice) are retried with backoff by `_retrying`; an enqueue is not retried (its outcome
after a lost COMMIT is unknown, and the caller decides).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import logging
import math
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import psycopg
import trio

from .._core.channels import control_channel, schedules_channel
from .._core.codec import Undecodable
from .._core.errors import MigrationLockTimeout, SchemaNotMigrated
from .._core.explain import ExplainFacts
from .._core.limits import Rate
from .._core.outcomes import rule_of
from .._core.schedule import fire_dedup_key
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
    ScheduleAdvance,
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
    QueueAdmission,
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
    ChildOutcome,
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
from .._sql import (
    Migration,
    PositionalStatement,
    functions,
    functions_digest,
    migrations,
    positional_queries,
    queries,
)
from . import (
    Connection,
    ConnectOptions,
    Listener,
    PollingListener,
    Pool,
    is_connection_lost,
    open_listener,
    open_pool,
)
from .errors import migration_refused, schema_required
from .inserts import NATIVE_INSERTS, insert_statement, inserted_jobs
from .inserts import quoted as _quoted
from .inserts import text_array as _text_array
from .limits import LimitedQueues
from .replies import (
    Cancelled,
    CheckpointWritten,
    ChildrenCancelled,
    ChildrenWait,
    Claimed,
    ClaimedRow,
    CompletePlain,
    ContinuedAsNew,
    EventEmitted,
    EventWait,
    Explained,
    FunctionDigest,
    FunctionDigestKept,
    JobStateRow,
    LeaderElected,
    LeaderResigned,
    LeaseRenewal,
    Maintenance,
    MessageSent,
    MigrationApplied,
    PlainClaimed,
    QueueLimited,
    QueueLimitGate,
    QueueLimitRow,
    QueueLimitSpent,
    ReadyChannel,
    Received,
    ScheduleFired,
    ScheduleNextDue,
    SchedulerLead,
    ScheduleUpserted,
    Settled,
    Spawned,
    TraceContext,
    Unroutable,
    ValuesSet,
    WorkerRow,
)

T = TypeVar("T")
Params = dict[str, Any]

logger = logging.getLogger("trioq.pg")
#: How long one lock of a migration may wait (a queued ACCESS EXCLUSIVE request holds up every
#: enqueue and claim behind it): the online-migration bound of docs/operations.md is 1 s.
MIGRATE_LOCK_TIMEOUT = 0.5
#: How long `migrate` keeps trying in all before it gives up (a nightly pg_dump runs minutes).
MIGRATE_LOCK_WAIT = 600.0


def _lease_arrays(leases: Sequence[Lease]) -> Params:
    """The fencing triples as three array literals (cast to bigint[], int[], uuid[] in SQL).

    Sent as text: psycopg dumps a Python list element by element, which showed in the worker's
    profile at saturation; ints and UUIDs need no quoting in an array literal. A token is
    written as its 32 hex digits (`UUID.hex`, which Postgres reads as the same uuid): `str()`
    of a UUID, with its hyphens, cost 1.3 us each, a third of a 25-job claim's parameters.
    """
    return {
        "ids": "{" + ",".join([str(lease.id) for lease in leases]) + "}",
        "attempts": "{" + ",".join([str(lease.attempt) for lease in leases]) + "}",
        "lease_tokens": "{" + ",".join([lease.lease_token.hex for lease in leases]) + "}",
    }


def _admission_arrays(admission: Sequence[QueueAdmission]) -> Params:
    """The admission snapshot as parallel arrays (unnested into the worker row's jsonb)."""
    return {
        "admission_queues": [a.queue for a in admission],
        "admission_limits": [a.limit for a in admission],
        "admission_concurrency": [a.concurrency for a in admission],
        "admission_reasons": [a.reason for a in admission],
        "admission_causes": [a.cause for a in admission],
        "admission_reduced_for": [a.reduced_for_seconds for a in admission],
    }


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


def _lease_params(lease: Lease) -> Params:
    return {"id": lease.id, "attempt": lease.attempt, "lease_token": lease.lease_token}


def _nullable_array(values: Sequence[object | None]) -> str:
    """An array literal of text, numbers or datetimes (cast in SQL) with NULL for None:
    psycopg dumps a list of 25 strings element by element in Python (60 us per claim round
    here), this is one join."""
    return "{" + ",".join(["NULL" if value is None else _element(value) for value in values]) + "}"


def _element(value: object) -> str:
    if type(value) is str:  # the common element (results, errors): tested first
        return _quoted(value)
    if isinstance(value, datetime.datetime):
        return f'"{value.isoformat()}"'
    if isinstance(value, float | int) and not isinstance(value, bool):
        return repr(float(value))  # a float subclass (numpy) would repr as np.float64(1.5)
    if isinstance(value, str):
        return _quoted(value)
    raise TypeError(f"array element {value!r}: expected str, a number or a datetime")


def _results_array(settlements: Sequence[Settlement]) -> str:
    """The results of completions as a text[] literal (`_nullable_array`), with the no-op
    handler's "null" answered without quoting: most jobs of a drain return None."""
    return (
        "{"
        + ",".join(
            [
                _QUOTED_NULL if (r := s.result_json) == "null" else _results_element(r)
                for s in settlements
            ]
        )
        + "}"
    )


_QUOTED_NULL = _quoted("null")


def _results_element(value: str | None) -> str:
    return "NULL" if value is None else _quoted(value)


@functools.lru_cache(maxsize=64)
def _cached_text_array(values: tuple[str, ...]) -> str:
    """A worker's task list, the same tuple every round: quoted once."""
    return _text_array(values)


def complete_plain_params(settlements: Sequence[Settlement]) -> Params:
    """The parameters of job_complete_plain (the completer's common flush): the fences and
    the results, nothing the full statement's rules need."""
    return {
        **_lease_arrays([settlement.lease for settlement in settlements]),
        "results": _results_array(settlements),
    }


def checkpoint_params(writes: Sequence[CheckpointWrite]) -> Params:
    """The parameters of checkpoint_insert_many(_plain): one array literal per column, as the
    settlements' are. psycopg's list dumper took 120-280 us per batch of 25 writes here (five
    lists, element by element in Python), paid between two steps of every workflow in the
    batch; these joins take 23 us."""
    return {
        **_lease_arrays([write.lease for write in writes]),
        "positions": "{" + ",".join([str(write.position) for write in writes]) + "}",
        "kinds": "{" + ",".join([_quoted_kind(write.kind) for write in writes]) + "}",
        "names": "{" + ",".join([_quoted_name(write.name) for write in writes]) + "}",
        "values": "{"
        + ",".join(
            [
                _QUOTED_NULL if (v := write.value_json) == "null" else _results_element(v)
                for write in writes
            ]
        )
        + "}",
        "wake_ins": "{"
        + ",".join(
            ["NULL" if (w := write.wake_in_seconds) is None else _element(w) for write in writes]
        )
        + "}",
    }


@functools.lru_cache(maxsize=64)
def _quoted_kind(kind: str) -> str:
    """A checkpoint kind, one of a few constants (step, sleep, ...): quoted once."""
    return _quoted(kind)


@functools.lru_cache(maxsize=1024)
def _quoted_name(name: str) -> str:
    """A checkpoint name: a workflow names the same few steps in every run, so each is quoted
    once (quoting every write's name was 1.2% of a 3-step workflow drain's worker CPU)."""
    return _quoted(name)


def _nulls(count: int) -> str:
    """An array literal of `count` NULLs."""
    return "{" + ",".join(["NULL"] * count) + "}"


# The statements whose result columns are read in binary format (native.fetch): the claim,
# whose 25 rows of 22 columns were the largest decode of a worker's round, and the settles.
# Every column of a statement listed here must be of a built-in type (psycopg returns bytes for
# a type it has no binary loader for).
BINARY_RESULTS = frozenset(
    {
        "job_claim",
        "job_claim_rated",
        "job_claim_plain",
        "job_settle_many",
        "job_complete_plain",
        "job_complete_discard",
    }
)


@functools.cache
def _seconds(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


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
        **_lease_arrays([settlement.lease for settlement in settlements]),
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
class PgDriver:
    schema: str
    _pool: Pool
    # Lease renewals get a connection of their own: handlers that fill the main pool (say,
    # each inside client.transaction()) must never hold renewals back until leases expire.
    _renewal_pool: Pool
    # Database-wide scans (`queue_demand()`, which reads every unfinished row) get one
    # connection of their own, opened on first use: a burst of them (scrapes of /metrics, say)
    # waits for that connection instead of taking the main pool from claims and settles.
    _scan_pool: Pool
    _conninfo: str = attrs.field(repr=False)  # holds the password
    # Where LISTEN goes; None: nowhere (behind a transaction pooler without a listen URL, where
    # a LISTEN would be silently dead and stay behind for the session's next client).
    _listen_conninfo: str | None = attrs.field(repr=False)
    _listen_options: dict[str, Any] = attrs.field(factory=dict)
    _sql: dict[str, str] = attrs.field(init=False)
    _positional: dict[str, PositionalStatement] = attrs.field(init=False)
    _calls: collections.Counter[str] = attrs.field(init=False, factory=collections.Counter)
    # Per queue: whether its last settle-and-claim round saw no ready keyed row and no row due
    # within the lookahead, so the next may be a plain one.
    _limited: LimitedQueues = attrs.field(init=False, factory=LimitedQueues)
    # Whether any key has a rate (one entry, ""): keyed claims then run the rated statement.
    _rated: LimitedQueues = attrs.field(init=False, factory=LimitedQueues)

    def __attrs_post_init__(self) -> None:
        self._sql = queries(self.schema)
        self._positional = positional_queries(self.schema)

    async def _query(
        self, conn: Connection, name: str, params: Params | None
    ) -> list[tuple[Any, ...]]:
        """Run the named statement; with parameters, in its positional form (see
        `PositionalStatement`: the cost does not depend on the schema name's length), on the
        trio-native libpq path with psycopg's own parameter types (no worker thread: a thread
        start and a wake-up of the trio loop per statement cost 60-140 us of a short
        statement's latency, and every checkpoint, renewal and claim waits for one)."""
        if params is None:
            return await conn.fetch(self._sql[name])
        statement = self._positional[name]
        return await conn.fetch_native(
            statement.text, statement.values(params), typed=True, binary=name in BINARY_RESULTS
        )

    def statistics(self) -> DriverStatistics:
        return DriverStatistics(calls=dict(self._calls))

    async def _fetch(
        self, name: str, params: Params | None = None, *, pool: Pool | None = None
    ) -> list[tuple[Any, ...]]:
        self._calls[name] += 1
        async with (pool or self._pool).connection() as conn:
            with self._schema_required():
                return await self._query(conn, name, params)

    def _schema_required(self) -> contextlib.AbstractContextManager[None]:
        """`errors.schema_required` for this schema."""
        return schema_required(self.schema)

    async def _retrying(
        self,
        name: str,
        params: Params | None = None,
        attempts: int = 5,
        *,
        pool: Pool | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run an idempotent statement, retrying when the connection was lost."""
        delay = 0.05
        for attempt in range(attempts):
            try:
                return await self._fetch(name, params, pool=pool)
            except Exception as exc:
                if not is_connection_lost(exc) or attempt == attempts - 1:
                    raise
            await trio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    # --- schema ---------------------------------------------------------------------------

    async def migrate(
        self,
        *,
        lock_timeout: float = MIGRATE_LOCK_TIMEOUT,
        lock_wait: float = MIGRATE_LOCK_WAIT,
    ) -> list[int]:
        """Apply the SQL functions' current bodies and the missing migrations; returns the
        migration versions applied.

        Online (docs/operations.md, "Online migrations"): consecutive transactional migrations
        run in one transaction with the functions' bodies, under an advisory lock, and every lock
        they take waits at most `lock_timeout` seconds; a lock not granted rolls the transaction
        back and it is tried again after a pause, for `lock_wait` seconds in all, so a
        migration queued behind a long reader (a `pg_dump`) holds up enqueues and claims for a
        `lock_timeout` at a time, not for as long as the reader runs. A no-transaction migration
        (`CREATE INDEX CONCURRENTLY`, batches) runs statement by statement in between.
        """
        applied: list[int] = []
        deadline = trio.current_time() + lock_wait
        # Migrations may run long (an index build on a big table): not under trioq's timeouts.
        async with self._pool.connection() as conn:
            try:
                while True:
                    group, online = await self._retry_lock_timeouts(
                        deadline, lambda: self._migrate_group(conn, lock_timeout)
                    )
                    applied += group
                    if online is None:
                        return applied
                    run = functools.partial(self._run_no_transaction, conn, online, lock_timeout)
                    await self._retry_lock_timeouts(deadline, run)
                    applied.append(online.version)
            except psycopg.errors.InsufficientPrivilege as exc:
                role, database = conn.role_and_database()
                refused = migration_refused(exc, self.schema, role, database)
                raise SchemaNotMigrated(refused or str(exc)) from exc

    async def _retry_lock_timeouts(self, deadline: float, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = 0.1
        while True:
            try:
                return await attempt()
            except psycopg.errors.LockNotAvailable as exc:
                if trio.current_time() + delay > deadline:
                    raise MigrationLockTimeout(
                        "trioq migrate: a lock it needs was held by another session for longer"
                        " than its --lock-wait; see pg_stat_activity for long transactions"
                        f" (a pg_dump, an idle-in-transaction session) and run it again ({exc})"
                    ) from exc
                logger.info("migrate: a lock it needs is held elsewhere; trying again")
            await trio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)

    async def _migrate_group(
        self, conn: Connection, lock_timeout: float
    ) -> tuple[list[int], Migration | None]:
        """One transaction: the functions' bodies when they changed, then the pending
        transactional migrations up to the next no-transaction one, which it returns; every
        lock wait bounded by `lock_timeout`."""
        applied: list[int] = []
        online: Migration | None = None
        async with conn.transaction(trioq_timeouts=False):
            await conn.execute(self._sql["migration_lock"], {"schema_name": self.schema})
            await conn.execute(self._sql["migration_prepare"])
            await conn.execute(
                self._sql["migration_lock_timeout"], {"milliseconds": str(int(lock_timeout * 1000))}
            )
            applied_rows = await conn.fetch(self._sql["migration_applied"])
            done = {row[MigrationApplied.version] for row in applied_rows}
            bodies = functions(self.schema)
            digest = functions_digest(bodies)
            changed = await self._functions_changed(conn, digest)
            if changed:
                # Before the migrations, whose triggers name them (queries.sql says why they
                # are not checked here).
                await conn.execute(self._sql["migration_functions_unchecked"])
                for function in bodies:
                    await conn.execute(function.sql)
                await conn.execute(self._sql["migration_functions_checked"])
            for migration in migrations(self.schema):
                if migration.version in done:
                    continue
                if not migration.transactional:
                    online = migration
                    break
                await conn.execute(migration.sql)
                await self._record_migration(conn, migration)
                applied.append(migration.version)
            if changed:
                await conn.execute(
                    self._sql["migration_function_digest_record"], {"digest": digest}
                )
        return applied, online

    async def _record_migration(self, conn: Connection, migration: Migration) -> None:
        await conn.execute(
            self._sql["migration_record"], {"version": migration.version, "name": migration.name}
        )

    async def _run_no_transaction(
        self, conn: Connection, migration: Migration, lock_timeout: float
    ) -> None:
        """Each statement on its own (autocommit), under the session's default timeouts and
        `lock_timeout`; then the record, which another migrate may have written meanwhile."""
        [saved] = await conn.fetch(self._sql["migration_session_timeouts_save"])
        await conn.execute(
            self._sql["migration_session_timeouts_default"],
            {"milliseconds": str(int(lock_timeout * 1000))},
        )
        try:
            for statement in migration.statements():
                await conn.execute(statement)
        finally:
            await conn.execute(
                self._sql["migration_session_timeouts_restore"],
                {
                    "statement_timeout": saved[0],
                    "lock_timeout": saved[1],
                    "idle_timeout": saved[2],
                },
            )
        async with conn.transaction(trioq_timeouts=False):
            await conn.execute(self._sql["migration_lock"], {"schema_name": self.schema})
            applied_rows = await conn.fetch(self._sql["migration_applied"])
            if migration.version not in {row[MigrationApplied.version] for row in applied_rows}:
                await self._record_migration(conn, migration)

    async def _functions_changed(self, conn: Connection, digest: str) -> bool:
        """Whether the functions' bodies differ from what the last migrate applied."""
        [kept] = await conn.fetch(self._sql["migration_function_digest_kept"])
        if not kept[FunctionDigestKept.kept]:
            return True
        rows = await conn.fetch(self._sql["migration_function_digest"])
        return [row[FunctionDigest.digest] for row in rows] != [digest]

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
                and (next_due is None or next_due > now + _seconds(params.lookahead_seconds))
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
                    conn, "job_complete_discard", _lease_arrays([s.lease for s in discarded])
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

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]:
        """Retried on a lost connection: a repeated write finds its position taken and its
        fence still held, so it reports the write without storing it twice."""
        params = checkpoint_params(writes)
        if any(write.values for write in writes):
            rows = await self._retrying(
                "checkpoint_insert_many", {**params, **_value_arrays(writes)}
            )
        else:  # a plain workflow's batch: no ctx.set_value to carry
            rows = await self._retrying("checkpoint_insert_many_plain", params)
        return [
            WrittenCheckpoint(
                job_id=row[CheckpointWritten.id],
                position=row[CheckpointWritten.position],
                value=row[CheckpointWritten.value],
            )
            for row in rows
        ]

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult:
        rows = await self._retrying(
            "lease_renew_many",
            {
                **_lease_arrays(params.leases),
                "worker_id": params.worker_id,
                "worker_state": params.worker_state,
                "lease_seconds": params.lease_seconds,
                **_admission_arrays(params.admission),
            },
            pool=self._renewal_pool,
        )
        leases = LeaseRenewal.id  # a RenewedLease from here on
        return RenewalResult(
            leases=tuple(RenewedLease(*row[leases:]) for row in rows if row[leases] is not None),
            registered=bool(rows[0][LeaseRenewal.registered]),
        )

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport:
        """One bounded pass, swept only while `params.leader_id` holds the leader seat (or with
        no leader_id). Retried on a lost connection: a repeated pass finds less to do."""
        rows = await self._retrying(
            "maintenance_pass",
            {
                "recover_limit": params.recover_limit,
                "prune_limit": params.prune_limit,
                "retention_seconds": params.retention_seconds,
                "worker_stale_seconds": params.worker_stale_seconds,
                "leader_id": params.leader_id,
                "scheduler": params.scheduler,
                "ttl_seconds": params.ttl_seconds,
                "queues": list(params.queues),
                "deadline_limit": params.deadline_limit,
                "control_channel": control_channel(self.schema),
            },
        )
        row, now = rows[0], rows[0][Maintenance.now]
        return MaintenanceReport(
            leader=bool(row[Maintenance.leader]),
            recovered=tuple((int(job_id), state) for job_id, state in row[Maintenance.recovered]),
            pruned_jobs=row[Maintenance.pruned_jobs],
            pruned_workers=row[Maintenance.pruned_workers],
            registered=bool(row[Maintenance.registered]),
            now=now,
            probes=_probes(
                row[Maintenance.queues], row[Maintenance.work_due], row[Maintenance.next_due]
            ),
            schedules=ScheduleDue(
                now=now,
                any_schedule=row[Maintenance.any_schedule],
                next_fire_at=row[Maintenance.next_fire_at],
            ),
            deadlines_passed=row[Maintenance.deadlines_passed],
        )

    async def leader_elect(self, params: LeaderElect) -> LeadershipReport:
        """Retried on a lost connection (taking or extending the seat twice is harmless)."""
        rows = await self._retrying(
            "leader_elect",
            {
                "worker_id": params.worker_id,
                "scheduler": params.scheduler,
                "ttl_seconds": params.ttl_seconds,
                "queues": list(params.queues),
            },
        )
        row = rows[0]
        return LeadershipReport(
            leader=bool(row[LeaderElected.leader]),
            registered=bool(row[LeaderElected.registered]),
            now=row[LeaderElected.now],
            probes=_probes(
                row[LeaderElected.queues],
                row[LeaderElected.work_due],
                row[LeaderElected.next_due],
            ),
        )

    async def leader_resign(self, params: LeaderResign) -> bool:
        [row] = await self._fetch(
            "leader_resign",
            {"worker_id": params.worker_id, "control_channel": control_channel(self.schema)},
        )
        return bool(row[LeaderResigned.resigned])

    async def job_cancel(self, job_id: int) -> CancelOutcome | None:
        rows = await self._fetch(
            "job_cancel", {"id": job_id, "control_channel": control_channel(self.schema)}
        )
        return _cancel_outcome(rows)

    async def job_get(self, job_id: int) -> JobRecord | None:
        rows = await self._retrying("job_get", {"id": job_id})
        return JobRecord(*rows[0]) if rows else None

    async def job_result_watch(self, job_id: int) -> None:
        await self._retrying("job_result_watch", {"id": job_id})  # setting a flag: idempotent

    async def job_attempts(self, job_id: int) -> list[AttemptRecord]:
        rows = await self._retrying("job_attempts", {"id": job_id})
        return [AttemptRecord(*row) for row in rows]

    async def checkpoint_list(self, job_id: int) -> list[Checkpoint]:
        rows = await self._retrying("checkpoint_list", {"id": job_id})
        return [Checkpoint(*row) for row in rows]

    async def job_list(self, params: JobFilter) -> list[JobRecord]:
        def optional(values: tuple[str, ...] | None) -> list[str] | None:
            return None if values is None else list(values)

        rows = await self._retrying(
            "job_list",
            {
                "states": optional(params.states),
                "tasks": optional(params.tasks),
                "queues": optional(params.queues),
                "partition_key": params.partition_key,
                "older_than": params.older_than_seconds,
                "before_id": params.before_id,
                "limit": params.limit,
            },
        )
        return [JobRecord(*row) for row in rows]

    # --- events and children -------------------------------------------------------------

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

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome:
        """Retried: if the lost reply had suspended the job, the retry finds the lease gone
        ("lost"), which ends the execution exactly as the suspension would."""
        rows = await self._retrying(
            "job_wait_event",
            {
                **_lease_params(params.lease),
                "position": params.position,
                "key": params.key,
                "timeout_seconds": params.timeout_seconds,
                "deadline": params.deadline,
            },
        )
        row = rows[0]
        return EventWaitOutcome(
            row[EventWait.state] if row[EventWait.owned] else "lost",
            row[EventWait.payload],
            row[EventWait.deadline],
        )

    async def job_spawn_many(self, spawns: Sequence[Spawn]) -> list[SpawnOutcome]:
        """Retried: the (parent, position) key returns the child a lost reply had inserted."""
        children = [spawn.child for spawn in spawns]
        rows = await self._retrying(
            "job_spawn_many",
            {
                **_lease_arrays([spawn.lease for spawn in spawns]),
                "positions": [spawn.position for spawn in spawns],
                "queues": [child.queue for child in children],
                "tasks": [child.task for child in children],
                "payloads": [child.payload_json for child in children],
                "priorities": [child.priority for child in children],
                "run_ats": [child.run_at for child in children],
                "delays": [child.delay_seconds for child in children],
                "partition_keys": [child.partition_key for child in children],
                "max_attempts": [child.max_attempts for child in children],
                "versions": [child.version for child in children],
                "on_parent_cancels": [spawn.on_parent_cancel for spawn in spawns],
                "concurrency_keys": [child.concurrency_key for child in children],
                "concurrency_limits": [child.concurrency_limit for child in children],
                "deadline_ats": [child.deadline_at for child in children],
                "deadlines": [child.deadline_seconds for child in children],
                "deadline_sources": [child.deadline_source for child in children],
                "task_deadlines": [child.task_deadline for child in children],
            },
        )
        outcome = Spawned.child_id  # a SpawnOutcome from here on
        return [SpawnOutcome(*row[outcome:]) for row in rows]

    async def job_wait_children(self, params: WaitChildren) -> ChildrenWaitOutcome:
        rows = await self._retrying(
            "job_wait_children",
            {
                **_lease_params(params.lease),
                "position": params.position,
                "child_ids": list(params.child_ids),
                "stop_on_failure": params.stop_on_failure,
                "record": params.record,
                "kind": params.kind,
                "name": params.name,
            },
        )
        child = ChildrenWait.id  # a ChildOutcome from here on
        children = tuple(ChildOutcome(*row[child:]) for row in rows if row[child] is not None)
        return ChildrenWaitOutcome(rows[0][ChildrenWait.outcome], children)

    async def job_cancel_children(self, params: CancelChildren) -> bool:
        rows = await self._retrying(
            "job_cancel_children",
            {
                **_lease_params(params.lease),
                "position": params.position,
                "kind": params.kind,
                "name": params.name,
                "value": params.value_json,
                "child_ids": list(params.child_ids),
                "control_channel": control_channel(self.schema),
            },
        )
        return bool(rows[0][ChildrenCancelled.owned])

    async def job_retry(self, job_id: int) -> CancelOutcome | None:
        rows = await self._fetch("job_retry", {"id": job_id})
        return _cancel_outcome(rows)

    async def job_purge(self, params: JobPurge) -> int:
        rows = await self._fetch(
            "job_purge",
            {
                "states": list(params.states),
                "older_than": params.older_than_seconds,
                "tasks": None if params.tasks is None else list(params.tasks),
                "queues": None if params.queues is None else list(params.queues),
                "limit": params.limit,
            },
        )
        return len(rows)

    async def queue_pause(self, queue: str) -> bool:
        return bool(await self._retrying("queue_pause", {"queue": queue}))

    async def queue_resume(self, queue: str) -> bool:
        return bool(await self._retrying("queue_resume", {"queue": queue}))

    async def queue_pause_list(self) -> list[QueuePause]:
        return [QueuePause(*row) for row in await self._retrying("queue_pause_list")]

    async def concurrency_limit_set(self, pattern: str, max_running: int | None) -> bool:
        """Set (or, with None, remove) a key pattern's limit; False: there was none to remove."""
        if max_running is None:
            return bool(await self._retrying("concurrency_limit_delete", {"pattern": pattern}))
        params = {"pattern": pattern, "max_running": max_running}
        return bool(await self._retrying("concurrency_limit_set", params))

    async def concurrency_limit_list(self) -> list[ConcurrencyLimit]:
        return [ConcurrencyLimit(*row) for row in await self._retrying("concurrency_limit_list")]

    async def concurrency_key_status(
        self, keys: Sequence[str] | None = None
    ) -> list[ConcurrencyKeyStatus]:
        params = {"keys": None if keys is None else list(keys)}
        rows = await self._retrying("concurrency_key_status", params)
        return [ConcurrencyKeyStatus(*row) for row in rows]

    async def concurrency_rate_set(self, pattern: str, rate: Rate | None) -> bool:
        """Set (or, with None, remove) a key pattern's rate; False: there was none to remove.
        This process's claims read the rates again at their next round."""
        self._rated.forget("")
        if rate is None:
            return bool(await self._retrying("concurrency_rate_delete", {"pattern": pattern}))
        params = {"pattern": pattern, "rate_allowed": rate.allowed, "rate_period": rate.period}
        return bool(await self._retrying("concurrency_rate_set", params))

    async def concurrency_rate_list(self) -> list[ConcurrencyRate]:
        return [
            ConcurrencyRate(pattern, Rate(allowed, period), updated_at)
            for pattern, allowed, period, updated_at in await self._retrying(
                "concurrency_rate_list"
            )
        ]

    async def concurrency_rate_status(self) -> list[KeyRateStatus]:
        return [
            KeyRateStatus(key, Rate(allowed, period), recent, until)
            for key, allowed, period, recent, until in await self._retrying(
                "concurrency_rate_status"
            )
        ]

    async def queue_limit_set(self, params: QueueLimitSet) -> None:
        """Retried on a lost connection: applying the same change twice leaves the same row."""
        rate = params.rate
        await self._retrying(
            "queue_limit_set",
            {
                "queue": params.queue,
                "set_limit": params.set_limit,
                "global_limit": params.global_limit,
                "set_rate": params.set_rate,
                "rate_allowed": None if rate is None else rate.allowed,
                "rate_period": None if rate is None else rate.period,
                "control_channel": control_channel(self.schema),
            },
        )
        self._limited.forget(params.queue)

    def queue_limits_changed(self, queue: str | None) -> None:
        self._limited.forget(queue)

    def queue_limits_notified(self, live: bool) -> None:
        self._limited.follow_notifications(live)

    async def queue_limit_list(self) -> list[QueueLimit]:
        return [
            QueueLimit(
                queue=row[QueueLimitRow.queue],
                global_limit=row[QueueLimitRow.global_limit],
                rate=(
                    None
                    if (allowed := row[QueueLimitRow.rate_allowed]) is None
                    else Rate(allowed, row[QueueLimitRow.rate_period])
                ),
                running=row[QueueLimitRow.running],
                recent_starts=row[QueueLimitRow.recent_starts],
                rate_limited_until=row[QueueLimitRow.rate_limited_until],
            )
            for row in await self._retrying("queue_limit_list")
        ]

    # --- workers and status ---------------------------------------------------------------

    async def worker_register(self, params: WorkerRegistration) -> None:
        await self._retrying(
            "worker_register",
            {
                "worker_id": params.worker_id,
                "hostname": params.hostname,
                "pid": params.pid,
                "queues": list(params.queues),
                "concurrency": params.concurrency,
                "queue_concurrency": list(params.queue_concurrency) or None,
                "task_versions": list(params.task_versions),
                "default_tasks": [row[0] for row in params.task_defaults],
                "default_versions": [row[1] for row in params.task_defaults],
                "default_max_attempts": [row[2] for row in params.task_defaults],
                "default_deadlines": [row[3] for row in params.task_defaults],
                "heartbeat_seconds": params.heartbeat_seconds,
            },
        )

    async def worker_unregister(self, worker_id: uuid.UUID) -> None:
        await self._retrying("worker_unregister", {"worker_id": worker_id})

    async def job_explain(self, job_id: int) -> ExplainFacts | None:
        rows = await self._retrying("job_explain", {"id": job_id})
        if not rows:
            return None
        row = rows[0]
        return ExplainFacts(
            row[Explained.now],
            row[Explained.job],
            row[Explained.key_holder],
            row[Explained.key_ahead],
            tuple(row[Explained.workers]),
            row[Explained.last_attempt],
            row[Explained.pause],
            row[Explained.concurrency],
            other_workers=tuple(row[Explained.other_workers]),
        )

    async def job_trace_context(self, job_id: int) -> str | None:
        rows = await self._retrying("job_trace_context", {"id": job_id})
        return rows[0][TraceContext.trace_context] if rows else None

    async def notify_send(self, channel: str, payload: str) -> None:
        await self._retrying("notify_send", {"channel": channel, "payload": payload})

    async def status_health(self) -> HealthReport:
        [row] = await self._retrying("status_health")
        return HealthReport(*row)

    async def queue_demand(self) -> list[QueueDemand]:
        rows = await self._retrying("queue_demand", pool=self._scan_pool)
        return [QueueDemand(*row) for row in rows]

    async def queue_status(self) -> list[QueueStatus]:
        return [QueueStatus(*row) for row in await self._retrying("queue_status")]

    async def worker_list(self) -> list[WorkerInfo]:
        rows = await self._retrying("worker_list")
        return [
            WorkerInfo(
                row[WorkerRow.id],
                row[WorkerRow.hostname],
                row[WorkerRow.pid],
                tuple(row[WorkerRow.queues]),
                row[WorkerRow.concurrency],
                row[WorkerRow.state],
                row[WorkerRow.started_at],
                row[WorkerRow.heartbeat_at],
                row[WorkerRow.running],
                tuple(row[WorkerRow.task_versions]),
                tuple(
                    QueueAdmission(q, int(lim), int(conc), reason, cause, float(age))
                    for q, lim, conc, reason, cause, age in row[WorkerRow.admission]
                ),
                tuple(row[WorkerRow.queue_concurrency] or ()),
                row[WorkerRow.heartbeat_seconds],
                row[WorkerRow.heartbeat_age],
            )
            for row in rows
        ]

    async def ready_channels(self, queues: Sequence[str]) -> list[str]:
        rows = await self._retrying("ready_channels", {"queues": list(queues)})
        return [row[ReadyChannel.channel] for row in rows]

    async def task_history_kinds(self) -> list[TaskHistoryKind]:
        return [TaskHistoryKind(*row) for row in await self._retrying("task_history_kinds")]

    async def job_unroutable(self, stale_seconds: float = 120.0) -> list[UnroutableJobs]:
        rows = await self._retrying("job_unroutable", {"stale_seconds": stale_seconds})
        return [
            UnroutableJobs(
                row[Unroutable.queue],
                row[Unroutable.task],
                row[Unroutable.version],
                row[Unroutable.jobs],
                tuple(sorted(row[Unroutable.states])),
            )
            for row in rows
        ]

    async def task_status(self) -> list[TaskStatus]:
        return [TaskStatus(*row) for row in await self._retrying("task_status")]

    # --- schedules ------------------------------------------------------------------------

    async def schedule_upsert_many(self, schedules: Sequence[NewSchedule]) -> list[str]:
        """Create or update schedules by name; returns the names that were created."""
        rows = await self._retrying(
            "schedule_upsert_many",
            {
                "names": [s.name for s in schedules],
                "tasks": [s.task for s in schedules],
                "queues": [s.queue for s in schedules],
                "payloads": [s.payload_json for s in schedules],
                "crons": [s.cron for s in schedules],
                "timezones": [s.timezone for s in schedules],
                "misfires": [s.misfire for s in schedules],
                "catchup_limits": [s.catchup_limit for s in schedules],
                "max_attempts": [s.max_attempts for s in schedules],
                "versions": [s.version for s in schedules],
                "origins": [s.origin for s in schedules],
                "channel": schedules_channel(self.schema),
            },
        )
        return [row[ScheduleUpserted.name] for row in rows if row[ScheduleUpserted.created]]

    async def schedule_delete(self, name: str) -> bool:
        rows = await self._retrying(
            "schedule_delete", {"name": name, "channel": schedules_channel(self.schema)}
        )
        return bool(rows)

    async def schedule_list(self) -> list[ScheduleRecord]:
        return [ScheduleRecord(*row) for row in await self._retrying("schedule_list")]

    async def schedule_next_due(self) -> ScheduleDue:
        [row] = await self._retrying("schedule_next_due")
        return ScheduleDue(
            now=row[ScheduleNextDue.now],
            any_schedule=row[ScheduleNextDue.any_schedule],
            next_fire_at=row[ScheduleNextDue.next_fire_at],
        )

    async def schedule_fire_due(self, params: ScheduleFireDue) -> ScheduleFireReport:
        """One tick in one transaction, done only by the holder of the scheduler lock.

        Not retried: the fence and the dedup keys make a repeated tick harmless, and the
        scheduler's next tick does it. Cancelling it rolls the whole tick back."""
        async with self._pool.connection() as conn, conn.transaction():
            with self._schema_required():
                [lead] = await self._counted(conn, "scheduler_lead", {"schema_name": self.schema})
                now = lead[SchedulerLead.now]
                if not lead[SchedulerLead.leader]:
                    return ScheduleFireReport(leader=False, now=now)
                rows = await self._counted(
                    conn, "schedule_due_lock", {"now": now, "limit": params.limit}
                )
                advances = params.plan([ScheduleRecord(*row) for row in rows], now)
                fired = await self._fire(conn, advances) if advances else []
        return ScheduleFireReport(leader=True, now=now, due=len(rows), fired=tuple(fired))

    async def _counted(
        self, conn: Connection, name: str, params: Params | None = None
    ) -> list[tuple[Any, ...]]:
        self._calls[name] += 1
        return await self._query(conn, name, params)

    async def _fire(
        self, conn: Connection, advances: Sequence[ScheduleAdvance]
    ) -> list[FiredOccurrence]:
        fires = [(a.name, fire) for a in advances for fire in a.fires]
        rows = await self._counted(
            conn,
            "schedule_fire_many",
            {
                "names": [a.name for a in advances],
                "expected": [a.expected_next_fire_at for a in advances],
                "next_fire_ats": [a.next_fire_at for a in advances],
                "last_fire_ats": [max(a.fires) if a.fires else None for a in advances],
                "fired": [len(a.fires) for a in advances],
                "missed": [a.missed for a in advances],
                "fire_names": [name for name, _ in fires],
                "fire_ats": [fire for _, fire in fires],
                "fire_keys": [fire_dedup_key(name, fire) for name, fire in fires],
            },
        )
        return [
            FiredOccurrence(
                schedule=row[ScheduleFired.name],
                fire_at=row[ScheduleFired.fire_at],
                job_id=row[ScheduleFired.id],
            )
            for row in rows
        ]

    # --- messages and workflow values (migration 0016) ----------------------------------

    async def message_send(self, params: MessageSend) -> SendOutcome:
        """Not retried on a lost connection: a send is not idempotent (a retry after a lost
        reply would queue the message twice), so the caller sees the error."""
        values = {"id": params.job_id, "topic": params.topic, "payload": params.payload_json}
        try:
            rows = await self._fetch("message_send", values)
        except (psycopg.errors.RaiseException, psycopg.errors.NoDataFound):
            # The job became final (or was deleted) between the statement's unlocked read and
            # the function's lock: read again, which now names its state.
            rows = await self._fetch("message_send", values)
        return SendOutcome(rows[0][MessageSent.state], rows[0][MessageSent.message_id])

    async def job_receive(self, params: Receive) -> ReceiveOutcome:
        """Retried: a repeated receive of a recorded position returns what it recorded, and
        one whose lost reply had suspended the job finds the lease gone ("lost")."""
        rows = await self._retrying(
            "job_receive",
            {
                **_lease_params(params.lease),
                "position": params.position,
                "topic": params.topic,
                "timeout_seconds": params.timeout_seconds,
                "deadline": params.deadline,
                "limit": params.limit,
                "value_keys": [key for key, _ in params.values],
                "value_values": [value for _, value in params.values],
            },
        )
        row = rows[0]
        messages = row[Received.messages] or ()
        # The messages arrive as one JSON array: one message too deep to decode makes the
        # whole array undecodable, which the receive raises as that job's PayloadError.
        received = (messages,) if type(messages) is Undecodable else tuple(messages)
        return ReceiveOutcome(row[Received.state], received, row[Received.deadline])

    async def job_value_set_many(self, params: ValueSet) -> bool:
        """Retried: writing the same values again changes nothing."""
        rows = await self._retrying(
            "job_value_set_many",
            {
                **_lease_params(params.lease),
                "keys": [key for key, _ in params.values],
                "values": [value for _, value in params.values],
            },
        )
        return bool(rows[0][ValuesSet.owned])

    async def job_value_get(self, job_id: int, key: str) -> ValueRead:
        rows = await self._retrying("job_value_get", {"id": job_id, "key": key})
        return ValueRead(*rows[0])

    async def job_values(self, job_id: int) -> list[WorkflowValue]:
        rows = await self._retrying("job_values", {"id": job_id})
        return [WorkflowValue(*row) for row in rows]

    async def workflow_list(self, params: WorkflowFilter) -> list[WorkflowRecord]:
        rows = await self._retrying(
            "workflow_list",
            {
                "states": None if params.states is None else list(params.states),
                "tasks": None if params.tasks is None else list(params.tasks),
                "before_id": params.before_id,
                "limit": params.limit,
            },
        )
        return [WorkflowRecord(*row) for row in rows]

    # --- transactions and notifications ---------------------------------------------------

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

    # --- continue-as-new and cancellation policies ---------------------------------------------

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        """Retried: if a lost reply had continued the job, the retry finds the lease gone
        ("lost"), which ends the execution as the continuation would."""
        rows = await self._retrying(
            "job_continue_as_new",
            {**_lease_params(params.lease), "payload": params.payload_json},
        )
        return str(rows[0][ContinuedAsNew.outcome])

    async def job_cancel_with(self, params: CancelJob) -> CancelOutcome | None:
        rows = await self._fetch(
            "job_cancel_with",
            {"id": params.id, "tree": params.tree, "control_channel": control_channel(self.schema)},
        )
        return _cancel_outcome(rows)

    async def job_descendants(self, job_id: int) -> list[Descendant]:
        return _job_states(await self._fetch("job_descendants", {"id": job_id}))


def _job_states(rows: Sequence[Sequence[Any]]) -> list[Descendant]:
    return [Descendant(row[JobStateRow.id], row[JobStateRow.state]) for row in rows]


def _cancel_outcome(rows: Sequence[Sequence[Any]]) -> CancelOutcome | None:
    """What job_cancel, job_cancel_with or job_retry did (None: no such job)."""
    if not rows:
        return None
    return CancelOutcome(
        previous_state=rows[0][Cancelled.previous_state], state=rows[0][Cancelled.state]
    )


def _emitted(rows: Sequence[Sequence[Any]]) -> EmitOutcome:
    return EmitOutcome(
        first=rows[0][EventEmitted.emitted_first], woken=rows[0][EventEmitted.woken_count]
    )


def _value_arrays(writes: Sequence[CheckpointWrite]) -> Params:
    """The values carried by a batch of checkpoint writes, as three parallel arrays."""
    carried = [(write.lease.id, key, value) for write in writes for key, value in write.values]
    return {  # array literals, as checkpoint_params' (cast to bigint[], text[], text[])
        "value_ids": "{" + ",".join([str(job_id) for job_id, _, _ in carried]) + "}",
        "value_keys": "{" + ",".join([_quoted(key) for _, key, _ in carried]) + "}",
        "value_values": "{" + ",".join([_quoted(value) for _, _, value in carried]) + "}",
    }


def _probes(
    queues: Sequence[str], work_due: Sequence[bool], next_due: Sequence[datetime.datetime | None]
) -> tuple[QueueProbe, ...]:
    return tuple(QueueProbe(*row) for row in zip(queues, work_due, next_due, strict=True))


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
