"""A trio-native pool of `Connection`s (psycopg_pool is asyncio-only).

A semaphore of `size` slots bounds the connections in use; idle connections wait on a stack (the
most recently used is handed out first, so a lightly loaded pool keeps few connections warm), and
a slot with no connection opens one on demand. Nothing runs in the background.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Unpack

import attrs
import psycopg
import trio

from trioq._pg.connection import (
    CLOSE_TIMEOUT,
    ROLLBACK_TIMEOUT,
    Connection,
    ConnectOptions,
    connect,
)
from trioq._pg.errors import connection_problem

logger = logging.getLogger("trioq.pg")


@attrs.frozen
class PoolStatistics:
    size: int
    idle: int
    in_use: int
    opened_total: int
    replaced_total: int


@attrs.frozen
class _IdleConnection:
    connection: Connection
    idle_since: float


@attrs.define(eq=False)
class Pool:
    """Hands out `Connection`s for exclusive use; see `open_pool()`."""

    _conninfo: str = attrs.field(repr=False)  # holds the password
    _size: int
    _ping_idle_after: float
    _connect_options: ConnectOptions
    _slots: trio.Semaphore = attrs.field(init=False)
    _idle: list[_IdleConnection] = attrs.field(init=False, factory=list)
    _in_use: int = attrs.field(default=0, init=False)
    _opened_total: int = attrs.field(default=0, init=False)
    _replaced_total: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self._size)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            size=self._size,
            idle=len(self._idle),
            in_use=self._in_use,
            opened_total=self._opened_total,
            replaced_total=self._replaced_total,
        )

    def connection(self) -> AbstractAsyncContextManager[Connection]:
        """Borrow a connection for the duration of the block; waits while all are in use.

        The connection handed out is open and idle: one the server has already hung up on is
        replaced first, and one idle for longer than `ping_idle_after` is pinged. If a new
        connection has to be opened and cannot be, the error is raised here (the slot stays free
        for the next attempt). Cancelled while waiting: nothing was taken.

        On the way out (shielded): an open transaction is rolled back (bounded by
        `ROLLBACK_TIMEOUT`); a connection that is closed, broken or still not idle is closed and
        its slot reopened lazily by a later caller. Session state (SET, temp tables, LISTEN) is
        not reset.

        The hot path (a free slot and an idle connection that needs no ping, `_take_nowait`)
        awaits nothing of its own, on the way in or out when the block leaves the connection
        idle: the block's own statements are its checkpoints. For the claim loop's round on an
        idle worker that is one scheduling round less (the slot's acquire) and two shielded
        cancel scopes less (the give-back) between a notification and the claim's send. That
        path is `_Borrow`'s own, without a generator context manager (two statements per
        25-job drain round pass here: the generator's enter and exit were ~2.7% of a drain's
        worker CPU in py-spy); every other path is `_borrow_waiting`.
        """
        return _Borrow(self)

    @asynccontextmanager
    async def _borrow_waiting(self) -> AsyncIterator[Connection]:
        """`connection()` when the hot path does not apply: wait for a slot, check out."""
        await self._slots.acquire()
        try:
            if self._closed:
                raise trio.ClosedResourceError("the pool is closed")
            conn = await self._checkout()
        except BaseException:
            self._slots.release()
            raise
        self._in_use += 1
        try:
            yield conn
        finally:
            await self._give_back(conn)

    async def _return(self, conn: Connection) -> None:
        """Give back a connection whose block ended normally: straight to the idle list when
        its last statement left it idle (nothing can have arrived since), else `_give_back`."""
        if self._closed or not conn.is_idle_nowait():
            await self._give_back(conn)
            return
        self._in_use -= 1
        self._idle.append(_IdleConnection(conn, trio.current_time()))
        self._slots.release()

    async def _give_back(self, conn: Connection) -> None:
        """Return a borrowed connection (shielded): checked in, or replaced if unusable."""
        with trio.CancelScope(shield=True):
            self._in_use -= 1
            try:
                await self._checkin(conn, replace_if_unusable=True)
            finally:
                self._slots.release()

    async def fetch_native(self, sql: bytes, params: list[Any]) -> list[tuple[Any, ...]]:
        """`Connection.fetch_native` on a borrowed connection: `connection()` for one statement.

        The hot path (a free slot and an idle connection that needs no ping) is `connection()`'s
        own (`_take_nowait`, `_return`), written out here without the generator context
        manager, which costs a single enqueue 6-16 us of CPU (bench/RESULTS.md, "Design
        decisions"). Anything else (no slot or no idle connection, one to ping or replace, a
        closed pool) goes through
        `connection()`, with its guarantees; a statement that fails or is cancelled is given
        back as `connection()` gives it back.
        """
        conn = self._take_nowait()
        if conn is None:
            async with self.connection() as borrowed:
                return await borrowed.fetch_native(sql, params)
        try:
            rows = await conn.fetch_native(sql, params)
        except BaseException:
            await self._give_back(conn)
            raise
        await self._return(conn)
        return rows

    def _take_nowait(self) -> Connection | None:
        """The most recent idle connection with its slot, if both are free and it needs no
        ping, counted in use; else None (and nothing taken)."""
        if self._closed:
            raise trio.ClosedResourceError("the pool is closed")
        if not self._idle or self._slots.value == 0:  # value > 0: nobody waits for a slot
            return None
        entry = self._idle[-1]
        if trio.current_time() - entry.idle_since >= self._ping_idle_after:
            return None
        if not entry.connection.is_reusable_nowait():
            return None
        self._slots.acquire_nowait()
        self._idle.pop()
        self._in_use += 1
        return entry.connection

    async def _checkout(self) -> Connection:
        while self._idle:
            entry = self._idle.pop()
            if await self._still_usable(entry):
                return entry.connection
            await self._replace(entry.connection)
        conn = await connect(self._conninfo, **self._connect_options)
        self._opened_total += 1
        return conn

    async def _still_usable(self, entry: _IdleConnection) -> bool:
        conn = entry.connection
        if not conn.is_reusable_nowait():
            return False
        if trio.current_time() - entry.idle_since < self._ping_idle_after:
            return True
        try:
            await conn.execute("SELECT 1")
        except psycopg.Error as exc:
            logger.info("pooled connection %d failed its ping: %r", conn.backend_pid, exc)
            return False
        except BaseException:  # cancelled during the ping: the connection goes back unharmed
            await self._checkin(conn, replace_if_unusable=False)
            raise
        return True

    async def _checkin(self, conn: Connection, *, replace_if_unusable: bool) -> None:
        with trio.CancelScope(shield=True):
            if self._closed:
                await conn.close()
                return
            if conn.in_transaction:
                try:
                    with trio.fail_after(ROLLBACK_TIMEOUT):
                        await conn.execute("ROLLBACK")
                except Exception as exc:
                    logger.warning("ROLLBACK on release failed (%d): %r", conn.backend_pid, exc)
            if conn.is_reusable_nowait():
                self._idle.append(_IdleConnection(conn, trio.current_time()))
            elif replace_if_unusable:
                await self._replace(conn)
            else:
                await conn.close()

    async def _replace(self, conn: Connection) -> None:
        """Close a dead or dirty connection; its slot opens a new one when next needed."""
        self._replaced_total += 1
        logger.info("replacing pooled connection %d", conn.backend_pid)
        await conn.close()

    async def _open_first(self) -> None:
        conn = await connect(self._conninfo, **self._connect_options)
        self._opened_total += 1
        self._idle.append(_IdleConnection(conn, trio.current_time()))

    async def _close(self) -> None:
        self._closed = True
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
            while self._idle:
                await self._idle.pop().connection.close()


@asynccontextmanager
async def open_pool(
    conninfo: str,
    size: int = 10,
    *,
    ping_idle_after: float = 5.0,
    open_first: bool = True,
    **connect_options: Unpack[ConnectOptions],
) -> AsyncIterator[Pool]:
    """A pool of up to `size` connections made by `connect(conninfo, **connect_options)`.

    One connection is opened before the block starts (unless `open_first` is false), so a
    wrong conninfo or an unreachable server raises here (psycopg's
    `OperationalError`/`ProgrammingError`, bounded by `connect_timeout`); the others open when
    first needed. Leaving the block closes every idle
    connection (shielded, bounded by `CLOSE_TIMEOUT`); connections still borrowed are closed when
    returned, and borrowing afterwards raises `trio.ClosedResourceError`.
    """
    if size < 1:
        raise ValueError(f"pool size must be at least 1, not {size}")
    pool = Pool(conninfo, size, ping_idle_after, connect_options)
    if open_first:
        try:
            await pool._open_first()
        except psycopg.Error as exc:
            problem = connection_problem(exc, "the App's database_url or TRIOQ_DATABASE_URL")
            if problem is not None and problem.permanent:
                # psycopg's error as it is (callers catch it), with the CLI's line naming the fix
                # (a pooler refusing "auto"'s startup options: prepared_statements="off").
                exc.add_note(f"trioq: {problem.message}")
            raise
    try:
        yield pool
    finally:
        await pool._close()


class _Borrow:
    """`Pool.connection()`: the hot path inline (see there), else `_borrow_waiting`."""

    __slots__ = ("_conn", "_pool", "_waiting")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: Connection | None = None
        self._waiting: AbstractAsyncContextManager[Connection] | None = None

    async def __aenter__(self) -> Connection:
        conn = self._pool._take_nowait()  # raises on a closed pool
        if conn is not None:
            self._conn = conn
            return conn
        self._waiting = self._pool._borrow_waiting()
        return await self._waiting.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._waiting is not None:
            return await self._waiting.__aexit__(exc_type, exc, tb)
        conn = self._conn
        assert conn is not None
        if exc_type is not None:
            await self._pool._give_back(conn)
            return False
        await self._pool._return(conn)
        return False
