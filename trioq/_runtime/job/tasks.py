"""Registered tasks: what the runtime needs to know to run one kind of job."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from ..._core.codec import Undecodable, structure_payload
from ..._core.concurrency import KeyTemplate, validate_limit, validate_template
from ..._core.identifiers import validate_name
from ..._core.retry import DEFAULT_MAX_ATTEMPTS, RetryPolicy

# An `async def` handler, or a plain `def` one that the executor runs in a worker thread.
Handler = Callable[..., Awaitable[Any]] | Callable[..., Any]

DEFAULT_HISTORY_LIMIT = 10_000


@attrs.frozen
class TaskSpec:
    name: str
    handler: Handler
    queue: str = "default"
    max_attempts: int = 5
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    timeout: float | None = None
    # Seconds from enqueue the whole workflow has (docs/flow-control.md, "Timeouts and
    # deadlines"); the client stores it as each job's deadline unless the enqueue gives one.
    deadline: float | None = None
    payload_type: Any = None  # an attrs class (structured by cattrs) or None for plain JSON
    version: int = 1  # handler version: a job runs only on workers serving its (task, version)
    # Checkpoints a workflow may record before it must continue as new (docs/workflows.md).
    history_limit: int = DEFAULT_HISTORY_LIMIT
    # Each job's concurrency key from its payload, and the limit per key (docs/flow-control.md).
    concurrency_key: KeyTemplate | None = None
    concurrency_limit: int | None = None
    # False: a completed job of the task is deleted, not kept (App.task's `keep`).
    keep: bool = True
    # A plain `def` handler: it runs in a worker thread (docs/handlers.md). Decided once here,
    # not per job.
    sync: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        validate_name("task", self.name)
        validate_name("queue", self.queue)
        handler = self.handler
        if (
            not callable(handler)
            or inspect.isasyncgenfunction(handler)
            or inspect.isgeneratorfunction(handler)
        ):
            raise TypeError(
                f"task {self.name!r}: the handler must be an `async def` or a plain `def` "
                "function taking (ctx, payload)"
            )
        object.__setattr__(self, "sync", not inspect.iscoroutinefunction(handler))
        if self.max_attempts < 1:
            raise ValueError(f"task {self.name!r}: max_attempts must be >= 1")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"task {self.name!r}: version must be an integer >= 1")
        if (
            isinstance(self.history_limit, bool)
            or not isinstance(self.history_limit, int)
            or self.history_limit < 1
        ):
            raise ValueError(f"task {self.name!r}: history_limit must be an integer >= 1")
        validate_template(self.concurrency_key)
        if self.concurrency_limit is not None:
            validate_limit("concurrency_limit", self.concurrency_limit)
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"task {self.name!r}: timeout must be > 0 seconds")
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"task {self.name!r}: deadline must be a positive timedelta")

    @property
    def pair(self) -> str:
        """`task@version`, as workers advertise it ('@' cannot occur in a task name)."""
        return f"{self.name}@{self.version}"

    def load_payload(self, payload: Any) -> Any:
        if type(payload) is Undecodable:
            raise payload.error("payload")
        if self.payload_type is None:
            return payload
        # None for a class whose fields all have defaults (the producer accepted it).
        return structure_payload({} if payload is None else payload, self.payload_type)


def payload_type_of(handler: Handler) -> Any:
    """The attrs class a handler's second parameter is annotated with, else None."""
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) < 2:
        raise TypeError(f"{handler.__qualname__}: a handler takes (ctx, payload)")
    try:
        hints = typing.get_type_hints(handler)
    except NameError as exc:
        raise TypeError(
            f"{handler.__qualname__}: cannot resolve the payload annotation ({exc}); define "
            f"the payload class at module level"
        ) from None
    annotation = hints.get(parameters[1].name)
    return annotation if isinstance(annotation, type) and attrs.has(annotation) else None


class _Declaration(typing.Protocol):
    @property
    def name(self) -> str: ...

    @property
    def max_attempts(self) -> int | None: ...


def task_max_attempts(
    declared: _Declaration, max_attempts: int | None, retry: RetryPolicy | None
) -> int:
    """A task's attempts from its declaration: `max_attempts`, else `retry.max_attempts`, else
    the shared declaration's, else 5. Two of them given with different numbers is an error:
    silently preferring one is how a `RetryPolicy(max_attempts=2)` came to be ignored."""
    from_retry = None if retry is None else retry.max_attempts
    sources = [
        ("max_attempts", max_attempts),
        ("retry=RetryPolicy(max_attempts=...)", from_retry),
        ("the TaskDeclaration's max_attempts", declared.max_attempts),
    ]
    given: list[tuple[str, int]] = [(label, value) for label, value in sources if value is not None]
    # The explicit argument may override the shared declaration (documented); retry may not
    # disagree with either.
    if max_attempts is not None:
        given = [item for item in given if item[0] != "the TaskDeclaration's max_attempts"]
    if len({value for _, value in given}) > 1:
        listed = " and ".join(f"{label} = {value}" for label, value in given)
        raise ValueError(
            f"task {declared.name!r}: {listed} disagree; give the task's attempts once"
        )
    return given[0][1] if given else DEFAULT_MAX_ATTEMPTS
