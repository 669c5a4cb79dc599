"""The asyncio producer (FastAPI, aiohttp): `SyncProducer`'s methods, awaited, on psycopg's
async connections and psycopg_pool (docs/producers.md).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from .._core.channels import control_channel
from .._core.errors import (
    JobNotFound,
    ResultTimeout,
)
from .._core.states import TERMINAL_STATES
from .._enqueue.rows import (
    Job,
    TaskLike,
    seconds_option,
)
from .._pg.replies import Cancelled, EventEmitted, TaskServed
from .._seam.records import EventOutcome, JobRecord, ValueRead, WorkflowValue

if TYPE_CHECKING:
    # psycopg, psycopg_pool and the result listeners are imported when a producer first
    # connects: `import trioq.producer` costs a web process only what it uses (docs/producers.md).
    from psycopg_pool import AsyncConnectionPool

    from .listen import (
        AsyncResultListener,
        ResultListenerStatistics,
    )
from . import shared
from .shared import (
    FORKS,
    LEFT_BY_PARENT,
    AsyncConnection,
    PreparedStatements,
    Settings,
    Statements,
    caller_connection_error,
    check_id,
    event_params,
    final_result,
    message_sent,
    send_params,
    task_map,
    value_params,
    wait_for_subscription,
)


class AsyncProducer:
    """`SyncProducer` for asyncio (FastAPI, aiohttp): the same methods, awaited.

    Open it with `await producer.open()` (or `async with AsyncProducer(...)`), e.g. in a FastAPI
    lifespan; opening connects once and raises `trioq.ProducerConnectionError` as
    `SyncProducer` does. `conn=` takes your `psycopg.AsyncConnection` to enqueue inside your
    transaction. Fork-safe like `SyncProducer`: a child process (or another event loop, for the
    result listener) opens its own pool on first use.
    """

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        schema: str = "trioq",
        tasks: Iterable[TaskLike] = (),
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        prepared_statements: str = "auto",
        listen_url: str | None = None,
        strict: bool = False,
    ) -> None:
        self._statements = Statements(schema, task_map(tasks), strict)
        self._settings = Settings.of(
            conninfo, prepared_statements, listen_url, pool_size, connect_timeout
        )
        self._prepared = PreparedStatements(unnamed=prepared_statements == "off")
        self._generation = FORKS.generation
        self._pool = self._new_pool()
        self._opened = False  # open() was called: a child opens its fresh pool on first use
        self._pool_open = False
        self._results: AsyncResultListener | None = None

    def _new_pool(self) -> AsyncConnectionPool[AsyncConnection]:
        from psycopg_pool import AsyncConnectionPool

        settings = self._settings
        return AsyncConnectionPool(
            settings.url,
            min_size=0,
            max_size=settings.pool_size,
            kwargs=settings.connect_kwargs,
            timeout=settings.connect_timeout,
            open=False,
        )

    @property
    def schema(self) -> str:
        return self._statements.schema

    async def open(self) -> None:
        if await self._settings.check_async(self._statements.sql["server_pid"]):
            self._prepared.pooler_found()
            self._settings = self._settings.behind_pooler()
        self._opened = True
        await self._ready_pool()

    async def _ready_pool(self) -> AsyncConnectionPool[AsyncConnection]:
        if self._generation != FORKS.generation:  # see SyncProducer._this_process
            LEFT_BY_PARENT.extend([self._pool, self._results])
            self._pool, self._results, self._pool_open = self._new_pool(), None, False
            self._generation = FORKS.generation
        if self._opened and not self._pool_open:
            self._pool_open = True
            await self._pool.open()
        return self._pool

    def _result_listener(self) -> AsyncResultListener | None:
        if self._settings.listen_url is None:
            return None
        import asyncio  # imported by the loop that runs us already; not at trioq.producer's import

        results = self._results
        if results is None or results.loop is not asyncio.get_running_loop():
            if results is not None:  # its task died with another event loop
                LEFT_BY_PARENT.append(results)
            from .listen import AsyncResultListener

            results = self._results = AsyncResultListener(
                self._settings.listen_url, self._settings.listen_kwargs, self.schema
            )
        return results

    def statistics(self) -> ResultListenerStatistics | None:
        """See `SyncProducer.statistics`."""
        return None if self._results is None else self._results.statistics()

    async def close(self) -> None:
        pool = await self._ready_pool()
        if self._results is not None:
            await self._results.close()
        await pool.close()

    async def __aenter__(self) -> AsyncProducer:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _fetch(
        self, name_or_sql: str, params: Mapping[str, Any], conn: AsyncConnection | None
    ) -> list[tuple[Any, ...]]:
        text = self._statements.sql.get(name_or_sql, name_or_sql)
        with self._statements.schema_required():
            if conn is not None:
                try:
                    return await (await conn.execute(text, params)).fetchall()
                except Exception as exc:
                    error = caller_connection_error(exc)
                    if error is None:
                        raise
                    raise error from exc
            try:
                return await self._fetch_pooled(text, params)
            except Exception as exc:
                if not self._prepared.switch_if_lost(exc):
                    raise
            return await self._fetch_pooled(text, params)  # see SyncProducer._fetch

    async def _fetch_pooled(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        pool = await self._ready_pool()
        from .._pg.errors import MOVED_ROW_ATTEMPTS, is_moved_row  # see SyncProducer's

        for attempt in range(MOVED_ROW_ATTEMPTS):
            try:
                async with pool.connection() as pooled:
                    self._prepared.apply(pooled)
                    return await (await pooled.execute(text, params)).fetchall()
            except Exception as exc:
                if not is_moved_row(exc) or attempt == MOVED_ROW_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def enqueue(
        self,
        task: str | TaskLike,
        payload: Any = None,
        *,
        conn: AsyncConnection | None = None,
        **options: Any,
    ) -> Job:
        insert = self._statements.insert(task, [payload], options, single=True)
        await self._check_name(task, conn)
        return insert.result(await self._fetch(insert.text, insert.params, conn))[0]

    async def enqueue_many(
        self,
        task: str | TaskLike,
        payloads: Iterable[Any],
        *,
        conn: AsyncConnection | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        **options: Any,
    ) -> list[Job]:
        insert = self._statements.insert(
            task, list(payloads), options, single=False, dedup_keys=dedup_keys
        )
        if not insert.jobs:
            return []
        await self._check_name(task, conn)
        return insert.result(await self._fetch(insert.text, insert.params, conn))

    async def _check_name(self, task: str | TaskLike, conn: AsyncConnection | None) -> None:
        name = self._statements.unchecked_name(task)
        if name is not None:
            [row] = await self._fetch("task_served", self._statements.served_params(name), conn)
            self._statements.judge(name, bool(row[TaskServed.served]))

    async def emit_event(
        self, key: str, payload: Any = None, *, conn: AsyncConnection | None = None
    ) -> EventOutcome:
        text = self._statements.statement("event_emit")
        [row] = await self._fetch(text, event_params(key, payload), conn)
        return EventOutcome(
            first=bool(row[EventEmitted.emitted_first]), woken=int(row[EventEmitted.woken_count])
        )

    async def send(
        self, job_id: int, topic: str, payload: Any = None, *, conn: AsyncConnection | None = None
    ) -> int:
        """Send a message to a workflow (see `trioq.Client.send`); returns the message id."""
        params = send_params(job_id, topic, payload)
        return message_sent(job_id, await self._fetch("message_send", params, conn))

    async def cancel(self, job_id: int, *, conn: AsyncConnection | None = None) -> str:
        params = {"id": check_id(job_id), "control_channel": control_channel(self.schema)}
        rows = await self._fetch("job_cancel", params, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return str(rows[0][Cancelled.state])

    async def get_job(self, job_id: int, *, conn: AsyncConnection | None = None) -> JobRecord:
        rows = await self._fetch("job_get", {"id": check_id(job_id)}, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return JobRecord(*rows[0])

    async def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Wait until the job is final; see `SyncProducer.wait_final`."""
        import asyncio  # see _result_listener

        job_id = check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = self._result_listener()
        if results is None:
            event = asyncio.Event()  # never set: poll only
        else:
            event = await results.watch(job_id, wait_for_subscription(timeout))
        try:
            if results is not None:  # see SyncProducer.wait_final
                await self._fetch("job_result_watch", {"id": job_id}, None)
                await self._fetch("job_result_watch_run", {"id": job_id}, None)
            while True:
                record = await self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = (
                    shared.RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                )
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                with suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, shared.RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(job_id, event)

    async def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        return final_result(await self.wait_final(job_id, timeout))

    async def get_value(
        self,
        job_id: int,
        key: str,
        *,
        wait: datetime.timedelta | float | None = None,
        conn: AsyncConnection | None = None,
    ) -> Any:
        """See `SyncProducer.get_value`."""
        import asyncio  # see _result_listener

        params = value_params(job_id, key)
        seconds = seconds_option("wait", wait)
        if seconds is None:
            rows = await self._fetch("job_value_get", params, conn)
            return ValueRead(*rows[0]).answer(params["id"], key, None)
        deadline = time.monotonic() + seconds
        results = self._result_listener()
        if results is None:
            event = asyncio.Event()  # never set: poll only
        else:
            event = await results.watch(params["id"], wait_for_subscription(seconds))
        try:
            if results is not None:  # see SyncProducer.wait_final
                await self._fetch("job_result_watch", {"id": params["id"]}, None)
                await self._fetch("job_result_watch_run", {"id": params["id"]}, None)
            while True:
                read = ValueRead(*(await self._fetch("job_value_get", params, None))[0])
                left = deadline - time.monotonic()
                if read.found or read.state in TERMINAL_STATES or read.state is None or left <= 0:
                    return read.answer(params["id"], key, seconds)
                with suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, shared.RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(params["id"], event)

    async def values(
        self, job_id: int, *, conn: AsyncConnection | None = None
    ) -> list[WorkflowValue]:
        """See `SyncProducer.values`."""
        rows = await self._fetch("job_values", {"id": check_id(job_id)}, conn)
        return [WorkflowValue(*row) for row in rows]
