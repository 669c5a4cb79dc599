"""Retry policy: exponential backoff with full jitter, a pure function of the attempt."""

from __future__ import annotations

import math
import random

import attrs

MAX_RETRY_SECONDS = 365 * 24 * 3600.0
# A task's attempts when nothing declares them, and a step's tries when its policy gives none.
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_STEP_ATTEMPTS = 3


@attrs.frozen
class RetryPolicy:
    """Delay before attempt `n + 1` after attempt `n` failed: base * 2**(n-1), capped, jittered.

    Jitter draws the delay uniformly from [delay * (1 - jitter), delay]: it spreads a burst of
    failures (an outage) so the retries do not arrive together.
    """

    base_seconds: float = 1.0
    max_seconds: float = 300.0
    jitter: float = 0.5
    # On `ctx.step(..., retry=policy)`: how many times the step runs in place at most (None: 3).
    # On `@app.task(..., retry=policy)`: the task's attempts, when its own `max_attempts` is not
    # given (both given and different is an error at declaration).
    max_attempts: int | None = None

    def __attrs_post_init__(self) -> None:
        for field in ("base_seconds", "max_seconds"):
            value = getattr(self, field)
            # NaN, inf or centuries would reach SQL as an interval it cannot represent.
            if not math.isfinite(value) or not 0 <= value <= MAX_RETRY_SECONDS:
                raise ValueError(
                    f"retry: {field} must be a number in [0, {MAX_RETRY_SECONDS:.0f}] "
                    f"(one year), not {value!r}"
                )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("retry: jitter must be within [0, 1]")
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not (isinstance(self.max_attempts, int) and 1 <= self.max_attempts <= 1000)
        ):
            raise ValueError(
                f"retry: max_attempts must be an integer in [1, 1000], not {self.max_attempts!r}"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        exponent = max(0, attempt - 1)
        # Bounded so 2.0**exponent cannot overflow (a product that does is inf, which min()
        # caps); unlike jumping straight to max_seconds, a zero base stays zero.
        raw = self.base_seconds * 2.0 ** min(exponent, 1000)
        capped = min(self.max_seconds, raw)
        draw = (rng or random).random()
        return capped * (1.0 - self.jitter * draw)


def should_retry(attempt: int, max_attempts: int) -> bool:
    """A failed attempt is retried while attempts remain."""
    return attempt < max_attempts


def applied_max_attempts(stored: int | None, declared: int) -> int:
    """The attempts a job gets: its row's own `max_attempts` (given at enqueue), else the
    declaration of the task on the worker that runs it. Lease recovery applies the same rule in
    SQL, with the declarations workers register (task_defaults)."""
    return declared if stored is None else stored
