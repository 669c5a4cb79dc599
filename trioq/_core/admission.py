"""Admission control maths (AIMD): pure, no I/O, no clock reads (`now` is a parameter).

A worker under sustained overload claims less: each queue's *effective* limit is cut
multiplicatively (x0.5) while an overload signal persists, and grows back additively (+1 per
step) once every signal is healthy. It never exceeds the configured concurrency, never goes
below `min_limit`, and never affects what is already running (the claim loop only claims less).

Signals (sampled by `trioq._runtime.services.admission`):
- scheduler lag: how late a probe task woke (the trio thread is blocked or starved);
- lease-renewal age against the lease: renewals falling behind put every lease at risk;
- database errors within a recent window (the service keeps it);
- the slowest claim statement since the last sample.
"""

from __future__ import annotations

import math

import attrs

# Reason codes (logged, and exported as the `trioq_admission_reason` metric label).
OK = "ok"
RECOVERING = "recovering"
SCHEDULER_LAG = "scheduler_lag"
LEASE_RENEWAL_LATE = "lease_renewal_late"
DB_ERRORS = "db_errors"
CLAIM_LATENCY = "claim_latency"
REASONS = (OK, RECOVERING, SCHEDULER_LAG, LEASE_RENEWAL_LATE, DB_ERRORS, CLAIM_LATENCY)


@attrs.frozen
class AdmissionSignals:
    scheduler_lag: float = 0.0  # seconds the probe woke late (the worst within the lag window)
    renewal_age: float = 0.0  # seconds since lease renewals last succeeded (0: nothing to renew)
    lease_seconds: float = 30.0
    db_errors: int = 0  # driver errors within the service's error window
    claim_latency: float | None = None  # the slowest claim statement since the last sample


@attrs.frozen
class AdmissionPolicy:
    max_scheduler_lag: float = 0.1
    max_renewal_fraction: float = 0.5  # of the lease: renewals run every lease/3
    max_db_errors: int = 0  # any error in a sample is a bad sample
    max_claim_latency: float = 2.0
    # Overload must persist this long before the first cut: longer than the service's signal
    # windows (1 s of lag, 5 s of errors), so one stall or one error never cuts.
    sustain_seconds: float = 2.0
    decrease_factor: float = 0.5
    decrease_every: float = 2.0  # at most one cut per this, so a cut can take effect
    # +1 slot per this, once every signal has been healthy for this long without a break (a
    # healthy sample in the middle of an overload neither grows the limit nor ends the streak).
    increase_every: float = 1.0
    increase_step: int = 1
    min_limit: int = 1

    def __attrs_post_init__(self) -> None:
        if not 0 < self.decrease_factor < 1:
            raise ValueError("decrease_factor: must be between 0 and 1")
        if self.increase_step < 1 or self.min_limit < 0:
            raise ValueError("increase_step: must be >= 1; min_limit: must be >= 0")


@attrs.frozen
class AdmissionState:
    limit: int
    reason: str = OK
    overloaded_since: float | None = None  # start of the current overload streak
    last_change_at: float = -math.inf
    healthy_since: float | None = None  # start of the current run of healthy samples


def initial_state(concurrency: int) -> AdmissionState:
    return AdmissionState(limit=concurrency)


def overload_reason(signals: AdmissionSignals, policy: AdmissionPolicy) -> str | None:
    """The first overload signal that is over its threshold, most fundamental first."""
    if signals.scheduler_lag > policy.max_scheduler_lag:
        return SCHEDULER_LAG
    if signals.renewal_age > policy.max_renewal_fraction * signals.lease_seconds:
        return LEASE_RENEWAL_LATE
    if signals.db_errors > policy.max_db_errors:
        return DB_ERRORS
    if signals.claim_latency is not None and signals.claim_latency > policy.max_claim_latency:
        return CLAIM_LATENCY
    return None


def admission_step(
    state: AdmissionState,
    signals: AdmissionSignals,
    concurrency: int,
    policy: AdmissionPolicy,
    now: float,
) -> AdmissionState:
    """The next state of one queue's effective limit (a new object only when it changes)."""
    floor = min(policy.min_limit, concurrency)
    limit = min(max(state.limit, floor), concurrency)
    reason = overload_reason(signals, policy)
    if reason is not None:
        since = state.overloaded_since if state.overloaded_since is not None else now
        sustained = now - since >= policy.sustain_seconds
        cut = max(floor, math.floor(limit * policy.decrease_factor))
        if sustained and cut < limit and now - state.last_change_at >= policy.decrease_every:
            return AdmissionState(cut, reason, since, now)
        if limit == floor and sustained and state.reason != reason:
            return AdmissionState(limit, reason, since, state.last_change_at)
        return attrs.evolve(state, limit=limit, overloaded_since=since, healthy_since=None)
    healthy_since = state.healthy_since if state.healthy_since is not None else now
    healthy_for = now - healthy_since
    # A streak ends only after a full increase period of health: short gaps do not reset it.
    streak = state.overloaded_since if healthy_for < policy.increase_every else None
    if limit < concurrency:
        if healthy_for >= policy.increase_every and (
            now - state.last_change_at >= policy.increase_every
        ):
            grown = min(concurrency, limit + policy.increase_step)
            reason_now = OK if grown == concurrency else RECOVERING
            return AdmissionState(grown, reason_now, None, now, healthy_since)
        return attrs.evolve(
            state, limit=limit, overloaded_since=streak, healthy_since=healthy_since
        )
    if state.reason != OK or state.limit != limit or state.overloaded_since != streak:
        return AdmissionState(limit, OK, streak, state.last_change_at, healthy_since)
    if state.healthy_since is None:
        return attrs.evolve(state, healthy_since=healthy_since)
    return state


__all__ = [
    "REASONS",
    "AdmissionPolicy",
    "AdmissionSignals",
    "AdmissionState",
    "admission_step",
    "initial_state",
    "overload_reason",
]
