"""What one execution of a job ended with: typed, frozen outcomes (the executor's return value).

The claim loop turns each outcome into at most one `Settlement` (the row the settle statement
writes); `Lost` writes nothing, since another attempt owns the job now (or will, once the
unconfirmed lease expires and maintenance recovers it, consuming the attempt).
"""

from __future__ import annotations

import datetime

import attrs

from ..._core.states import JobState
from ..._seam.driver import Settlement
from ..._seam.lease import Lease


@attrs.frozen
class Completed:
    result_json: str


@attrs.frozen
class RetryAt:
    """Failed, attempts left: run again after `delay_seconds` (scheduled, key released)."""

    error_json: str
    delay_seconds: float


@attrs.frozen
class Failed:
    """Failed for good (attempts used up, or an error retrying cannot fix)."""

    error_json: str


@attrs.frozen
class Cancelled:
    error_json: str


@attrs.frozen
class Released:
    """Handed back unfinished (drain): ready again, no attempt consumed."""


@attrs.frozen
class Suspended:
    """The execution ended on a durable primitive: the job sleeps (until `until`) or waits (until
    woken, or until `until` when it has a deadline), holding its partition key, no attempt
    consumed. `until` is database time."""

    state: str  # "sleeping", "waiting", or "continued" (ctx.continue_as_new: ready again)
    until: datetime.datetime | None
    # True when the primitive's own statement already suspended the job (event and child
    # waits decide and suspend under one lock): the settle statement writes nothing for it.
    written: bool = False

    def __attrs_post_init__(self) -> None:
        if self.state not in (JobState.SLEEPING, JobState.WAITING, "continued"):
            raise ValueError(f"suspended state {self.state!r} is not sleeping/waiting")
        if self.state == JobState.SLEEPING and self.until is None:
            raise ValueError("a sleep needs its wake time")


@attrs.frozen
class CompletedInTransaction:
    """The handler completed its job inside its own transaction (`ctx.transaction()` and
    `tx.complete(...)`), which committed: the job is settled already, nothing is written."""


@attrs.frozen
class Lost:
    """The lease was lost (recovered elsewhere, or not confirmed in time): write nothing."""

    reason: str = "lease lost"


Outcome = (
    Completed | RetryAt | Failed | Cancelled | Released | Suspended | CompletedInTransaction | Lost
)


def settlement_of(
    lease: Lease, outcome: Outcome, *, plain: bool = False, keep: bool = True
) -> Settlement | None:
    """The settle-statement row for `outcome` (None for `Lost`); `plain`: the job has no
    partition key and no parent (`ClaimedJob.plain`); `keep=False`: a completion deletes the
    job (its task keeps nothing, and it has no parent)."""
    if type(outcome) is Completed:  # nearly every outcome: no pattern match, no keywords
        return Settlement(lease, "complete", outcome.result_json, None, None, None, plain, keep)
    match outcome:
        case Completed(result_json):
            return Settlement(lease, "complete", result_json=result_json, plain=plain, keep=keep)
        case RetryAt(error_json, delay):
            return Settlement(lease, "retry", error_json=error_json, delay_seconds=delay)
        case Failed(error_json):
            return Settlement(lease, "fail", error_json=error_json)
        case Cancelled(error_json):
            return Settlement(lease, "cancel", error_json=error_json)
        case Released():
            return Settlement(lease, "release")
        case Suspended(state, until, written):
            if written:
                return None
            return Settlement(
                lease, "sleep" if state == JobState.SLEEPING else "wait", wake_at=until
            )
        case Lost() | CompletedInTransaction():
            return None
    raise AssertionError(f"unknown outcome {outcome!r}")


_NAMES: dict[type, str] = {
    Completed: "completed",
    CompletedInTransaction: "completed",
    RetryAt: "retried",
    Failed: "failed",
    Cancelled: "cancelled",
    Released: "released",
    Lost: "lost",
}


def outcome_name(outcome: Outcome) -> str:
    """The name hooks and logs use: completed, retried, failed, cancelled, released,
    sleeping, waiting, lost."""
    if type(outcome) is Suspended:
        return outcome.state
    name = _NAMES.get(type(outcome))
    if name is None:
        raise AssertionError(f"unknown outcome {outcome!r}")
    return name
