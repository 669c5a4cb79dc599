"""A PROTOTYPE of a narrow hot table, for bench/statement_shape.py's replays only.

The design it prototypes: the claim-path state of ready and running jobs lives in a small table
of its own, `jobs_hot` (one row per ready or running job: its claim order, keys, lease and the
fencing pair attempt + lease token), and the wide record in `jobs` is written at the enqueue
and at the end. Per job, the drain writes the narrow row twice (claim: UPDATE; completion:
DELETE) and the wide row once (completion), where trioq writes the wide row twice. Nothing in
trioq or its migrations changes: the table is installed next to the migrated ones of a fresh
bench schema.

Common to every variant (`Variant`):
- install: `jobs_hot` with three partial indexes (unkeyed ready rows in claim order; keyed
  ready rows, only so the claim's keyed probe stays one probe; running rows' leases, which
  recovery needs); the migrated table's four claim-path indexes (jobs_ready_task_idx,
  jobs_partition_ready_idx, jobs_concurrency_ready_idx, jobs_lease_idx) are dropped, as a
  migration to this design would drop them. No foreign key between the tables (its check
  would lock the wide row at every hot insert): the statements keep them in step.
- enqueue: job_insert_one's own INSERT into jobs (every column, CHECK and index it writes)
  and, in the same statement, the hot row of a ready job (a delayed one stays in jobs, for a
  promotion to move), with the ready notification.
- claim: job_claim_plain's shape on jobs_hot: the keyed probe (jobs_hot), the due probe
  (jobs_due_idx of jobs), the pause check, the per-task scan in claim order FOR UPDATE SKIP
  LOCKED, then one UPDATE of the hot rows (attempt + 1, a fresh lease token, the lease from
  db_now()), returning the same columns as job_claim_plain.
- completion: one statement fenced as job_complete_plain is (id + attempt + lease token +
  running): DELETE the hot rows, write the outcome into the wide rows of the ids deleted
  (state, result, attempt, worker, start and finish times), then job_complete_plain's own
  result notifications and reply.

The variants (the systems of bench/statement_shape.py):
- `narrow`: the worker's columns (payload, max_attempts, ...) joined from jobs at the claim
  (read by primary key, not written);
- `ncopy`: those columns copied into jobs_hot at the enqueue; the claim reads jobs_hot only;
- `nwide`: as `narrow`, and the claim also marks the wide row running (state, lease,
  worker), for readers that look at one table only;
- `nlate`: no wide row before the end: jobs_hot carries everything job_insert_one writes, the
  enqueue inserts only the hot row (ids from the jobs table's sequence), the completion
  INSERTs the wide row. Lookups by id, dedup keys and watchers would then read both tables.

What it is not: no keyed claim (partition and concurrency keys), no promotion of due rows into
jobs_hot, no retry, failure, cancellation, release, heartbeat, recovery or workflow statement
(each would have to write one table or both), no attempts history, no dedup-key check against
hot rows, `traced` and `result_watched` not carried in the hot row. It measures what the
two-table shape costs the server on a one-session drain and on single enqueues, nothing more.
"""

from __future__ import annotations

import attrs
import psycopg

from bench.hot_path_cost import insert_backlog
from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]

# The migrated table's indexes this design moves to jobs_hot.
CLAIM_PATH_INDEXES = (
    "jobs_ready_task_idx",
    "jobs_partition_ready_idx",
    "jobs_concurrency_ready_idx",
    "jobs_lease_idx",
)

# The hot row: claim order, keys (for the keyed probe), the lease and the fencing pair.
HOT_COLUMNS = (
    "id, queue, task, version, priority, run_at, partition_key, concurrency_key, attempt,"
    " executions"
)
# The worker's columns that `copied` carries in the hot row too.
COPIED_COLUMNS = "payload, max_attempts, created_at, cancel_requested, parent_id, checkpoint_count"
# And the rest of what job_insert_one writes, which `late` carries until the end.
LATE_COLUMNS = "trace_context, deadline_at, deadline_source"
# What the hot row of `late` hands the wide row at the end, the outcome's columns aside.
LATE_RECORD_COLUMNS = (
    f"queue, task, version, priority, run_at, partition_key, concurrency_key, {COPIED_COLUMNS},"
    f" {LATE_COLUMNS}"
)
# What `late`'s enqueue writes into the hot row (job_insert_one's columns but the state).
LATE_ENQUEUE_COLUMNS = (
    "queue, task, payload, priority, run_at, partition_key, max_attempts, created_at, version,"
    " trace_context, deadline_at, deadline_source"
)
# job_insert_one's columns (queries.sql's job_insert, every writer's), in its order (the
# enqueue of `late` reads its SELECT's row).
INSERT_ONE_COLUMNS = (
    "id, queue, task, payload, state, priority, run_at, partition_key, dedup_key, max_attempts,"
    " created_at, unique_states, unique_until, version, trace_context, concurrency_key,"
    " concurrency_limit, deadline_at, deadline_source, parent_id, parent_position,"
    " on_parent_cancel"
)

INSTALL_SQL = """
CREATE TABLE {schema}.jobs_hot (
    id               bigint      PRIMARY KEY,
    queue            text        NOT NULL,
    task             text        NOT NULL,
    version          int         NOT NULL,
    priority         smallint    NOT NULL,
    run_at           timestamptz NOT NULL,
    state            text        NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'running')),
    partition_key    text,
    concurrency_key  text,
    attempt          int         NOT NULL DEFAULT 0,
    executions       int         NOT NULL DEFAULT 0,
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        uuid,
    started_at       timestamptz{copied}
);
CREATE INDEX jobs_hot_ready_idx ON {schema}.jobs_hot (queue, task, priority, run_at, id)
    WHERE state = 'ready' AND partition_key IS NULL AND concurrency_key IS NULL;
CREATE INDEX jobs_hot_keyed_ready_idx
    ON {schema}.jobs_hot (queue, partition_key, concurrency_key, priority, run_at, id)
    WHERE state = 'ready' AND (partition_key IS NOT NULL OR concurrency_key IS NOT NULL);
CREATE INDEX jobs_hot_lease_idx ON {schema}.jobs_hot (lease_expires_at) WHERE state = 'running';
"""

INSTALL_COPIED = """,
    payload          jsonb       NOT NULL,
    max_attempts     int,
    created_at       timestamptz NOT NULL,
    cancel_requested boolean     NOT NULL DEFAULT false,
    parent_id        bigint,
    checkpoint_count int         NOT NULL DEFAULT 0"""
INSTALL_LATE = """,
    trace_context    text,
    deadline_at      timestamptz,
    deadline_source  text"""

# The claim: job_claim_plain's probes, pause check and per-task scan (trioq/_sql/queries.sql,
# plain_claim), on jobs_hot; the due probe stays on jobs (delayed rows live there).
CLAIM_SQL = """
WITH probe AS MATERIALIZED (
    SELECT keyed.ready AS keyed_ready, due.run_at AS next_due,
           keyed.ready OR coalesce(due.run_at <= {schema}.db_now()
                                   + (SELECT %(lookahead)s::float8) * interval '1 second',
                                   false) AS blocked
    FROM (SELECT EXISTS (SELECT 1 FROM {schema}.jobs_hot h
                         WHERE h.queue = (SELECT %(queue)s::text) AND h.state = 'ready'
                           AND (h.partition_key IS NOT NULL OR h.concurrency_key IS NOT NULL))
                 AS ready) AS keyed
    LEFT JOIN LATERAL (SELECT j.run_at FROM {schema}.jobs j
                       WHERE j.queue = (SELECT %(queue)s::text)
                         AND j.state IN ('scheduled', 'sleeping', 'waiting')
                         AND j.run_at IS NOT NULL
                       ORDER BY j.run_at LIMIT 1) AS due ON true
),
unkeyed AS MATERIALIZED (
    SELECT per_task.*
    FROM unnest((SELECT %(tasks)s::text[])) AS served(task)
    CROSS JOIN LATERAL (
        SELECT h.id, h.priority, h.run_at
        FROM {schema}.jobs_hot h
        WHERE h.queue = (SELECT %(queue)s::text)
          AND h.task = served.task
          AND h.state = 'ready'
          AND h.partition_key IS NULL
          AND h.concurrency_key IS NULL
          AND h.run_at <= {schema}.db_now()
          AND ((SELECT %(task_versions)s::text[]) IS NULL
               OR h.task || '@' || h.version = ANY((SELECT %(task_versions)s::text[])::text[]))
        ORDER BY h.priority, h.run_at, h.id
        LIMIT (SELECT %(limit)s::int)
        FOR UPDATE OF h SKIP LOCKED
    ) AS per_task
    WHERE NOT (SELECT blocked FROM probe)
),
candidates AS MATERIALIZED (
    SELECT id FROM unkeyed
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses p
                      WHERE p.queue = (SELECT %(queue)s::text))
    ORDER BY priority, run_at, id
    LIMIT (SELECT %(limit)s::int)
),
claimed AS (
    UPDATE {schema}.jobs_hot h
    SET state = 'running', attempt = h.attempt + 1, executions = h.executions + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = {schema}.db_now() + %(lease_seconds)s * interval '1 second',
        worker_id = %(worker_id)s, started_at = greatest({schema}.db_now(), h.run_at)
    WHERE h.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING h.*
){wide_claimed}
SELECT (SELECT blocked FROM probe) AS blocked, (SELECT next_due FROM probe) AS next_due,
       {schema}.db_now() + (clock_timestamp() - now()) AS now,
       c.id, w.queue, w.task, w.payload, c.attempt, w.max_attempts, c.lease_token,
       w.partition_key, w.priority, w.run_at, w.created_at, w.cancel_requested, w.version,
       CASE WHEN w.checkpoint_count > 0 THEN
           (SELECT jsonb_agg(jsonb_build_array(k.position, k.kind, k.name, k.value)
                             ORDER BY k.position)
            FROM {schema}.checkpoints k WHERE k.job_id = c.id) END AS history,
       w.parent_id, w.concurrency_key
FROM (SELECT 1) AS one
LEFT JOIN ({source}) ON true
"""

# The worker's columns read from jobs by primary key (the wide row is read, not written).
JOINED_SOURCE = "claimed c JOIN {schema}.jobs w ON w.id = c.id"
COPIED_SOURCE = "claimed c CROSS JOIN LATERAL (SELECT c.*) AS w"

# `wide_at_claim`: the wide row shows the attempt running (a dashboard reads one table); the
# CHECK of jobs wants its lease beside a running state.
WIDE_CLAIMED = """,
wide_claimed AS (
    UPDATE {schema}.jobs w
    SET state = 'running', attempt = c.attempt, executions = c.executions,
        lease_token = c.lease_token, lease_expires_at = c.lease_expires_at,
        worker_id = c.worker_id, started_at = c.started_at, error = NULL
    FROM claimed c
    WHERE w.id = c.id
    RETURNING w.*
)"""
WIDE_CLAIMED_SOURCE = "claimed c JOIN wide_claimed w ON w.id = c.id"

# The completion: the hot rows go, fenced; the wide rows of the ids that went take the
# outcome. job_complete_plain's result notifications and reply follow (its own text).
COMPLETE_SQL = """
WITH input AS MATERIALIZED (
    SELECT t.*
    FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(attempts)s::int[]),
                (SELECT %(lease_tokens)s::uuid[]), (SELECT %(results)s::text[]))
         AS t(id, attempt, lease_token, result)
),
finished AS (
    DELETE FROM {schema}.jobs_hot h
    USING input i
    WHERE h.id = i.id AND h.attempt = i.attempt AND h.lease_token = i.lease_token
      AND h.state = 'running'
    RETURNING h.*, i.result
),
"""
# The wide row takes the outcome: updated (written at the enqueue) or, `late`, inserted.
COMPLETE_UPDATE = """settled AS (
    UPDATE {schema}.jobs j
    SET state = 'completed', result = f.result::jsonb, error = NULL, attempt = f.attempt,
        executions = f.executions, worker_id = f.worker_id, started_at = f.started_at,
        finished_at = {schema}.db_now(), lane = {schema}.job_lane({schema}.db_now()),
        lease_token = NULL, lease_expires_at = NULL
    FROM finished f
    WHERE j.id = f.id
    RETURNING j.id, j.state, j.result_watched
),
"""
COMPLETE_INSERT = """settled AS (
    INSERT INTO {schema}.jobs AS j (id, {late_columns}, state, result, attempt, executions,
                                   worker_id, started_at, finished_at, lane)
    SELECT id, {late_columns}, 'completed', result::jsonb, attempt, executions,
           worker_id, started_at, {schema}.db_now(), {schema}.job_lane({schema}.db_now())
    FROM finished
    RETURNING j.id, j.state, j.result_watched
),
"""

# `late`'s enqueue: job_insert_one's row (its `new_jobs`, then its SELECT, which draws the id),
# into jobs_hot when ready, into jobs when delayed (a promotion would move it).
LATE_INSERT = """
{source},
new AS MATERIALIZED (
    SELECT r.* FROM ({select}) AS r({insert_columns})
),
hot AS (
    INSERT INTO {schema}.jobs_hot (id, {hot_columns})
    SELECT id, {hot_columns} FROM new WHERE state = 'ready'
),
wide AS (
    INSERT INTO {schema}.jobs ({insert_columns})
    SELECT {insert_columns} FROM new WHERE state <> 'ready'
)
SELECT new.id, pg_notify({schema}.ready_channel(new.queue), new.queue) AS notified FROM new
"""

# The enqueue: job_insert_one's INSERT (its RETURNING replaced), then the hot row.
INSERT_TAIL = """
    RETURNING j.*
),
hot AS (
    INSERT INTO {schema}.jobs_hot ({columns})
    SELECT {columns} FROM wide WHERE wide.state = 'ready'
)
SELECT wide.id, pg_notify({schema}.ready_channel(wide.queue), wide.queue) AS notified
FROM wide
"""


@attrs.frozen
class Variant:
    """One way to split the job between the two tables."""

    copied: bool = False  # the worker's columns copied into jobs_hot at the enqueue
    wide_at_claim: bool = False  # the claim marks the wide row running too
    late: bool = False  # no wide row before the end: jobs_hot carries the whole enqueue

    @property
    def hot_columns(self) -> str:
        if self.late:
            return f"{HOT_COLUMNS}, {COPIED_COLUMNS}, {LATE_COLUMNS}"
        return f"{HOT_COLUMNS}, {COPIED_COLUMNS}" if self.copied else HOT_COLUMNS

    def install(self, conn: Conn, schema: str) -> None:
        """jobs_hot in a migrated schema, the migrated table's claim-path indexes dropped."""
        copied = INSTALL_COPIED if self.copied or self.late else ""
        copied += INSTALL_LATE if self.late else ""
        conn.execute(INSTALL_SQL.format(schema=schema, copied=copied))
        for name in CLAIM_PATH_INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {schema}.{name}")

    def insert_backlog(self, conn: Conn, schema: str, jobs: int) -> None:
        """The drain's backlog in both tables (`late`: in jobs_hot only, as insert_backlog
        would write it), analyzed and checkpointed."""
        if self.late:
            conn.execute(
                f"INSERT INTO {schema}.jobs_hot (id, queue, task, version, priority, run_at,"
                " attempt, executions, payload, max_attempts, created_at)"
                f" SELECT nextval('{_sequence(conn, schema)}'), 'default', 'noop', 1, 0,"
                " now() - interval '1 s', 0, 0, '{}', 1, now() FROM generate_series(1, %s)",
                [jobs],
            )
        else:
            insert_backlog(conn, schema, jobs)
            columns = self.hot_columns
            conn.execute(
                f"INSERT INTO {schema}.jobs_hot ({columns}) SELECT {columns} FROM {schema}.jobs"
            )
        conn.execute(f"ANALYZE {schema}.jobs_hot")
        conn.execute("CHECKPOINT")

    def claim_sql(self, schema: str) -> str:
        if self.wide_at_claim:
            wide, source = WIDE_CLAIMED, WIDE_CLAIMED_SOURCE
        else:
            wide, source = "", COPIED_SOURCE if self.copied or self.late else JOINED_SOURCE
        sql = CLAIM_SQL.replace("{wide_claimed}", wide).replace("{source}", source)
        return sql.format(schema=schema)

    def complete_sql(self, schema: str) -> str:
        plain = queries(schema)["job_complete_plain"]
        if self.late:
            settled = COMPLETE_INSERT.format(schema=schema, late_columns=LATE_RECORD_COLUMNS)
        else:
            settled = COMPLETE_UPDATE.format(schema=schema)
        return (
            COMPLETE_SQL.format(schema=schema)
            + settled
            + plain[plain.index("results_notified AS") :]
        )

    def insert_sql(self, schema: str) -> str:
        one = queries(schema)["job_insert_one"]
        insert, returning = one.rsplit("RETURNING", 1)
        source, statement = insert.split("INSERT INTO", 1)  # its `WITH new_jobs AS (...)`
        columns = " ".join(statement.split("(", 1)[1].split(")", 1)[0].split())
        if (
            not returning.lstrip().startswith("j.id, pg_notify")
            or columns != INSERT_ONE_COLUMNS
            or not source.startswith("WITH new_jobs AS")
        ):
            raise RuntimeError("job_insert_one changed: update bench/narrow_table.py")
        if self.late:
            return LATE_INSERT.format(
                schema=schema,
                source=source.strip(),
                select=statement.split(")", 1)[1],
                insert_columns=INSERT_ONE_COLUMNS,
                hot_columns=LATE_ENQUEUE_COLUMNS,
            )
        tail = INSERT_TAIL.format(schema=schema, columns=self.hot_columns)
        return f"WITH wide AS (\n{insert}{tail}"


def _sequence(conn: Conn, schema: str) -> str:
    """The jobs table's id sequence (`late` takes the hot row's id from it)."""
    [[name]] = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", [f"{schema}.jobs"])
    return str(name)


VARIANTS = {
    "narrow": Variant(),
    "ncopy": Variant(copied=True),
    "nwide": Variant(wide_at_claim=True),
    "nlate": Variant(late=True),
}
