"""The executor: runs ONE job and returns its outcome (River's job executor, Oban's return
contract). It never raises for anything the handler did: every exit of the handler, including
`BaseException`s raised by handler code (SystemExit, KeyboardInterrupt, GeneratorExit, custom
ones), maps to an outcome. Only cancellation from outside the job (a hard stop of the worker)
and a KeyboardInterrupt that trio raised for a real SIGINT propagate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from typing import Any

import trio

from ..._core import codec
from ..._core.errors import HistoryLimitExceeded, NondeterminismError
from ..._core.retry import should_retry
from ..._seam import tracing
from ..services.logs import log_job_failure
from ..workflow import messages, waits
from ..workflow.context import Context
from .outcome import (
    Cancelled,
    Completed,
    CompletedInTransaction,
    Failed,
    Lost,
    Outcome,
    Released,
    RetryAt,
)
from .run import LeaseLost, Run, SuspendExecution

log = logging.getLogger("trioq.worker")

MAX_TRACEBACK_CHARS = 20_000


# The outcome of every job that returns None: values are frozen, one serves them all (the
# claim loop names it without `outcome_name`'s lookup).
COMPLETED_NULL = Completed("null")


async def execute(run: Run) -> Outcome:
    """Run `run.job`'s handler under `run.scope` and map how it ended to an outcome.

    The path of a plain job (no timeout, no hold, no tracing, no children, result None) is
    kept to what it needs: each optional part is skipped by a test, not entered empty."""
    spec = run.spec
    job = run.job
    scope = run.scope
    error: BaseException | None = None
    result_json = "null"
    try:
        with scope:
            if job.cancel_requested:
                run.cancel("cancelled")
            held = run.due_at is not None and await run.hold_until_due()
            if spec.timeout is not None:
                # From the handler's start: a job claimed early is held until its run_at
                # first (up to the claim's lookahead), and that wait is not the handler's.
                scope.deadline = trio.current_time() + spec.timeout
            if run.traced:  # the otel extra, when configured: a span linked to the enqueuer's
                span = tracing.job_span(
                    task=job.task, queue=job.queue, job_id=job.id, attempt=job.attempt,
                    traceparent=await _trace_context(run), trace_id=job.lease_token.int,
                )  # fmt: skip
                with span as run.trace_id:
                    result_json = await _handle(run, held)
            else:
                # No span to enter: a nullcontext's enter and exit were 0.3 us of every job.
                result_json = await _handle(run, held)
    except trio.Cancelled:
        raise  # not ours: our own scope's cancellation never reaches this point
    except BaseException as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(
            lambda leaf: isinstance(leaf, trio.Cancelled) or _from_signal(leaf)
        ):
            raise
        if _from_signal(exc):
            raise  # Ctrl-C delivered by trio: it stops the worker, it is not the job's fault
        error = exc
    if run.kept_children and run.cancel_reason == "cancelled" and run.suspension is None:
        await _join_kept_children(run)
    if (
        error is None
        and run.cancel_reason is None
        and run.suspension is None
        and not run.completed_in_transaction
        and not scope.cancelled_caught
    ):
        # The common end, decided without `_outcome`'s walk (and, for a None result, without
        # building an outcome: values are frozen, one serves every such job).
        return COMPLETED_NULL if result_json == "null" else Completed(result_json)
    return _outcome(run, error, result_json)


async def _handle(run: Run, held: bool) -> str:
    """Run the handler and what must follow it inside the job's scope (and span); return
    the result as JSON."""
    spec = run.spec
    payload = spec.load_payload(run.job.payload)
    if spec.sync:
        result = await run_sync_handler(run, payload)
    else:
        result = await spec.handler(Context(run), payload)
    if held:
        # Held jobs wake in bursts (one timer for all whose sleeps end together): yield once,
        # so every handler of the burst resumes before any of them does its bookkeeping
        # (encode, settle, metrics). Shielded: the handler is done, nothing may cancel its
        # result now.
        await trio.lowlevel.cancel_shielded_checkpoint()
    result_json = "null" if result is None else codec.encode(result, root="result")
    if run.pending_values and not run.completed_in_transaction:
        await messages.flush_values(run)  # ctx.set_value after the last checkpoint
    if run.unfinished_children:
        # Nursery semantics: a workflow completes only once every child it spawned is final
        # (it waits durably for the ones it did not await itself).
        await waits.join_children(run)
    return result_json


async def _join_kept_children(run: Run) -> None:
    """A cancelled workflow is final only after its children spawned with
    on_parent_cancel="wait" or "cancel": wait for them durably (shielded: the run is
    cancelled)."""
    # Suspended (the outcome says so) or lost (the cancel reason says so): nothing more to do.
    with trio.CancelScope(shield=True), contextlib.suppress(SuspendExecution, LeaseLost):
        await waits.join_kept_children(run)


async def run_sync_handler(run: Run, payload: Any) -> Any:
    """Run a plain `def` handler in a worker thread, so that it blocks no other handler, claim
    or lease renewal. Trio cannot interrupt a thread: a cancellation (timeout, drain, cancel
    request, lost lease) is seen by `ctx.cancelled()` in the thread, and the job's task waits
    until the function returns; then the cancellation wins over its result."""
    result = await trio.to_thread.run_sync(
        run.spec.handler, Context(run), payload, limiter=run.thread_limiter
    )
    await trio.lowlevel.checkpoint_if_cancelled()
    return result


async def _trace_context(run: Run) -> str | None:
    try:
        return await run.driver.job_trace_context(run.job.id)
    except Exception as exc:  # tracing is best effort: the job runs unlinked
        log.warning("job %d: trace context not read: %s", run.job.id, exc)
        return None


_TRIO_DIR = os.path.dirname(trio.__file__)


def _from_signal(exc: BaseException) -> bool:
    """A KeyboardInterrupt that trio raised for a real SIGINT (its innermost frame is trio's
    signal handler or KI delivery), as opposed to one `raise`d by handler code, which is the
    job's failure like any other exception."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    tb = exc.__traceback__
    if tb is None:
        return True  # no frame to blame handler code for: treat as a signal
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_TRIO_DIR)


def _outcome(run: Run, error: BaseException | None, result_json: str) -> Outcome:
    if run.completed_in_transaction:
        # Committed with the handler's writes; whatever happened after (an error, the lease
        # renewal finding the job no longer running) changes nothing.
        return CompletedInTransaction()
    reason = run.cancel_reason
    if reason == "lost":
        return Lost()
    if run.suspension is not None:
        return run.suspension  # recorded durably: a cancel or drain applies to the woken job
    if reason is not None and (run.scope.cancelled_caught or error is not None):
        # Cancelled on purpose (and perhaps turned into another error): the reason decides. A
        # handler that finished before the cancellation reached it keeps its result.
        if reason == "cancelled":
            return Cancelled(
                error_json("Cancelled", "cancelled on request", None, trace_id=run.trace_id)
            )
        # Drain, or "unconfirmed": renewals did not get through for 90% of the lease, so it may
        # or may not still be ours. A fenced release hands it back at once, attempt restored, if
        # it is, and changes nothing if not (writing nothing would let it expire into a lost
        # attempt).
        return Released()
    if error is not None:
        return failure(run, error)
    if run.scope.cancelled_caught:
        spec = run.spec
        return failure(
            run, TimeoutError(f"task {spec.name!r} exceeded its {spec.timeout}s timeout")
        )
    return Completed(result_json)


def failure(run: Run, exc: BaseException) -> Outcome:
    """A failed execution: retried while attempts remain, else failed for good. A
    NondeterminismError fails at once (re-running the same code cannot fix it)."""
    job = run.job
    message = str(exc)
    step = None
    if run.failed_step is not None:
        position, name = run.failed_step
        step = name
        message = f"step {name!r} (history position {position}) failed: {message}"
    error_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
    error = error_json(
        error_type,
        message,
        "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:],
        step=step,
        trace_id=run.trace_id,
    )
    retryable = not isinstance(exc, (NondeterminismError, HistoryLimitExceeded))
    delay = (
        run.spec.retry.delay(job.attempt)
        if retryable and should_retry(job.attempt, run.max_attempts)
        else None
    )
    log_job_failure(
        job_id=job.id, attempt=job.attempt, max_attempts=run.max_attempts, task=job.task,
        queue=job.queue, worker_id=run.worker_id, error_type=error_type, message=message,
        retry_in=delay, trace_id=run.trace_id,
    )  # fmt: skip
    if delay is not None:
        return RetryAt(error, delay)
    return Failed(error)


def _storable(text: str) -> str:
    """Error text as Postgres can store it (no NUL, no lone surrogates)."""
    return text.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")


def error_json(
    error_type: str,
    message: str,
    tb: str | None,
    *,
    step: str | None = None,
    trace_id: str | None = None,
) -> str:
    """The error as the settle statement stores it: in the job row, and in the attempt's
    history row (its `trace_id` too, the execution's span when tracing is configured)."""
    error: dict[str, str | None] = {
        "type": _storable(error_type),
        "message": _storable(message[:4000]),
        "traceback": None if tb is None else _storable(tb),
    }
    if step is not None:
        error["step"] = _storable(step)
    if trace_id is not None:
        error["trace_id"] = trace_id
    return codec.encode(error, root="error")
