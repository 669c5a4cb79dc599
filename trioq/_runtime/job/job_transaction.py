"""A handler's own transaction (`ctx.transaction()`), with transactional completion.

River's `JobCompleteTx`: the handler's writes and its job's completion commit in ONE transaction,
so a database side effect of the job happens exactly once. `tx.complete(result)` runs the claim
loop's own settle statement (fenced by the run's lease) inside the transaction; the job is
completed exactly when the transaction commits, and the runtime then writes nothing for it.
Rolled back (an exception, a cancellation, the process killed before COMMIT), neither the writes
nor the completion exist, and the job runs again like any failed attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs

from ..._core import codec
from ..._core.errors import TrioqError
from ..._enqueue.rows import ClientTransaction
from ..._seam.driver import Settlement
from .active import ClientPort

if TYPE_CHECKING:
    from .run import Run


class JobLeaseLost(TrioqError):
    """`tx.complete()` found that this attempt no longer owns the job (its lease expired and
    another attempt took over, or it was cancelled): the transaction is rolled back."""


@attrs.define(eq=False)
class JobTransaction(ClientTransaction):
    """`ClientTransaction` (execute, fetch, enqueue, enqueue_many) plus `complete`."""

    _run: Run = attrs.field(kw_only=True)
    completed: bool = attrs.field(default=False, init=False)

    async def complete(self, result: Any = None) -> None:
        """Complete this job in this transaction, fenced by the attempt's lease.

        Call it last, just before the `async with` block ends: from here until COMMIT the job's
        row is locked, and the worker's lease renewals wait for it. Raises `JobLeaseLost` (so
        the block rolls back) when the attempt no longer owns the job.
        """
        if self.completed:
            raise RuntimeError("complete: this job is already completed in this transaction")
        result_json = codec.encode(result, root="result")
        lease = self._run.lease
        run = self._run
        keep = run.spec.keep or run.job.parent_id is not None  # a parent reads its children
        written = await self._tx.job_settle_many(
            [Settlement(lease, "complete", result_json=result_json, keep=keep)]
        )
        if not written.settled:
            raise JobLeaseLost(
                f"job {lease.id} attempt {lease.attempt}: the lease is no longer held; "
                "nothing was completed"
            )
        self.completed = True


@asynccontextmanager
async def open_job_transaction(run: Run, client: ClientPort) -> AsyncIterator[JobTransaction]:
    """BEGIN on the client's pool; COMMIT on success (then the run is marked completed if the
    block called `complete`), ROLLBACK on any exception or cancellation."""
    async with client.driver.transaction() as tx:
        job_tx = JobTransaction(tx, client.enqueuer, run=run)
        yield job_tx
    if job_tx.completed:
        run.completed_in_transaction = True
