"""LISTEN on one dedicated connection, without threads.

One task (the pump) owns the connection's socket: it waits with `trio.lowlevel.wait_readable`,
reads with `pgconn.consume_input()` and hands every `pgconn.notifies()` entry to a synchronous
callback. LISTEN/UNLISTEN are sent by the same task with libpq's asynchronous calls
(`send_query`, `flush`, `get_result`), so no libpq call ever blocks and nothing else touches the
socket. Everything used is psycopg's public `pq` API.

Notifications are a wake-up hint, not a delivery guarantee: those sent while the listener is
disconnected are lost, which is why `on_reconnect` exists (the runtime polls once to catch up).
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Unpack

import attrs
import psycopg
import psycopg.errors
import trio
from psycopg import pq, sql
from psycopg.pq.abc import PGresult

from trioq._pg.connection import ConnectOptions, RawConnection, open_raw_connection, session_params
from trioq._pg.errors import is_connection_lost

logger = logging.getLogger("trioq.pg")

NotifyCallback = Callable[[str, str], None]
ReconnectCallback = Callable[[], None]

RECONNECT_DELAY_FIRST = 0.1
RECONNECT_DELAY_MAX = 5.0

_LISTEN = sql.SQL("LISTEN {}")
_UNLISTEN = sql.SQL("UNLISTEN {}")


@attrs.define(eq=False)
class _Backoff:
    """Exponential reconnect delays with jitter: 0.1 s doubling up to 5 s, each scaled by 0.5-1."""

    _rng: random.Random = attrs.field(factory=random.Random)
    _delay: float = RECONNECT_DELAY_FIRST

    def next_delay(self) -> float:
        delay = self._delay * self._rng.uniform(0.5, 1.0)
        self._delay = min(self._delay * 2, RECONNECT_DELAY_MAX)
        return delay

    def reset(self) -> None:
        self._delay = RECONNECT_DELAY_FIRST


@attrs.define(eq=False)
class Listener:
    """A LISTEN connection that survives connection loss; see `open_listener()`."""

    _params: dict[str, Any] = attrs.field(repr=False)  # holds the password
    _on_notify: NotifyCallback
    _on_reconnect: ReconnectCallback | None
    _raw: RawConnection | None = None
    _connected: bool = False
    _wanted: set[str] = attrs.field(factory=set)
    _active: set[str] = attrs.field(factory=set)
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _wait_scope: trio.CancelScope | None = None
    _refused_channels: set[str] = attrs.field(factory=set)  # a callback raised on these

    @property
    def connected(self) -> bool:
        """True while the connection is up and every remembered channel is LISTENed on it."""
        return self._connected

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the current connection, None while disconnected."""
        return None if self._raw is None else self._raw.info.backend_pid

    async def listen(self, channel: str) -> None:
        """LISTEN on `channel` (any string: it is quoted as an identifier). Idempotent.

        The channel is remembered and LISTENed again after every reconnect. Returns once LISTEN
        has run on the current connection, or at once while disconnected (it will run before
        `on_reconnect` is called). Cancelling the wait does not forget the channel.
        """
        self._wanted.add(channel)
        await self._wait_applied(channel)

    async def unlisten(self, channel: str) -> None:
        """Stop listening on `channel` and forget it; returns once UNLISTEN has run (or at once
        while disconnected). Idempotent."""
        self._wanted.discard(channel)
        await self._wait_applied(channel)

    async def _wait_applied(self, channel: str) -> None:
        await trio.lowlevel.checkpoint()
        while self._connected and (channel in self._wanted) != (channel in self._active):
            if self._wait_scope is not None:
                self._wait_scope.cancel()  # wake the pump so it sends the command
            await self._changed.park()

    async def _run(self, raw: RawConnection) -> None:
        """The pump: serve the connection; on loss, reconnect with backoff, forever."""
        backoff = _Backoff()
        reconnected = False
        while True:
            try:
                await self._serve(raw, reconnected=reconnected, backoff=backoff)
            except Exception as exc:
                if not is_connection_lost(exc):
                    raise
                logger.warning("LISTEN connection lost, reconnecting: %s", exc)
            finally:
                self._disconnect()
            reconnected = True
            raw = await self._reconnect(backoff)

    async def _reconnect(self, backoff: _Backoff) -> RawConnection:
        while True:
            await trio.sleep(backoff.next_delay())
            try:
                raw = await open_raw_connection(self._params, prepare_threshold=None)
            except psycopg.OperationalError as exc:  # any connect failure may be temporary
                logger.warning("LISTEN connection: reconnect failed: %s", exc)
                continue
            self._raw = raw
            return raw

    async def _serve(self, raw: RawConnection, *, reconnected: bool, backoff: _Backoff) -> None:
        await self._sync_channels(raw)
        self._connected = True
        backoff.reset()
        self._changed.unpark_all()
        if reconnected:
            logger.info("LISTEN connection re-established (%d)", raw.info.backend_pid)
            if self._on_reconnect is not None:
                self._on_reconnect()
        pgconn = raw.pgconn
        while True:
            with trio.CancelScope() as self._wait_scope:
                await trio.lowlevel.wait_readable(pgconn.socket)
            self._wait_scope = None
            self._consume(raw)
            await self._sync_channels(raw)

    async def _sync_channels(self, raw: RawConnection) -> None:
        """LISTEN/UNLISTEN until the connection's channels match the remembered ones."""
        while True:
            if to_listen := self._wanted - self._active:
                channel = min(to_listen)
                await self._command(raw, _LISTEN, channel)
                self._active.add(channel)
            elif to_unlisten := self._active - self._wanted:
                channel = min(to_unlisten)
                await self._command(raw, _UNLISTEN, channel)
                self._active.discard(channel)
            else:
                break
        self._changed.unpark_all()

    async def _command(self, raw: RawConnection, statement: sql.SQL, channel: str) -> None:
        pgconn = raw.pgconn
        pgconn.send_query(statement.format(sql.Identifier(channel)).as_bytes(raw))
        while pgconn.flush():
            await trio.lowlevel.wait_writable(pgconn.socket)
        failure: PGresult | None = None
        while True:
            self._consume(raw)
            if pgconn.is_busy():
                await trio.lowlevel.wait_readable(pgconn.socket)
                continue
            result = pgconn.get_result()
            if result is None:
                break
            if result.status != pq.ExecStatus.COMMAND_OK:
                failure = result
        self._dispatch(raw)  # get_result() may have parsed notifications after the last read
        if failure is not None:
            raise _error_from_result(failure, raw.info.encoding)

    def _consume(self, raw: RawConnection) -> None:
        """Read what the server sent (raises OperationalError if it hung up) and dispatch it."""
        raw.pgconn.consume_input()
        self._dispatch(raw)

    def _dispatch(self, raw: RawConnection) -> None:
        pgconn = raw.pgconn
        encoding = raw.info.encoding
        while (notify := pgconn.notifies()) is not None:
            channel = notify.relname.decode(encoding, errors="replace")
            payload = notify.extra.decode(encoding, errors="replace")
            try:
                self._on_notify(channel, payload)
            except Exception:
                # Any login may NOTIFY any channel: a payload a callback cannot take is
                # dropped (a notification is a hint, and the poll covers a lost one); the pump
                # and the process go on. Logged once per channel, not once per payload.
                if channel not in self._refused_channels:
                    self._refused_channels.add(channel)
                    logger.exception("a notification on %s was dropped (%r)", channel, payload[:80])

    def _disconnect(self) -> None:
        raw, self._raw = self._raw, None
        self._connected = False
        self._active.clear()
        self._wait_scope = None
        self._changed.unpark_all()
        if raw is not None:
            raw.close()  # PQfinish: sends Terminate without waiting for an answer


@attrs.define(eq=False)
class PollingListener:
    """Stands in for a LISTEN connection where there is none (a transaction pooler in front and
    no listen URL): it delivers nothing, so every waiter finds its result by its poll."""

    @property
    def connected(self) -> bool:
        return False

    async def listen(self, channel: str) -> None:
        await trio.lowlevel.checkpoint()

    async def unlisten(self, channel: str) -> None:
        await trio.lowlevel.checkpoint()


def _error_from_result(result: PGresult, encoding: str) -> psycopg.Error:
    sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    try:
        error_class = psycopg.errors.lookup(sqlstate)
    except KeyError:
        error_class = psycopg.OperationalError if not sqlstate else psycopg.DatabaseError
    return error_class(result.get_error_message(encoding))


@asynccontextmanager
async def open_listener(
    conninfo: str,
    *,
    on_notify: NotifyCallback,
    on_reconnect: ReconnectCallback | None = None,
    **connect_options: Unpack[ConnectOptions],
) -> AsyncIterator[Listener]:
    """Open a dedicated LISTEN connection and pump its notifications in a background task.

    `on_notify(channel, payload)` is called synchronously, in the pump task, for every
    notification; it must not block (the runtime only sets a wake-up flag). If the connection is
    lost, the listener reconnects with exponential backoff (0.1 s doubling to 5 s, jittered),
    LISTENs on every remembered channel again, and then calls `on_reconnect()` so the caller can
    poll for what it missed. Connection errors never escape the block; an exception raised by a
    callback, or a non-connection error from LISTEN (e.g. on a hot standby), does.

    The first connection is opened before the block starts, so a wrong conninfo raises here.
    Leaving the block stops the pump and closes the connection.
    """
    params = session_params(conninfo, connect_options)
    raw = await open_raw_connection(params, prepare_threshold=None)
    listener = Listener(params, on_notify, on_reconnect, raw=raw, connected=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(listener._run, raw)
        try:
            yield listener
        finally:
            nursery.cancel_scope.cancel()
