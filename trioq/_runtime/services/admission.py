"""Admission control service: samples the worker's overload signals and sets each claim
loop's effective limit through the pure AIMD maths in `trioq._core.admission`.

Modes: `on` (default) applies the limit; `observe` computes, logs and exports it but the claim
loops keep their full concurrency; `off` samples nothing. It never cancels a running handler:
the claim loops read `effective_limit(queue)` before each claim and only claim less.

The probe is the scheduler-lag signal: a task that sleeps one sample interval and measures how
late it woke. A blocked trio thread (CPU-bound handler code, a blocking call) or a starved
scheduler shows up as lateness, which is what also delays lease renewals.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Mapping

import attrs
import trio

from ..._core.admission import (
    OK,
    REASONS,
    RECOVERING,
    AdmissionPolicy,
    AdmissionSignals,
    AdmissionState,
    admission_step,
    initial_state,
)
from ..._seam.services import QueueAdmission
from .metrics import WorkerMetrics

log = logging.getLogger("trioq.worker")

MODES = ("off", "observe", "on")


def validate_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"admission: must be one of {', '.join(MODES)} (got {mode!r})")
    return mode


@attrs.define(eq=False)
class AdmissionControl:
    concurrency: Mapping[str, int]  # configured slots per queue
    mode: str = attrs.field(default="on", validator=lambda _s, _a, v: validate_mode(v))
    policy: AdmissionPolicy = attrs.field(factory=AdmissionPolicy)
    sample_interval: float = 0.25
    lease_seconds: float = 30.0
    renewal_age: Callable[[], float] = lambda: 0.0
    metrics: WorkerMetrics | None = None
    on_change: Callable[[str, AdmissionState], None] | None = None  # test hook
    on_publish: Callable[[tuple[QueueAdmission, ...]], None] | None = None  # test hook
    # Database errors count for this long: a failing claim loop backs off (up to 5 s between
    # attempts), so errors are sparse in time while the database is away.
    error_window: float = 5.0
    # The lag signal is the worst probe lateness within this window: one probe's lateness
    # depends on where its deadline fell inside a stall, the window's worst does not.
    lag_window: float = 1.0
    _states: dict[str, AdmissionState] = attrs.field(init=False)
    _lags: collections.deque[tuple[float, float]] = attrs.field(factory=collections.deque)
    _errors: collections.deque[float] = attrs.field(factory=collections.deque)
    _claim_latency: dict[str, float] = attrs.field(factory=dict)
    # The snapshot the worker's lease renewal writes on its row (for `trioq explain`): a change
    # asks for an early renewal, at most one per `publish_every` seconds, so an admission change
    # costs at most one extra statement and an idle worker at a steady limit sends none.
    publish_every: float = 1.0
    _reduced_since: dict[str, float] = attrs.field(factory=dict)  # trio time the cut began
    _causes: dict[str, str] = attrs.field(factory=dict)  # the overload reason that cut it
    _published: tuple[tuple[object, ...], ...] = ()  # the snapshot last written (its key)
    _unpublished: trio.Event = attrs.field(factory=trio.Event)
    _early_at: float = -float("inf")

    def __attrs_post_init__(self) -> None:
        self._states = {queue: initial_state(n) for queue, n in self.concurrency.items()}
        for queue, n in self.concurrency.items():
            self._export(queue, self._states[queue], changed=False)
            if self.metrics is not None:
                self.metrics.effective_limit.labels(queue).set(n)

    # --- what the claim loops and the health server read --------------------------------

    def effective_limit(self, queue: str) -> int:
        """The slots `queue` may fill now: the computed limit when `on`, else the concurrency."""
        if self.mode != "on":
            return self.concurrency[queue]
        return self._states[queue].limit

    def state(self, queue: str) -> AdmissionState:
        """The computed state (also in `observe` mode, where it is not applied)."""
        return self._states[queue]

    # --- the worker row's snapshot, written by the lease renewal ---------------------------

    def snapshot(self) -> tuple[QueueAdmission, ...]:
        """The queues whose applied limit is below their concurrency (none unless `on`)."""
        if self.mode != "on":
            return ()
        now = trio.current_time()
        return tuple(
            QueueAdmission(
                queue=queue,
                limit=state.limit,
                concurrency=self.concurrency[queue],
                reason=state.reason,
                cause=self._causes.get(queue, state.reason),
                reduced_for_seconds=max(0.0, now - self._reduced_since.get(queue, now)),
            )
            for queue, state in self._states.items()
            if state.limit < self.concurrency[queue]
        )

    def unpublished(self, snapshot: tuple[QueueAdmission, ...]) -> bool:
        """Whether `snapshot` differs from the one last written (ignoring its age)."""
        return _key(snapshot) != self._published

    def published(self, snapshot: tuple[QueueAdmission, ...]) -> None:
        """The lease renewal wrote `snapshot` (`()`: the row is new, it holds none)."""
        self._published = _key(snapshot)
        if self.on_publish is not None:
            self.on_publish(snapshot)
        if self.unpublished(self.snapshot()):
            self._unpublished.set()
        elif self._unpublished.is_set():
            self._unpublished = trio.Event()

    async def wait_renewal(self, interval: float) -> None:
        """Sleep `interval` (the renewal period), or less when the snapshot changed, but
        never earlier than `publish_every` after the previous early wake-up."""
        deadline = trio.current_time() + interval
        with trio.move_on_at(deadline):
            await self._unpublished.wait()
            await trio.sleep_until(self._early_at + self.publish_every)
            self._early_at = trio.current_time()

    # --- signal sinks (called synchronously by the instrumented driver) -----------------

    def record_error(self, statement: str, error: BaseException) -> None:
        self._errors.append(trio.current_time())

    def record_claim(self, queue: str, seconds: float) -> None:
        self._claim_latency[queue] = max(seconds, self._claim_latency.get(queue, 0.0))

    def record_lag(self, seconds: float) -> None:
        self._lags.append((trio.current_time(), seconds))

    # --- the sampler ---------------------------------------------------------------------

    async def run(self) -> None:
        """The probe and sampler, until cancelled (nothing to do when `off`)."""
        if self.mode == "off":
            await trio.sleep_forever()
        while True:
            expected = trio.current_time() + self.sample_interval
            await trio.sleep(self.sample_interval)
            now = trio.current_time()
            self.record_lag(now - expected)
            self.sample(now)

    def sample(self, now: float) -> None:
        """Fold the signals gathered since the last sample into each queue's state."""
        while self._errors and self._errors[0] < now - self.error_window:
            self._errors.popleft()
        while self._lags and self._lags[0][0] < now - self.lag_window:
            self._lags.popleft()
        lag = max((seconds for _, seconds in self._lags), default=0.0)
        errors, latencies = len(self._errors), self._claim_latency
        self._claim_latency = {}
        renewal_age = self.renewal_age()
        for queue, concurrency in self.concurrency.items():
            signals = AdmissionSignals(
                scheduler_lag=lag,
                renewal_age=renewal_age,
                lease_seconds=self.lease_seconds,
                db_errors=errors,
                claim_latency=latencies.get(queue),
            )
            before = self._states[queue]
            after = admission_step(before, signals, concurrency, self.policy, now)
            self._states[queue] = after
            self._track_reduction(queue, after, concurrency, now)
            if after.limit != before.limit or after.reason != before.reason:
                self._export(queue, after, changed=True, previous=before, signals=signals)

    def _track_reduction(
        self, queue: str, state: AdmissionState, concurrency: int, now: float
    ) -> None:
        if state.limit >= concurrency:
            self._reduced_since.pop(queue, None)
            self._causes.pop(queue, None)
            return
        self._reduced_since.setdefault(queue, now)
        if state.reason not in (OK, RECOVERING):
            self._causes[queue] = state.reason

    def _export(
        self,
        queue: str,
        state: AdmissionState,
        *,
        changed: bool,
        previous: AdmissionState | None = None,
        signals: AdmissionSignals | None = None,
    ) -> None:
        if self.metrics is not None:
            for reason in REASONS:
                self.metrics.admission_reason.labels(queue, reason).set(reason == state.reason)
            if self.mode == "on":
                self.metrics.effective_limit.labels(queue).set(state.limit)
            if changed:
                self.metrics.admission_changes.labels(queue, state.reason).inc()
        if changed and previous is not None:
            verb = "effective limit" if self.mode == "on" else "effective limit (observe only)"
            of = self.concurrency[queue]
            if previous.limit == state.limit:
                # Only the reason moved (a one-slot queue cannot be cut): no limit change to
                # announce, and not a warning.
                log_at = logging.INFO
                change = f"reason {previous.reason} -> {state.reason}, {verb} stays {state.limit}"
            else:
                log_at = logging.WARNING
                change = f"{verb} {previous.limit} -> {state.limit}"
            log.log(
                log_at,
                "admission: queue %s %s of %d, reason=%s (lag %.3fs, renewal age "
                "%.1fs, db errors %d, claim latency %s)",
                queue,
                change,
                of,
                state.reason,
                signals.scheduler_lag if signals else 0.0,
                signals.renewal_age if signals else 0.0,
                signals.db_errors if signals else 0,
                "-"
                if signals is None or signals.claim_latency is None
                else f"{signals.claim_latency:.3f}s",
            )
        if changed and self.unpublished(self.snapshot()):
            self._unpublished.set()
        if changed and self.on_change is not None:
            self.on_change(queue, state)


def _key(snapshot: tuple[QueueAdmission, ...]) -> tuple[tuple[object, ...], ...]:
    return tuple((a.queue, a.limit, a.concurrency, a.reason, a.cause) for a in snapshot)


__all__ = ["MODES", "AdmissionControl", "validate_mode"]
