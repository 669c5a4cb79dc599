"""The job state machine as data: states and the transitions each statement may make."""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    READY = "ready"  # waiting for run_at (delayed, retrying) or ready to claim
    RUNNING = "running"  # claimed: attempt, lease_token and lease_expires_at are set
    COMPLETED = "completed"
    FAILED = "failed"  # attempts used up, or a permanent error
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

# (from, to) -> the statement(s) allowed to make that transition.
TRANSITIONS: dict[tuple[JobState, JobState], tuple[str, ...]] = {
    (JobState.READY, JobState.RUNNING): ("job_claim",),
    (JobState.READY, JobState.CANCELLED): ("job_cancel",),
    (JobState.RUNNING, JobState.COMPLETED): ("job_complete_many",),
    (JobState.RUNNING, JobState.READY): (
        "job_fail_many",  # retry with backoff
        "job_release_many",  # drain: no attempt consumed
        "lease_recover_expired",  # the holder died
    ),
    (JobState.RUNNING, JobState.FAILED): ("job_fail_many", "lease_recover_expired"),
    (JobState.RUNNING, JobState.CANCELLED): ("job_cancel", "job_fail_many"),
}


def is_allowed(source: JobState, target: JobState) -> bool:
    """True when the state machine has an edge from `source` to `target`."""
    return (source, target) in TRANSITIONS
