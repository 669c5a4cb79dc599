"""Producers for code that is not trio: a synchronous one (Django, Flask, scripts) and an asyncio
one (FastAPI, aiohttp), on psycopg's own sync and async connections and psycopg_pool.

They run the statements of queries.sql (the same `job_insert_batch`, `job_insert_many`,
`job_get`, `job_cancel`, `event_emit` the trio driver runs) and build rows with
`trioq._enqueue.rows.build_jobs`, so validation, uniqueness and notifications are those of
`trioq.Client`. They need no handlers: a task is named by a string (queue and options given,
or defaults) or by a shared `trioq.TaskDeclaration`. Both accept the caller's own psycopg
connection (`conn=`) so the enqueue commits or rolls back with the caller's transaction.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from .._core import codec
from .._core.channels import control_channel
from .._core.errors import (
    JobFailed,
    JobNotFound,
    ProducerConnectionError,
    ProducerError,
    ResultTimeout,
    UnknownTask,
    UnservedTaskWarning,
)
from .._core.explain import LIVE_HEARTBEAT_SECONDS
from .._core.identifiers import (
    validate_job_id,
    validate_key,
    validate_name,
    validate_prepared_statements,
    validate_schema,
)
from .._core.states import TERMINAL_STATES, JobState
from .._enqueue.rows import (
    EnqueueOptions,
    Job,
    TaskDeclaration,
    TaskLike,
    build_jobs,
    build_message,
    message_refused,
    seconds_option,
    to_jobs,
)
from .._pg.inserts import insert_statement, inserted_jobs
from .._pg.libpq import DATABASE_URL_ENV, network_defaults
from .._pg.replies import Cancelled, EventEmitted, MessageSent, TaskServed
from .._seam.records import EventOutcome, JobRecord, NewJob, ValueRead, WorkflowValue
from .._sql import queries

if TYPE_CHECKING:
    # psycopg, psycopg_pool and the result listeners are imported when a producer first
    # connects: `import trioq.producer` costs a web process only what it uses (docs/producers.md).
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from .listen import (
        AsyncResultListener,
        ResultListenerStatistics,
        SyncResultListener,
    )

logger = logging.getLogger("trioq.producer")

RESULT_POLL_SECONDS = 1.0  # safety net under the result notifications
# Opening a producer connects once, to fail at once with the cause (psycopg_pool would retry
# in the background and raise PoolTimeout after `connect_timeout`, the cause only in its log).
CHECK_TIMEOUT = 3
# How long a wait_final waits for its channel's LISTEN before it reads the job's state anyway.
SUBSCRIBE_TIMEOUT = 5.0

SyncConnection: TypeAlias = "psycopg.Connection[Any]"
AsyncConnection: TypeAlias = "psycopg.AsyncConnection[Any]"


@attrs.define
class _ForkCount:
    """Forks of this process so far, as seen by the child (`os.register_at_fork`)."""

    generation: int = 0
    producers: weakref.WeakSet[SyncProducer] = attrs.field(factory=weakref.WeakSet)

    def forked(self) -> None:
        self.generation += 1
        for producer in self.producers:
            # Another thread of the parent may have held it at the fork: that thread is gone.
            producer._fork_lock = threading.Lock()


_FORKS = _ForkCount()
os.register_at_fork(after_in_child=_FORKS.forked)
# A child keeps its parent's pools and listeners referenced: their connections are the parent's
# sockets (closing them would end the parent's sessions), their threads did not survive the
# fork, and their finalisers would only warn.
_LEFT_BY_PARENT: list[object] = []


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
    strict: bool = False
    sql: dict[str, str] = attrs.field(init=False)
    _served: set[str] = attrs.field(factory=set, init=False)  # names a live worker serves
    _warned: set[str] = attrs.field(factory=set, init=False)

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

    def unchecked_name(self, task: str | TaskLike) -> str | None:
        """A task named by a string no declaration knows, still to be looked up (once per name;
        with `strict`, until a live worker serves it)."""
        if not isinstance(task, str) or task in self.tasks or task in self._served:
            return None
        return None if task in self._warned and not self.strict else task

    def served_params(self, name: str) -> dict[str, Any]:
        return {"task": validate_name("task", name), "stale_seconds": LIVE_HEARTBEAT_SECONDS}

    def judge(self, name: str, served: bool) -> None:
        """Warn once per name (`strict`: raise `UnknownTask`, nothing written) when no live
        worker serves a task the producer has no declaration for."""
        if served:
            self._served.add(name)
            return
        message = (
            f"task {name!r}: no declaration given to this producer names it and no live worker "
            f"serves it, so its jobs wait until one does (a misspelt name? pass tasks=[...] "
            f"with its trioq.TaskDeclaration, or start a worker that registers it)"
        )
        if self.strict:
            raise UnknownTask(message)
        self._warned.add(name)
        warnings.warn(message, UnservedTaskWarning, stacklevel=4)

    def statement(self, name: str) -> str:
        text = self.sql.get(name)
        if text is None:
            raise ProducerError(f"{name}: this version of trioq has no such statement")
        return text

    def schema_required(self) -> AbstractContextManager[None]:
        from .._pg.errors import schema_required

        return schema_required(self.schema)


@attrs.define(eq=False)
class _PreparedStatements:
    """Whether the producer's pooled connections may prepare statements: `"auto"` until a
    transaction pooler loses one (`prepared statement "_pg3_0" does not exist`, or `already
    exists`), unnamed statements for good from then on; `"off"` from the start.

    The lost statement failed before it ran, so the call is run once more on unnamed statements
    (`retry`). The switch is a safety net, not a setting: until it happens a statement of the
    same name and parameter count prepared by another client could run in place of ours."""

    unnamed: bool
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def switch_if_lost(self, exc: BaseException) -> bool:
        """True if `exc` is a lost prepared statement and the call may run once more unnamed;
        the first one switches the producer and logs one line."""
        from .._pg.errors import is_lost_prepared_statement

        if not is_lost_prepared_statement(exc):
            return False
        self._switch(
            "a prepared statement went missing on the server (%s): a transaction pooler "
            "(PgBouncer in transaction mode?) is in front, switching to unnamed "
            'statements; set prepared_statements="off" (--prepared-statements off) to '
            "start that way",
            _first_line(exc),
        )
        return True

    def pooler_found(self) -> None:
        """Opening found a connection pooler in front: unnamed statements from the start."""
        self._switch(
            "a connection pooler answers in front of PostgreSQL (PgBouncer?): using "
            'unnamed statements; set prepared_statements="off" (--prepared-statements off) '
            "to say so"
        )

    def _switch(self, message: str, *args: object) -> None:
        """Unnamed statements from now on; the first switch logs `message`, once."""
        with self._lock:
            first, self.unnamed = not self.unnamed, True
        if first:
            logger.warning(message, *args)

    def apply(self, conn: SyncConnection | AsyncConnection) -> None:
        if self.unnamed:
            conn.prepare_threshold = None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _caller_connection_error(exc: BaseException) -> ProducerConnectionError | None:
    """A lost prepared statement on the caller's own connection (`conn=`): its transaction has
    failed, and only its owner can turn prepared statements off."""
    from .._pg.errors import is_lost_prepared_statement

    if not is_lost_prepared_statement(exc):
        return None
    return ProducerConnectionError(
        f"{_first_line(exc)}: the connection passed as conn= goes through a transaction "
        "pooler with prepared statements on; open it with prepare_threshold=None (Django: "
        "DATABASES OPTIONS {'prepare_threshold': None})",
        permanent=True,
    )


def _resolve_url(conninfo: str | None) -> str:
    url = conninfo or os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ProducerError(f"conninfo: not given and {DATABASE_URL_ENV} is not set")
    return url


@attrs.frozen
class _Settings:
    """What both producers connect with (see `SyncProducer`)."""

    url: str = attrs.field(repr=False)  # holds the password
    # None: poll for results (a transaction pooler and no listen URL)
    listen_url: str | None = attrs.field(repr=False)
    connect_kwargs: dict[str, Any] = attrs.field(repr=False)
    pool_size: int
    connect_timeout: float

    @classmethod
    def of(
        cls,
        conninfo: str | None,
        prepared_statements: str,
        listen_url: str | None,
        pool_size: int,
        connect_timeout: float,
    ) -> _Settings:
        url = _resolve_url(conninfo)
        off = validate_prepared_statements(prepared_statements) == "off"
        import psycopg  # the producer's first use of psycopg (see the imports above)
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise _connection_error(exc) from None
        # Keepalives and tcp_user_timeout as trioq's own connections have them: a request
        # thread, or the result listener, never waits hours on a network that went away.
        kwargs: dict[str, Any] = {"autocommit": True, **network_defaults(params)}
        if off:
            kwargs["prepare_threshold"] = None  # unnamed statements only
        if "application_name" not in params and not os.environ.get("PGAPPNAME"):
            kwargs["application_name"] = "trioq-producer"
        if listen_url is None and not off:
            listen_url = url
        return cls(url, listen_url, kwargs, pool_size, connect_timeout)

    @property
    def _check_kwargs(self) -> dict[str, Any]:
        return {**self.connect_kwargs, "connect_timeout": CHECK_TIMEOUT}

    @property
    def listen_kwargs(self) -> dict[str, Any]:
        return {**self.connect_kwargs, "prepare_threshold": None}

    def check(self) -> bool:
        """Connect once (bounded by CHECK_TIMEOUT): ProducerConnectionError naming the fix.
        True if a connection pooler answered (see `_pooler_answers`)."""
        import psycopg

        try:
            with psycopg.connect(self.url, **self._check_kwargs) as conn:
                if self.connect_kwargs.get("prepare_threshold", 5) is None:
                    return False  # "off": nothing to find out
                return _pooler_answers(conn.info.backend_pid, conn.execute(_SERVER_PID).fetchone())
        except psycopg.Error as exc:
            raise _connection_error(exc) from None

    async def check_async(self) -> bool:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self.url, **self._check_kwargs)
        except psycopg.Error as exc:
            raise _connection_error(exc) from None
        try:
            if self.connect_kwargs.get("prepare_threshold", 5) is None:
                return False
            row = await (await conn.execute(_SERVER_PID)).fetchone()
            return _pooler_answers(conn.info.backend_pid, row)
        except psycopg.Error as exc:
            raise _connection_error(exc) from None
        finally:
            await conn.close()


_SERVER_PID = "SELECT pg_backend_pid()"


def _pooler_answers(announced_pid: int, row: tuple[Any, ...] | None) -> bool:
    """A connection pooler in front (PgBouncer, RDS Proxy, Supavisor): the process id the
    connection announced at startup (its cancel key) is the pooler's own, not that of the
    server process that runs the statements."""
    return row is not None and row[0] != announced_pid


def _connection_error(exc: psycopg.Error) -> ProducerConnectionError | psycopg.Error:
    """The CLI's one line for `exc` (the shared mapping in errors.py), as a ProducerError."""
    from .._pg.errors import PRODUCER_URL, connection_problem

    problem = connection_problem(exc, PRODUCER_URL)
    if problem is None:
        return exc
    return ProducerConnectionError(problem.message, permanent=problem.permanent)


def _wait_for_subscription(timeout: float | None) -> float:
    return SUBSCRIBE_TIMEOUT if timeout is None else max(0.0, min(timeout, SUBSCRIBE_TIMEOUT))


def _event_params(key: str, payload: Any) -> dict[str, Any]:
    return {"key": validate_key("key", key), "payload": codec.encode(payload)}


def _send_params(job_id: int, topic: str, payload: Any) -> dict[str, Any]:
    message = build_message(job_id, topic, payload)
    return {"id": message.job_id, "topic": message.topic, "payload": message.payload_json}


def _sent(job_id: int, rows: Sequence[tuple[Any, ...]]) -> int:
    state, message_id = rows[0][MessageSent.state], rows[0][MessageSent.message_id]
    if message_id is None:
        raise message_refused(job_id, state)
    return int(message_id)


def _check_id(job_id: object) -> int:
    return validate_job_id(job_id)


def _value_params(job_id: object, key: object) -> dict[str, Any]:
    if key is None:
        raise ValueError("key: a value needs a key (a non-empty string)")
    return {"id": _check_id(job_id), "key": validate_key("key", key)}


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

    Constructing it connects once (at most `CHECK_TIMEOUT` seconds) and raises
    `trioq.ProducerConnectionError`, one line naming the cause and the fix, if that fails.
    `prepared_statements="off"` behind a transaction pooler (PgBouncer, RDS Proxy, Supavisor):
    unnamed statements only; result waits then LISTEN on `listen_url` (a direct connection),
    or poll once a second without one. All waits share one LISTEN connection. Fork-safe: a
    child process (gunicorn `--preload`, uWSGI, Celery prefork) opens its own pool and listener
    on first use and never touches the parent's connections.
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
        self._statements = _Statements(schema, _task_map(tasks), strict)
        self._settings = _Settings.of(
            conninfo, prepared_statements, listen_url, pool_size, connect_timeout
        )
        pooled = self._settings.check()
        self._prepared = _PreparedStatements(unnamed=prepared_statements == "off")
        if pooled:
            self._prepared.pooler_found()
        self._fork_lock = threading.Lock()
        self._generation = _FORKS.generation
        _FORKS.producers.add(self)
        self._pool = self._new_pool()
        self._results: SyncResultListener | None = None

    def _new_pool(self) -> ConnectionPool[SyncConnection]:
        from psycopg_pool import ConnectionPool

        settings = self._settings
        return ConnectionPool(
            settings.url,
            min_size=0,
            max_size=settings.pool_size,
            kwargs=settings.connect_kwargs,
            timeout=settings.connect_timeout,
            open=True,
        )

    def _this_process(self) -> None:
        """After a fork, leave the parent's pool and listener alone and start afresh."""
        if self._generation == _FORKS.generation:
            return
        with self._fork_lock:
            if self._generation == _FORKS.generation:
                return
            _LEFT_BY_PARENT.extend([self._pool, self._results])
            self._pool, self._results = self._new_pool(), None
            self._generation = _FORKS.generation

    def _result_listener(self) -> SyncResultListener | None:
        self._this_process()
        if self._settings.listen_url is None:
            return None
        with self._fork_lock:
            if self._results is None:
                from .listen import SyncResultListener

                self._results = SyncResultListener(
                    self._settings.listen_url, self._settings.listen_kwargs, self.schema
                )
            return self._results

    def statistics(self) -> ResultListenerStatistics | None:
        """The shared result listener's figures (None before the first wait, or without one)."""
        return None if self._results is None else self._results.statistics()

    def close(self) -> None:
        self._this_process()
        if self._results is not None:
            self._results.close()
        self._pool.close()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fetch(
        self, name_or_sql: str, params: Mapping[str, Any], conn: SyncConnection | None
    ) -> list[tuple[Any, ...]]:
        text = self._statements.sql.get(name_or_sql, name_or_sql)
        with self._statements.schema_required():
            if conn is not None:
                try:
                    return conn.execute(text, params).fetchall()
                except Exception as exc:
                    error = _caller_connection_error(exc)
                    if error is None:
                        raise
                    raise error from exc
            try:
                return self._fetch_pooled(text, params)
            except Exception as exc:
                if not self._prepared.switch_if_lost(exc):
                    raise
            return self._fetch_pooled(text, params)  # once more, unnamed (see _PreparedStatements)

    def _fetch_pooled(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self._this_process()
        with self._pool.connection() as pooled:
            self._prepared.apply(pooled)
            return pooled.execute(text, params).fetchall()

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
        self._check_name(task, conn)
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
        if not insert.jobs:
            return []
        self._check_name(task, conn)
        return insert.result(self._fetch(insert.text, insert.params, conn))

    def _check_name(self, task: str | TaskLike, conn: SyncConnection | None) -> None:
        name = self._statements.unchecked_name(task)
        if name is not None:
            [row] = self._fetch("task_served", self._statements.served_params(name), conn)
            self._statements.judge(name, bool(row[TaskServed.served]))

    def emit_event(
        self, key: str, payload: Any = None, *, conn: SyncConnection | None = None
    ) -> EventOutcome:
        """Store the event `key` and wake the jobs waiting for it (`ctx.wait_for_event`)."""
        text = self._statements.statement("event_emit")
        [row] = self._fetch(text, _event_params(key, payload), conn)
        return EventOutcome(
            first=bool(row[EventEmitted.emitted_first]), woken=int(row[EventEmitted.woken_count])
        )

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
        return str(rows[0][Cancelled.state])

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
        under it); raises ResultTimeout after `timeout` seconds. Every wait of this producer
        shares one LISTEN connection (never the caller's). The wait registers on the job's row
        first: a job nobody waits for ends without a notification."""
        job_id = _check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = self._result_listener()
        if results is None:
            event = threading.Event()  # never set: poll only
        else:
            event = results.watch(job_id, _wait_for_subscription(timeout))
        try:
            if results is not None:  # LISTEN, register, read (trioq.Client.wait_final)
                self._fetch("job_result_watch", {"id": job_id}, None)
            while True:
                record = self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                event.wait(min(left, RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(job_id, event)

    def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        """The job's result once it completes; JobFailed if it ended failed or cancelled."""
        return _final_result(self.wait_final(job_id, timeout))

    def get_value(
        self,
        job_id: int,
        key: str,
        *,
        wait: datetime.timedelta | float | None = None,
        conn: SyncConnection | None = None,
    ) -> Any:
        """The value the workflow `job_id` last published under `key` (`ctx.set_value`), as
        `trioq.Client.get_value`: with `wait`, block up to that long for the key to be set
        (woken by the job's result notifications, with a slow poll under them). Raises
        `trioq.ValueNotSet` or `trioq.JobNotFound`."""
        params = _value_params(job_id, key)
        seconds = seconds_option("wait", wait)
        if seconds is None:
            return ValueRead(*self._fetch("job_value_get", params, conn)[0]).answer(
                params["id"], key, None
            )
        deadline = time.monotonic() + seconds
        results = self._result_listener()
        if results is None:
            event = threading.Event()  # never set: poll only
        else:
            event = results.watch(params["id"], _wait_for_subscription(seconds))
        try:
            if results is not None:  # see wait_final
                self._fetch("job_result_watch", {"id": params["id"]}, None)
            while True:
                read = ValueRead(*self._fetch("job_value_get", params, None)[0])
                left = deadline - time.monotonic()
                if read.found or read.state in TERMINAL_STATES or read.state is None or left <= 0:
                    return read.answer(params["id"], key, seconds)
                event.wait(min(left, RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(params["id"], event)

    def values(self, job_id: int, *, conn: SyncConnection | None = None) -> list[WorkflowValue]:
        """Every value the job published, by key (`trioq.Client.values`)."""
        rows = self._fetch("job_values", {"id": _check_id(job_id)}, conn)
        return [WorkflowValue(*row) for row in rows]


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
        self._statements = _Statements(schema, _task_map(tasks), strict)
        self._settings = _Settings.of(
            conninfo, prepared_statements, listen_url, pool_size, connect_timeout
        )
        self._prepared = _PreparedStatements(unnamed=prepared_statements == "off")
        self._generation = _FORKS.generation
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
        if await self._settings.check_async():
            self._prepared.pooler_found()
        self._opened = True
        await self._ready_pool()

    async def _ready_pool(self) -> AsyncConnectionPool[AsyncConnection]:
        if self._generation != _FORKS.generation:  # see SyncProducer._this_process
            _LEFT_BY_PARENT.extend([self._pool, self._results])
            self._pool, self._results, self._pool_open = self._new_pool(), None, False
            self._generation = _FORKS.generation
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
                _LEFT_BY_PARENT.append(results)
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
                    error = _caller_connection_error(exc)
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
        async with pool.connection() as pooled:
            self._prepared.apply(pooled)
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
        [row] = await self._fetch(text, _event_params(key, payload), conn)
        return EventOutcome(
            first=bool(row[EventEmitted.emitted_first]), woken=int(row[EventEmitted.woken_count])
        )

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
        return str(rows[0][Cancelled.state])

    async def get_job(self, job_id: int, *, conn: AsyncConnection | None = None) -> JobRecord:
        rows = await self._fetch("job_get", {"id": _check_id(job_id)}, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return JobRecord(*rows[0])

    async def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Wait until the job is final; see `SyncProducer.wait_final`."""
        import asyncio  # see _result_listener

        job_id = _check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = self._result_listener()
        if results is None:
            event = asyncio.Event()  # never set: poll only
        else:
            event = await results.watch(job_id, _wait_for_subscription(timeout))
        try:
            if results is not None:  # see SyncProducer.wait_final
                await self._fetch("job_result_watch", {"id": job_id}, None)
            while True:
                record = await self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                with suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(job_id, event)

    async def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        return _final_result(await self.wait_final(job_id, timeout))

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

        params = _value_params(job_id, key)
        seconds = seconds_option("wait", wait)
        if seconds is None:
            rows = await self._fetch("job_value_get", params, conn)
            return ValueRead(*rows[0]).answer(params["id"], key, None)
        deadline = time.monotonic() + seconds
        results = self._result_listener()
        if results is None:
            event = asyncio.Event()  # never set: poll only
        else:
            event = await results.watch(params["id"], _wait_for_subscription(seconds))
        try:
            if results is not None:  # see SyncProducer.wait_final
                await self._fetch("job_result_watch", {"id": params["id"]}, None)
            while True:
                read = ValueRead(*(await self._fetch("job_value_get", params, None))[0])
                left = deadline - time.monotonic()
                if read.found or read.state in TERMINAL_STATES or read.state is None or left <= 0:
                    return read.answer(params["id"], key, seconds)
                with suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(params["id"], event)

    async def values(
        self, job_id: int, *, conn: AsyncConnection | None = None
    ) -> list[WorkflowValue]:
        """See `SyncProducer.values`."""
        rows = await self._fetch("job_values", {"id": _check_id(job_id)}, conn)
        return [WorkflowValue(*row) for row in rows]
