"""Producers for code that is not trio: a synchronous one (Django, Flask, scripts) and an asyncio
one (FastAPI, aiohttp), on psycopg's own sync and async connections and psycopg_pool.

They run the statements of queries.sql (the same `job_insert_batch`, `job_insert_many`,
`job_get`, `job_cancel`, `event_emit` the trio driver runs) and build rows with
`trioq._enqueue.build_jobs`, so validation, uniqueness and notifications are those of
`trioq.Client`. They need no handlers: a task is named by a string (queue and options given,
or defaults) or by a shared `trioq.TaskDeclaration`. Both accept the caller's own psycopg
connection (`conn=`) so the enqueue commits or rolls back with the caller's transaction.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .._core import codec
from .._core.channels import control_channel, result_channel
from .._core.errors import JobFailed, JobNotFound, ResultTimeout, SchemaNotMigrated, TrioqError
from .._core.identifiers import validate_job_id, validate_key, validate_schema
from .._core.states import TERMINAL_STATES, JobState
from .._driver import JobRecord, NewJob
from .._enqueue import (
    EnqueueOptions,
    Job,
    TaskDeclaration,
    TaskLike,
    build_jobs,
    build_message,
    message_refused,
    to_jobs,
)
from .._sql import queries
from .driver import insert_statement, inserted_jobs

DATABASE_URL_ENV = "TRIOQ_DATABASE_URL"
RESULT_POLL_SECONDS = 1.0  # safety net under the result notifications
_LISTEN = sql.SQL("LISTEN {}")

SyncConnection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]


class ProducerError(TrioqError):
    """A producer cannot do what was asked (no database URL, a statement this schema lacks)."""


@attrs.frozen
class EventOutcome:
    """`first`: this emit stored the event (later emits of a key change nothing); `woken`: the
    waiting jobs it made ready."""

    first: bool
    woken: int


@attrs.frozen
class _Insert:
    """One enqueue's statement, built once for the sync and the asyncio producer alike."""

    name: str
    text: str
    params: dict[str, Any]
    jobs: Sequence[NewJob]

    def result(self, rows: Sequence[tuple[Any, ...]]) -> list[Job]:
        return to_jobs(self.jobs, inserted_jobs(self.name, rows))


@attrs.define(eq=False)
class _Statements:
    """What both producers share: task lookup, row building, statement text, row parsing."""

    schema: str
    tasks: dict[str, TaskLike]
    sql: dict[str, str] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        validate_schema(self.schema)
        self.sql = queries(self.schema)

    def spec(self, task: str | TaskLike, queue: str | None) -> TaskLike:
        if not isinstance(task, str):
            return task
        known = self.tasks.get(task)
        if known is not None:
            return known
        # Enqueue by name: the queue given (else "default") and the default options.
        return TaskDeclaration(task, queue or "default")

    def insert(
        self,
        task: str | TaskLike,
        payloads: Sequence[Any],
        options: Mapping[str, Any],
        *,
        single: bool,
        dedup_keys: Sequence[str | None] | None = None,
    ) -> _Insert:
        enqueue_options = EnqueueOptions(**options)
        jobs = build_jobs(
            self.spec(task, enqueue_options.queue),
            payloads,
            enqueue_options,
            single=single,
            dedup_keys=dedup_keys,
        )
        name, params = insert_statement(jobs)
        return _Insert(name, self.sql[name], params, jobs)

    def statement(self, name: str) -> str:
        text = self.sql.get(name)
        if text is None:
            raise ProducerError(f"{name}: this version of trioq has no such statement")
        return text

    @contextmanager
    def schema_required(self) -> Iterator[None]:
        try:
            yield
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
            raise SchemaNotMigrated(
                f"schema {self.schema!r} has no trioq tables ({exc.diag.message_primary}): "
                f"run `trioq migrate --schema {self.schema}`"
            ) from exc


def _resolve_url(conninfo: str | None) -> str:
    url = conninfo or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ProducerError(f"conninfo: not given and {DATABASE_URL_ENV} is not set")
    return url


def _event_params(key: str, payload: Any) -> dict[str, Any]:
    return {"key": validate_key("key", key), "payload": codec.encode(payload)}


def _send_params(job_id: int, topic: str, payload: Any) -> dict[str, Any]:
    message = build_message(job_id, topic, payload)
    return {"id": message.job_id, "topic": message.topic, "payload": message.payload_json}


def _sent(job_id: int, rows: Sequence[tuple[Any, ...]]) -> int:
    state, message_id = rows[0]
    if message_id is None:
        raise message_refused(job_id, state)
    return int(message_id)


def _check_id(job_id: object) -> int:
    return validate_job_id(job_id)


def _final_result(record: JobRecord) -> Any:
    if record.state != JobState.COMPLETED:
        raise JobFailed(f"job {record.id} ended {record.state}: {record.error}", record)
    return record.result


def _task_map(tasks: Iterable[TaskLike]) -> dict[str, TaskLike]:
    return {task.name: task for task in tasks}


class SyncProducer:
    """Enqueue, emit events, cancel and wait for results from synchronous code; thread-safe.

    `conn=` on each call runs it on your psycopg connection, inside your transaction (Django:
    `django.db.connection.connection` inside `transaction.atomic()`; the job exists only if you
    commit). Without it, a pooled autocommit connection is used (`pool_size` at most).
    """

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        schema: str = "trioq",
        tasks: Iterable[TaskLike] = (),
        pool_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        self._url = _resolve_url(conninfo)
        self._statements = _Statements(schema, _task_map(tasks))
        self._pool = ConnectionPool(
            self._url,
            min_size=0,
            max_size=pool_size,
            kwargs={"autocommit": True, "application_name": "trioq-producer"},
            timeout=connect_timeout,
            open=True,
        )

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _connection(self, conn: SyncConnection | None) -> Iterator[SyncConnection]:
        if conn is not None:
            yield conn
            return
        with self._pool.connection() as pooled:
            yield pooled

    def _fetch(
        self, name_or_sql: str, params: Mapping[str, Any], conn: SyncConnection | None
    ) -> list[tuple[Any, ...]]:
        text = self._statements.sql.get(name_or_sql, name_or_sql)
        with self._connection(conn) as connection, self._statements.schema_required():
            return connection.execute(text, params).fetchall()

    def enqueue(
        self,
        task: str | TaskLike,
        payload: Any = None,
        *,
        conn: SyncConnection | None = None,
        **options: Any,
    ) -> Job:
        """Insert one job; options as for `trioq.Client.enqueue`."""
        insert = self._statements.insert(task, [payload], options, single=True)
        return insert.result(self._fetch(insert.text, insert.params, conn))[0]

    def enqueue_many(
        self,
        task: str | TaskLike,
        payloads: Iterable[Any],
        *,
        conn: SyncConnection | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        **options: Any,
    ) -> list[Job]:
        """Insert a batch in one statement; results in the order of `payloads`."""
        insert = self._statements.insert(
            task, list(payloads), options, single=False, dedup_keys=dedup_keys
        )
        return insert.result(self._fetch(insert.text, insert.params, conn)) if insert.jobs else []

    def emit_event(
        self, key: str, payload: Any = None, *, conn: SyncConnection | None = None
    ) -> EventOutcome:
        """Store the event `key` and wake the jobs waiting for it (`ctx.wait_for_event`)."""
        text = self._statements.statement("event_emit")
        [row] = self._fetch(text, _event_params(key, payload), conn)
        return EventOutcome(first=bool(row[0]), woken=int(row[1]))

    def send(
        self, job_id: int, topic: str, payload: Any = None, *, conn: SyncConnection | None = None
    ) -> int:
        """Send a message to a workflow (see `trioq.Client.send`); returns the message id."""
        return _sent(
            job_id, self._fetch("message_send", _send_params(job_id, topic, payload), conn)
        )

    def cancel(self, job_id: int, *, conn: SyncConnection | None = None) -> str:
        """Cancel a job (see `trioq.Client.cancel`); returns its state after the request."""
        params = {"id": _check_id(job_id), "control_channel": control_channel(self.schema)}
        rows = self._fetch("job_cancel", params, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return str(rows[0][1])

    @property
    def schema(self) -> str:
        return self._statements.schema

    def get_job(self, job_id: int, *, conn: SyncConnection | None = None) -> JobRecord:
        rows = self._fetch("job_get", {"id": _check_id(job_id)}, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return JobRecord(*rows[0])

    def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Block until the job is final (woken by its result notification, with a slow poll
        under it); raises ResultTimeout after `timeout` seconds. Uses a connection of its own
        for LISTEN, never the caller's."""
        deadline = None if timeout is None else time.monotonic() + timeout
        channel = result_channel(self.schema, _check_id(job_id))
        with psycopg.connect(self._url, autocommit=True) as listener:
            listener.execute(_LISTEN.format(sql.Identifier(channel)))
            while True:
                record = self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                for _ in listener.notifies(timeout=min(left, RESULT_POLL_SECONDS), stop_after=1):
                    pass

    def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        """The job's result once it completes; JobFailed if it ended failed or cancelled."""
        return _final_result(self.wait_final(job_id, timeout))


class AsyncProducer:
    """`SyncProducer` for asyncio (FastAPI, aiohttp): the same methods, awaited.

    Open it with `await producer.open()` (or `async with AsyncProducer(...)`), e.g. in a FastAPI
    lifespan; `conn=` takes your `psycopg.AsyncConnection` to enqueue inside your transaction.
    """

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        schema: str = "trioq",
        tasks: Iterable[TaskLike] = (),
        pool_size: int = 4,
        connect_timeout: float = 10.0,
    ) -> None:
        self._url = _resolve_url(conninfo)
        self._statements = _Statements(schema, _task_map(tasks))
        self._pool = AsyncConnectionPool(
            self._url,
            min_size=0,
            max_size=pool_size,
            kwargs={"autocommit": True, "application_name": "trioq-producer"},
            timeout=connect_timeout,
            open=False,
        )

    @property
    def schema(self) -> str:
        return self._statements.schema

    async def open(self) -> None:
        await self._pool.open()

    async def close(self) -> None:
        await self._pool.close()

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
                return await (await conn.execute(text, params)).fetchall()
            async with self._pool.connection() as pooled:
                return await (await pooled.execute(text, params)).fetchall()

    async def enqueue(
        self,
        task: str | TaskLike,
        payload: Any = None,
        *,
        conn: AsyncConnection | None = None,
        **options: Any,
    ) -> Job:
        insert = self._statements.insert(task, [payload], options, single=True)
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
        return insert.result(await self._fetch(insert.text, insert.params, conn))

    async def emit_event(
        self, key: str, payload: Any = None, *, conn: AsyncConnection | None = None
    ) -> EventOutcome:
        text = self._statements.statement("event_emit")
        [row] = await self._fetch(text, _event_params(key, payload), conn)
        return EventOutcome(first=bool(row[0]), woken=int(row[1]))

    async def send(
        self, job_id: int, topic: str, payload: Any = None, *, conn: AsyncConnection | None = None
    ) -> int:
        """Send a message to a workflow (see `trioq.Client.send`); returns the message id."""
        params = _send_params(job_id, topic, payload)
        return _sent(job_id, await self._fetch("message_send", params, conn))

    async def cancel(self, job_id: int, *, conn: AsyncConnection | None = None) -> str:
        params = {"id": _check_id(job_id), "control_channel": control_channel(self.schema)}
        rows = await self._fetch("job_cancel", params, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return str(rows[0][1])

    async def get_job(self, job_id: int, *, conn: AsyncConnection | None = None) -> JobRecord:
        rows = await self._fetch("job_get", {"id": _check_id(job_id)}, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return JobRecord(*rows[0])

    async def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Wait until the job is final; see `SyncProducer.wait_final`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        channel = result_channel(self.schema, _check_id(job_id))
        async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as listener:
            await listener.execute(_LISTEN.format(sql.Identifier(channel)))
            while True:
                record = await self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                async for _ in listener.notifies(
                    timeout=min(left, RESULT_POLL_SECONDS), stop_after=1
                ):
                    pass

    async def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        return _final_result(await self.wait_final(job_id, timeout))
