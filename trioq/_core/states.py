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
# The same, and the others, in JobState's order (for messages, choices and tables).
TERMINAL_IN_ORDER = tuple(state for state in JobState if state in TERMINAL_STATES)
UNFINISHED_IN_ORDER = tuple(state for state in JobState if state not in TERMINAL_STATES)
SUSPENDED_STATES = frozenset({JobState.SLEEPING, JobState.WAITING})
# States whose job holds its partition key (one such job per key at any instant).
KEY_HOLDING_STATES = frozenset({JobState.RUNNING, JobState.SLEEPING, JobState.WAITING})

S = JobState
CLAIM = "job_claim"  # the claim loop's: promotes due rows, claims ready (and due) ones
CLAIM_PLAIN = "job_claim_plain"  # the common-case claim: unkeyed ready rows only
SETTLE = "job_settle_many"  # the completer's: every outcome's rule
COMPLETE_PLAIN = "job_complete_plain"  # the common-case flush: completions of plain jobs
DISCARD = "job_complete_discard"  # completions of tasks that keep nothing: the row is deleted
# (from, to) -> the statement(s) allowed to make that transition.
# The cancel statements: each runs job_cancel_tree (migration 0017), which makes a scheduled or
# ready job cancelled, a sleeping or waiting one ready (flagged: its worker runs the handler
# cancelled, so its cleanup steps run, then records it cancelled), a parent with a running
# child waiting (flagged), and wakes the waiting parent of a child it cancelled. The leader's
# maintenance pass runs it too, for jobs past their deadline (job_deadline_pass, migration 0021).
CANCEL = ("job_cancel", "job_cancel_with", "job_cancel_children", "maintenance_pass")
# (from, to) -> the statement(s) allowed to make that transition. CheckedDriver
# (trioq/testing/transitions.py) checks every row change of the conformance suite and the
# differential machines against this table; docs/state-machine.md's diagram is rendered from it.
TRANSITIONS: dict[tuple[JobState, JobState], tuple[str, ...]] = {
    (S.SCHEDULED, S.READY): (CLAIM,),  # promotion when due
    (S.SCHEDULED, S.CANCELLED): CANCEL,
    (S.SCHEDULED, S.WAITING): CANCEL,  # a parent waits for its running children
    (S.READY, S.RUNNING): (CLAIM, CLAIM_PLAIN),  # claim
    # Due unkeyed rows are claimed by the statement that promotes them (due_unkeyed), and
    # sleeping or scheduled ones within the claim's lookahead a little early.
    (S.SCHEDULED, S.RUNNING): (CLAIM,),
    (S.SLEEPING, S.RUNNING): (CLAIM,),
    (S.WAITING, S.RUNNING): (CLAIM,),
    (S.READY, S.CANCELLED): CANCEL,
    (S.READY, S.WAITING): CANCEL,  # a parent waits for its running children
    (S.RUNNING, S.COMPLETED): (SETTLE, COMPLETE_PLAIN),
    (S.RUNNING, S.SCHEDULED): (SETTLE,),  # retry with backoff
    (S.RUNNING, S.READY): (
        SETTLE,  # drain release (attempt restored), zero-delay retry, suspension already due
        "maintenance_pass",  # the holder died
        "job_continue_as_new",  # the same job starts over with a fresh history
    ),
    (S.RUNNING, S.SLEEPING): (SETTLE,),
    (S.RUNNING, S.WAITING): (SETTLE, "job_wait_event", "job_wait_children", "job_receive"),
    (S.RUNNING, S.FAILED): (SETTLE, "maintenance_pass"),
    (S.RUNNING, S.CANCELLED): (
        SETTLE,  # handler cancelled on request
        "maintenance_pass",  # the holder of a job whose cancel was requested died
    ),
    (S.SLEEPING, S.READY): (CLAIM, *CANCEL),  # promotion at the wake time; cancel's cleanup run
    (S.SLEEPING, S.WAITING): CANCEL,  # a parent waits for its running children
    (S.WAITING, S.READY): (
        CLAIM,  # deadline promotion
        SETTLE,  # a child's final outcome waking its parent
        "event_emit",  # the event it waits for
        "message_send",  # a message to a waiting receive
        "maintenance_pass",  # a child failed by lease recovery
        *CANCEL,  # its cleanup run, or a child cancelled (parents_notify)
    ),
    (S.FAILED, S.READY): ("job_retry",),  # redrive
    (S.CANCELLED, S.READY): ("job_retry",),
}

# The states a new row may start in -> the statements that insert rows in that state.
INSERTED: dict[JobState, tuple[str, ...]] = {
    S.READY: ("job_insert_many", "job_spawn_many", "schedule_fire_many"),  # due now
    S.SCHEDULED: ("job_insert_many", "job_spawn_many"),  # run_at later (an occurrence is due)
}
# The states a row may be deleted in -> the statements that delete: final rows, and a running
# one whose completion its task keeps nothing of (`keep=False`: deleted instead of completed).
DELETED_BY: dict[JobState, tuple[str, ...]] = {
    **{state: ("job_purge", "maintenance_pass") for state in sorted(TERMINAL_STATES)},
    S.RUNNING: (DISCARD,),
}


def is_allowed(source: JobState, target: JobState) -> bool:
    """True when the state machine has an edge from `source` to `target`."""
    return (source, target) in TRANSITIONS
