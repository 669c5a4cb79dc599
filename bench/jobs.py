"""Enqueueing through trioq's own client from the harness (trio, in this process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import trio

from bench.app import make_app
from bench.harness import HARNESS_ROLE, Database


@attrs.frozen
class JobGroup:
    task: str
    count: int
    partition_key: str | None = None
    queue: str = "default"


def enqueue_committed(
    db: Database,
    schema: str,
    groups: Sequence[JobGroup],
    before_commit: Callable[[], None] = lambda: None,
) -> float:
    """Enqueue every group (one `enqueue_many` statement each) in ONE transaction.

    Nothing is visible to the workers until COMMIT, which also delivers the ready notification:
    the backlog appears at once, at a known instant. Returns `time.time()` right after COMMIT.
    `before_commit` runs just before it (e.g. to reset pg_stat_statements).
    """
    app = make_app(schema, db.conninfo(HARNESS_ROLE))

    async def enqueue() -> float:
        async with app.client() as client:
            async with client.transaction() as tx:
                for group in groups:
                    await tx.enqueue_many(
                        group.task,
                        [{}] * group.count,
                        queue=group.queue,
                        partition_key=group.partition_key,
                    )
                before_commit()
            return time.time()

    return trio.run(enqueue)


def completed_sql(schema: str, where: str = "true") -> str:
    return f"SELECT count(*) FROM {schema}.jobs WHERE state = 'completed' AND {where}"
