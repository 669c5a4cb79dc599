"""What the producers for code that is not trio share: the synchronous one (`sync.py`: Django,
Flask, scripts) and the asyncio one (`aio.py`: FastAPI, aiohttp), on psycopg's own sync and
async connections and psycopg_pool.

They run the statements of queries.sql (the same `job_insert_batch`, `job_insert_many`,
`job_get`, `job_cancel`, `event_emit` the trio driver runs) and build rows with
`trioq._enqueue.rows.build_jobs`, so validation, uniqueness and notifications are those of
`trioq.Client`. They need no handlers: a task is named by a string (queue and options given,
or defaults) or by a shared `trioq.TaskDeclaration`. Both accept the caller's own psycopg
connection (`conn=`) so the enqueue commits or rolls back with the caller's transaction.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import attrs

from .._core import codec
from .._core.errors import (
    JobFailed,
    ProducerConnectionError,
    ProducerError,
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
from .._core.states import JobState
from .._enqueue.rows import (
    EnqueueOptions,
    Job,
    TaskDeclaration,
    TaskLike,
    build_jobs,
    build_message,
    message_refused,
    to_jobs,
)
from .._pg.inserts import insert_statement, inserted_jobs
from .._pg.libpq import DATABASE_URL_ENV, network_defaults
from .._pg.replies import MessageSent, ServerPid
from .._seam.records import JobRecord, NewJob
from .._sql import queries

if TYPE_CHECKING:
    # psycopg, psycopg_pool and the result listeners are imported when a producer first
    # connects: `import trioq.producer` costs a web process only what it uses (docs/producers.md).
    import psycopg


logger = logging.getLogger("trioq.producer")

RESULT_POLL_SECONDS = 1.0  # safety net under the result notifications
# Opening a producer connects once, to fail at once with the cause (psycopg_pool would retry
# in the background and raise PoolTimeout after `connect_timeout`, the cause only in its log).
CHECK_TIMEOUT = 3
# How long a wait_final waits for its channel's LISTEN before it reads the job's state anyway.
SUBSCRIBE_TIMEOUT = 5.0

SyncConnection: TypeAlias = "psycopg.Connection[Any]"
AsyncConnection: TypeAlias = "psycopg.AsyncConnection[Any]"


class _ForkLocked(Protocol):
    """A producer as the fork count sees it: a lock its threads share within one process."""

    _fork_lock: threading.Lock


@attrs.define
class _ForkCount:
    """Forks of this process so far, as seen by the child (`os.register_at_fork`)."""

    generation: int = 0
    producers: weakref.WeakSet[_ForkLocked] = attrs.field(factory=weakref.WeakSet)

    def forked(self) -> None:
        self.generation += 1
        for producer in self.producers:
            # Another thread of the parent may have held it at the fork: that thread is gone.
            producer._fork_lock = threading.Lock()


FORKS = _ForkCount()
os.register_at_fork(after_in_child=FORKS.forked)
# A child keeps its parent's pools and listeners referenced: their connections are the parent's
# sockets (closing them would end the parent's sessions), their threads did not survive the
# fork, and their finalisers would only warn.
LEFT_BY_PARENT: list[object] = []


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
class Statements:
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
class PreparedStatements:
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
            "to say so. Results are polled (every %ss) unless listen_url= names a direct "
            "connection for their notifications",
            RESULT_POLL_SECONDS,
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


def caller_connection_error(exc: BaseException) -> ProducerConnectionError | None:
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
class Settings:
    """What both producers connect with (see `SyncProducer`)."""

    url: str = attrs.field(repr=False)  # holds the password
    # None: poll for results (a transaction pooler and no listen URL)
    listen_url: str | None = attrs.field(repr=False)
    connect_kwargs: dict[str, Any] = attrs.field(repr=False)
    pool_size: int
    connect_timeout: float
    listen_given: bool = False  # the caller named a listen URL (else it is the database URL)

    def behind_pooler(self) -> Settings:
        """A pooler answered at open: without a listen URL of its own, results are polled. A
        LISTEN through a transaction pooler is lost: the server connection it ran on goes back
        to the pool, and its notifications to whichever client holds it next."""
        if self.listen_given:
            return self
        return attrs.evolve(self, listen_url=None)

    @classmethod
    def of(
        cls,
        conninfo: str | None,
        prepared_statements: str,
        listen_url: str | None,
        pool_size: int,
        connect_timeout: float,
    ) -> Settings:
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
        given = listen_url is not None
        if listen_url is None and not off:
            listen_url = url
        return cls(url, listen_url, kwargs, pool_size, connect_timeout, given)

    @property
    def _check_kwargs(self) -> dict[str, Any]:
        return {**self.connect_kwargs, "connect_timeout": CHECK_TIMEOUT}

    @property
    def listen_kwargs(self) -> dict[str, Any]:
        return {**self.connect_kwargs, "prepare_threshold": None}

    def check(self, server_pid: str) -> bool:
        """Connect once (bounded by CHECK_TIMEOUT): ProducerConnectionError naming the fix.
        True if a connection pooler answered (see `_pooler_answers`)."""
        import psycopg

        try:
            with psycopg.connect(self.url, **self._check_kwargs) as conn:
                if self.connect_kwargs.get("prepare_threshold", 5) is None:
                    return False  # "off": nothing to find out
                return _pooler_answers(conn.info.backend_pid, conn.execute(server_pid).fetchone())
        except psycopg.Error as exc:
            raise _connection_error(exc) from None

    async def check_async(self, server_pid: str) -> bool:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self.url, **self._check_kwargs)
        except psycopg.Error as exc:
            raise _connection_error(exc) from None
        try:
            if self.connect_kwargs.get("prepare_threshold", 5) is None:
                return False
            row = await (await conn.execute(server_pid)).fetchone()
            return _pooler_answers(conn.info.backend_pid, row)
        except psycopg.Error as exc:
            raise _connection_error(exc) from None
        finally:
            await conn.close()


def _pooler_answers(announced_pid: int, row: tuple[Any, ...] | None) -> bool:
    """A connection pooler in front (PgBouncer, RDS Proxy, Supavisor): the process id the
    connection announced at startup (its cancel key) is the pooler's own, not that of the
    server process that runs the statements."""
    return row is not None and row[ServerPid.pid] != announced_pid


def _connection_error(exc: psycopg.Error) -> ProducerConnectionError | psycopg.Error:
    """The CLI's one line for `exc` (the shared mapping in errors.py), as a ProducerError."""
    from .._pg.errors import PRODUCER_URL, connection_problem

    problem = connection_problem(exc, PRODUCER_URL)
    if problem is None:
        return exc
    return ProducerConnectionError(problem.message, permanent=problem.permanent)


def wait_for_subscription(timeout: float | None) -> float:
    return SUBSCRIBE_TIMEOUT if timeout is None else max(0.0, min(timeout, SUBSCRIBE_TIMEOUT))


def event_params(key: str, payload: Any) -> dict[str, Any]:
    return {"key": validate_key("key", key), "payload": codec.encode(payload)}


def send_params(job_id: int, topic: str, payload: Any) -> dict[str, Any]:
    message = build_message(job_id, topic, payload)
    return {"id": message.job_id, "topic": message.topic, "payload": message.payload_json}


def message_sent(job_id: int, rows: Sequence[tuple[Any, ...]]) -> int:
    state, message_id = rows[0][MessageSent.state], rows[0][MessageSent.message_id]
    if message_id is None:
        raise message_refused(job_id, state)
    return int(message_id)


def check_id(job_id: object) -> int:
    return validate_job_id(job_id)


def value_params(job_id: object, key: object) -> dict[str, Any]:
    if key is None:
        raise ValueError("key: a value needs a key (a non-empty string)")
    return {"id": check_id(job_id), "key": validate_key("key", key)}


def final_result(record: JobRecord) -> Any:
    if record.state != JobState.COMPLETED:
        raise JobFailed(f"job {record.id} ended {record.state}: {record.error}", record)
    return record.result


def task_map(tasks: Iterable[TaskLike]) -> dict[str, TaskLike]:
    return {task.name: task for task in tasks}
