"""The columns of each statement's reply, by name.

A reply row is a tuple (no dict per row: the claim decodes 25 rows a round); the driver reads
it by position, and the positions come from here: each `Reply` subclass lists one statement's
final SELECT (or RETURNING) columns in order, and each becomes the position of its column
once, when this module is imported. `row[Claim.next_due]` then costs what `row[6]` did, and
means the same column in every reply that has one.

tests/test_replies.py describes each statement on PostgreSQL and fails when its columns and
its class here differ (a column added, removed, renamed or moved), and when a record built
from a whole row (`RECORDS`) no longer has the statement's columns as its fields.
"""

from __future__ import annotations

from typing import ClassVar


class Reply:
    """One statement's reply columns: each `name: ClassVar[int]` annotation of a subclass, in
    order, is set to its column's position (from `start`). `then` is a class whose columns
    follow these (its `start` must be where they end): the claimed job's columns after a
    round's own."""

    statements: ClassVar[tuple[str, ...]] = ()
    columns: ClassVar[tuple[str, ...]] = ()
    then: ClassVar[type[Reply] | None] = None

    def __init_subclass__(
        cls,
        *,
        statements: tuple[str, ...] = (),
        start: int = 0,
        then: type[Reply] | None = None,
    ) -> None:
        super().__init_subclass__()
        names = tuple(cls.__annotations__)  # its own (Python >= 3.10), in order
        for position, name in enumerate(names, start):
            setattr(cls, name, position)
        if then is not None and then.first_position() != start + len(names):
            raise TypeError(
                f"{cls.__name__}: {then.__name__} starts at column {then.first_position()}, "
                f"after {start + len(names)} columns"
            )
        cls.statements = statements
        cls.columns = names
        cls.then = then

    @classmethod
    def first_position(cls) -> int:
        return int(getattr(cls, cls.columns[0]))

    @classmethod
    def all_columns(cls) -> tuple[str, ...]:
        """The statement's whole column list: these, then `then`'s."""
        return cls.columns + (() if cls.then is None else cls.then.all_columns())


# --- the claim loop's claim and the completer's settle ------------------------------------------


class ClaimedRow(Reply, start=6):
    """A claimed job's columns (the `claim_returning` fragment), after the 6 columns of either
    claim's reply; NULL on the one row of a claim that claimed nothing."""

    id: ClassVar[int]
    queue: ClassVar[int]
    task: ClassVar[int]
    payload: ClassVar[int]
    attempt: ClassVar[int]
    max_attempts: ClassVar[int]
    lease_token: ClassVar[int]
    partition_key: ClassVar[int]
    priority: ClassVar[int]
    run_at: ClassVar[int]
    created_at: ClassVar[int]
    cancel_requested: ClassVar[int]
    version: ClassVar[int]
    history: ClassVar[int]
    parent_id: ClassVar[int]
    concurrency_key: ClassVar[int]


class Claimed(Reply, statements=("job_claim",), then=ClaimedRow):
    """job_claim (job_claim_rated adds key_rate_limited_until after the claimed row's columns).
    The statement's columns are the same on every row; `now` is read as each row is produced
    (the last row's is the latest)."""

    key_cursor: ClassVar[int]
    keys_visited: ClassVar[int]
    promoted: ClassVar[int]
    now: ClassVar[int]
    next_due: ClassVar[int]
    concurrency_cursor: ClassVar[int]


class PlainClaimed(Reply, statements=("job_claim_plain",), then=ClaimedRow):
    """job_claim_plain: Claimed's columns, with `blocked` and `keyed_ready` where Claimed has
    `key_cursor` and `keys_visited` (the same positions of `now` and `next_due` let one decode
    read both)."""

    blocked: ClassVar[int]
    keyed_ready: ClassVar[int]
    promoted: ClassVar[int]
    now: ClassVar[int]
    next_due: ClassVar[int]
    concurrency_cursor: ClassVar[int]


class Settled(Reply, statements=("job_settle_many",)):
    ids: ClassVar[int]
    states: ClassVar[int]
    now: ClassVar[int]
    next_due: ClassVar[int]
    notified: ClassVar[int]


class CompletePlain(Reply, statements=("job_complete_plain", "job_complete_discard")):
    ids: ClassVar[int]
    states: ClassVar[int]
    notified: ClassVar[int]
    now: ClassVar[int]


# --- leases and checkpoints -------------------------------------------------------------------


class LeaseRenewal(Reply, statements=("lease_renew_many",)):
    """One row per lease still held (`id` NULL on the one row when none is); `registered` is
    the same on every row. The columns from `id` on are a RenewedLease."""

    registered: ClassVar[int]
    id: ClassVar[int]
    cancel_requested: ClassVar[int]
    confirmed: ClassVar[int]


class CheckpointWritten(
    Reply, statements=("checkpoint_insert_many", "checkpoint_insert_many_plain")
):
    id: ClassVar[int]
    position: ClassVar[int]
    value: ClassVar[int]


# --- events, children, messages, values -------------------------------------------------------


class EventEmitted(Reply, statements=("event_emit",)):
    emitted_first: ClassVar[int]
    woken_count: ClassVar[int]


class EventWait(Reply, statements=("job_wait_event",)):
    state: ClassVar[int]
    payload: ClassVar[int]
    deadline: ClassVar[int]
    owned: ClassVar[int]


class Spawned(Reply, statements=("job_spawn_many",)):
    """One row per spawn, in order; the columns from `child_id` on are a SpawnOutcome."""

    ord: ClassVar[int]
    child_id: ClassVar[int]
    created: ClassVar[int]
    cancelling: ClassVar[int]


class ChildrenWait(Reply, statements=("job_wait_children",)):
    """One row per child (`id` NULL on the one row when the wait suspends or was lost);
    `outcome` is the same on every row. The columns from `id` on are a ChildOutcome."""

    outcome: ClassVar[int]
    id: ClassVar[int]
    state: ClassVar[int]
    result: ClassVar[int]
    error: ClassVar[int]


class ChildrenCancelled(Reply, statements=("job_cancel_children",)):
    owned: ClassVar[int]


class MessageSent(Reply, statements=("message_send",)):
    state: ClassVar[int]
    message_id: ClassVar[int]


class Received(Reply, statements=("job_receive",)):
    state: ClassVar[int]
    messages: ClassVar[int]
    deadline: ClassVar[int]


class ValuesSet(Reply, statements=("job_value_set_many",)):
    owned: ClassVar[int]
    notified: ClassVar[int]


class ContinuedAsNew(Reply, statements=("job_continue_as_new",)):
    outcome: ClassVar[int]


# --- jobs, queues, workers --------------------------------------------------------------------


class Cancelled(Reply, statements=("job_cancel", "job_cancel_with", "job_retry")):
    previous_state: ClassVar[int]
    state: ClassVar[int]


class Explained(Reply, statements=("job_explain",)):
    """`trioq explain`'s facts (each a jsonb document but `now`)."""

    now: ClassVar[int]
    job: ClassVar[int]
    key_holder: ClassVar[int]
    key_ahead: ClassVar[int]
    workers: ClassVar[int]
    last_attempt: ClassVar[int]
    pause: ClassVar[int]
    concurrency: ClassVar[int]
    other_workers: ClassVar[int]


class TraceContext(Reply, statements=("job_trace_context",)):
    trace_context: ClassVar[int]


class JobStateRow(Reply, statements=("job_states", "job_descendants")):
    id: ClassVar[int]
    state: ClassVar[int]


class ServerPid(Reply, statements=("server_pid",)):
    pid: ClassVar[int]


class MigrationApplied(Reply, statements=("migration_applied",)):
    version: ClassVar[int]


class MigrationSessionTimeouts(Reply, statements=("migration_session_timeouts_save",)):
    statement_timeout: ClassVar[int]
    lock_timeout: ClassVar[int]
    idle_timeout: ClassVar[int]
    own: ClassVar[int]


class FunctionDigestKept(Reply, statements=("migration_function_digest_kept",)):
    kept: ClassVar[int]


class FunctionDigest(Reply, statements=("migration_function_digest",)):
    digest: ClassVar[int]


class ReadyChannel(Reply, statements=("ready_channels",)):
    channel: ClassVar[int]


class Unroutable(Reply, statements=("job_unroutable",)):
    queue: ClassVar[int]
    task: ClassVar[int]
    version: ClassVar[int]
    jobs: ClassVar[int]
    states: ClassVar[int]


class WorkerRow(Reply, statements=("worker_list",)):
    id: ClassVar[int]
    hostname: ClassVar[int]
    pid: ClassVar[int]
    queues: ClassVar[int]
    concurrency: ClassVar[int]
    state: ClassVar[int]
    started_at: ClassVar[int]
    heartbeat_at: ClassVar[int]
    running: ClassVar[int]
    task_versions: ClassVar[int]
    admission: ClassVar[int]
    queue_concurrency: ClassVar[int]
    heartbeat_seconds: ClassVar[int]
    heartbeat_age: ClassVar[int]


class QueueLimited(Reply, statements=("queue_limited",)):
    limited: ClassVar[int]


class QueueLimitGate(Reply, statements=("queue_limit_gate",)):
    allowed: ClassVar[int]
    running: ClassVar[int]
    global_limit: ClassVar[int]
    rate_allowed: ClassVar[int]
    rate_period: ClassVar[int]
    next_start_at: ClassVar[int]
    started_at: ClassVar[int]


class QueueLimitSpent(Reply, statements=("queue_limit_spend",)):
    next_start_at: ClassVar[int]


class QueueLimitRow(Reply, statements=("queue_limit_list",)):
    queue: ClassVar[int]
    global_limit: ClassVar[int]
    rate_allowed: ClassVar[int]
    rate_period: ClassVar[int]
    running: ClassVar[int]
    recent_starts: ClassVar[int]
    rate_limited_until: ClassVar[int]


# --- leadership and schedules -----------------------------------------------------------------


class LeaderElected(Reply, statements=("leader_elect",)):
    leader: ClassVar[int]
    registered: ClassVar[int]
    now: ClassVar[int]
    queues: ClassVar[int]
    work_due: ClassVar[int]
    next_due: ClassVar[int]


class Maintenance(Reply, statements=("maintenance_pass",)):
    leader: ClassVar[int]
    recovered: ClassVar[int]
    pruned_workers: ClassVar[int]
    side_effects: ClassVar[int]  # read so that its CTEs run; the driver ignores it
    registered: ClassVar[int]
    now: ClassVar[int]
    queues: ClassVar[int]
    work_due: ClassVar[int]
    next_due: ClassVar[int]
    any_schedule: ClassVar[int]
    next_fire_at: ClassVar[int]
    deadlines_passed: ClassVar[int]
    ready_pending: ClassVar[int]


class EpochsRotated(Reply, statements=("job_epochs_rotate",)):
    pruned: ClassVar[int]
    next_due: ClassVar[int]


class ReadySwept(Reply, statements=("ready_sweep",)):
    truncated: ClassVar[int]
    pending: ClassVar[int]


class LeaderResigned(Reply, statements=("leader_resign",)):
    resigned: ClassVar[int]


class ScheduleUpserted(Reply, statements=("schedule_upsert_many",)):
    name: ClassVar[int]
    created: ClassVar[int]


class ScheduleNextDue(Reply, statements=("schedule_next_due",)):
    now: ClassVar[int]
    any_schedule: ClassVar[int]
    next_fire_at: ClassVar[int]


class SchedulerLead(Reply, statements=("scheduler_lead",)):
    leader: ClassVar[int]
    now: ClassVar[int]


class ScheduleFired(Reply, statements=("schedule_fire_many",)):
    name: ClassVar[int]
    fire_at: ClassVar[int]
    id: ClassVar[int]


# --- inserts (the driver's and the producers') ------------------------------------------------


class Inserted(Reply, statements=("job_insert_many",)):
    """One row per job, in the batch's order; `created` is false for a dedup key's existing
    job."""

    ord: ClassVar[int]
    id: ClassVar[int]
    created: ClassVar[int]


class InsertedBatch(Reply, statements=("job_insert_batch",)):
    ids: ClassVar[int]
    sent: ClassVar[int]


class InsertedOne(Reply, statements=("job_insert_one",)):
    id: ClassVar[int]
    notified: ClassVar[int]


class TaskServed(Reply, statements=("task_served",)):
    served: ClassVar[int]
