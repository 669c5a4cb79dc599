"""The synchronous producer (Django, Flask, scripts): psycopg's sync connections and
psycopg_pool, thread-safe and fork-safe (docs/producers.md).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
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
    from psycopg_pool import ConnectionPool

    from .listen import (
        ResultListenerStatistics,
        SyncResultListener,
    )
from . import shared
from .shared import (
    FORKS,
    LEFT_BY_PARENT,
    PreparedStatements,
    Settings,
    Statements,
    SyncConnection,
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
        self._statements = Statements(schema, task_map(tasks), strict)
        self._settings = Settings.of(
            conninfo, prepared_statements, listen_url, pool_size, connect_timeout
        )
        pooled = self._settings.check(self._statements.sql["server_pid"])
        self._prepared = PreparedStatements(unnamed=prepared_statements == "off")
        if pooled:
            self._prepared.pooler_found()
            self._settings = self._settings.behind_pooler()
        self._fork_lock = threading.Lock()
        self._generation = FORKS.generation
        FORKS.producers.add(self)
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
        if self._generation == FORKS.generation:
            return
        with self._fork_lock:
            if self._generation == FORKS.generation:
                return
            LEFT_BY_PARENT.extend([self._pool, self._results])
            self._pool, self._results = self._new_pool(), None
            self._generation = FORKS.generation

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
                    error = caller_connection_error(exc)
                    if error is None:
                        raise
                    raise error from exc
            try:
                return self._fetch_pooled(text, params)
            except Exception as exc:
                if not self._prepared.switch_if_lost(exc):
                    raise
            return self._fetch_pooled(text, params)  # once more, unnamed (see PreparedStatements)

    def _fetch_pooled(self, text: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        self._this_process()
        # Here, not at the top: psycopg loads with a producer's first connection. A statement
        # that waited for a row a finishing job moved runs again, as the driver's do.
        from .._pg.errors import MOVED_ROW_ATTEMPTS, is_moved_row

        for attempt in range(MOVED_ROW_ATTEMPTS):
            try:
                with self._pool.connection() as pooled:
                    self._prepared.apply(pooled)
                    return pooled.execute(text, params).fetchall()
            except Exception as exc:
                if not is_moved_row(exc) or attempt == MOVED_ROW_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

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
        [row] = self._fetch(text, event_params(key, payload), conn)
        return EventOutcome(
            first=bool(row[EventEmitted.emitted_first]), woken=int(row[EventEmitted.woken_count])
        )

    def send(
        self, job_id: int, topic: str, payload: Any = None, *, conn: SyncConnection | None = None
    ) -> int:
        """Send a message to a workflow (see `trioq.Client.send`); returns the message id."""
        return message_sent(
            job_id, self._fetch("message_send", send_params(job_id, topic, payload), conn)
        )

    def cancel(self, job_id: int, *, conn: SyncConnection | None = None) -> str:
        """Cancel a job (see `trioq.Client.cancel`); returns its state after the request."""
        params = {"id": check_id(job_id), "control_channel": control_channel(self.schema)}
        rows = self._fetch("job_cancel", params, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return str(rows[0][Cancelled.state])

    @property
    def schema(self) -> str:
        return self._statements.schema

    def get_job(self, job_id: int, *, conn: SyncConnection | None = None) -> JobRecord:
        rows = self._fetch("job_get", {"id": check_id(job_id)}, conn)
        if not rows:
            raise JobNotFound(f"job_id: no job {job_id}")
        return JobRecord(*rows[0])

    def wait_final(self, job_id: int, timeout: float | None = 30.0) -> JobRecord:
        """Block until the job is final (woken by its result notification, with a slow poll
        under it); raises ResultTimeout after `timeout` seconds. Every wait of this producer
        shares one LISTEN connection (never the caller's). The wait registers on the job's row
        first: a job nobody waits for ends without a notification."""
        job_id = check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = self._result_listener()
        if results is None:
            event = threading.Event()  # never set: poll only
        else:
            event = results.watch(job_id, wait_for_subscription(timeout))
        try:
            if results is not None:  # LISTEN, register, read (trioq.Client.wait_final)
                self._fetch("job_result_watch", {"id": job_id}, None)
                self._fetch("job_result_watch_run", {"id": job_id}, None)
            while True:
                record = self.get_job(job_id)
                if record.state in TERMINAL_STATES:
                    return record
                left = (
                    shared.RESULT_POLL_SECONDS if deadline is None else deadline - time.monotonic()
                )
                if left <= 0:
                    raise ResultTimeout(f"job {job_id} is still {record.state} after {timeout}s")
                event.wait(min(left, shared.RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(job_id, event)

    def wait_result(self, job_id: int, timeout: float | None = 30.0) -> Any:
        """The job's result once it completes; JobFailed if it ended failed or cancelled."""
        return final_result(self.wait_final(job_id, timeout))

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
        params = value_params(job_id, key)
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
            event = results.watch(params["id"], wait_for_subscription(seconds))
        try:
            if results is not None:  # see wait_final
                self._fetch("job_result_watch", {"id": params["id"]}, None)
                self._fetch("job_result_watch_run", {"id": params["id"]}, None)
            while True:
                read = ValueRead(*self._fetch("job_value_get", params, None)[0])
                left = deadline - time.monotonic()
                if read.found or read.state in TERMINAL_STATES or read.state is None or left <= 0:
                    return read.answer(params["id"], key, seconds)
                event.wait(min(left, shared.RESULT_POLL_SECONDS))
                event.clear()
        finally:
            if results is not None:
                results.forget(params["id"], event)

    def values(self, job_id: int, *, conn: SyncConnection | None = None) -> list[WorkflowValue]:
        """Every value the job published, by key (`trioq.Client.values`)."""
        rows = self._fetch("job_values", {"id": check_id(job_id)}, conn)
        return [WorkflowValue(*row) for row in rows]
