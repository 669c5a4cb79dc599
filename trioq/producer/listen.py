"""One LISTEN connection per producer, shared by all its `wait_final` / `wait_result` calls.

A waiter registers its job id, which LISTENs on the job's result channel (one of 64) unless
the connection already does, and waits on an event that a result notification naming the job
sets; it re-reads the job's state after every wake-up and at least once a second, so a lost
notification only delays it. The connection belongs to one thread (sync producer) or one task
(asyncio producer) that LISTENs and UNLISTENs as waiters come and go, and reconnects with
backoff when it is lost, waking every waiter to re-read.

Hand-written because psycopg's `notifies()` holds the connection's lock while it waits, so
another thread or task cannot add a channel to a connection that is waiting.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import selectors
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import attrs
import psycopg
from psycopg import sql

from .._core.channels import job_ids_of, result_channel

logger = logging.getLogger("trioq.producer")

RECONNECT_DELAY_FIRST = 0.1
RECONNECT_DELAY_MAX = 5.0
_LISTEN = sql.SQL("LISTEN {}")
_UNLISTEN = sql.SQL("UNLISTEN {}")


class _Event(Protocol):
    def set(self) -> None: ...


E = TypeVar("E", bound=_Event)


@attrs.frozen
class ResultListenerStatistics:
    waiters: int  # wait calls registered now
    channels: int  # result channels LISTENed on the current connection
    connected: bool
    connections_opened: int


@attrs.define(eq=False)
class _Waiters(Generic[E]):
    """Who waits for which job, and the channels that needs; the caller holds the lock."""

    schema: str
    by_job: dict[int, list[E]] = attrs.field(factory=dict)
    channels: collections.Counter[str] = attrs.field(factory=collections.Counter)
    listening: set[str] = attrs.field(factory=set)  # on the current connection
    connected: bool = False
    failed: bool = False  # the last connection attempt failed: waiters poll meanwhile
    closed: bool = False
    opened: int = 0

    def add(self, job_id: int, event: E) -> str:
        channel = result_channel(self.schema, job_id)
        self.by_job.setdefault(job_id, []).append(event)
        self.channels[channel] += 1
        return channel

    def remove(self, job_id: int, event: E) -> None:
        events = self.by_job.get(job_id, [])
        if event not in events:
            return
        events.remove(event)
        if not events:
            del self.by_job[job_id]
        channel = result_channel(self.schema, job_id)
        self.channels[channel] -= 1
        if not self.channels[channel]:
            del self.channels[channel]

    def ready(self, channel: str) -> bool:
        """A waiter on `channel` can read the job's state now: a notification will wake it,
        or nothing will (disconnected, closed) and it polls."""
        return channel in self.listening or self.failed or self.closed

    def changes(self) -> tuple[list[str], list[str]]:
        """The channels to LISTEN on and to UNLISTEN from."""
        return sorted(set(self.channels) - self.listening), sorted(
            self.listening - set(self.channels)
        )

    def notified(self, payload: str) -> list[E]:
        """The events of the jobs a result notification names (its payload lists job ids)."""
        return [event for job_id in job_ids_of(payload) for event in self.by_job.get(job_id, ())]

    def everyone(self) -> list[E]:
        return [event for events in self.by_job.values() for event in events]

    def statistics(self) -> ResultListenerStatistics:
        return ResultListenerStatistics(
            waiters=sum(len(events) for events in self.by_job.values()),
            channels=len(self.listening),
            connected=self.connected,
            connections_opened=self.opened,
        )


def _dispatch_buffered(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
                       on_payload: Callable[[str], None]) -> None:  # fmt: skip
    """Hand over every notification libpq holds (PQnotifies parses what was already read)."""
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    while (notify := pgconn.notifies()) is not None:
        on_payload(notify.extra.decode(encoding))


class SyncResultListener:
    """The sync producer's listener: a daemon thread owns the connection (see the module)."""

    def __init__(self, conninfo: str, connect_kwargs: dict[str, Any], schema: str) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._waiters: _Waiters[threading.Event] = _Waiters(schema)
        self._changed = threading.Condition()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._thread: threading.Thread | None = None

    def statistics(self) -> ResultListenerStatistics:
        with self._changed:
            return self._waiters.statistics()

    def watch(self, job_id: int, wait: float) -> threading.Event:
        """Register a waiter for `job_id`; returns once a result notification for it will set
        the event (its channel is LISTENed), or after `wait` seconds, or at once while the
        listener is down. Read the job's state after this returns: nothing is missed."""
        event = threading.Event()
        with self._changed:
            channel = self._waiters.add(job_id, event)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="trioq producer listener", daemon=True
                )
                self._thread.start()
            if not self._waiters.ready(channel):
                self._wake()
                self._changed.wait_for(lambda: self._waiters.ready(channel), timeout=wait)
        return event

    def forget(self, job_id: int, event: threading.Event) -> None:
        """Unregister a waiter; its channel is UNLISTENed later if nobody else needs it."""
        with self._changed:
            self._waiters.remove(job_id, event)

    def close(self) -> None:
        with self._changed:
            self._waiters.closed = True
            for event in self._waiters.everyone():
                event.set()
            self._changed.notify_all()
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout=10)
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _wake(self) -> None:
        # A full pipe (BlockingIOError) holds wake-ups enough for the thread to read.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"x")

    def _run(self) -> None:
        delay = RECONNECT_DELAY_FIRST
        while not self._waiters.closed:
            try:
                conn = psycopg.connect(self._conninfo, **self._connect_kwargs)
            except psycopg.Error as exc:
                logger.warning("producer LISTEN connection failed (results are polled): %s", exc)
                self._disconnected(failed=True)
                if self._pause(delay):
                    return
                delay = min(delay * 2, RECONNECT_DELAY_MAX)
                continue
            delay = RECONNECT_DELAY_FIRST
            try:
                self._serve(conn)
            except psycopg.Error as exc:
                logger.warning("producer LISTEN connection lost, reconnecting: %s", exc)
            finally:
                conn.close()
                self._disconnected(failed=False)

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        conn.add_notify_handler(lambda notify: self._on_payload(notify.payload))
        with self._changed:
            self._waiters.opened += 1
            self._waiters.connected, self._waiters.failed = True, False
        with selectors.DefaultSelector() as selector:  # poll/epoll: no FD_SETSIZE limit
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                self._sync_channels(conn)
                _dispatch_buffered(conn, self._on_payload)
                selector.select()
                with self._changed:
                    if self._waiters.closed:
                        return
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 4096)
                conn.pgconn.consume_input()  # non-blocking; raises if the server hung up

    def _sync_channels(self, conn: psycopg.Connection[Any]) -> None:
        while True:
            with self._changed:
                to_listen, to_unlisten = self._waiters.changes()
            if not to_listen and not to_unlisten:
                return
            for channel in to_listen:
                conn.execute(_LISTEN.format(sql.Identifier(channel)))
            for channel in to_unlisten:
                conn.execute(_UNLISTEN.format(sql.Identifier(channel)))
            with self._changed:
                self._waiters.listening.update(to_listen)
                self._waiters.listening.difference_update(to_unlisten)
                self._changed.notify_all()

    def _on_payload(self, payload: str) -> None:
        with self._changed:
            events = self._waiters.notified(payload)
        for event in events:
            event.set()

    def _disconnected(self, *, failed: bool) -> None:
        with self._changed:
            self._waiters.listening.clear()
            self._waiters.connected = False
            self._waiters.failed = failed
            for event in self._waiters.everyone():  # re-read: a notification may be lost
                event.set()
            self._changed.notify_all()

    def _pause(self, seconds: float) -> bool:
        """Sleep before reconnecting, woken early by `close`; True once closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._waiters.closed, timeout=seconds)
            return self._waiters.closed


class AsyncResultListener:
    """The asyncio producer's listener: one task of the event loop that first waited owns the
    connection (see the module)."""

    def __init__(self, conninfo: str, connect_kwargs: dict[str, Any], schema: str) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._waiters: _Waiters[asyncio.Event] = _Waiters(schema)
        self._changed = asyncio.Event()  # replaced after each set: waiters re-check
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def statistics(self) -> ResultListenerStatistics:
        return self._waiters.statistics()

    async def watch(self, job_id: int, wait: float) -> asyncio.Event:
        """See `SyncResultListener.watch`."""
        event = asyncio.Event()
        channel = self._waiters.add(job_id, event)
        loop = asyncio.get_running_loop()
        if self._task is None:
            self.loop = loop
            self._task = loop.create_task(self._run(), name="trioq producer listener")
        deadline = loop.time() + wait
        while not self._waiters.ready(channel) and loop.time() < deadline:
            self._kick.set()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
            except TimeoutError:
                break
        return event

    def forget(self, job_id: int, event: asyncio.Event) -> None:
        self._waiters.remove(job_id, event)

    async def close(self) -> None:
        self._waiters.closed = True
        for event in self._waiters.everyone():
            event.set()
        self._signal_change()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _signal_change(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        delay = RECONNECT_DELAY_FIRST
        while not self._waiters.closed:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._connect_kwargs)
            except psycopg.Error as exc:
                logger.warning("producer LISTEN connection failed (results are polled): %s", exc)
                self._disconnected(failed=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_DELAY_MAX)
                continue
            delay = RECONNECT_DELAY_FIRST
            try:
                await self._serve(conn)
            except psycopg.Error as exc:
                logger.warning("producer LISTEN connection lost, reconnecting: %s", exc)
            finally:
                await conn.close()
                self._disconnected(failed=False)

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        conn.add_notify_handler(lambda notify: self._on_payload(notify.payload))
        self._waiters.opened += 1
        self._waiters.connected, self._waiters.failed = True, False
        loop = asyncio.get_running_loop()
        fd = conn.fileno()
        while True:
            await self._sync_channels(conn)
            _dispatch_buffered(conn, self._on_payload)
            # psycopg's own waits (the LISTENs above) register this descriptor too, and a
            # descriptor has one reader: ours is added only while nothing else runs on it.
            loop.add_reader(fd, self._kick.set)
            try:
                await self._kick.wait()
            finally:
                loop.remove_reader(fd)
            self._kick.clear()
            conn.pgconn.consume_input()  # non-blocking; raises if the server hung up

    async def _sync_channels(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            to_listen, to_unlisten = self._waiters.changes()
            if not to_listen and not to_unlisten:
                return
            for channel in to_listen:
                await conn.execute(_LISTEN.format(sql.Identifier(channel)))
            for channel in to_unlisten:
                await conn.execute(_UNLISTEN.format(sql.Identifier(channel)))
            self._waiters.listening.update(to_listen)
            self._waiters.listening.difference_update(to_unlisten)
            self._signal_change()

    def _on_payload(self, payload: str) -> None:
        for event in self._waiters.notified(payload):
            event.set()

    def _disconnected(self, *, failed: bool) -> None:
        self._waiters.listening.clear()
        self._waiters.connected = False
        self._waiters.failed = failed
        for event in self._waiters.everyone():
            event.set()
        self._signal_change()
