"""Which queues have cluster-wide limits, as PgDriver last read it (migration 0023).

A queue without a row in queue_limits claims with the plain claim statements, untouched; a
limited one claims in a transaction that first takes the queue's gate (queue_limit_gate).
Whether a queue is limited is read with one primary key probe (`queue_limited`) at the first
claim, and again:
- after `queue_limit_set` told the workers on the control channel ('limits:QUEUE'), and after
  the listener reconnected (it may have missed that notification);
- at once after this process changed a limit itself;
- once per `refresh_seconds` (the poll interval) while the worker has no listener that is known
  to receive notifications (`--notifications off`, a transaction-pooling proxy, before the
  listener's self-probe arrived).
With a working listener an idle queue then costs its poll claim alone (a probe per poll
interval doubled the idle worker's statements); without one a limit set while workers run still
applies within one poll interval, without a restart.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import attrs
import trio

REFRESH_SECONDS = 1.0  # the worker's default poll interval: a change applies within one


@attrs.define(eq=False)
class LimitedQueues:
    refresh_seconds: float = REFRESH_SECONDS
    _notified: bool = False  # a listener that receives the control channel is live
    _known: dict[str, tuple[bool, float]] = attrs.field(factory=dict)

    async def limited(self, queue: str, read: Callable[[str], Awaitable[bool]]) -> bool:
        """Whether `queue` has limits: the cached answer, or `read`'s once it is stale."""
        known = self._known.get(queue)
        now = trio.current_time()
        if known is not None and now < known[1]:
            return known[0]
        limited = await read(queue)
        self._known[queue] = (limited, math.inf if self._notified else now + self.refresh_seconds)
        return limited

    def note(self, queue: str, limited: bool) -> None:
        """A gate's reply said whether the queue still has limits."""
        known = self._known.get(queue)
        if known is not None:
            self._known[queue] = (limited, known[1])

    def forget(self, queue: str | None) -> None:
        """The queue's limits changed (None: any queue's may have): read them at its next claim."""
        if queue is None:
            self._known.clear()
        else:
            self._known.pop(queue, None)

    def follow_notifications(self, live: bool) -> None:
        """Whether changes now arrive as notifications (then a read stays valid until one
        comes) or must be polled for (every `refresh_seconds`)."""
        self._notified = live
        self._known.clear()
