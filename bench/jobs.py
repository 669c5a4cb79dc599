"""Enqueueing through trioq's own client from the harness (trio, in this process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import psycopg
import trio

from bench import contract_floor
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


# --- the systems a drain can run on -------------------------------------------------------


@attrs.frozen
class System:
    """How to fill a schema with a committed backlog and read its completions, per system."""

    name: str
    enqueue: Callable[[Database, str, str, int, Callable[[], None]], float]
    completed_sql: str  # a count of completed jobs; `{schema}` is substituted
    last_finished_sql: str  # epoch seconds of the last completion

    def completed(self, schema: str) -> str:
        return self.completed_sql.format(schema=schema)

    def last_finished(self, schema: str) -> str:
        return self.last_finished_sql.format(schema=schema)


def _trioq_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    return enqueue_committed(db, schema, [JobGroup(task, count)], before_commit)


def _raw_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    import asyncio

    from bench import baseline

    before_commit()
    return asyncio.run(
        baseline.enqueue_committed(db.asyncpg_dsn(HARNESS_ROLE), schema, task, count)
    )


def _pgq_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    before_commit()
    return float(db.pgq(schema, "enqueue-committed", "--task", task, "--count", str(count)))


def _awa_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    before_commit()
    return float(db.awa("enqueue-committed", "--count", str(count)))


def _contract_enqueue(
    db: Database, schema: str, task: str, count: int, before_commit: Callable[[], None]
) -> float:
    """The contract floor's backlog (its tables were installed as its worker started), in one
    transaction, bare (`settle=False`) as the other systems' are."""
    if task != "noop":
        raise ValueError(f"the contract floor's backlog is of noop jobs, not {task}")
    with psycopg.connect(db.conninfo(HARNESS_ROLE)) as conn:
        contract_floor.insert_backlog(conn, schema, count, settle=False)
        before_commit()
        conn.commit()
        return time.time()


def _raw_sql() -> tuple[str, str]:
    from bench import baseline

    return baseline.COMPLETED_SQL, baseline.LAST_FINISHED_SQL


def _raw_delete_sql() -> tuple[str, str]:
    from bench import baseline

    return baseline.DELETED_COMPLETED_SQL, baseline.DELETED_LAST_FINISHED_SQL


def _awa_sql() -> tuple[str, str]:
    from bench import awa_peer

    return awa_peer.COMPLETED_SQL, awa_peer.LAST_FINISHED_SQL


def _pgq_sql() -> tuple[str, str]:
    from bench import pgq

    return pgq.COMPLETED_SQL, pgq.LAST_FINISHED_SQL


TRIOQ = System(
    "trioq",
    _trioq_enqueue,
    "SELECT count(*) FROM {schema}.jobs WHERE state = 'completed'",
    "SELECT extract(epoch FROM max(finished_at))::float8 FROM {schema}.jobs",
)
# `@app.task(keep=False)` (bench.app's `noop_unkept`): completed jobs are deleted, so the count is
# the jobs enqueued (ids from a fresh schema's sequence) less the rows left, and the last
# completion is read when the harness sees the last one (at most its 50 ms poll late).
TRIOQ_UNKEPT = System(
    "trioq-unkept",
    _trioq_enqueue,
    "SELECT (SELECT last_value FROM {schema}.jobs_id_seq) - (SELECT count(*) FROM {schema}.jobs)",
    "SELECT extract(epoch FROM clock_timestamp())::float8",
)
RAW = System("raw", _raw_enqueue, *_raw_sql())  # keeps the finished row and its result
RAW_DELETE = System("raw-del", _raw_enqueue, *_raw_delete_sql())  # deletes it, keeps nothing
PGQUEUER = System("pgqueuer", _pgq_enqueue, *_pgq_sql())
AWA = System("awa", _awa_enqueue, *_awa_sql())


def contract_system(*, keep: bool, jobs: int) -> System:
    """The contract's floor (bench/contract_floor.py) drained live: the outcome appended to its
    history (`contract`), or nothing kept (`contract-del`, whose count needs the backlog's
    size: `jobs`)."""
    if keep:
        return System(
            "contract",
            _contract_enqueue,
            contract_floor.COMPLETED_SQL,
            contract_floor.LAST_FINISHED_SQL,
        )
    return System(
        "contract-del",
        _contract_enqueue,
        contract_floor.deleted_completed_sql(jobs),
        contract_floor.DELETED_LAST_FINISHED_SQL,
    )
