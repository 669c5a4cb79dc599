"""The app of the transactional-completion crash test (`tests.tx_app:app`): a handler that
writes a ledger row and completes its job in ONE transaction, and on its first attempt kills
its own worker process (SIGKILL) between the write and the COMMIT."""

from __future__ import annotations

import os
import signal
from typing import Any

import trioq

SCHEMA_ENV = "TRIOQ_TEST_SCHEMA"
QUEUE = "ledger"

app = trioq.App(schema=os.environ.get(SCHEMA_ENV, "trioq"))


@app.task("post_ledger", queue=QUEUE, max_attempts=3)
async def post_ledger(ctx: trioq.Context, payload: dict[str, Any]) -> dict[str, Any]:
    async with ctx.transaction() as tx:
        await tx.execute(
            f'INSERT INTO "{app.schema}".ledger (job_id, attempt) VALUES (%s, %s)',
            (ctx.job.id, ctx.job.attempt),
        )
        await tx.complete({"posted_by_attempt": ctx.job.attempt})
        if ctx.job.attempt == 1 and payload.get("die_before_commit"):
            os.kill(os.getpid(), signal.SIGKILL)  # the write and the completion never commit
    return {"ignored": True}  # the completion committed above is the result
