"""The driver seam: one async method per named statement, each taking one attrs params object.

`trioq._pg.driver.PgDriver` implements it on PostgreSQL, `trioq._memory.MemoryDriver` in
memory; the conformance suite in `trioq.testing` runs the same checks against both, and a test
fails when their method sets differ from `DRIVER_METHODS`.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from .._core import outcomes
from .._core.explain import ExplainFacts
from .._core.limits import Rate
from .records import EmitEvent as EmitEvent
from .records import EmitOutcome as EmitOutcome
from .records import EventOutcome as EventOutcome
from .records import InsertedJob as InsertedJob
from .records import JobRecord as JobRecord
from .records import MessageSend as MessageSend
from .records import NewJob as NewJob
from .records import NewJobs as NewJobs
from .records import ValueRead as ValueRead
from .records import WorkflowValue as WorkflowValue

# --- params ---------------------------------------------------------------------------------

DEFAULT_KEY_WINDOW = 200
DEFAULT_PROMOTE_LIMIT = 1000


@attrs.frozen(cache_hash=True)
class Lease:
    """The fencing triple every write after a claim carries. Its hash is cached: the settle
    buffer and the renewer key dicts and sets by lease, several times per job."""

    id: int
    attempt: int
    lease_token: uuid.UUID


# What a settlement may record; trioq/_core/outcomes.py holds what each kind does to its row.
SETTLE_KINDS = outcomes.SETTLE_KINDS


@attrs.frozen
class Settlement:
    """The recorded outcome of one execution, fenced by its lease.

    `kind` is one of `SETTLE_KINDS`: complete (`result_json`), retry (`error_json`, after
    `delay_seconds`), fail / cancel (`error_json`), release (drain: attempt restored), sleep
    (until `wake_at`, attempt restored, key kept), wait (until `wake_at` or, when None, until
    woken; attempt restored, key kept). `wake_at` is database time.
    """

    lease: Lease
    kind: str
    result_json: str | None = None
    error_json: str | None = None
    delay_seconds: float | None = None
    wake_at: datetime.datetime | None = None
    # The execution's job has no partition key and no parent (`ClaimedJob.plain`): its
    # completion releases no key and wakes no parent, so a driver may write it with a leaner
    # statement. False (the default) is always safe.
    plain: bool = False
    # False: a completion that deletes the job instead of keeping it (its task's `keep=False`;
    # never for a job with a parent, whose parent reads the outcome). Only for kind complete.
    keep: bool = True

    def __attrs_post_init__(self) -> None:
        if self.kind == "complete" and self.result_json is not None:
            return  # nearly every settlement: valid, and the rest of the checks cannot fail
        if not self.keep and self.kind != "complete":
            raise ValueError(f"a {self.kind} settlement is always kept (keep=False completes)")
        if self.kind not in SETTLE_KINDS:
            raise ValueError(f"settlement kind {self.kind!r} is not one of {sorted(SETTLE_KINDS)}")
        if self.kind == "complete" and self.result_json is None:
            raise ValueError("a complete settlement needs result_json")
        if self.kind in ("retry", "fail", "cancel") and self.error_json is None:
            raise ValueError(f"a {self.kind} settlement needs error_json")
        if self.kind == "retry" and self.delay_seconds is None:
            raise ValueError("a retry settlement needs delay_seconds")
        if self.kind == "sleep" and self.wake_at is None:
            raise ValueError("a sleep settlement needs wake_at")


@attrs.frozen
class Claim:
    """The claim loop's claim of up to `limit` ready jobs of `queue` (outcomes are not part of
    it: the completer writes them with `job_settle_many`)."""

    queue: str
    tasks: tuple[str, ...]
    limit: int
    lease_seconds: float
    worker_id: uuid.UUID
    key_cursor: str = ""  # partition keys: continue the round-robin after this key
    key_window: int = DEFAULT_KEY_WINDOW  # each kind of key: visit at most this many per claim
    concurrency_cursor: str = ""  # concurrency keys: continue the round-robin after this key
    # 'task@version' pairs this worker serves; None: any version of `tasks` (older callers).
    task_versions: tuple[str, ...] | None = None
    promote_limit: int = DEFAULT_PROMOTE_LIMIT  # due rows made ready per statement
    # Unkeyed sleeping or scheduled rows due within this many seconds are claimed early: the
    # executor holds them until their run_at, so they start on time instead of a statement and
    # a batch start-up late (0: only rows already due).
    lookahead_seconds: float = 0.0
    # The claiming worker traces its executions: their spans' trace ids are the lease tokens
    # (_seam/tracing.py), so a lost attempt's row can carry one (jobs.traced, migration 0022).
    traced: bool = False
    # The caller's choice, from the queue's last claim (`ClaimResult.plain_next`): try the
    # lean claim of unkeyed ready rows first. A driver claims exactly what the full claim would
    # either way (PgDriver falls back to it when keyed or due work shows up).
    plain: bool = False


@attrs.frozen
class CheckpointWrite:
    """One checkpoint to record for a running job (fenced by its lease).

    The stored value is `value_json`; with `wake_in_seconds`, it is that JSON object (or `{}`)
    with "wake_at" = database now + wake_in_seconds merged in (durable sleeps).
    """

    lease: Lease
    position: int
    kind: str
    name: str
    value_json: str | None
    wake_in_seconds: float | None = None
    # ctx.set_value: (key, value JSON) pairs set since the job's last checkpoint, written in
    # the same statement (the last of a key wins).
    values: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class QueueAdmission:
    """One queue whose effective limit admission control has reduced (the worker row's
    admission snapshot, migration 0008): `reason` is the current reason code (`recovering`
    while it grows back), `cause` the overload signal that cut it, `reduced_for_seconds` how
    long the limit has been below the configured concurrency (stored as the database's time)."""

    queue: str
    limit: int
    concurrency: int
    reason: str
    cause: str
    reduced_for_seconds: float


@attrs.frozen
class RenewLeases:
    worker_id: uuid.UUID
    worker_state: str
    lease_seconds: float
    leases: tuple[Lease, ...]
    # The heartbeat writes this snapshot on the worker row (empty: every queue at full).
    admission: tuple[QueueAdmission, ...] = ()


@attrs.frozen
class MaintenancePass:
    recover_limit: int = 1000
    prune_limit: int = 1000
    retention_seconds: float = 7 * 24 * 3600.0
    worker_stale_seconds: float = 300.0
    # The elected leader sending the pass (it extends its seat first and sweeps only if it still
    # holds it); None: an operator's or a test's one-off pass, swept without the election.
    leader_id: uuid.UUID | None = None
    scheduler: bool = True  # the leader runs the scheduler
    ttl_seconds: float = 30.0  # the seat's time to live from this pass
    queues: tuple[str, ...] = ()  # the leader's queues, probed (see QueueProbe)
    deadline_limit: int = 1000  # jobs past their deadline cancelled per pass


@attrs.frozen
class LeaderElect:
    """A follower's periodic statement: try to take the leader seat, heartbeat, probe."""

    worker_id: uuid.UUID
    ttl_seconds: float
    scheduler: bool = True  # this worker runs the scheduler when it leads
    queues: tuple[str, ...] = ()


@attrs.frozen
class LeaderResign:
    worker_id: uuid.UUID


@attrs.frozen
class WorkerRegistration:
    worker_id: uuid.UUID
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    task_versions: tuple[str, ...] = ()  # 'task@version' pairs served
    # (task, version, max_attempts, deadline seconds or None) of each served pair, sorted: the
    # declarations that rows without a max_attempts of their own take (task_defaults, migration
    # 0015), and the deadline inserts give jobs without one of their own (migration 0029)
    task_defaults: tuple[tuple[str, int, int, float | None], ...] = ()
    # The slots of each queue in `queues`, in order (migration 0018); `concurrency` is their sum.
    queue_concurrency: tuple[int, ...] = ()
    heartbeat_seconds: float | None = None  # the longest gap between its heartbeats (0019)


@attrs.frozen
class JobFilter:
    """Which jobs `job_list` returns (None: any), newest first, keyset-paged by `before_id`."""

    states: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    partition_key: str | None = None
    older_than_seconds: float | None = None  # created more than this long ago
    before_id: int | None = None  # the page after the one that ended with this id
    limit: int = 50


@attrs.frozen
class NewSchedule:
    """A schedule to create or update by name; `payload_json` is validated and encoded."""

    name: str
    task: str
    queue: str
    payload_json: str
    cron: str
    timezone: str = "UTC"
    misfire: str = "latest"
    catchup_limit: int = 100
    max_attempts: int = 5
    version: int = 1
    origin: str = "runtime"  # "code": declared with @app.periodic; "runtime": client.schedule


@attrs.frozen
class ScheduleAdvance:
    """The plan for one due schedule: enqueue `fires`, then wait for `next_fire_at`.

    Applied only if the schedule's next_fire_at is still `expected_next_fire_at` (the fence)."""

    name: str
    expected_next_fire_at: datetime.datetime | None
    next_fire_at: datetime.datetime
    fires: tuple[datetime.datetime, ...] = ()
    missed: int = 0


@attrs.frozen
class ScheduleFireDue:
    """One scheduler tick: `plan` (pure, no I/O) turns the due schedules and database time into
    advances, inside the leader's transaction; at most `limit` schedules per tick."""

    plan: Callable[[Sequence[ScheduleRecord], datetime.datetime], Sequence[ScheduleAdvance]]
    limit: int = 100


@attrs.frozen
class JobPurge:
    """Which finished jobs `job_purge` deletes: at most `limit` per call, oldest first."""

    states: tuple[str, ...]
    older_than_seconds: float
    tasks: tuple[str, ...] | None = None
    queues: tuple[str, ...] | None = None
    limit: int = 1000


@attrs.frozen
class WaitEvent:
    """A running job waits for `key` until `deadline` (a replay passes the stored one) or, on
    the first wait, `timeout_seconds` from database time."""

    lease: Lease
    position: int
    key: str
    timeout_seconds: float
    deadline: datetime.datetime | None = None


@attrs.frozen
class Spawn:
    """A running job enqueues `child` exactly once for its checkpoint `position`."""

    lease: Lease
    position: int
    child: NewJob
    # What cancelling the parent does to the child: cancel it, abandon it (it runs on, the
    # parent does not wait), or wait for it (it runs on, the parent is final after it).
    on_parent_cancel: str = "cancel"


@attrs.frozen
class WaitChildren:
    """A running job waits until its `child_ids` are final (or, with `stop_on_failure`, one
    failed); with `record`, their outcomes become checkpoint `position` (`kind`, `name`)."""

    lease: Lease
    position: int
    child_ids: tuple[int, ...]
    stop_on_failure: bool = False
    record: bool = True
    kind: str = "children"
    name: str = ""


@attrs.frozen
class CancelChildren:
    """gather's fail-fast: record checkpoint `position`, then cancel `child_ids` (and their
    children) that are not final."""

    lease: Lease
    position: int
    kind: str
    name: str
    value_json: str
    child_ids: tuple[int, ...]


@attrs.frozen
class ContinueAsNew:
    """A running workflow ends its history and starts again, same job id, with `payload_json`."""

    lease: Lease
    payload_json: str


@attrs.frozen
class CancelJob:
    """Cancel `id` and its descendants; `tree`: every descendant, whatever its spawn's
    `on_parent_cancel` policy."""

    id: int
    tree: bool = False


@attrs.frozen
class Receive:
    """A running job takes up to `limit` messages of `topic` as checkpoint `position`, or
    waits for them until `deadline` (a replay passes the stored one) or, on the first wait,
    `timeout_seconds` from database time. `values` as in `CheckpointWrite`."""

    lease: Lease
    position: int
    topic: str
    timeout_seconds: float
    deadline: datetime.datetime | None = None
    limit: int = 1000
    values: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class ValueSet:
    """Write a running job's values (key, value JSON) now, fenced by its lease."""

    lease: Lease
    values: tuple[tuple[str, str], ...]


@attrs.frozen
class WorkflowFilter:
    states: tuple[str, ...] | None = None  # of running, sleeping, waiting (None: all three)
    tasks: tuple[str, ...] | None = None
    before_id: int | None = None
    limit: int = 50


# --- records --------------------------------------------------------------------------------


@attrs.frozen
class Checkpoint:
    """One entry of a job's history (`value` is the decoded JSON)."""

    position: int
    kind: str
    name: str
    value: Any


@attrs.frozen
class ClaimedJob:
    id: int
    queue: str
    task: str
    payload: Any
    attempt: int
    max_attempts: int | None  # None: the task's declaration decides (Run.max_attempts)
    lease_token: uuid.UUID
    partition_key: str | None
    priority: int
    run_at: datetime.datetime
    created_at: datetime.datetime
    cancel_requested: bool
    version: int = 1
    history: tuple[Checkpoint, ...] = ()  # loaded by the claim when the job has any
    parent_id: int | None = None  # the workflow that spawned this job as a child
    concurrency_key: str | None = None  # its slot is released when it stops running
    # Built with the job (every claimed job's outcome carries it): a cached_property on this
    # slotted class cost more on first use than building it here.
    lease: Lease = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "lease", Lease(self.id, self.attempt, self.lease_token))

    @property
    def plain(self) -> bool:
        """No partition key and no parent: settling it touches only its own row."""
        return self.partition_key is None and self.parent_id is None


@attrs.frozen
class ClaimResult:
    claimed: tuple[ClaimedJob, ...]
    now: datetime.datetime  # database time as the statement ended
    next_due: datetime.datetime | None = None  # the queue's next scheduled/sleeping/waiting run_at
    promoted: int = 0  # due rows this statement made ready (claimable from the next one)
    key_cursor: str | None = None  # the last partition key visited (None: no keyed work)
    # Keys the claim looked at, the larger of the two kinds (== key_window: a window was full).
    keys_visited: int = 0
    concurrency_cursor: str | None = None  # the last concurrency key visited
    # trio's clock when the reply arrived, before its rows were decoded (None: not measured;
    # the caller takes its own clock). The pair (now, replied_at) maps database time to trio's.
    replied_at: float | None = None
    # The queue's rate limit allows no start before this (database time; None: no rate limit
    # holds the claim back). The claim loop sleeps until then instead of asking again.
    rate_limited_until: datetime.datetime | None = None
    # The queue's global limit held this claim back (it claimed fewer than it asked for).
    at_global_limit: bool = False
    # A concurrency key's rate held some of its ready jobs back: its next start is allowed from
    # then (database time; the earliest among such keys). Other keys and slots are unaffected:
    # the claim loop's timer follows it, as it follows next_due.
    key_rate_limited_until: datetime.datetime | None = None
    # This claim saw no keyed or due work: the next may be a plain one (`Claim.plain`).
    plain_next: bool = False


@attrs.frozen
class SettleResult:
    settled: tuple[tuple[int, str], ...]  # (job id, new state) of each settlement that held
    now: datetime.datetime  # database time as the statement ended
    # The earliest new run_at of the rows suspended or scheduled by these outcomes (the claim
    # loop's timer takes it: a claim sent before this commit could not see them).
    next_due: datetime.datetime | None = None
    replied_at: float | None = None  # trio's clock when the reply arrived (None: not measured)

    @property
    def settled_ids(self) -> tuple[int, ...]:
        return tuple(job_id for job_id, _ in self.settled)


@attrs.frozen
class WrittenCheckpoint:
    """A checkpoint write that held its fence; `value` is what is stored at that position."""

    job_id: int
    position: int
    value: Any


@attrs.frozen
class EventWaitOutcome:
    state: str  # "received", "timeout", "waiting" (suspended), "lost" (lease lost)
    payload: Any
    deadline: datetime.datetime


@attrs.frozen
class SpawnOutcome:
    child_id: int | None  # None: refused (the parent's lease is lost, or it is cancelling)
    created: bool
    cancelling: bool = False  # refused because the parent's cancel was requested


@attrs.frozen
class ChildOutcome:
    id: int
    state: str | None  # None: no such job
    result: Any
    error: Any


@attrs.frozen
class ChildrenWaitOutcome:
    # "done", "failed" (stop_on_failure), "waiting" (suspended), "changed" (a child finished
    # while deciding: ask again), "unknown" (an id is not a child of this job), "lost"
    state: str
    children: tuple[ChildOutcome, ...] = ()


@attrs.frozen
class RenewedLease:
    id: int
    cancel_requested: bool
    # False: still this worker's, but its row was locked by another transaction, so the lease
    # was not extended this time (neither renewed nor lost: the watchdog decides).
    confirmed: bool = True


@attrs.frozen
class RenewalResult:
    leases: tuple[RenewedLease, ...]  # leases not listed are lost
    registered: bool  # False: the worker row was gone (pruned); register again


@attrs.frozen
class QueueProbe:
    """What a claim poll of `queue` would have found at the statement's `now`, without claiming:
    `work_due` (a ready row, or a promotable due one) and the first future due time."""

    queue: str
    work_due: bool
    next_due: datetime.datetime | None


@attrs.frozen
class MaintenanceReport:
    leader: bool
    recovered: tuple[tuple[int, str], ...] = ()  # (job id, new state)
    pruned_jobs: int = 0
    pruned_workers: int = 0
    registered: bool = True  # False: the leader's worker row was gone (pruned); register again
    now: datetime.datetime | None = None  # database time of the pass
    probes: tuple[QueueProbe, ...] = ()  # one per queue of MaintenancePass.queues
    schedules: ScheduleDue | None = None  # the scheduler's idle read, done by the pass
    deadlines_passed: int = 0  # jobs cancelled because their deadline passed


@attrs.frozen
class LeadershipReport:
    leader: bool  # this worker holds the seat after the statement
    registered: bool  # False: the worker row was gone (pruned); register again
    now: datetime.datetime
    probes: tuple[QueueProbe, ...] = ()


@attrs.frozen
class CancelOutcome:
    previous_state: str
    state: str


@attrs.frozen
class Descendant:
    id: int
    state: str


@attrs.frozen
class AttemptRecord:
    attempt: int
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    worker_id: uuid.UUID | None
    started_at: datetime.datetime | None
    finished_at: datetime.datetime
    trace_id: str | None = None  # the execution's trace id (the otel extra, when configured)


@attrs.frozen
class QueueStatus:
    queue: str
    ready: int
    scheduled: int
    running: int
    expired_leases: int
    completed: int
    failed: int
    cancelled: int
    oldest_ready_seconds: float | None
    sleeping: int = 0
    waiting: int = 0


@attrs.frozen
class TaskStatus:
    """How many jobs of one (queue, task, version) are in one state."""

    queue: str
    task: str
    version: int
    state: str
    jobs: int
    retried: int  # of those, jobs that needed more than one attempt


@attrs.frozen
class TaskHistoryKind:
    """How many jobs of `task` recorded at least one checkpoint of `kind`."""

    task: str
    kind: str
    jobs: int


@attrs.frozen
class UnroutableJobs:
    """Jobs waiting to run (not running, not final) that no live worker serves: none of the
    workers that heartbeat recently serves this (queue, task, version)."""

    queue: str
    task: str
    version: int
    jobs: int
    states: tuple[str, ...]


@attrs.frozen
class QueueDemand:
    """One queue's demand (`queue_demand()`): the replica-scaling signal."""

    queue: str
    ready: int
    oldest_ready_seconds: float | None
    running: int
    scheduled: int
    sleeping: int
    waiting: int
    due_now: int  # ready, plus future work whose time has come but is not promoted yet


@attrs.frozen
class HealthReport:
    """`trioq status`'s incident health list (counts) and database pressure figures. The
    database figures are None on a driver without a server (the in-memory one)."""

    ready_backlog: int
    expired_ownership: int  # running rows whose lease has expired, not recovered yet
    sleeping_due: int  # sleeping work whose wake-up time has passed, not promoted yet
    stale_running: int  # running rows whose worker has no live heartbeat
    active_waits: int
    due_wait_timeouts: int
    waiting_locks: int | None = None  # pg_locks not granted
    deadlocks: int | None = None  # pg_stat_database, since the statistics reset
    backends: Mapping[str, int] = attrs.field(factory=dict)  # this database's, by state
    lock_waits: int | None = None  # backends waiting on a lock
    cache_hit_ratio: float | None = None
    jobs_table_bytes: int | None = None
    jobs_index_bytes: int | None = None
    dead_tuples: int | None = None
    live_tuples: int | None = None
    last_autovacuum: datetime.datetime | None = None


@attrs.frozen
class WorkerInfo:
    id: uuid.UUID
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    state: str
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    running: int
    task_versions: tuple[str, ...] = ()
    # The queues whose effective limit this worker's admission control reduced, as its last
    # heartbeat wrote them (migration 0008); `reduced_for_seconds` as of this read.
    admission: tuple[QueueAdmission, ...] = ()
    # The slots of each queue in `queues`, in order (migration 0018; empty for older rows).
    queue_concurrency: tuple[int, ...] = ()
    # The longest gap it promised between heartbeats (None: registered by an older version),
    # and the age of its last heartbeat as of this read (database time).
    heartbeat_seconds: float | None = None
    heartbeat_age_seconds: float | None = None

    def slots(self, queue: str) -> int:
        """This worker's slots for `queue` (its total for a row from before per-queue slots)."""
        if self.queue_concurrency and queue in self.queues:
            return self.queue_concurrency[self.queues.index(queue)]
        return self.concurrency


@attrs.frozen
class ScheduleRecord:
    name: str
    task: str
    queue: str
    payload: Any
    cron: str
    timezone: str
    misfire: str
    catchup_limit: int
    max_attempts: int
    version: int
    origin: str
    anchor_at: datetime.datetime
    next_fire_at: datetime.datetime | None
    last_fire_at: datetime.datetime | None
    fired: int
    missed: int
    created_at: datetime.datetime
    updated_at: datetime.datetime


@attrs.frozen
class ScheduleDue:
    """Database time and the schedule due first (None: no schedules, or one not yet timed)."""

    now: datetime.datetime
    any_schedule: bool
    next_fire_at: datetime.datetime | None

    @property
    def due(self) -> bool:
        return self.any_schedule and (self.next_fire_at is None or self.next_fire_at <= self.now)


@attrs.frozen
class FiredOccurrence:
    schedule: str
    fire_at: datetime.datetime
    job_id: int


@attrs.frozen
class ScheduleFireReport:
    leader: bool  # False: another process held the scheduler lock; nothing was done
    now: datetime.datetime
    due: int = 0  # due schedules locked by this tick (== limit: more may be due)
    fired: tuple[FiredOccurrence, ...] = ()


@attrs.frozen
class QueueLimitSet:
    """`trioq queue limit` / `trioq queue rate`: change one or both of a queue's cluster-wide
    limits (`set_limit`/`set_rate` say which; a None value removes that limit). A queue left
    with neither has no row, and its claim pays nothing for limits."""

    queue: str
    set_limit: bool = False
    global_limit: int | None = None
    set_rate: bool = False
    rate: Rate | None = None


@attrs.frozen
class QueueLimit:
    """A queue's cluster-wide limits and where it stands against them now."""

    queue: str
    global_limit: int | None
    rate: Rate | None
    running: int  # the queue's running jobs, across workers
    recent_starts: int  # starts within the rate's current window (0 without a rate)
    rate_limited_until: datetime.datetime | None  # no start before this (None: one may start)


@attrs.frozen
class QueuePause:
    queue: str
    paused_at: datetime.datetime


@attrs.frozen
class ConcurrencyLimit:
    """A limit set for a concurrency key or a `prefix*` pattern (concurrency_limits)."""

    pattern: str
    max_running: int
    updated_at: datetime.datetime


@attrs.frozen
class ConcurrencyRate:
    """A rate set for a concurrency key or a `prefix*` pattern (concurrency_rates)."""

    pattern: str
    rate: Rate
    updated_at: datetime.datetime


@attrs.frozen
class KeyRateStatus:
    """A rated key with starts in its window now, and when the next is allowed (None: now)."""

    key: str
    rate: Rate
    recent_starts: int
    rate_limited_until: datetime.datetime | None


@attrs.frozen
class ConcurrencyKeyStatus:
    """A concurrency key with running jobs: how many, and the limit that applies to it."""

    key: str
    running: int
    limit: int

    @property
    def saturated(self) -> bool:
        return self.running >= self.limit


@attrs.frozen
class DriverStatistics:
    """Statement counts by name since the driver opened (tests and the benchmark read these)."""

    calls: Mapping[str, int]


NotifyCallback = Callable[[str, str], None]


@attrs.frozen
class SendOutcome:
    state: str | None  # the job's state as seen (None: no such job)
    message_id: int | None  # None: not sent (unknown or final job)


@attrs.frozen
class ReceiveOutcome:
    state: str  # "received", "timeout" (nothing came), "waiting" (suspended), "lost"
    messages: tuple[Any, ...]
    deadline: datetime.datetime


@attrs.frozen
class WorkflowRecord:
    """One unfinished workflow and what it waits on (`trioq workflows`)."""

    id: int
    task: str
    queue: str
    state: str  # running, sleeping or waiting
    run_at: datetime.datetime | None  # sleeping: the wake time; waiting: the deadline
    checkpoints: int
    wait_event_key: str | None
    wait_topic: str | None
    waits_for_children: bool
    children_settled: int
    children_total: int | None
    created_at: datetime.datetime


# --- the protocol ---------------------------------------------------------------------------


class Listener(Protocol):
    @property
    def connected(self) -> bool: ...

    async def listen(self, channel: str) -> None: ...

    async def unlisten(self, channel: str) -> None: ...


class Transaction(Protocol):
    """A caller's transaction: their own SQL and trioq's enqueue commit or roll back together."""

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> None: ...

    async def fetch(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]: ...

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]: ...

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """Settle running jobs (fenced) inside this transaction, with the completer's settle
        statement: the settlement commits with the caller's writes or not at all (a handler's
        transactional completion). `settled`: (id, new state) of the rows whose fence held."""
        ...

    async def event_emit(self, params: EmitEvent) -> EmitOutcome: ...


class Driver(Protocol):
    schema: str

    def statistics(self) -> DriverStatistics: ...

    async def migrate(self) -> list[int]: ...

    async def job_insert_many(self, jobs: Sequence[NewJob]) -> list[InsertedJob]: ...

    def is_connection_lost(self, exc: BaseException) -> bool:
        """True when `exc` means the database connection was lost (retry later), not a bug."""
        ...

    async def job_claim(self, params: Claim) -> ClaimResult:
        """The claim loop's claim: promote the queue's due work and claim up to `limit` ready
        jobs (fewer when a queue limit, a key or its limit holds them back). Not retried here:
        a claim whose reply was lost may have committed (its rows then wait for lease recovery)."""
        ...

    async def job_settle_many(self, settlements: Sequence[Settlement]) -> SettleResult:
        """The completer's flush: record finished executions' outcomes, fenced, in one statement
        (their keys released, history written, waiters and parents woken, ready rows'
        queues notified). Not retried here: the completer keeps the batch and writes it again
        (fenced: a batch that committed is not applied twice)."""
        ...

    async def checkpoint_insert_many(
        self, writes: Sequence[CheckpointWrite]
    ) -> list[WrittenCheckpoint]: ...

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult: ...

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport: ...

    async def leader_elect(self, params: LeaderElect) -> LeadershipReport: ...

    async def leader_resign(self, params: LeaderResign) -> bool: ...

    async def job_cancel(self, job_id: int) -> CancelOutcome | None: ...

    async def job_get(self, job_id: int) -> JobRecord | None: ...

    async def job_result_watch(self, job_id: int) -> None:
        """Register interest in the job's final state before reading it: its result channel is
        notified when it ends only if somebody registered (queries.sql, job_result_watch)."""
        ...

    async def event_emit(self, params: EmitEvent) -> EmitOutcome: ...

    async def job_wait_event(self, params: WaitEvent) -> EventWaitOutcome: ...

    async def job_spawn_many(self, spawns: Sequence[Spawn]) -> list[SpawnOutcome]: ...

    async def job_wait_children(self, params: WaitChildren) -> ChildrenWaitOutcome: ...

    async def job_cancel_children(self, params: CancelChildren) -> bool: ...

    async def job_attempts(self, job_id: int) -> list[AttemptRecord]: ...

    async def job_list(self, params: JobFilter) -> list[JobRecord]: ...

    async def checkpoint_list(self, job_id: int) -> list[Checkpoint]: ...

    async def job_retry(self, job_id: int) -> CancelOutcome | None: ...

    async def job_purge(self, params: JobPurge) -> int: ...

    async def queue_pause(self, queue: str) -> bool: ...

    async def queue_resume(self, queue: str) -> bool: ...

    async def queue_pause_list(self) -> list[QueuePause]: ...

    async def concurrency_limit_set(self, pattern: str, max_running: int | None) -> bool: ...

    async def concurrency_limit_list(self) -> list[ConcurrencyLimit]: ...

    async def concurrency_key_status(
        self, keys: Sequence[str] | None = None
    ) -> list[ConcurrencyKeyStatus]: ...

    async def concurrency_rate_set(self, pattern: str, rate: Rate | None) -> bool: ...

    async def concurrency_rate_list(self) -> list[ConcurrencyRate]: ...

    async def concurrency_rate_status(self) -> list[KeyRateStatus]: ...

    async def queue_limit_set(self, params: QueueLimitSet) -> None: ...

    def queue_limits_changed(self, queue: str | None) -> None:
        """A 'limits:QUEUE' control notification arrived (None: the listener reconnected and
        may have missed some): the driver reads the queue's limits again at its next claim."""

    def queue_limits_notified(self, live: bool) -> None:
        """Whether this process's listener receives notifications (its self-probe arrived):
        then limit changes arrive as notifications instead of being polled for."""

    async def queue_limit_list(self) -> list[QueueLimit]: ...

    async def worker_register(self, params: WorkerRegistration) -> None: ...

    async def worker_unregister(self, worker_id: uuid.UUID) -> None: ...

    async def queue_status(self) -> list[QueueStatus]: ...

    async def worker_list(self) -> list[WorkerInfo]: ...

    async def queue_demand(self) -> list[QueueDemand]: ...

    async def job_explain(self, job_id: int) -> ExplainFacts | None: ...

    async def status_health(self) -> HealthReport: ...

    async def notify_send(self, channel: str, payload: str) -> None: ...

    async def job_trace_context(self, job_id: int) -> str | None: ...

    async def ready_channels(self, queues: Sequence[str]) -> list[str]: ...

    async def task_status(self) -> list[TaskStatus]: ...

    async def task_history_kinds(self) -> list[TaskHistoryKind]: ...

    async def job_unroutable(self, stale_seconds: float = 120.0) -> list[UnroutableJobs]: ...

    async def schedule_upsert_many(self, schedules: Sequence[NewSchedule]) -> list[str]: ...

    async def schedule_delete(self, name: str) -> bool: ...

    async def schedule_list(self) -> list[ScheduleRecord]: ...

    async def schedule_next_due(self) -> ScheduleDue: ...

    async def schedule_fire_due(self, params: ScheduleFireDue) -> ScheduleFireReport: ...

    async def message_send(self, params: MessageSend) -> SendOutcome: ...

    async def job_receive(self, params: Receive) -> ReceiveOutcome: ...

    async def job_value_set_many(self, params: ValueSet) -> bool: ...

    async def job_value_get(self, job_id: int, key: str) -> ValueRead: ...

    async def job_values(self, job_id: int) -> list[WorkflowValue]: ...

    async def workflow_list(self, params: WorkflowFilter) -> list[WorkflowRecord]: ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...

    def open_listener(
        self, on_notify: NotifyCallback, on_reconnect: Callable[[], None]
    ) -> AbstractAsyncContextManager[Listener]: ...

    # --- continue-as-new and cancellation policies (docs/workflows.md) ------------------------

    async def job_continue_as_new(self, params: ContinueAsNew) -> str:
        """ "continued" (history gone, the job ready again with the new payload), "cancelling"
        (its cancel was requested: nothing changed) or "lost" (the lease no longer holds)."""
        ...

    async def job_cancel_with(self, params: CancelJob) -> CancelOutcome | None: ...

    async def job_descendants(self, job_id: int) -> list[Descendant]:
        """Every descendant of the job (children, their children, ...) with its state, by id:
        `trioq cancel --tree` reads them before and after to say what it cancelled."""
        ...


DRIVER_METHODS = frozenset(
    name for name in vars(Driver) if not name.startswith("_") and name != "schema"
)

__all__ = ["DRIVER_METHODS", "AsyncIterator", "Driver"]
