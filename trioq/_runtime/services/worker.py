"""The worker supervisor: one nursery owning the claim loops, the notification listener and
the worker's services: the lease renewer (leases.py), the watchdog (watchdog.py), admission
control (admission.py), the checkpoint writer, and leadership (leadership.py), under which the
elected worker runs maintenance (maintenance.py) and the scheduler (scheduler.py).

Shutdown is a drain: stop claiming, let handlers finish within the grace period, then cancel
the rest and release them back to ready without consuming an attempt, so another worker starts
them at once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

import attrs
import trio

from ..._core.capacity import DEFAULT_PREFETCH
from ..._core.channels import control_channel, job_id_of, schedules_channel
from ..._core.identifiers import validate_name
from ..._seam.driver import Driver, Listener
from ..._seam.schedules import NewSchedule
from ..._seam.services import WorkerRegistration
from ..job.claim_loop import ClaimLoop, ClaimLoopStatistics, WorkerHooks
from ..job.tasks import TaskSpec
from ..workflow.checkpoints import CheckpointWriter
from .admission import AdmissionControl, validate_mode
from .leadership import Leadership
from .leases import LeaseRenewer
from .maintenance import Maintenance
from .metrics import WorkerMetrics, instrument_driver
from .outage import DatabaseOutage
from .polls import PollSharing
from .scheduler import Scheduler
from .watchdog import Watchdog

log = logging.getLogger("trioq.worker")

# An idle worker's heartbeat rides its election or maintenance pass (leadership.py), at most 1.4
# maintenance intervals apart; `trioq status` and `job_unroutable` count a worker not heard
# from for 120 s as gone. So the interval is at most 60 s (84 s between beats at worst), also
# when derived from a long lease.
MAX_MAINTENANCE_INTERVAL = 60.0


class ListenerGuest(Protocol):
    """Someone in the worker's process that would otherwise open a LISTEN connection of its own
    (the client's result watcher, when handlers call `wait_result`): while the worker runs it
    borrows the worker's listener and gets every notification the worker does not consume."""

    def adopt(self, listener: Listener) -> None: ...

    def release(self, listener: Listener) -> None: ...

    def on_notify(self, channel: str, payload: str) -> None: ...

    def on_reconnect(self) -> None: ...


MAX_CONCURRENCY = 10_000


QueueSlots = tuple[tuple[str, int], ...]


def _queue_slots(value: Mapping[str, int] | QueueSlots) -> QueueSlots:
    return tuple(value.items()) if isinstance(value, Mapping) else tuple(value)


@attrs.frozen
class WorkerConfig:
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 10  # slots of every queue not in `queue_concurrency`
    # Slots of the queues that have their own (`--queue mail=2`, `queues={"mail": 2}`): a busy
    # queue never takes another's slots, each has its own claim loop and admission state.
    queue_concurrency: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_queue_slots)
    poll_interval: float = 1.0
    lease_seconds: float = 30.0
    grace_seconds: float = 30.0
    maintenance_interval: float | None = None  # default: lease_seconds / 3, at most 60 s
    retention_seconds: float = 7 * 24 * 3600.0
    write_timeout: float = 30.0  # bound on the final writes of a drain
    # Run the scheduler when elected leader (cron schedules). Every worker stands for the
    # leadership, which also runs maintenance; a candidate with the scheduler on takes the seat
    # from a leader with it off (docs/operations.md, "Leadership").
    run_scheduler: bool = True
    admission: str = "on"  # admission control: off, observe, on
    # False: poll-only (no LISTEN connection), for transaction-pooling proxies.
    notifications: bool = True
    # How long the listener self-probe waits for its own NOTIFY before falling back to polling.
    probe_timeout: float = 5.0
    # Jobs each queue's loop keeps claimed ahead of its free slots (0: off).
    prefetch: int = DEFAULT_PREFETCH

    def __attrs_post_init__(self) -> None:
        if not self.queues:
            raise ValueError("queues: at least one queue is required")
        for queue in self.queues:
            validate_name("queue", queue)
        if len(set(self.queues)) != len(self.queues):
            raise ValueError("queues: a queue is listed twice")
        _check_slots(None, self.concurrency)
        for queue, slots in self.queue_concurrency:
            _check_slots(queue, slots)
        unknown = sorted({q for q, _ in self.queue_concurrency} - set(self.queues))
        if unknown:
            raise ValueError(f"queue_concurrency: {', '.join(unknown)} not among the queues")
        for field in ("poll_interval", "lease_seconds"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: must be > 0")
        if self.grace_seconds < 0:
            raise ValueError("grace_seconds: must be >= 0")
        interval = self.maintenance_interval
        if interval is not None and not 0 < interval <= MAX_MAINTENANCE_INTERVAL:
            raise ValueError(
                f"maintenance_interval: must be > 0 and at most {MAX_MAINTENANCE_INTERVAL:g} s"
                " (an idle worker heartbeats with it; one silent for 120 s counts as gone)"
            )
        validate_mode(self.admission)
        if (
            isinstance(self.prefetch, bool)
            or not isinstance(self.prefetch, int)
            or not 0 <= self.prefetch <= MAX_CONCURRENCY
        ):
            raise ValueError(
                f"prefetch: must be a whole number from 0 to {MAX_CONCURRENCY}, "
                f"got {self.prefetch!r}"
            )

    def slots(self, queue: str) -> int:
        """The concurrency of `queue`: its own, else the worker's `concurrency`."""
        return dict(self.queue_concurrency).get(queue, self.concurrency)

    @property
    def total_slots(self) -> int:
        return sum(self.slots(queue) for queue in self.queues)

    @property
    def renew_interval(self) -> float:
        return self.lease_seconds / 3

    @property
    def maintenance_every(self) -> float:
        if self.maintenance_interval is not None:
            return self.maintenance_interval
        return min(self.lease_seconds / 3, MAX_MAINTENANCE_INTERVAL)

    @property
    def heartbeat_every(self) -> float:
        """The longest gap between this worker's heartbeats: an idle worker beats with its
        election or maintenance pass, at most 1.4 intervals apart (see `leader_ttl`); a busy
        one also with every lease renewal. Registered, so status can tell a silent worker."""
        return 1.4 * self.maintenance_every

    @property
    def leader_ttl(self) -> float:
        """The leader seat's time to live: the leader extends it with every maintenance pass, at
        most 1.4 intervals apart (1.2 jitter, 0.2 waiting for a claim poll to stand in for), so
        2.5 intervals leave a whole interval of slack before a live leader loses it, and a dead
        leader's seat is free before its leases expire (25 s against a 30 s lease by default)."""
        return 2.5 * self.maintenance_every


def _check_slots(queue: str | None, slots: object) -> None:
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_CONCURRENCY:
        field = "concurrency" if queue is None else f"queue {queue!r}"
        raise ValueError(
            f"{field}: concurrency must be a whole number from 1 to {MAX_CONCURRENCY} "
            f"(got {slots!r})"
        )


@attrs.frozen
class WorkerStatistics:
    worker_id: uuid.UUID
    draining: bool
    listener_connected: bool
    database_healthy: bool
    listener_state: str  # "ok", "down", "polling" (self-probe failed), "off" (poll-only)
    seconds_since_lease_renewal: float
    loops: tuple[ClaimLoopStatistics, ...]
    leader: bool = False  # this worker holds the leader seat (runs maintenance, the scheduler)


@attrs.define(eq=False)
class Worker:
    driver: Driver
    tasks: Mapping[str, TaskSpec]
    config: WorkerConfig
    hooks: WorkerHooks = attrs.field(factory=WorkerHooks)
    worker_id: uuid.UUID = attrs.field(factory=uuid.uuid4)
    metrics: WorkerMetrics = attrs.field(factory=WorkerMetrics)
    listener_guest: ListenerGuest | None = None
    schedules: Sequence[NewSchedule] = ()  # the app's declared schedules, stored at start
    # Every (task, version) this worker serves; empty: the versions of `tasks`.
    versions: Mapping[tuple[str, int], TaskSpec] = attrs.field(factory=dict)
    admission: AdmissionControl = attrs.field(init=False)
    loops: dict[str, ClaimLoop] = attrs.field(init=False)
    scheduler: Scheduler = attrs.field(init=False)
    checkpoints: CheckpointWriter = attrs.field(init=False)
    renewer: LeaseRenewer = attrs.field(init=False)
    outage: DatabaseOutage = attrs.field(init=False)
    watchdog: Watchdog = attrs.field(init=False)
    maintenance: Maintenance = attrs.field(init=False)
    leadership: Leadership = attrs.field(init=False)
    _drain_requested: trio.Event = attrs.field(factory=trio.Event)
    _ready_channels: set[str] = attrs.field(factory=set)
    _listener: Listener | None = None
    _probe_payload: str = ""
    _probe_arrived: trio.Event = attrs.field(factory=trio.Event)
    _probe_failed: bool = False
    _probe_done: trio.Event = attrs.field(factory=trio.Event)  # the probe decided (tests wait)

    def __attrs_post_init__(self) -> None:
        self.admission = AdmissionControl(
            concurrency={queue: self.config.slots(queue) for queue in self.config.queues},
            mode=self.config.admission,
            lease_seconds=self.config.lease_seconds,
            renewal_age=lambda: self.renewer.age(),
            metrics=self.metrics,
        )
        self.outage = DatabaseOutage(self.driver.is_connection_lost)

        def on_error(statement: str, error: BaseException) -> None:
            self.admission.record_error(statement, error)
            self.outage.failed(statement, error)

        self.driver = instrument_driver(
            self.driver,
            self.metrics,
            on_error=on_error,
            on_claim=self.admission.record_claim,
            on_success=self.outage.succeeded,
        )
        hooks = _with_metrics(self.hooks, self.metrics)
        self.checkpoints = CheckpointWriter(self.driver)
        self.loops = {
            queue: ClaimLoop(
                queue=queue,
                concurrency=self.config.slots(queue),
                driver=self.driver,
                tasks=self.tasks,
                versions=self.versions or {(s.name, s.version): s for s in self.tasks.values()},
                worker_id=self.worker_id,
                lease_seconds=self.config.lease_seconds,
                poll_interval=self.config.poll_interval,
                hooks=hooks,
                tally=self.metrics.jobs,
                admitted=functools.partial(self.admission.effective_limit, queue),
                checkpoints=self.checkpoints,
                write_timeout=self.config.write_timeout,
                prefetch=self.config.prefetch,
                notifications_live=self._notifications_live,
            )
            for queue in self.config.queues
        }
        self.scheduler = Scheduler(self.driver, declared=self.schedules)
        self._wire_services()

    def _wire_services(self) -> None:
        config, loops = self.config, list(self.loops.values())
        self.renewer = LeaseRenewer(
            driver=self.driver,
            worker_id=self.worker_id,
            loops=loops,
            lease_seconds=config.lease_seconds,
            metrics=self.metrics,
            admission=self.admission,
            draining=self._drain_requested.is_set,
            register_again=self._register_again,
        )
        self.watchdog = Watchdog(loops, config.lease_seconds)
        polls = PollSharing(loops, config.poll_interval)
        scheduler = self.scheduler if config.run_scheduler else None
        self.maintenance = Maintenance(
            driver=self.driver,
            worker_id=self.worker_id,
            interval=config.maintenance_every,
            ttl_seconds=config.leader_ttl,
            retention_seconds=config.retention_seconds,
            polls=polls,
            register_again=self._register_again,
            scheduler=scheduler,
        )
        self.leadership = Leadership(
            driver=self.driver,
            worker_id=self.worker_id,
            interval=config.maintenance_every,
            ttl_seconds=config.leader_ttl,
            polls=polls,
            maintenance=self.maintenance,
            register_again=self._register_again,
            scheduler=scheduler,
        )

    def _served(self) -> list[TaskSpec]:
        return list(self.versions.values()) if self.versions else list(self.tasks.values())

    # --- control -------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Stop claiming; running handlers get the grace period, then are released."""
        self._drain_requested.set()

    def effective_limit(self, queue: str) -> int:
        """The slots of `queue` this worker may fill now (its concurrency unless reduced)."""
        return self.admission.effective_limit(queue)

    def _notifications_live(self) -> bool:
        """Ready notifications reach this worker (on, connected, self-probe not failed)."""
        listener = self._listener
        return (
            self.config.notifications
            and not self._probe_failed
            and listener is not None
            and listener.connected
        )

    def statistics(self) -> WorkerStatistics:
        listener_connected = self._listener is not None and self._listener.connected
        if not self.config.notifications:
            listener_state = "off"
        elif self._probe_failed:
            listener_state = "polling"
        else:
            listener_state = "ok" if listener_connected else "down"
        return WorkerStatistics(
            worker_id=self.worker_id,
            draining=self._drain_requested.is_set(),
            listener_connected=listener_connected,
            listener_state=listener_state,
            database_healthy=self.renewer.healthy
            and all(loop.db_healthy for loop in self.loops.values()),
            seconds_since_lease_renewal=self.renewer.age(),
            loops=tuple(loop.statistics() for loop in self.loops.values()),
            leader=self.leadership.is_leader,
        )

    # --- the supervisor ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until drained (see `request_drain`). Cancelling it is a hard stop: handlers are
        cancelled and their leases expire, to be recovered by the leader's maintenance."""
        await self.driver.worker_register(self._registration())
        try:
            async with self._open_listener() as listener:
                if listener is not None:
                    await self._subscribe(listener)
                loops_scope = trio.CancelScope()
                async with trio.open_nursery() as services:
                    if listener is not None:
                        services.start_soon(self._probe_listener, name="trioq listener probe")
                    services.start_soon(self.checkpoints.run)
                    services.start_soon(self.renewer.run, name="trioq lease renewer")
                    services.start_soon(self.watchdog.run, name="trioq watchdog")
                    if self.config.run_scheduler:
                        services.start_soon(self.scheduler.declare)
                    services.start_soon(self.leadership.run, name="trioq leadership")
                    services.start_soon(self.admission.run, name="trioq admission control")
                    services.start_soon(self._drain_when_requested, loops_scope)
                    with loops_scope:
                        async with trio.open_nursery() as loops:
                            for loop in self.loops.values():
                                loops.start_soon(loop.run, name=f"trioq claim loop {loop.queue}")
                            task_status.started(self)
                    services.cancel_scope.cancel()
        finally:
            if self.listener_guest is not None and self._listener is not None:
                self.listener_guest.release(self._listener)
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await self.driver.worker_unregister(self.worker_id)
                except Exception as exc:
                    log.warning("could not unregister worker %s: %s", self.worker_id, exc)

    # --- the listener --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _open_listener(self) -> AsyncIterator[Listener | None]:
        """The worker's LISTEN connection, or None in poll-only mode (`notifications=False`):
        the claim loops then find work by their poll timer and cancellations arrive with the
        lease renewals."""
        if not self.config.notifications:
            log.info("worker %s: notifications off, polling every %.2fs", self.worker_id,
                     self.config.poll_interval)  # fmt: skip
            yield None
            return
        async with self.driver.open_listener(self._on_notify, self._on_reconnect) as listener:
            yield listener

    async def _subscribe(self, listener: Listener) -> None:
        # Ready notifications carry the queue name: the channel only filters.
        self._ready_channels.update(await self.driver.ready_channels(self.config.queues))
        for channel in [
            *self._ready_channels,
            control_channel(self.driver.schema),
            schedules_channel(self.driver.schema),
        ]:
            await listener.listen(channel)
        self._listener = listener
        if self.listener_guest is not None:
            self.listener_guest.adopt(listener)

    async def _probe_listener(self) -> None:
        """NOTIFY ourselves once at start. A listener behind a transaction-pooling proxy (or a
        misrouted one) is connected yet receives nothing: then warn once, report `polling` on
        /readyz (a note, not a failure) and rely on the poll timer, which runs anyway."""
        self._probe_payload = f"probe:{self.worker_id}"
        try:
            await self.driver.notify_send(control_channel(self.driver.schema), self._probe_payload)
        except Exception as exc:
            log.warning("listener self-probe could not be sent: %s", exc)
            self._probe_done.set()
            return
        with trio.move_on_after(self.config.probe_timeout):
            await self._probe_arrived.wait()
            self._probe_done.set()
            return
        self._probe_failed = True
        self.driver.queue_limits_notified(False)
        self._probe_done.set()
        log.warning(
            "worker %s: the listener received no notification in %.1fs (a transaction-pooling "
            "proxy?): falling back to polling every %.2fs; use --notifications off to skip "
            "the LISTEN connection",
            self.worker_id,
            self.config.probe_timeout,
            self.config.poll_interval,
        )

    async def _drain_when_requested(self, loops_scope: trio.CancelScope) -> None:
        await self._drain_requested.wait()
        log.info("worker %s draining (grace %.1fs)", self.worker_id, self.config.grace_seconds)
        self.leadership.stop()  # a draining worker leaves the seat (maintenance, scheduler)
        for loop in self.loops.values():
            loop.stop_claiming()
        with trio.move_on_after(self.config.grace_seconds):
            for loop in self.loops.values():
                await loop.wait_no_running()
        overdue = [run for loop in self.loops.values() for run in loop.running.values()]
        if overdue:
            # Said here: otherwise a drain whose handler never returns prints nothing for the
            # grace, then exits 0, and the operator cannot tell which jobs went back and why.
            log.warning(
                "worker %s: %d job(s) still running after the %.1fs drain grace are released "
                "(cancelled here; another worker runs them again): %s",
                self.worker_id,
                len(overdue),
                self.config.grace_seconds,
                ", ".join(f"job {run.job.id} ({run.job.task})" for run in overdue),
            )
        for run in overdue:
            run.cancel("drain")
        # The loops write the releases and exit; if the database is away, give up after a bound
        # (the leases then expire and maintenance recovers the jobs).
        await trio.sleep(self.config.write_timeout)
        log.warning(
            "worker %s: final writes did not finish in %.0fs; stopping anyway",
            self.worker_id,
            self.config.write_timeout,
        )
        loops_scope.cancel()

    # --- notifications -------------------------------------------------------------------

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel in self._ready_channels:
            self.metrics.notifications.inc()
            loop = self.loops.get(payload)
            if loop is not None:
                loop.wake()
            return
        if channel == control_channel(self.driver.schema) and payload == self._probe_payload:
            self._probe_arrived.set()
            self.driver.queue_limits_notified(True)
            if self._probe_failed:
                self._probe_failed = False
                log.warning("worker %s: notifications arrive again", self.worker_id)
            return
        if channel == control_channel(self.driver.schema) and payload.startswith("limits:"):
            self.driver.queue_limits_changed(payload.removeprefix("limits:"))
            return
        if channel == control_channel(self.driver.schema) and payload == "leader":
            self.leadership.wake()  # the leader gave its seat up
            return
        if channel == control_channel(self.driver.schema):
            self._cancel_job(payload)
            return
        if channel == schedules_channel(self.driver.schema):
            self.scheduler.wake()
            return
        if self.listener_guest is not None:
            self.listener_guest.on_notify(channel, payload)

    def _on_reconnect(self) -> None:
        self.driver.queue_limits_changed(None)  # a limits notification may have been missed
        for loop in self.loops.values():
            loop.wake()  # catch up on notifications missed while disconnected
        self.scheduler.wake()
        if self.listener_guest is not None:
            self.listener_guest.on_reconnect()

    def _cancel_job(self, payload: str) -> None:
        """A cancel hint: any login can NOTIFY this channel, so a job id here cancels nothing
        by itself. When the job runs here, the lease renewer renews early, and that statement
        reads each job's stored cancel request (set by a cancel or a passed deadline): only
        a job whose request is stored is cancelled."""
        job_id = job_id_of(payload)
        if job_id is not None and any(job_id in loop.running for loop in self.loops.values()):
            self.renewer.check_soon()

    # --- registration --------------------------------------------------------------------

    def _registration(self) -> WorkerRegistration:
        return WorkerRegistration(
            worker_id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.config.queues,
            concurrency=self.config.total_slots,
            queue_concurrency=tuple(self.config.slots(queue) for queue in self.config.queues),
            task_versions=tuple(sorted(spec.pair for spec in self._served())),
            task_defaults=tuple(
                sorted(
                    (spec.name, spec.version, spec.max_attempts, spec.deadline)
                    for spec in self._served()
                )
            ),
            heartbeat_seconds=self.config.heartbeat_every,
        )

    async def _register_again(self) -> None:
        """The worker row was pruned (this process was paused past the stale limit, say):
        register again, so `trioq status` and maintenance see a live worker."""
        log.warning("worker %s was unregistered while alive: registering again", self.worker_id)
        try:
            await self.driver.worker_register(self._registration())
        except Exception as exc:
            log.warning("re-registration failed (the next heartbeat retries): %s", exc)
            return
        self.admission.published(())  # the new row holds no admission snapshot yet


def _with_metrics(hooks: WorkerHooks, metrics: WorkerMetrics) -> WorkerHooks:
    """The claim loops' per-round hooks: the worker's metrics first, then the caller's (test)
    hooks. The per-job ones are the caller's alone: the claim loop counts each finished job in
    `metrics.jobs` itself (no wrapper call per job)."""
    on_round, on_poll = hooks.on_round, hooks.on_poll

    def round_(queue: str, requested: int, claimed: int) -> None:
        metrics.on_round(queue, requested, claimed)
        if on_round:
            on_round(queue, requested, claimed)

    def poll(queue: str) -> None:
        metrics.poll_wakeups.labels(queue).inc()
        if on_poll:
            on_poll(queue)

    return WorkerHooks(
        on_round=round_,
        on_job_start=hooks.on_job_start,
        on_job_end=hooks.on_job_end,
        on_poll=poll,
    )
