"""Which queues have cluster-wide limits, as PgDriver last read it (migration 0023).

A queue without a row in queue_limits claims with the plain claim statements, untouched; a
limited one claims in a transaction that first takes the queue's gate (queue_limit_gate).
Whether a queue is limited is read at most once per `refresh_seconds` per queue (one primary
key probe: `queue_limited`), and at once after this process changed a limit, so a limit set
while workers run applies within that interval without a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

REFRESH_SECONDS = 1.0  # the worker's default poll interval: a change applies within one


@attrs.define(eq=False)
class LimitedQueues:
    refresh_seconds: float = REFRESH_SECONDS
    _known: dict[str, tuple[bool, float]] = attrs.field(factory=dict)

    async def limited(self, queue: str, read: Callable[[str], Awaitable[bool]]) -> bool:
        """Whether `queue` has limits: the cached answer, or `read`'s once it is stale."""
        known = self._known.get(queue)
        now = trio.current_time()
        if known is not None and now < known[1]:
            return known[0]
        limited = await read(queue)
        self._known[queue] = (limited, now + self.refresh_seconds)
        return limited

    def note(self, queue: str, limited: bool) -> None:
        """A gate's reply said whether the queue still has limits."""
        known = self._known.get(queue)
        if known is not None:
            self._known[queue] = (limited, known[1])

    def forget(self, queue: str) -> None:
        """This process changed the queue's limits: read them again at its next claim."""
        self._known.pop(queue, None)
