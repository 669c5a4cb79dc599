"""What the soak's driver did and saw, kept as it happens and turned into the checker's `Facts`.

Every time is the host clock (`now()`), like the handlers' log rows (tests/soak/app.py).
"""

from __future__ import annotations

import collections
import datetime

import attrs

from tests.soak.model import Facts, Interval, Sent


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@attrs.define(eq=False)
class Record:
    acknowledged: set[int] = attrs.field(factory=set)
    enqueue_errors: int = 0  # producer and client calls that raised (outcome unknown)
    died: dict[int, datetime.datetime] = attrs.field(factory=dict)
    killed: set[int] = attrs.field(factory=set)
    outages: list[Interval] = attrs.field(factory=list)
    faults: collections.Counter[str] = attrs.field(factory=collections.Counter)
    messages: dict[int, list[Sent]] = attrs.field(factory=dict)
    event_waiters: dict[str, set[int]] = attrs.field(factory=dict)
    emitted: set[str] = attrs.field(factory=set)
    observations: list[tuple[datetime.datetime, int, str]] = attrs.field(factory=list)
    redriven: dict[int, list[datetime.datetime]] = attrs.field(factory=dict)
    cancels: int = 0
    workflows: set[int] = attrs.field(factory=set)

    def ack(self, *job_ids: int) -> None:
        self.acknowledged.update(job_ids)

    def death(self, pid: int, *, killed: bool) -> None:
        self.died.setdefault(pid, now())
        if killed:
            self.killed.add(pid)

    def facts(self, **settings: object) -> Facts:
        return Facts(
            frozenset(self.acknowledged),
            died=dict(self.died),
            killed=frozenset(self.killed),
            outages=list(self.outages),
            messages={job: list(sent) for job, sent in self.messages.items()},
            event_waiters={key: frozenset(jobs) for key, jobs in self.event_waiters.items()},
            emitted=frozenset(self.emitted),
            observations=list(self.observations),
            redriven={job: list(times) for job, times in self.redriven.items()},
            **settings,  # type: ignore[arg-type]
        )
