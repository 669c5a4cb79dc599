"""Helpers shared by the integration tests (not fixtures: plain functions and context managers)."""

from __future__ import annotations

import datetime
import functools
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
import trio
from psycopg import sql
from psycopg.types.json import Jsonb

import trioq
from trioq._pg import Connection
from trioq._sql import Migration, functions, queries

T = TypeVar("T")


def apply_functions(
    conn: psycopg.Connection[Any], schema: str, bodies: list[str] | None = None
) -> None:
    """What `migrate` does before the migrations, for a test that replays them one by one: the
    SQL functions' current bodies (trioq/_sql/functions/), or `bodies` (an earlier release's,
    tests/releases.py), unchecked until they run."""
    statements = queries(schema)
    if bodies is None:
        bodies = [function.sql for function in functions(schema)]
    with conn.transaction():
        conn.execute(statements["migration_functions_unchecked"])
        for body in bodies:
            conn.execute(body)  # type: ignore[arg-type]


def apply_migration(conn: psycopg.Connection[Any], migration: Migration) -> None:
    """One migration's SQL on an autocommit connection, as `migrate` runs it: a transactional
    one whole, a no-transaction one (`-- trioq: no-transaction`) statement by statement."""
    if migration.transactional:
        conn.execute(migration.sql)  # type: ignore[arg-type]
        return
    for statement in migration.statements():
        conn.execute(statement)  # type: ignore[arg-type]


def make_app(pg_url: str, pg_schema: str, **kwargs: Any) -> trioq.App:
    return trioq.App(pg_url, schema=pg_schema, **kwargs)


@asynccontextmanager
async def running_worker(
    app: trioq.App, queues: list[str] | None = None, concurrency: int = 5, **config: Any
) -> AsyncIterator[trioq.Worker]:
    """Start a worker in a nursery; drain it (grace 0 unless given) when the block ends."""
    config.setdefault("grace_seconds", 0)
    config.setdefault("write_timeout", 10)
    async with trio.open_nursery() as nursery:
        worker: trioq.Worker = await nursery.start(
            functools.partial(app.run_worker, queues or ["default"], concurrency, **config)
        )
        try:
            yield worker
        finally:
            worker.request_drain()


def sql_scalar(pg_url: str, query: str, params: Any = None) -> Any:
    """A blocking one-off read from a separate session (for assertions from the outside)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
        return None if row is None else row[0]


def sql_rows(pg_url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def partitions_of(pg_url: str, parent: str) -> list[str]:
    """The names of the partitions of `parent` (schema-qualified), in name order."""
    rows = sql_rows(
        pg_url,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY 1",
        (parent,),
    )
    return [name for (name,) in rows]


async def scalar(pg_url: str, query: str, params: Any = None) -> Any:
    return await trio.to_thread.run_sync(sql_scalar, pg_url, query, params)


async def in_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A blocking helper (one of the job writes below) called from a trio test, off the event
    loop so the test's own workers keep running meanwhile."""
    return await trio.to_thread.run_sync(functools.partial(function, *args, **kwargs))


class Gate:
    """Handlers wait on `release`; the test waits until `n` handlers have `entered`."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.entered = 0
        self._changed = trio.Event()

    def enter(self) -> None:
        self.entered += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_entered(self, n: int) -> None:
        while self.entered < n:
            await self._changed.wait()


async def wait_until(condition: Callable[[], Awaitable[bool]], interval: float = 0.02) -> None:
    """Poll an observable condition that offers no event (another session's or process's
    state); bound it with `trio.fail_after` in the caller."""
    while True:
        if await condition():
            return
        await trio.sleep(interval)


def stall_db_now_once(conn: psycopg.Connection[Any], schema: str) -> None:
    """Replace `schema.db_now()` for an interleaving test: in a session that has set `test.stall`
    to 'on', the first call waits for the advisory lock `hold_stall` holds on `conn`'s side, so
    that session's statement (a claim) has taken its snapshot and stays there, having locked no
    row, until the test has done what must happen meanwhile and calls `end_stall`. A lock, not
    a pg_sleep: the stall lasts as long as the test needs, however slow the machine."""
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}.db_now() RETURNS timestamptz "
            "LANGUAGE plpgsql AS $$ BEGIN "
            "IF current_setting('test.stall', true) = 'on' THEN "
            "PERFORM set_config('test.stall', 'off', false); "
            "PERFORM pg_advisory_xact_lock(hashtext({})); END IF; "
            "RETURN now(); END $$"
        ).format(sql.Identifier(schema), sql.Literal(_stall_key(schema)))
    )


def _stall_key(schema: str) -> str:
    return f"{schema}: test stall"


def hold_stall(conn: psycopg.Connection[Any], schema: str) -> None:
    """Take the lock a stalling `db_now()` waits for (a session lock on `conn`)."""
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (_stall_key(schema),))


def end_stall(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_stall_key(schema),))


def wait_stalled(conn: psycopg.Connection[Any], pid: int, within: float = 30.0) -> None:
    """Block until backend `pid` waits in the stalling `db_now()` (for `hold_stall`'s lock)."""
    deadline = time.monotonic() + within
    query = "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s"
    while conn.execute(query, (pid,)).fetchone() != ("Lock", "advisory"):
        assert time.monotonic() < deadline, f"session {pid} never stalled"
        time.sleep(0.01)  # another session's state: polled, there is no event


def stalled_claim(
    pg_url: str,
    schema: str,
    claim: Callable[[psycopg.Connection[Any], str], T],
    act: Callable[[psycopg.Connection[Any]], None],
) -> T | BaseException:
    """B runs `claim` (a claim statement as the worker sends it), which takes its snapshot and
    stalls in `db_now()` before it locks anything; `act` runs on another session meanwhile;
    then B's claim goes on. B's claim, or what it raised."""
    with psycopg.connect(pg_url, autocommit=True) as setup:
        stall_db_now_once(setup, schema)
    claimed: queue.Queue[T | BaseException] = queue.Queue()
    pid: queue.Queue[int] = queue.Queue()

    def claimer_b() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT set_config('test.stall', 'on', false)")
            pid.put(conn.info.backend_pid)
            try:
                claimed.put(claim(conn, schema))
            except BaseException as exc:
                claimed.put(exc)

    with psycopg.connect(pg_url, autocommit=True) as a:
        hold_stall(a, schema)
        b = threading.Thread(target=claimer_b)
        b.start()
        wait_stalled(a, pid.get(timeout=30))
        act(a)
        end_stall(a, schema)
        b.join(timeout=30)
        assert not b.is_alive(), "B's claim did not return"
    return claimed.get_nowait()


def run_explained(
    conn: psycopg.Connection[Any], statement: str, params: Any
) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Run `statement` prepared on `conn` with auto_explain on: its rows and the plans
    PostgreSQL logged for it (as notices), so a test can read the plan a prepared statement
    actually ran."""
    plans: list[str] = []
    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_level = notice"):
        conn.execute(f"SET auto_explain.{setting}")
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    return conn.execute(statement, params, prepare=True).fetchall(), plans


async def blocked_on_a_lock(observer: Connection, pg_schema: str) -> bool:
    """Whether some session's statement on `pg_schema` waits for a lock (an interleaving test's
    held transaction has blocked it)."""
    count = await observer.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND position(%s in query) > 0",
        [pg_schema],
    )
    return bool(count)


# --- Job states built in SQL ------------------------------------------------------------------
# Tests build crash states and other hard-to-reach states by writing a job's row directly (as
# Oban's and DBOS's tests do). Where a job's state, lease and outcome are stored is a layout
# decision that bench/plans/write_once_layout.md plans to change (the `jobs` table may become a
# view over a record, a run and an outcome), so these writes live here, in one place, and the
# tests name the state they want rather than the columns that hold it.

JobTarget = psycopg.Connection[Any] | str
"""A connection (the write joins its transaction) or a database URL (a one-off autocommit
session)."""


def _write_jobs(
    target: JobTarget,
    schema: str,
    assignments: list[sql.Composable],
    job_ids: list[int],
    params: dict[str, Any],
) -> None:
    """The jobs' records (job_rows, behind the `jobs` view: migrations 0047, 0049), with their
    copies in job_due as every statement that moves a record writes them (migration 0050: no
    trigger does): the rows written out of scheduled, sleeping and waiting leave it, the ones
    written into them are filed or rewritten."""
    statement = sql.SQL(
        "WITH written AS (UPDATE {s}.job_rows SET {assignments} WHERE id = ANY(%(ids)s)"
        " RETURNING id, queue, phase, run_at),"
        " due_left AS (DELETE FROM {s}.job_due d USING written w WHERE d.job_id = w.id"
        " AND w.phase NOT IN ('scheduled', 'sleeping', 'waiting'))"
        " INSERT INTO {s}.job_due AS d (job_id, queue, state, run_at)"
        " SELECT id, queue, phase, run_at FROM written"
        " WHERE phase IN ('scheduled', 'sleeping', 'waiting')"
        " ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, run_at = excluded.run_at"
    ).format(s=sql.Identifier(schema), assignments=sql.SQL(", ").join(assignments))
    _execute(target, statement, {**params, "ids": job_ids})


def _execute(target: JobTarget, statement: sql.Composable, params: dict[str, Any]) -> None:
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(statement, params)
    else:
        target.execute(statement, params)


@contextmanager
def _one_transaction(target: JobTarget) -> Iterator[psycopg.Connection[Any]]:
    """A helper's several writes as one state: with a URL, one session and one transaction, so a
    worker's pass never sees the first write without the next (a leader's recovery recovered a
    run force_running had written before its record, which then read `claimed` with no run)."""
    if isinstance(target, str):
        with psycopg.connect(target) as conn, conn.transaction():
            yield conn
    else:
        yield target


def _write_runs(target: JobTarget, schema: str, assignment: str, job_ids: list[int]) -> None:
    """The jobs' runs (job_runs, migration 0047: a running job's lease)."""
    statement = sql.SQL("UPDATE {}.job_runs SET {} WHERE job_id = ANY(%(ids)s)").format(
        sql.Identifier(schema), sql.SQL(assignment)
    )
    _execute(target, statement, {"ids": job_ids})


def force_running(
    target: JobTarget,
    schema: str,
    job_ids: list[int],
    *,
    expires_in: datetime.timedelta,
    attempt: int = 1,
    lease_token: uuid.UUID | None = None,
    worker_id: uuid.UUID | None = None,
    started_ago: datetime.timedelta | None = None,
    due_now: bool = False,
    cancel_requested: bool = False,
) -> None:
    """Put jobs in `running` as a claim would: on `attempt`, under a lease that ends
    `expires_in` from now (negative: already expired, a crashed worker's job). The lease token is
    `lease_token`, else a fresh one per job. `worker_id` and `started_at` (`started_ago` before
    now) are set only when given, `run_at` only with `due_now`, `cancel_requested` only when
    true (a cancel whose notification never arrived): the other columns keep what the enqueue
    wrote. As the full claim writes it (migration 0047): a run per job, and its row `claimed`
    with the attempt before the run."""
    runs = sql.SQL(
        "INSERT INTO {s}.job_runs AS u (job_id, attempt, lease_token, lease_expires_at,"
        " worker_id, traced, started_at, executions, queue, partition_key, concurrency_key,"
        " parent_id, result_watched)"
        " SELECT j.id, %(attempt)s, coalesce(%(lease_token)s::uuid, gen_random_uuid()),"
        " now() + %(expires_in)s, %(worker_id)s::uuid, j.traced,"
        " now() - %(started_ago)s::interval,"
        " j.executions + 1, j.queue, j.partition_key, j.concurrency_key, j.parent_id,"
        " j.result_watched"
        " FROM {s}.job_rows j WHERE j.id = ANY(%(ids)s)"
        " ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt,"
        " lease_token = excluded.lease_token, lease_expires_at = excluded.lease_expires_at,"
        " worker_id = coalesce(excluded.worker_id, u.worker_id),"
        " started_at = coalesce(excluded.started_at, u.started_at)"
    ).format(s=sql.Identifier(schema))
    assignments: list[sql.Composable] = [
        sql.SQL("phase = 'claimed'"),
        sql.SQL("attempt = %(attempt)s - 1"),
    ]
    params: dict[str, Any] = {"attempt": attempt}
    if due_now:
        assignments.append(sql.SQL("run_at = now()"))
    if cancel_requested:
        assignments.append(sql.SQL("cancel_requested = true"))
    with _one_transaction(target) as conn:
        _execute(
            conn,
            runs,
            {
                "attempt": attempt,
                "lease_token": lease_token,
                "expires_in": expires_in,
                "worker_id": worker_id,
                "started_ago": started_ago,
                "ids": job_ids,
            },
        )
        _write_jobs(conn, schema, assignments, job_ids, params)


def expire_lease(target: JobTarget, schema: str, job_ids: list[int]) -> None:
    """End the leases of running jobs a second ago, as if their worker had died: the next
    maintenance pass recovers them."""
    _write_runs(target, schema, "lease_expires_at = now() - interval '1 second'", job_ids)


def steal_lease(target: JobTarget, schema: str, job_id: int) -> None:
    """Give a running job a new lease token, as if another attempt had taken it over (lease
    recovery and a new claim): the running attempt's fenced writes are rejected."""
    _write_runs(target, schema, "lease_token = gen_random_uuid()", [job_id])


def request_cancel_silently(target: JobTarget, schema: str, job_id: int) -> None:
    """Mark a job's cancel as requested with no control notification (a lost NOTIFY): only the
    next lease renewal, or recovery, can deliver it."""
    _write_jobs(target, schema, [sql.SQL("cancel_requested = true")], [job_id], {})


def force_final(
    target: JobTarget,
    schema: str,
    job_ids: list[int],
    state: str,
    *,
    finished_ago: datetime.timedelta = datetime.timedelta(0),
    attempts: int | None = None,
    error: dict[str, Any] | None = None,
) -> None:
    """Put jobs in the final `state`, finished `finished_ago` before now, without running them
    (an old finished job for a purge or a listing): a running job's run ends with them, its
    record is `done` and its outcome appended (migration 0049). With `attempts`, the jobs ran
    that many attempts, all they had (`attempt` and `max_attempts`); with `error`, the stored
    error."""
    params: dict[str, Any] = {
        "ids": job_ids,
        "state": state,
        "finished_ago": finished_ago,
        "attempts": attempts,
        "error": None if error is None else Jsonb(error),
    }
    statement = sql.SQL(
        "WITH runs AS (DELETE FROM {s}.job_runs WHERE job_id = ANY(%(ids)s)"
        " RETURNING job_id, attempt, executions, worker_id, started_at),"
        " due_left AS (DELETE FROM {s}.job_due WHERE job_id = ANY(%(ids)s)),"
        " records AS (UPDATE {s}.job_rows j SET phase = 'done',"
        " attempt = coalesce(%(attempts)s, j.attempt),"
        " max_attempts = coalesce(%(attempts)s, j.max_attempts),"
        " error = coalesce(%(error)s, j.error)"
        " WHERE j.id = ANY(%(ids)s)"
        " RETURNING j.id, j.attempt, j.executions, j.worker_id, j.started_at, j.error, j.queue)"
        " INSERT INTO {s}.job_outcomes AS o (job_id, state, error, attempt, executions,"
        " worker_id, started_at, finished_at, queue)"
        " SELECT r.id, %(state)s, r.error, coalesce(%(attempts)s, u.attempt, r.attempt),"
        " coalesce(u.executions, r.executions), coalesce(u.worker_id, r.worker_id),"
        " coalesce(u.started_at, r.started_at), now() - %(finished_ago)s::interval, r.queue"
        " FROM records r LEFT JOIN runs u ON u.job_id = r.id"
        " ON CONFLICT (job_id) DO UPDATE SET state = excluded.state,"
        " finished_at = excluded.finished_at, attempt = excluded.attempt,"
        " error = coalesce(%(error)s, o.error)"
    ).format(s=sql.Identifier(schema))
    _execute(target, statement, params)


def relabel_final(target: JobTarget, schema: str, job_id: int, state: str) -> None:
    """Change a finished job's final state to `state`, keeping its finish time: a `failed` job
    made from a cancelled one, with no attempt run (its outcome's, migration 0049)."""
    statement = sql.SQL(
        "UPDATE {}.job_outcomes SET state = %(state)s WHERE job_id = %(id)s"
    ).format(sql.Identifier(schema))
    _execute(target, statement, {"state": state, "id": job_id})


def pass_deadline(target: JobTarget, schema: str, job_ids: list[int]) -> None:
    """Move jobs' deadlines a second into the past: the next deadline pass cancels them."""
    _write_jobs(target, schema, [sql.SQL("deadline_at = now() - interval '1 second'")], job_ids, {})


def end_unique_window(target: JobTarget, schema: str, job_id: int) -> None:
    """End a job's uniqueness window (`unique_for`) a second ago, as its time passing would:
    its dedup key no longer holds against a new enqueue."""
    _write_jobs(target, schema, [sql.SQL("unique_until = now() - interval '1 s'")], [job_id], {})


def force_waiting(
    target: JobTarget,
    schema: str,
    job_id: int,
    *,
    topic: str | None = None,
    event_key: str | None = None,
    wake_in: datetime.timedelta | None = None,
    checkpoint_count: int | None = None,
) -> None:
    """Put a job in `waiting` as a suspended workflow: on a message `topic` or an event
    `event_key` (each set only when given), woken by its timeout `wake_in` from now (never:
    `run_at` NULL), with `checkpoint_count` steps recorded when given."""
    assignments: list[sql.Composable] = [
        sql.SQL("phase = 'waiting'"),
        sql.SQL("run_at = now() + %(wake_in)s::interval"),
    ]
    params: dict[str, Any] = {"wake_in": wake_in}
    for column, value in (
        ("wait_topic", topic),
        ("wait_event_key", event_key),
        ("checkpoint_count", checkpoint_count),
    ):
        if value is not None:
            assignments.append(
                sql.SQL("{} = {}").format(sql.Identifier(column), sql.Placeholder(column))
            )
            params[column] = value
    _write_jobs(target, schema, assignments, [job_id], params)


def force_sleeping(target: JobTarget, schema: str, job_id: int, until: datetime.datetime) -> None:
    """Put a job in `sleeping` (a workflow's durable sleep) until `until`."""
    _write_jobs(
        target,
        schema,
        [sql.SQL("phase = 'sleeping'"), sql.SQL("run_at = %(until)s")],
        [job_id],
        {"until": until},
    )


def force_checkpoint_count(target: JobTarget, schema: str, job_id: int, count: int) -> None:
    """Set how many history positions a workflow job has taken (`checkpoint_count`), leaving its
    checkpoints alone: beside checkpoint rows a test inserted itself, the crash state of a
    parallel block whose steps finished out of order (position 2 recorded, 0 and 1 not), which a
    replay must complete without rerunning a recorded step."""
    _write_jobs(
        target, schema, [sql.SQL("checkpoint_count = %(count)s")], [job_id], {"count": count}
    )


def forget_wait_position(target: JobTarget, schema: str, job_id: int) -> None:
    """Clear the `wait_position` of a job suspended in a receive, as a row that suspended before
    migration 0025 added the column has it: a send must still queue the message and wake it."""
    _write_jobs(target, schema, [sql.SQL("wait_position = NULL")], [job_id], {})


def overwrite_payload(target: JobTarget, schema: str, job_id: int, json_text: str) -> None:
    """Replace a job's stored payload with `json_text` as PostgreSQL parses it, past every check
    a producer makes (the codec's, and `payload_check` in the SQL entry points), as a raw INSERT
    or a row from before those checks could hold it: a worker claiming a payload it cannot
    decode must fail that job and go on."""
    _write_jobs(
        target, schema, [sql.SQL("payload = %(payload)s::jsonb")], [job_id], {"payload": json_text}
    )


def wake_waiting(target: JobTarget, schema: str, job_ids: list[int]) -> None:
    """Make suspended jobs (`waiting`) ready now with their wait cleared (topic, event key,
    position), as an emitted event or a sent message does for the job it resolves: with a value
    a test wrote into the job's history itself (one the SQL entry points would refuse)."""
    assignments: list[sql.Composable] = [
        sql.SQL("phase = 'ready'"),
        sql.SQL("filed = filed + 1"),
        sql.SQL("run_at = now()"),
        sql.SQL("wait_event_key = NULL, wait_topic = NULL, wait_position = NULL"),
    ]
    _write_jobs(target, schema, assignments, job_ids, {})


def forget_jobs(target: JobTarget, schema: str, job_ids: list[int]) -> None:
    """Delete jobs as if never enqueued (the tables' delete triggers take their history and
    keys with them): a property test frees the dedup key an example stored, so that a later
    example with the same key is stored rather than deduplicated."""
    statement = sql.SQL(
        "WITH runs AS (DELETE FROM {s}.job_runs WHERE job_id = ANY(%(ids)s)),"
        " outcomes AS (DELETE FROM {s}.job_outcomes WHERE job_id = ANY(%(ids)s))"
        " DELETE FROM {s}.job_rows WHERE id = ANY(%(ids)s)"
    ).format(s=sql.Identifier(schema))
    _execute(target, statement, {"ids": job_ids})


def analyze_records(conn: psycopg.Connection[Any], schema: str) -> None:
    """ANALYZE the job records' epoch partitions that hold rows (migration 0049), and the parent.
    The epoch made ahead is left unanalyzed, as it is in service until its day starts: analyzed
    while empty it reads as empty (no pages), and a generic plan made then scans it
    sequentially (0 pages then; as its day fills, until autoanalyze's first pass replans)."""
    parts = conn.execute(
        "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = format('%%I.job_rows', %s::text)::regclass",
        (schema,),
    ).fetchall()
    for (part,) in parts:
        [[filled]] = conn.execute(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.SQL(part))
        ).fetchall()
        if filled:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.SQL(part)))
