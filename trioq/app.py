"""`trioq.App`: the registry of tasks plus the way in to clients and workers."""

from __future__ import annotations

import contextvars
import datetime
import importlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from ._core.concurrency import KeyTemplate, validate_pattern
from ._core.errors import ConfigurationError
from ._core.identifiers import validate_name, validate_prepared_statements, validate_schema
from ._core.limits import Rate, parse_global_limit, parse_rate
from ._core.retry import RetryPolicy
from ._core.schedule import DEFAULT_CATCHUP_LIMIT, Cron, validate_catchup_limit, validate_misfire
from ._enqueue.rows import Enqueuer, TaskDeclaration, check_deadline
from ._pg.libpq import DATABASE_URL_ENV as DATABASE_URL_ENV  # re-exported: its old home
from ._runtime.job.active import ACTIVE_CLIENT
from ._runtime.job.claim_loop import WorkerHooks
from ._runtime.job.tasks import (
    DEFAULT_HISTORY_LIMIT,
    Handler,
    TaskSpec,
    payload_type_of,
    task_max_attempts,
)
from ._runtime.services.worker import Worker, WorkerConfig
from ._seam.admin import QueueLimitSet
from ._seam.driver import Driver
from ._seam.schedules import NewSchedule
from .client import Client, _ResultWatcher
from .schedules import new_schedule


def load_app(path: str) -> App:
    """Import `module:attribute` (the current directory is importable) and return the App.

    Raises ConfigurationError naming what is wrong (the CLI prints it as one line).
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"APP_PATH: {path!r} must look like module:attribute")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _import_error(module_name, exc) from exc
    except SyntaxError as exc:
        raise ConfigurationError(
            f"APP_PATH: {exc.filename}, line {exc.lineno}: {exc.msg} (fix the app module)"
        ) from exc
    app = getattr(module, attribute, None)
    if app is None:
        raise ConfigurationError(f"APP_PATH: module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(app, App):
        raise ConfigurationError(f"APP_PATH: {path!r} is a {type(app).__name__}, not a trioq.App")
    return app


def _import_error(module_name: str, exc: ModuleNotFoundError) -> ConfigurationError:
    """Not found is one thing (wrong directory, not installed); a module that was found but
    imports one that is missing is another (install that dependency)."""
    missing = exc.name or ""
    if missing == module_name or module_name.startswith(missing + "."):
        return ConfigurationError(
            f"APP_PATH: cannot import module {module_name!r} ({exc}); run from the directory "
            f"that contains it or install it"
        )
    return ConfigurationError(
        f"APP_PATH: module {module_name!r} was found, but it imports {missing!r}, which is not "
        f"installed: install it into the environment trioq runs in"
    )


def queue_limit_changes(
    limits: Mapping[str, int | None], rates: Mapping[str, str | None]
) -> tuple[QueueLimitSet, ...]:
    """The App's declared limits as the changes a starting worker writes (a queue named in
    one mapping keeps the other limit as stored)."""
    changes = []
    for queue in sorted({*limits, *rates}):
        validate_name("queue_limits" if queue in limits else "queue_rates", queue)
        changes.append(
            QueueLimitSet(
                queue,
                set_limit=queue in limits,
                global_limit=parse_global_limit(f"queue_limits[{queue!r}]", limits.get(queue)),
                set_rate=queue in rates,
                rate=parse_rate(f"queue_rates[{queue!r}]", rates.get(queue)),
            )
        )
    return tuple(changes)


def key_rate_changes(rates: Mapping[str, str | None]) -> tuple[tuple[str, Rate | None], ...]:
    """The App's declared key rates, checked, as (pattern, rate) pairs a starting worker
    writes (None removes that pattern's rate)."""
    changes = []
    for pattern in sorted(rates):
        validate_pattern(pattern)
        changes.append((pattern, parse_rate(f"key_rates[{pattern!r}]", rates[pattern])))
    return tuple(changes)


class App:
    """Tasks are registered with `@app.task(name)`; `app.client()` opens the database pool.

    Behind a transaction pooler (PgBouncer, RDS Proxy, Supavisor in transaction mode) pass
    `prepared_statements="off"`: unnamed statements only, no startup options, nothing SET for
    the session. LISTEN then goes to `listen_url` (a direct connection), or nowhere: the
    worker polls and `wait_result` polls once a second (docs/operations.md).
    """

    def __init__(
        self,
        database_url: str | None = None,
        schema: str = "trioq",
        *,
        pool_size: int = 10,
        prepared_statements: str = "auto",
        listen_url: str | None = None,
        queue_limits: Mapping[str, int | None] | None = None,
        queue_rates: Mapping[str, str | None] | None = None,
        key_rates: Mapping[str, str | None] | None = None,
    ) -> None:
        self.schema = validate_schema(schema)
        # Cluster-wide limits (docs/flow-control.md), checked here and written by each worker
        # as it starts: `queue_limits={"partner": 5}`, `queue_rates={"partner": "100/m"}`.
        self.queue_limits = queue_limit_changes(queue_limits or {}, queue_rates or {})
        # Per concurrency key pattern: `key_rates={"tenant:*": "10/s"}`, written the same way.
        self.key_rates = key_rate_changes(key_rates or {})
        self.database_url = database_url
        self.pool_size = pool_size
        self.prepared_statements = validate_prepared_statements(prepared_statements)
        self.listen_url = listen_url
        self.tasks: dict[str, TaskSpec] = {}
        self.schedules: dict[str, NewSchedule] = {}  # declared with `periodic`
        # Every registered (task, version); `tasks` holds each task's highest version.
        self.versions: dict[tuple[str, int], TaskSpec] = {}
        # The open client of the current task and the tasks it starts (a context variable, not
        # an attribute: sibling tasks that each open `client()` get their own pools, and one
        # closing cannot pull the pool from under the other).
        self._client_var: contextvars.ContextVar[Client | None] = contextvars.ContextVar(
            f"trioq_client_{id(self)}", default=None
        )

    def task(
        self,
        name: str | TaskDeclaration,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        version: int | None = None,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        concurrency_key: KeyTemplate | None = None,
        concurrency_limit: int | None = None,
        deadline: datetime.timedelta | None = None,
        keep: bool = True,
    ) -> Callable[[Handler], Handler]:
        """Register an async handler `(ctx, payload)` for jobs of task `name`.

        `version` (default 1, or the declaration's): register several versions of one task to
        let jobs enqueued for an older one drain across a deploy. A job records the highest
        version registered by the app that enqueues it and runs only on workers serving that
        (task, version).

        `name` may be a `trioq.TaskDeclaration` shared with producers: its queue, max_attempts
        and payload class are then the task's (explicit arguments still win).

        The task's attempts are `max_attempts`, else `retry.max_attempts`, else the
        declaration's, else 5; two of them given with different numbers raise ValueError here.
        They apply to every job of the task that does not carry its own (docs/producers.md,
        "Which option wins").

        `history_limit`: a workflow of this task that would record more checkpoints fails, its
        error naming `ctx.continue_as_new` (a warning is logged at 80%).

        `concurrency_key` (a template over the payload's fields, `"tenant:{tenant_id}"`, or a
        callable of the payload) gives each job a key; at most `concurrency_limit` jobs of one
        key run at once across the cluster (default 1; `trioq key limit` overrides it without
        a restart). See docs/flow-control.md.
        `deadline` (a timedelta): each job of the task enqueued by this app without its own
        `deadline=` must be finished that long after its enqueue, or it is cancelled.
        `keep=False`: a job of the task that completes is deleted in the statement that would
        mark it completed (no result, attempts, history or values are kept; Celery's
        `ignore_result`, graphile-worker's delete on success). Failed and cancelled jobs are
        kept, and so is a workflow's child (its parent reads the outcome). See docs/api.md.
        """
        if not isinstance(keep, bool):
            raise ValueError(f"keep: {keep!r} must be True or False")
        if deadline is not None and not isinstance(deadline, datetime.timedelta):
            raise ValueError(f"deadline: {deadline!r} must be a positive timedelta")
        deadline_seconds = check_deadline(deadline)
        declared = name if isinstance(name, TaskDeclaration) else TaskDeclaration(name)
        version = declared.version if version is None else version
        attempts = task_max_attempts(declared, max_attempts, retry)

        def register(handler: Handler) -> Handler:
            if (declared.name, version) in self.versions:
                raise ValueError(f"task: {declared.name!r} version {version} is already registered")
            payload_type = payload_type_of(handler)
            if declared.payload_type is not None and payload_type not in (
                None,
                declared.payload_type,
            ):
                raise TypeError(
                    f"task {declared.name!r}: the handler takes {payload_type.__name__} but "
                    f"the declaration says {declared.payload_type.__name__}"
                )
            spec = TaskSpec(
                name=declared.name,
                handler=handler,
                queue=declared.queue if queue is None else queue,
                max_attempts=attempts,
                retry=retry or RetryPolicy(),
                timeout=timeout,
                deadline=deadline_seconds if isinstance(deadline_seconds, float) else None,
                payload_type=payload_type or declared.payload_type,
                version=version,
                history_limit=history_limit,
                concurrency_key=(
                    declared.concurrency_key if concurrency_key is None else concurrency_key
                ),
                concurrency_limit=(
                    declared.concurrency_limit if concurrency_limit is None else concurrency_limit
                ),
                keep=keep,
            )
            self.versions[(spec.name, version)] = spec
            latest = self.tasks.get(spec.name)
            if latest is None or latest.version < version:
                self.tasks[spec.name] = spec  # enqueue defaults come from the highest version
            return handler

        return register

    def with_database(self, database_url: str | None, schema: str | None = None) -> App:
        """A copy of this app (same tasks) on another database or schema; tests use it to run
        the real app on a throwaway schema. The copy has its own client."""
        copy = App(
            database_url,
            schema or self.schema,
            pool_size=self.pool_size,
            prepared_statements=self.prepared_statements,
            listen_url=self.listen_url,
        )
        for name, value in vars(self).items():
            if name not in (
                "schema",
                "database_url",
                "pool_size",
                "prepared_statements",
                "listen_url",
                "_client_var",
            ):
                setattr(copy, name, dict(value) if isinstance(value, dict) else value)
        return copy

    def current_client(self) -> Client | None:
        """The client `app.client()` opened in this task (or the task that started it)."""
        return self._client_var.get()

    @asynccontextmanager
    async def isolated_client(self, driver: Driver) -> AsyncIterator[Client]:
        """A client on `driver` even inside another `app.client()` block (test helpers run a
        job on a private in-memory driver this way)."""
        async with self._hosting_listener(driver) as client:
            yield client

    def periodic(
        self,
        name: str,
        *,
        cron: str,
        timezone: str = "UTC",
        payload: Any = None,
        misfire: str = "latest",
        catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
        task: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Declare a cron schedule named `name`; workers of this app store it at start.

        As a decorator above (or instead of) `@app.task`, it schedules that handler (an
        undecorated handler is registered as task `name`). With `task=`, it schedules an
        already registered task and the returned decorator is not needed. Bad expressions,
        time zones and policies raise ValueError here, at declaration.
        """
        Cron(cron, timezone)
        validate_misfire(misfire)
        validate_catchup_limit(catchup_limit)

        def declare(task_name: str) -> None:
            if name in self.schedules:
                raise ValueError(f"periodic: schedule {name!r} is already declared")
            spec = self.tasks.get(task_name)
            if spec is None:
                raise ValueError(
                    f"task: {task_name!r} is not registered (register it before its schedule)"
                )
            self.schedules[name] = new_schedule(
                name,
                spec,
                cron=cron,
                timezone=timezone,
                payload=payload,
                misfire=misfire,
                catchup_limit=catchup_limit,
                origin="code",
            )

        def decorate(handler: Handler) -> Handler:
            registered = next(
                (spec.name for spec in self.versions.values() if spec.handler is handler), None
            )
            if registered is None:
                self.task(name)(handler)
                registered = name
            declare(registered)
            return handler

        if task is not None:
            declare(task)
            return lambda handler: handler
        return decorate

    @property
    def listens(self) -> bool:
        """Whether this app's connections LISTEN for notifications: not behind a transaction
        pooler (`prepared_statements="off"`) unless `listen_url` says where."""
        return self.listen_url is not None or self.prepared_statements != "off"

    def resolve_database_url(self) -> str:
        url = self.database_url or os.environ.get(DATABASE_URL_ENV)
        if not url:
            raise ConfigurationError(
                f"database_url: not given and {DATABASE_URL_ENV} is not set "
                f"(`trioq demo` starts an embedded PostgreSQL instead)"
            )
        return url

    @asynccontextmanager
    async def client(
        self, *, migrate: bool = False, driver: Driver | None = None
    ) -> AsyncIterator[Client]:
        """Open the pool (or use `driver`, e.g. the in-memory one) and yield a Client.

        Nested `client()` blocks share the outer one's pool. With `migrate=True` the schema is
        created or upgraded first (under an advisory lock; safe from many processes at once).
        """
        current = self._client_var.get()
        if current is not None:
            yield current
            return
        async with self._open_driver(driver) as opened:
            if migrate:
                await opened.migrate()
            async with self._hosting_listener(opened) as client:
                yield client

    @asynccontextmanager
    async def _hosting_listener(self, driver: Driver) -> AsyncIterator[Client]:
        """A Client whose result listener lives in a nursery around the caller's block."""
        body_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                client = Client(driver, Enqueuer(self.tasks), _ResultWatcher(driver, nursery))
                token = self._client_var.set(client)
                active = ACTIVE_CLIENT.set(client)
                try:
                    yield client
                except BaseException as exc:
                    body_error = exc
                    raise
                finally:
                    self._client_var.reset(token)
                    ACTIVE_CLIENT.reset(active)
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The block's own exception comes out as itself, not wrapped by the nursery that
            # only hosts the result listener: `except KeyError` around `client()` works.
            if body_error is not None and list(group.exceptions) == [body_error]:
                raise body_error from None
            raise

    @asynccontextmanager
    async def _open_driver(self, driver: Driver | None) -> AsyncIterator[Driver]:
        if driver is not None:
            yield driver
            return
        from ._pg.driver import open_pg_driver  # imported here: psycopg stays behind the seam

        async with open_pg_driver(
            self.resolve_database_url(),
            self.schema,
            pool_size=self.pool_size,
            prepared_statements=self.prepared_statements,
            listen_conninfo=self.listen_url,
        ) as pg_driver:
            yield pg_driver

    def worker(
        self,
        queues: Mapping[str, int] | list[str] | tuple[str, ...] | None = None,
        concurrency: int = 10,
        *,
        hooks: WorkerHooks | None = None,
        **config: Any,
    ) -> Worker:
        """A Worker on the open client's driver (see `run_worker`)."""
        client = self._client_var.get()
        if client is None:
            raise ConfigurationError("run_worker: open `app.client()` first")
        if not self.tasks:
            raise ConfigurationError("run_worker: the app has no registered tasks")
        if not self.listens:
            if config.get("notifications"):
                raise ConfigurationError(
                    "notifications: with prepared_statements='off' (a transaction pooler) "
                    "LISTEN needs listen_url, a direct connection; give one, or poll only"
                )
            config["notifications"] = False
        # A mapping gives each queue its own slots (`{"default": 25, "mail": 2}`).
        if isinstance(queues, Mapping):
            config["queue_concurrency"] = tuple(queues.items())
        worker_config = WorkerConfig(
            queues=tuple(queues or ("default",)), concurrency=concurrency, **config
        )
        return Worker(
            driver=client.driver,
            tasks=dict(self.tasks),
            versions=dict(self.versions),
            config=worker_config,
            schedules=tuple(self.schedules.values()),
            hooks=hooks or WorkerHooks(),
            # handlers' wait_result shares the worker's LISTEN connection (no second one)
            listener_guest=client._watcher,
        )

    async def run_worker(
        self,
        queues: Mapping[str, int] | list[str] | tuple[str, ...] | None = None,
        concurrency: int = 10,
        *,
        hooks: WorkerHooks | None = None,
        task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED,
        **config: Any,
    ) -> None:
        """Run a worker inside this program until it is drained (`worker.request_drain()`)
        or cancelled. `queues` is a list of names (each gets `concurrency` slots) or a mapping
        of name to slots (`{"default": 25, "mail": 2}`). Use
        `await nursery.start(app.run_worker, ...)` to get the Worker."""
        worker = self.worker(queues, concurrency, hooks=hooks, **config)
        for change in self.queue_limits:
            await worker.driver.queue_limit_set(change)
        for pattern, rate in self.key_rates:
            await worker.driver.concurrency_rate_set(pattern, rate)
        await worker.run(task_status=task_status)
