"""The seam's worker-service statements: lease renewal and the worker's heartbeat, leader
election and the leader's maintenance pass (trioq/_runtime/services/).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from typing import Protocol

import attrs

from .lease import Lease
from .schedules import ScheduleDue


@attrs.frozen
class QueueAdmission:
    """One queue whose effective limit admission control has reduced (the worker row's
    admission snapshot, migration 0008): `reason` is the current reason code (`recovering`
    while it grows back), `cause` the overload signal that cut it, `reduced_for_seconds` how
    long the limit has been below the configured concurrency (stored as the database's time)."""

    queue: str
    limit: int
    concurrency: int
    reason: str
    cause: str
    reduced_for_seconds: float


@attrs.frozen
class RenewLeases:
    worker_id: uuid.UUID
    worker_state: str
    lease_seconds: float
    leases: tuple[Lease, ...]
    # The heartbeat writes this snapshot on the worker row (empty: every queue at full).
    admission: tuple[QueueAdmission, ...] = ()


@attrs.frozen
class MaintenancePass:
    recover_limit: int = 1000
    prune_limit: int = 1000
    retention_seconds: float = 7 * 24 * 3600.0
    worker_stale_seconds: float = 300.0
    # The elected leader sending the pass (it extends its seat first and sweeps only if it still
    # holds it); None: an operator's or a test's one-off pass, swept without the election.
    leader_id: uuid.UUID | None = None
    scheduler: bool = True  # the leader runs the scheduler
    ttl_seconds: float = 30.0  # the seat's time to live from this pass
    queues: tuple[str, ...] = ()  # the leader's queues, probed (see QueueProbe)
    deadline_limit: int = 1000  # jobs past their deadline cancelled per pass


@attrs.frozen
class LeaderElect:
    """A follower's periodic statement: try to take the leader seat, heartbeat, probe."""

    worker_id: uuid.UUID
    ttl_seconds: float
    scheduler: bool = True  # this worker runs the scheduler when it leads
    queues: tuple[str, ...] = ()


@attrs.frozen
class LeaderResign:
    worker_id: uuid.UUID


@attrs.frozen
class WorkerRegistration:
    worker_id: uuid.UUID
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    task_versions: tuple[str, ...] = ()  # 'task@version' pairs served
    # (task, version, max_attempts, deadline seconds or None) of each served pair, sorted: the
    # declarations that rows without a max_attempts of their own take (task_defaults, migration
    # 0015), and the deadline inserts give jobs without one of their own (migration 0029)
    task_defaults: tuple[tuple[str, int, int, float | None], ...] = ()
    # The slots of each queue in `queues`, in order (migration 0018); `concurrency` is their sum.
    queue_concurrency: tuple[int, ...] = ()
    heartbeat_seconds: float | None = None  # the longest gap between its heartbeats (0019)


@attrs.frozen
class RenewedLease:
    id: int
    cancel_requested: bool
    # False: still this worker's, but its row was locked by another transaction, so the lease
    # was not extended this time (neither renewed nor lost: the watchdog decides).
    confirmed: bool = True


@attrs.frozen
class RenewalResult:
    leases: tuple[RenewedLease, ...]  # leases not listed are lost
    registered: bool  # False: the worker row was gone (pruned); register again


@attrs.frozen
class QueueProbe:
    """What a claim poll of `queue` would have found at the statement's `now`, without claiming:
    `work_due` (a ready row, or a promotable due one) and the first future due time."""

    queue: str
    work_due: bool
    next_due: datetime.datetime | None


@attrs.frozen
class MaintenanceReport:
    leader: bool
    recovered: tuple[tuple[int, str], ...] = ()  # (job id, new state)
    pruned_jobs: int = 0
    pruned_workers: int = 0
    registered: bool = True  # False: the leader's worker row was gone (pruned); register again
    now: datetime.datetime | None = None  # database time of the pass
    probes: tuple[QueueProbe, ...] = ()  # one per queue of MaintenancePass.queues
    schedules: ScheduleDue | None = None  # the scheduler's idle read, done by the pass
    deadlines_passed: int = 0  # jobs cancelled because their deadline passed
    ready_pending: int = 0  # places ready_sweep has something to sweep in (the leader's only)


@attrs.frozen
class LeadershipReport:
    leader: bool  # this worker holds the seat after the statement
    registered: bool  # False: the worker row was gone (pruned); register again
    now: datetime.datetime
    probes: tuple[QueueProbe, ...] = ()


class ServiceStatements(Protocol):
    """The statements of a worker's services, part of `Driver`."""

    async def lease_renew_many(self, params: RenewLeases) -> RenewalResult: ...

    async def maintenance_pass(self, params: MaintenancePass) -> MaintenanceReport: ...

    # The leader's sweep of where ready jobs wait (PostgreSQL: the ready ring's drained slots
    # truncated, docs/concepts.md "Storage"), sent while the last maintenance pass or sweep
    # said something is left (`ready_pending`); how many places still hold something (0:
    # nothing, until jobs become ready again). The memory driver has nothing to sweep.
    async def ready_sweep(self) -> int: ...

    async def leader_elect(self, params: LeaderElect) -> LeadershipReport: ...

    async def leader_resign(self, params: LeaderResign) -> bool: ...

    async def worker_register(self, params: WorkerRegistration) -> None: ...

    async def worker_unregister(self, worker_id: uuid.UUID) -> None: ...

    async def ready_channels(self, queues: Sequence[str]) -> list[str]: ...
