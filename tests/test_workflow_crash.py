"""kill -9 a worker right after each durable primitive of a workflow commits, restart one, and
check the workflow still ends with the right result and every step's side effect ran exactly
once (a step's effect is recorded in `side_effects` by the step function itself). The child is
spawned with a 1 s delay so that no child step is in flight at the kill that follows the spawn
(a kill DURING a step re-runs it: steps are at-least-once, their checkpoint exactly-once)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio
from psycopg import sql

from tests.fault_app import build_app, create_exec_log
from tests.procs import fetch, wait_until, worker_group

LEASE = 2.0
KIND_AT = {0: "step", 1: "sleep", 2: "event", 3: "spawn", 4: "child"}


def q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


@pytest.mark.slow
async def test_workflow_survives_kill_9_after_each_primitive(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        async with worker_group(pg_url, pg_schema, tmp_path) as group:
            worker = await group.start("w0", concurrency=2, lease=LEASE)
            job = await client.enqueue(
                "crash_flow", {"nap": 0.5, "key": "crash:go", "child_delay": 1.0}
            )
            checkpoints = q(
                pg_schema, "SELECT position, kind FROM {s}.checkpoints WHERE job_id = %s"
            )
            with trio.fail_after(120):
                for position in range(4):
                    await wait_until(
                        pg_url,
                        checkpoints,
                        (job.id,),
                        lambda rows, p=position: (p, KIND_AT[p]) in rows,
                        within=60,
                        what=f"checkpoint {position} ({KIND_AT[position]})",
                    )
                    worker.signal(signal.SIGKILL)  # right after the primitive committed
                    await worker.wait_exit(10)
                    worker = await group.start(f"w{position + 1}", concurrency=2, lease=LEASE)
                    if position == 2:  # the workflow waits for its event: send it now
                        await wait_until(
                            pg_url,
                            q(pg_schema, "SELECT state FROM {s}.jobs WHERE id = %s"),
                            (job.id,),
                            lambda rows: rows == [("waiting",)],
                            within=30,
                            what="the workflow waiting for its event",
                        )
                        assert (await client.emit_event("crash:go", {"n": 14})).first is True
                result = await client.wait_result(job.id, timeout=60)
    assert result == {"count": 1, "event": {"n": 14}, "child": 42}
    effects = await fetch(
        pg_url, q(pg_schema, "SELECT name, count(*) FROM {s}.side_effects GROUP BY name")
    )
    assert sorted(effects) == [("count", 1), ("triple", 1)]
