"""The job state machine as data: states and the transitions each statement may make."""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    SCHEDULED = "scheduled"  # not due yet (delayed enqueue, retry backoff); holds no key
    READY = "ready"  # due and claimable: the only state in the claim indexes
    RUNNING = "running"  # claimed: attempt, lease_token and lease_expires_at are set
    SLEEPING = "sleeping"  # durable sleep until run_at; holds its partition key
    WAITING = "waiting"  # suspended on an event or children (run_at: deadline or NULL); holds key
    COMPLETED = "completed"
    FAILED = "failed"  # attempts used up, or a permanent error
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
SUSPENDED_STATES = frozenset({JobState.SLEEPING, JobState.WAITING})
# States whose job holds its partition key (one such job per key at any instant).
KEY_HOLDING_STATES = frozenset({JobState.RUNNING, JobState.SLEEPING, JobState.WAITING})

S = JobState
SETTLE = "job_settle_and_claim"
PLAIN = "job_settle_and_claim_plain"  # the common-case round: unkeyed claims, plain completions
# (from, to) -> the statement(s) allowed to make that transition.
TRANSITIONS: dict[tuple[JobState, JobState], tuple[str, ...]] = {
    (S.SCHEDULED, S.READY): (SETTLE,),  # promotion when due
    (S.SCHEDULED, S.CANCELLED): ("job_cancel", "job_cancel_children"),
    (S.SCHEDULED, S.WAITING): ("job_cancel",),  # a parent waits for its running children
    (S.READY, S.RUNNING): (SETTLE, PLAIN),  # claim
    # Due unkeyed rows are claimed by the statement that promotes them (due_unkeyed), and
    # sleeping or scheduled ones within the claim's lookahead a little early.
    (S.SCHEDULED, S.RUNNING): (SETTLE,),
    (S.SLEEPING, S.RUNNING): (SETTLE,),
    (S.WAITING, S.RUNNING): (SETTLE,),
    (S.READY, S.CANCELLED): ("job_cancel", "job_cancel_children"),
    (S.READY, S.WAITING): ("job_cancel",),  # a parent waits for its running children
    (S.RUNNING, S.COMPLETED): (SETTLE, PLAIN),
    (S.RUNNING, S.SCHEDULED): (SETTLE,),  # retry with backoff
    (S.RUNNING, S.READY): (
        SETTLE,  # drain release (attempt restored), zero-delay retry, suspension already due
        "maintenance_pass",  # the holder died
    ),
    (S.RUNNING, S.SLEEPING): (SETTLE,),
    (S.RUNNING, S.WAITING): (SETTLE, "job_wait_event", "job_wait_children"),
    (S.RUNNING, S.FAILED): (SETTLE, "maintenance_pass"),
    (S.RUNNING, S.CANCELLED): (SETTLE,),  # handler cancelled on request
    (S.SLEEPING, S.READY): (SETTLE,),  # promotion at the wake time
    (S.SLEEPING, S.CANCELLED): ("job_cancel", "job_cancel_children"),
    (S.SLEEPING, S.WAITING): ("job_cancel",),  # a parent waits for its running children
    (S.WAITING, S.READY): (
        SETTLE,  # deadline promotion, and a child's final outcome waking its parent
        "event_emit",  # the event it waits for
        "maintenance_pass",  # a child failed by lease recovery
        "job_cancel",  # a child cancelled (parents_notify)
        "job_cancel_children",
    ),
    (S.WAITING, S.CANCELLED): ("job_cancel", "job_cancel_children"),
    (S.FAILED, S.READY): ("job_retry",),  # redrive
    (S.CANCELLED, S.READY): ("job_retry",),
}


def is_allowed(source: JobState, target: JobState) -> bool:
    """True when the state machine has an edge from `source` to `target`."""
    return (source, target) in TRANSITIONS
