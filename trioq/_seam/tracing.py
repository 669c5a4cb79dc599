"""Optional OpenTelemetry tracing (the `trioq[otel]` extra: `pip install trioq[otel]`).

- At enqueue, the enqueuer's current trace context (W3C `traceparent`) is stored with the job
  (`jobs.trace_context`, migration 0005).
- Each handler run is a span `trioq.job <task>` (kind CONSUMER) *linked* to that context (a
  link, not a parent: a job may run long after, and more than once), current while the handler
  runs, so the handler's own spans nest under it; its trace id goes into the failure log line
  and the attempt's row (`attempts.trace_id`).
- That span's trace id is the execution's lease token (a random 128-bit UUID the claim already
  writes), and the claim marks the row `traced` (migration 0022). So lease recovery, which never
  saw the span of a worker that died, writes the token as the lost attempt's trace id: every
  attempt row of a traced execution names its trace, at no extra write. This needs the SDK's
  `TracerProvider` (its tracers take an `id_generator`); with another provider, spans keep
  the provider's ids and the claim marks nothing, so lost attempts keep a NULL trace id.

Without the extra, `opentelemetry` is never imported: `available()` only asks the import
system whether the package exists. With it but no SDK configured, the API's no-op tracer is
used and costs next to nothing; trioq then fetches nothing extra either (`enabled()`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from typing import Any


@functools.cache
def available() -> bool:
    return importlib.util.find_spec("opentelemetry") is not None


def enabled() -> bool:
    """A real tracer provider is configured (not the API's default proxy/no-op)."""
    if not available():
        return False
    # The module imported once (`_trace_api`): an import statement here, asked every claim
    # round, was half of this function's 1.9 us (timeit).
    provider = _trace_api().get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


def ids_from_leases() -> bool:
    """The configured provider is one whose spans `job_span` can give the lease token's trace
    id (the SDK's: its tracers draw trace ids from an `id_generator` attribute)."""
    return enabled() and hasattr(_trace_api().get_tracer_provider(), "id_generator")


class _LeaseTraceId:
    """An `IdGenerator` for one execution's tracer: the trace id is the lease token's, the
    span ids (and anything else) the provider's own generator's."""

    def __init__(self, inner: Any, trace_id: int) -> None:
        self._inner = inner
        self._trace_id = trace_id

    def generate_trace_id(self) -> int:
        return self._trace_id

    def generate_span_id(self) -> int:
        return int(self._inner.generate_span_id())

    def is_trace_id_random(self) -> bool:
        # A version-4 UUID's last 7 bytes are random, which is what W3C's random flag promises.
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@functools.cache
def _trace_api() -> Any:
    """`opentelemetry.trace`, imported once (an import statement on every enqueue showed up in
    its profile)."""
    import opentelemetry.trace as trace

    return trace


def current_traceparent() -> str | None:
    """The caller's trace context as a `traceparent` header value, or None."""
    if not available():
        return None
    # No valid current span (none open, or only the API's no-op ones): nothing to propagate.
    # Checked first because it is the common case and costs a third of `enabled()`, on the
    # path of every enqueue.
    if not _trace_api().get_current_span().get_span_context().is_valid or not enabled():
        return None
    import opentelemetry.propagate as propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def job_span(
    *,
    task: str,
    queue: str,
    job_id: int,
    attempt: int,
    traceparent: str | None,
    trace_id: int | None = None,
) -> Iterator[str | None]:
    """Run the handler inside a span linked to the enqueuer's; yields the trace id (hex).

    With `trace_id` (the lease token) and the SDK's provider, the span's trace id is that."""
    if not enabled():
        yield None
        return
    import opentelemetry.propagate as propagate
    import opentelemetry.trace as trace

    links: list[Any] = []
    if traceparent:
        parent = trace.get_current_span(propagate.extract({"traceparent": traceparent}))
        if parent.get_span_context().is_valid:
            links.append(trace.Link(parent.get_span_context()))
    attributes: dict[str, str | int] = {
        "messaging.system": "trioq",
        "messaging.destination.name": queue,
        "trioq.job.id": job_id,
        "trioq.job.attempt": attempt,
        "trioq.task": task,
    }
    tracer: Any = trace.get_tracer("trioq")
    generator = getattr(tracer, "id_generator", None)
    root: Any = None  # the current context: the span nests under an open one
    if trace_id and generator is not None:
        # The SDK builds a new Tracer per get_tracer call: this one serves this span only. A
        # root span (an empty context), or a span open around the worker would lend its id.
        tracer.id_generator = _LeaseTraceId(generator, trace_id)
        import opentelemetry.context as otel_context

        root = otel_context.Context()
    with tracer.start_as_current_span(
        f"trioq.job {task}",
        context=root,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    ) as span:
        context = span.get_span_context()
        yield format(context.trace_id, "032x") if context.is_valid else None


__all__ = ["available", "current_traceparent", "enabled", "ids_from_leases", "job_span"]
