"""Poll sharing: the services' periodic statements stand in for the claim loops' idle polls.

An idle claim loop polls its queue once per poll interval: that poll is the safety net for a
missed notification and for work that becomes due without one. The worker's services send
statements of their own on timers (the leader election, maintenance), and each of those also
probes the worker's queues (`queue_probe()`, migration 0010). A loop told by such a statement
"nothing is due in your queue" has had its poll: its timer restarts as if the poll had run, so
the probe replaces the poll instead of adding to it (and one statement probes every queue of
the worker). Told "work is due" (or when the statement fails) the loop keeps its timer
as it was. The poll interval is never lengthened: between two looks at a queue (a poll or a
probe) there is never more than one poll interval.

So that a probe replaces a whole poll rather than part of one, a service about to send its
periodic statement first waits for the moment the first loop's poll is due
(`wait_poll_due`): then the statement goes instead of that poll.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Sequence

import attrs
import trio

from ..._seam.services import QueueProbe
from ..job.claim_loop import ClaimLoop

# How far before a loop's poll is due a service sends its statement in the poll's place (the
# loop's timer is held while the statement is in flight, so this only needs to beat the timer).
LEAD_SECONDS = 0.001

# While no loop has a poll due (its round is in flight), a service waiting to stand in for one
# looks again after this share of the poll interval.
RECHECK_SHARE = 0.05
RECHECK_MIN = 0.005  # seconds

# The poll a service is about to stand in for is held this share of the poll interval past its
# due time (the only case where two looks at a queue are more than an interval apart: a service
# statement sent late by a busy event loop, at most this much).
HOLD_SHARE = 0.05

# A service waits for a poll to replace at most this share of its own interval, so its period
# stays within (0.8 + 0.4 jitter + this) x interval, whatever the poll interval.
ALIGN_SHARE = 0.2


@attrs.define(eq=False)
class ProbeAnswer:
    """Filled in by the service with what its statement reported."""

    now: datetime.datetime | None = None
    probes: tuple[QueueProbe, ...] = ()

    def set(self, now: datetime.datetime | None, probes: tuple[QueueProbe, ...]) -> None:
        self.now, self.probes = now, probes


@attrs.define(eq=False)
class PollSharing:
    loops: Sequence[ClaimLoop]
    poll_interval: float

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(loop.queue for loop in self.loops)

    async def wait_poll_due(self, at_most: float) -> float | None:
        """Sleep until just before the first waiting loop's poll is due, at most `at_most`
        seconds (loops busy with work have no poll to replace; with a poll interval longer
        than the service's own, its statements come more often than polls anyway). A wake-up
        that came too late (the loop's timer fired first, as under load) waits for the loop's
        next poll instead, within the same bound. With no poll due right now (every loop's
        round is in flight, or they are busy with work) it looks again every `RECHECK_SHARE`
        of a poll interval: a round in flight re-arms its loop's timer within milliseconds,
        and the statement must not go alongside it (it would replace no poll and take a
        second pooled connection). Returns when that poll was due (None: there was none to
        stand in for). Safe to cancel."""
        give_up = trio.current_time() + at_most
        while True:
            due = [(at, loop) for loop in self.loops if (at := loop.poll_due_at()) is not None]
            if not due:
                if trio.current_time() >= give_up:
                    return None
                recheck = trio.current_time() + max(RECHECK_MIN, RECHECK_SHARE * self.poll_interval)
                await trio.sleep_until(min(give_up, recheck))
                continue
            target, first = min(due, key=lambda pair: pair[0])
            if target - LEAD_SECONDS >= give_up:
                await trio.sleep_until(give_up)
                return None
            # Hold that poll a little past its time, so a late wake-up of this task (a busy
            # event loop runs both expired sleeps in one batch, in no fixed order) still
            # finds it waiting rather than losing the race to the loop's timer.
            held = target + max(RECHECK_MIN, HOLD_SHARE * self.poll_interval)
            first.defer_poll(held - self.poll_interval)
            await trio.sleep_until(target - LEAD_SECONDS)
            if first.poll_due_at() == held:
                return target  # that poll has not run: this statement goes in its place

    @contextlib.contextmanager
    def standing_in(self, poll_due: float | None = None) -> Iterator[ProbeAnswer]:
        """Around one probing statement: the loops hold their polls while it is in flight,
        then each learns its queue's answer (`answer.set`); none set (the statement failed or
        was cancelled) counts as "work may be due": the loops' timers stay as they were.
        `poll_due` (from `wait_poll_due`, a moment away): the statement is the poll due then,
        so the next one is due a poll interval after it, as if that poll had run."""
        sent_at = trio.current_time()
        looked_at = sent_at if poll_due is None else max(sent_at, poll_due)
        for loop in self.loops:
            loop.defer_poll(looked_at)
        answer = ProbeAnswer()
        try:
            yield answer
        finally:
            by_queue = {probe.queue: probe for probe in answer.probes}
            for loop in self.loops:
                probe = by_queue.get(loop.queue)
                if probe is None or answer.now is None or probe.work_due:
                    loop.observed(nothing_due=False, next_due_at=None)
                    continue
                next_due_at = None
                if probe.next_due is not None:
                    wait = max(0.0, (probe.next_due - answer.now).total_seconds())
                    next_due_at = sent_at + wait
                loop.observed(nothing_due=True, next_due_at=next_due_at)
