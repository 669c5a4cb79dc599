"""How long `trioq migrate` makes enqueues (and a claim-shaped write) wait, on a large schema.

Run once (not part of the test suite):
`python -m bench.migrate_stall [--finished 1000000] [--unfinished 100000] [--from-version 31]
[--checkpoints N] [--stopped] [--previous-release]`.

On the durable embedded cluster of `python -m bench`: a schema is migrated with this tree's
migrations up to `--from-version` (those above it are what the measured `migrate` applies),
filled with `--finished` completed jobs and `--unfinished` ready ones (half of them with a
partition key), then `migrate` runs while two sessions loop until it is done (`--stopped`: alone,
its time the downtime; `--previous-release`: the schema made by the previous release's own
migrations, the upgrade docs/operations.md describes):
- an enqueuer calling the SQL `enqueue()` (one job per call, committed);
- a "worker" taking one ready job per call with `FOR UPDATE SKIP LOCKED` and marking it running
  then completed (what a claim and a completion write), committed.
Reported: the migration's wall time and, per session, the calls made during it and the longest
single call (the stall). docs/operations.md and the online-migration rules quote these figures.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql

import trioq
from bench.harness import HARNESS_ROLE, open_database
from trioq._sql import Migration, functions, migrations

SCHEMA = "stall"
RESULTS = Path(__file__).with_name("results_migrate_stall.json")


def migrate_to(
    conninfo: str, version: int, *, previous_release: list[Migration] | None = None
) -> None:
    """Apply this tree's functions and its migrations up to `version` as `migrate` would,
    recording each; with `previous_release`, those migrations instead (the previous release's:
    they define the functions inline, as that release had them, tests/releases.py)."""
    found = migrations(SCHEMA) if previous_release is None else previous_release
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(SCHEMA))
        )
        if previous_release is None:
            with conn.transaction():  # as migrate does first: the functions' bodies, unchecked
                conn.execute("SET LOCAL check_function_bodies = off")
                for function in functions(SCHEMA):
                    conn.execute(function.sql)  # type: ignore[arg-type]
        for migration in found:
            if migration.version > version:
                break
            if not migration.transactional:  # statement by statement, outside a transaction
                for statement in migration.statements():
                    conn.execute(statement)  # type: ignore[arg-type]
            with conn.transaction():
                if migration.transactional:
                    conn.execute(migration.sql)  # type: ignore[arg-type]
                conn.execute(
                    sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(
                        sql.Identifier(SCHEMA)
                    ),
                    (migration.version, migration.name),
                )


def fill(
    conninfo: str,
    finished: int,
    unfinished: int,
    *,
    schema: str = SCHEMA,
    keyed: bool = False,
    days_ago: int = 1,
) -> float:
    """`finished` jobs completed `days_ago` days ago (over 1,000 s from then) and `unfinished`
    ready ones, in SQL; seconds taken. `keyed`: every tenth of each has a dedup key (what
    migration 0037 copies into job_keys)."""
    started = time.monotonic()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if records(conn, schema):
            _fill_records(conn, schema, finished, unfinished, keyed=keyed, days_ago=days_ago)
            return time.monotonic() - started
        # Migration 0047 renamed the table job_rows_legacy (`jobs` a view) and `state` phase.
        legacy = rows_legacy(conn, schema)
        jobs = sql.Identifier(schema, "job_rows_legacy" if legacy else "jobs")
        state = sql.SQL("phase" if legacy else "state")
        # From migration 0038 on, finished jobs are filed by the day they finished on: that
        # day's partition is made first (job_history_add) and each row names it (`lane`).
        lanes = has_lanes(conn, schema)
        finished_at = f"now() - interval '{int(days_ago)} days' + n * interval '1 ms'"
        if lanes:
            conn.execute(
                sql.SQL(
                    "SELECT {}.job_history_add({}.job_lane({} + n * interval '1 ms'))"
                    " FROM (VALUES (0), (%s)) AS t(n)"
                ).format(
                    sql.Identifier(schema),
                    sql.Identifier(schema),
                    sql.SQL(f"now() - interval '{int(days_ago)} days'"),
                ),
                (finished,),
            )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, payload, {}, run_at, created_at, started_at,"
                " finished_at, attempt, result, dedup_key{})"
                " SELECT 'default', 'noop', '{{}}', 'completed', now() - interval '1 day',"
                " now() - interval '1 day', now() - interval '1 day', {}, 1, 'null',"
                " CASE WHEN %s AND n %% 10 = 0 THEN 'f' || n END{}"
                " FROM generate_series(1, %s) AS n"
            ).format(
                jobs,
                state,
                sql.SQL(", lane" if lanes else ""),
                sql.SQL(finished_at),
                sql.SQL(f", {{}}.job_lane({finished_at})" if lanes else "").format(
                    sql.Identifier(schema)
                ),
            ),
            (keyed, finished),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, payload, {}, run_at, created_at, partition_key,"
                " dedup_key)"
                " SELECT 'default', 'noop', '{{}}', 'ready', now(), now(),"
                " CASE WHEN n %% 2 = 0 THEN 'k' || (n %% 1000) END,"
                " CASE WHEN %s AND n %% 10 = 0 THEN 'u' || n END"
                " FROM generate_series(1, %s) AS n"
            ).format(jobs, state),
            (keyed, unfinished),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))
    return time.monotonic() - started


def _fill_records(
    conn: psycopg.Connection[Any],
    schema: str,
    finished: int,
    unfinished: int,
    *,
    keyed: bool,
    days_ago: int,
) -> None:
    """`fill` on the write-once layout (migration 0049): each finished job a record (`done`)
    and its outcome, finished over 1,000 s from `days_ago` days ago; the unfinished ones ready
    records, every other one with a partition key."""
    finished_at = f"now() - interval '{int(days_ago)} days' + (r.id %% 1000000) * interval '1 ms'"
    conn.execute(
        sql.SQL(
            "WITH r AS (INSERT INTO {s}.job_rows (queue, task, payload, phase, run_at,"
            " created_at, started_at, attempt, dedup_key)"
            " SELECT 'default', 'noop', '{{}}', 'done', now() - interval '1 day',"
            " now() - interval '1 day', now() - interval '1 day', 1,"
            " CASE WHEN %s AND n %% 10 = 0 THEN 'f' || n END"
            " FROM generate_series(1, %s) AS n RETURNING id, queue, started_at)"
            " INSERT INTO {s}.job_outcomes (job_id, state, result, attempt, executions,"
            " started_at, finished_at, queue)"
            " SELECT r.id, 'completed', 'null', 1, 1, r.started_at, {finished}, r.queue FROM r"
        ).format(s=sql.Identifier(schema), finished=sql.SQL(finished_at)),
        (keyed, finished),
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (queue, task, payload, phase, run_at, created_at, partition_key,"
            " dedup_key)"
            " SELECT 'default', 'noop', '{{}}', 'ready', now(), now(),"
            " CASE WHEN n %% 2 = 0 THEN 'k' || (n %% 1000) END,"
            " CASE WHEN %s AND n %% 10 = 0 THEN 'u' || n END"
            " FROM generate_series(1, %s) AS n"
        ).format(sql.Identifier(schema, "job_rows")),
        (keyed, unfinished),
    )
    # The partitions holding the rows only: a VACUUM of the parent also vacuums the empty
    # partitions of the epochs ahead, and a partition vacuumed empty is planned by its actual
    # size (a never vacuumed one is taken for 10 pages): the claims' generic plans, made while
    # the day's new partition held a few pages, then looked its records up by a sequential
    # scan as it grew (4.0 ms a claim, 774 buffers, in bench.retention's clean phase).
    partitions = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent IN (%s::regclass, %s::regclass) ORDER BY 1",
        (
            sql.Identifier(schema, "job_rows").as_string(conn),
            sql.Identifier(schema, "job_outcomes").as_string(conn),
        ),
    ).fetchall()
    for (name,) in partitions:
        table = sql.Identifier(schema, name)
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)).fetchone() == (
            True,
        ):
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))


def records(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether the jobs' records are `job_rows` (migration 0049 on)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.job_rows",))
    return row.fetchone() == (True,)


def has_lanes(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether `jobs` is partitioned by `lane` (migration 0038 on): a finished job names its
    day's partition."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name IN ('jobs', 'job_rows_legacy')"
        " AND column_name = 'lane')",
        (schema,),
    ).fetchone()
    return row == (True,)


def rows_legacy(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether the jobs' rows are `job_rows_legacy` (migration 0047 on)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.job_rows_legacy",))
    return row.fetchone() == (True,)


class Loop:
    """Runs `statement` in a loop on its own connection until stopped; the longest call."""

    def __init__(self, conninfo: str, statement: sql.Composable) -> None:
        self.conninfo = conninfo
        self.statement = statement
        self.calls = 0
        self.longest = 0.0
        self.stop = threading.Event()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.stop.is_set():
                    started = time.monotonic()
                    conn.execute(self.statement)
                    self.longest = max(self.longest, time.monotonic() - started)
                    self.calls += 1
        except BaseException as exc:  # the waiting main thread raises it (else it waits forever)
            self.failed = exc
            raise

    def check(self) -> None:
        if self.failed is not None:
            raise RuntimeError(f"the loop's statement failed: {self.failed}") from self.failed


def hold_reader(conninfo: str, seconds: float, holding: threading.Event) -> None:
    """A pg_dump-like reader: ACCESS SHARE on jobs for `seconds`."""
    with psycopg.connect(conninfo) as conn:
        jobs = sql.Identifier(SCHEMA, "jobs")
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(jobs))
        holding.set()
        time.sleep(seconds)
        conn.rollback()


def add_column_migration() -> None:
    """A migration after this tree's last that needs ACCESS EXCLUSIVE on jobs for a moment."""
    from trioq._pg import migrations as pg_migrations

    def with_extra(schema: str) -> list[Migration]:
        found = migrations(schema)
        quoted = sql.Identifier(schema, "jobs").as_string(None)
        extra = f"ALTER TABLE {quoted} ADD COLUMN stall_probe integer;"
        return [*found, Migration(found[-1].version + 1, "stall_probe", extra)]

    pg_migrations.migrations = with_extra  # type: ignore[assignment]


def add_checkpoints(conn: psycopg.Connection[Any], schema: str, steps: int) -> None:
    """`steps` step checkpoints for every job in `schema`, vacuumed and checkpointed (written
    long before a prune or a migration, as a finished workflow's are)."""
    checkpoints = sql.Identifier(schema, "checkpoints")
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (job_id, position, kind, name, value, created_at)"
            " SELECT j.id, p, 'step', 's' || p, 'null', j.created_at"
            " FROM {} j, generate_series(0, %s - 1) AS p"
        ).format(checkpoints, sql.Identifier(schema, "jobs")),
        (steps,),
    )
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(checkpoints))
    conn.execute("CHECKPOINT")


def measure_stopped(conninfo: str, lock_timeout: float) -> dict[str, Any]:
    """A release that stops first (docs/operations.md, "Upgrading"): nothing runs beside
    `migrate`, and its time is the downtime."""
    started = time.monotonic()
    applied = trio.run(_migrate, conninfo, lock_timeout)
    seconds = round(time.monotonic() - started, 3)
    # What the migrated schema holds, read after the clock: every job carried over.
    with psycopg.connect(conninfo, autocommit=True) as conn:
        states = dict(
            conn.execute(
                sql.SQL("SELECT state, count(*) FROM {} GROUP BY 1 ORDER BY 1").format(
                    sql.Identifier(SCHEMA, "jobs")
                )
            ).fetchall()
        )
        checkpoints = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA, "checkpoints"))
        ).fetchone()
    return {
        "applied": applied,
        "migrate_seconds": seconds,
        "jobs_after": states,
        "checkpoints_after": checkpoints[0] if checkpoints else 0,
    }


def measure(
    conninfo: str, reader_seconds: float = 0.0, lock_timeout: float = 0.5
) -> dict[str, Any]:
    schema = sql.Identifier(SCHEMA)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        lane = sql.SQL(", lane = {}.job_lane(now())" if has_lanes(conn, SCHEMA) else "").format(
            schema
        )
    enqueuer = Loop(conninfo, sql.SQL("SELECT {}.enqueue('noop', '{{}}')").format(schema))
    worker = Loop(
        conninfo,
        sql.SQL(
            "WITH one AS (SELECT id FROM {s}.jobs WHERE state = 'ready' AND partition_key IS NULL"
            " ORDER BY priority, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED),"
            " started AS (UPDATE {s}.jobs j SET state = 'running', attempt = attempt + 1,"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '30 s',"
            " started_at = now() FROM one WHERE j.id = one.id RETURNING j.id)"
            " UPDATE {s}.jobs j SET state = 'completed', lease_token = NULL,"
            " lease_expires_at = NULL, finished_at = now(), result = 'null'{lane}"
            " FROM started WHERE j.id = started.id"
        ).format(s=schema, lane=lane),
    )
    for loop in (enqueuer, worker):
        loop.thread.start()
    while enqueuer.calls < 10 or worker.calls < 10:  # both running before the migration
        enqueuer.check()
        worker.check()
        time.sleep(0.01)
    if reader_seconds:
        holding = threading.Event()
        threading.Thread(
            target=hold_reader, args=(conninfo, reader_seconds, holding), daemon=True
        ).start()
        holding.wait()
    before = {"enqueue": enqueuer.calls, "claim": worker.calls}
    started = time.monotonic()
    applied = trio.run(_migrate, conninfo, lock_timeout)
    seconds = time.monotonic() - started
    during = {
        "enqueue": enqueuer.calls - before["enqueue"],
        "claim": worker.calls - before["claim"],
    }
    for loop in (enqueuer, worker):
        loop.stop.set()
        loop.thread.join()
        loop.check()  # a statement that failed during the migration is a stall not measured
    return {
        "applied": applied,
        "migrate_seconds": round(seconds, 3),
        "enqueue_longest_seconds": round(enqueuer.longest, 3),
        "claim_longest_seconds": round(worker.longest, 3),
        "calls_during": during,
    }


async def _migrate(conninfo: str, lock_timeout: float) -> list[int]:
    app = trioq.App(conninfo, schema=SCHEMA, pool_size=1)
    async with app.client() as client:
        return await client.driver.migrate(lock_timeout=lock_timeout)  # type: ignore[call-arg]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--unfinished", type=int, default=100_000)
    parser.add_argument("--from-version", type=int, default=31)
    parser.add_argument(
        "--reader-seconds",
        type=float,
        default=0.0,
        help="a pg_dump-like reader holds ACCESS SHARE on jobs this long as migrate starts,"
        " and a migration adding a column (ACCESS EXCLUSIVE) is appended",
    )
    parser.add_argument(
        "--lock-timeout", type=float, default=0.5, help="migrate's per-lock wait (0: none)"
    )
    parser.add_argument(
        "--stopped",
        action="store_true",
        help="no enqueuer or claimer beside migrate (a release that stops first): its time is"
        " the downtime",
    )
    parser.add_argument("--keyed", action="store_true", help="a tenth of the jobs with dedup keys")
    parser.add_argument(
        "--checkpoints", type=int, default=0, help="each job's step checkpoints (a workflow's)"
    )
    parser.add_argument(
        "--previous-release",
        action="store_true",
        help="the schema made by the previous release's migrations (tests/releases.py), all of"
        " them: `--from-version` is ignored, and `migrate` applies this release's since",
    )
    args = parser.parse_args()
    if args.reader_seconds:
        add_column_migration()
    with open_database() as db:
        conninfo = db.conninfo(HARNESS_ROLE)
        previous = None
        if args.previous_release:  # read from git once (a git show per migration)
            from tests.releases import previous_release_migrations

            previous = previous_release_migrations(SCHEMA)
            args.from_version = previous[-1].version
        migrate_to(conninfo, args.from_version, previous_release=previous)
        fill_seconds = fill(conninfo, args.finished, args.unfinished, keyed=args.keyed)
        if args.checkpoints:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                add_checkpoints(conn, SCHEMA, args.checkpoints)
        result = {
            "finished": args.finished,
            "unfinished": args.unfinished,
            "from_version": args.from_version,
            "previous_release": args.previous_release,
            "fill_seconds": round(fill_seconds, 1),
            "reader_seconds": args.reader_seconds,
            "lock_timeout": args.lock_timeout,
            "stopped": args.stopped,
            "keyed": args.keyed,
            "checkpoints": args.checkpoints,
            **(
                measure_stopped(conninfo, args.lock_timeout)
                if args.stopped
                else measure(conninfo, args.reader_seconds, args.lock_timeout)
            ),
        }
    print(json.dumps(result, indent=2))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
