"""What each outcome does to its job's row: ONE rule per settlement kind, applied by every
driver. The SQL settle statements apply the values decided here "if fenced" (id, attempt,
lease_token, running); the in-memory driver applies the same values to its rows.

The only fact a rule cannot decide in Python is whether a time-based outcome is already due
(a zero-delay retry, a sleep whose wake time has passed): that needs the database's clock, so
the rule says `ready_when_due` and the driver compares the new `run_at` with its own now.
"""

from __future__ import annotations

import datetime

import attrs

from .states import TERMINAL_STATES, JobState

SETTLE_KINDS = frozenset({"complete", "retry", "fail", "cancel", "release", "sleep", "wait"})


@attrs.frozen
class OutcomeRule:
    """What one settlement kind does to a row that still holds the settling lease."""

    state: JobState  # the row's new state (READY instead when `ready_when_due` and due)
    ready_when_due: bool  # the new run_at has passed already: READY instead of `state`
    moves_run_at: bool  # run_at becomes the settlement's (now + delay, or wake_at)
    attempt_change: int  # 0, or -1: this execution consumed no attempt
    releases_key: bool  # the partition key's lock row is deleted
    history: str | None  # the attempts row's outcome, or None: no entry
    stores_result: bool
    stores_error: bool
    clears_worker: bool  # worker_id and started_at go back to NULL (never really started)

    @property
    def final(self) -> bool:
        """Terminal: finished_at is set, the result is announced, a waiting parent may wake."""
        return self.state in TERMINAL_STATES


def _rule(state: JobState, **changes: object) -> OutcomeRule:
    base: dict[str, object] = {
        "state": state,
        "ready_when_due": False,
        "moves_run_at": False,
        "attempt_change": 0,
        "releases_key": True,
        "history": None,
        "stores_result": False,
        "stores_error": False,
        "clears_worker": False,
    }
    base.update(changes)
    return OutcomeRule(**base)  # type: ignore[arg-type]


RULES: dict[str, OutcomeRule] = {
    "complete": _rule(JobState.COMPLETED, stores_result=True),
    "fail": _rule(JobState.FAILED, history="failed", stores_error=True),
    "cancel": _rule(JobState.CANCELLED, history="cancelled", stores_error=True),
    # Backoff: scheduled at now + delay, ready at once when the delay is 0; the key is freed,
    # so another job of the key may run before the retry.
    "retry": _rule(
        JobState.SCHEDULED,
        ready_when_due=True,
        moves_run_at=True,
        history="retried",
        stores_error=True,
    ),
    # A drain hands the job back: ready again, as if never claimed.
    "release": _rule(JobState.READY, attempt_change=-1, clears_worker=True),
    # Suspensions keep their partition key (one workflow of a key at a time, start to finish).
    "sleep": _rule(
        JobState.SLEEPING,
        ready_when_due=True,
        moves_run_at=True,
        attempt_change=-1,
        releases_key=False,
    ),
    "wait": _rule(
        JobState.WAITING,
        ready_when_due=True,
        moves_run_at=True,
        attempt_change=-1,
        releases_key=False,
    ),
}
assert set(RULES) == SETTLE_KINDS


def rule_of(kind: str) -> OutcomeRule:
    rule = RULES.get(kind)
    if rule is None:
        raise ValueError(f"settlement kind {kind!r} is not one of {sorted(SETTLE_KINDS)}")
    return rule


def settled_state(
    rule: OutcomeRule, run_at: datetime.datetime | None, now: datetime.datetime
) -> JobState:
    """The state a settled row ends in, `run_at` being its new run_at (None: no deadline)."""
    if rule.ready_when_due and run_at is not None and run_at <= now:
        return JobState.READY
    return rule.state


def frees_key(kind: str) -> bool:
    """Whether an outcome of `kind` releases its job's partition key when written."""
    return rule_of(kind).releases_key
