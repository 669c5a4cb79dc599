"""Messages under faults, with real worker processes: a worker killed with SIGKILL between a
receive and the checkpoint after it, and PostgreSQL crashed and restarted while messages flow.
Neither loses a message nor delivers one twice: every acknowledged send is in exactly one
receive checkpoint, in send order, and the workflow's result lists each once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg import sql

import trioq
from tests.fault_app import build_app, create_exec_log
from tests.procs import fetch, wait_until, worker_group
from trioq.embedded import EmbeddedPostgres, EmbeddedSettings

LEASE = 2.0


def q(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


async def received_in_checkpoints(pg_url: str, schema: str, job_id: int) -> list[Any]:
    rows = await fetch(
        pg_url,
        q(
            schema,
            "SELECT value -> 'messages' FROM {s}.checkpoints WHERE job_id = %s "
            "AND kind = 'receive' AND value ? 'messages' ORDER BY position",
        ),
        (job_id,),
    )
    return [item for (batch,) in rows for item in batch]


@pytest.mark.slow
async def test_kill_9_between_a_receive_and_the_next_checkpoint_loses_and_doubles_nothing(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    app = build_app(pg_schema, pg_url)
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, pg_schema)
        job = await client.enqueue("inbox", {"pause_first": True})
        for n in range(3):
            await client.send(job.id, "items", n)  # queued before the first receive
        async with worker_group(pg_url, pg_schema, tmp_path) as group:
            first = await group.start("w0", concurrency=2, lease=LEASE)
            await wait_until(
                pg_url,
                q(pg_schema, "SELECT event FROM {s}.exec_log WHERE job_id = %s"),
                (job.id,),
                lambda rows: ("start",) in rows,
                within=30,
                what="the first receive, hanging before its next checkpoint",
            )
            assert await received_in_checkpoints(pg_url, pg_schema, job.id) == [0, 1, 2]
            first.signal(signal.SIGKILL)
            await first.wait_exit(10)
            await client.send(job.id, "items", 3)  # while nobody runs it
            await group.start("w1", concurrency=2, lease=LEASE)
            with trio.fail_after(60):
                # The replay returns 0..2 from history and the next receive takes 3; then the
                # workflow waits again and the sends below wake it.
                assert await client.get_value(job.id, "received", wait=30) >= 3
                for n in (4, 5, "stop"):
                    await client.send(job.id, "items", n)
                assert await client.wait_result(job.id, timeout=60) == [0, 1, 2, 3, 4, 5]
    assert await received_in_checkpoints(pg_url, pg_schema, job.id) == [0, 1, 2, 3, 4, 5, "stop"]
    left = await fetch(pg_url, q(pg_schema, "SELECT count(*) FROM {s}.messages"))
    assert left == [(0,)]


@pytest.fixture
def own_cluster() -> Iterator[EmbeddedPostgres]:
    """A cluster this test may crash (synchronous_commit on: an acknowledged commit survives
    an immediate stop)."""
    settings = EmbeddedSettings(max_connections=60, server_settings={"synchronous_commit": True})
    with EmbeddedPostgres(settings=settings) as cluster:
        yield cluster


@pytest.mark.slow
async def test_postgres_restarts_while_messages_flow_lose_and_double_nothing(
    own_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A sender sends 1..N one at a time while PostgreSQL is stopped (immediate) and started
    twice. A send that raised may or may not have committed (its reply was lost): it may be
    delivered at most once. Every acknowledged send is delivered exactly once, in order."""
    pg_url, schema, total = own_cluster.conninfo, "faults", 120
    app = build_app(schema, pg_url)
    acked: list[int] = []
    unsure: list[int] = []
    reached = {total // 4: trio.Event(), total // 2: trio.Event()}
    async with app.client(migrate=True) as client:
        await trio.to_thread.run_sync(create_exec_log, pg_url, schema)
        job = await client.enqueue("inbox", {})

        async def send_all() -> None:
            for n in range(1, total + 1):
                try:
                    await client.send(job.id, "items", n)
                except Exception:
                    unsure.append(n)
                    await trio.sleep(0.2)  # the server is away: let it come back
                else:
                    acked.append(n)
                    if len(acked) in reached:
                        reached[len(acked)].set()
                await trio.sleep(0.01)
            while True:  # the end marker must get through; a duplicate "stop" is harmless
                try:
                    await client.send(job.id, "items", "stop")
                    return
                except trioq.JobFinished:
                    return
                except Exception:
                    await trio.sleep(0.2)

        async with worker_group(pg_url, schema, tmp_path) as group:
            await group.start("w0", concurrency=4, lease=LEASE)
            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send_all)
                    for after in sorted(reached):  # restart after this many acks
                        await reached[after].wait()
                        await trio.to_thread.run_sync(own_cluster.restart, "immediate")
                result = await wait_until(
                    pg_url,
                    q(schema, "SELECT state, result FROM {s}.jobs WHERE id = %s"),
                    (job.id,),
                    lambda rows: rows[0][0] == "completed",
                    within=60,
                    what="the workflow completed",
                )
    delivered = result[0][1]
    assert delivered == sorted(delivered)  # send order
    assert len(delivered) == len(set(delivered))  # none twice
    assert set(acked) <= set(delivered)  # no acknowledged send lost
    assert set(delivered) <= set(acked) | set(unsure)  # nothing that was never sent
    print(f"\nmessages: {len(acked)} acknowledged, {len(unsure)} unsure across 2 restarts")
