"""The floor of trioq's contract, for bench/statement_shape.py's replays only: the least any
layout must write to claim a job under a fenced lease and keep its outcome apart from the
claimable rows, on the narrowest tables that can hold it (bench-only SQL, no migration).

The drain targets (results kept: server CPU per job <= 1.5x the raw loop that deletes; nothing
kept: <= 1.2x) are ratios to a loop that owes nothing: its claim marks a row, its completion
deletes it. trioq owes more whatever its layout, and this is that minimum:
- a job's record written once, at the enqueue (`floor_jobs`: id, queue, task, payload,
  attempts allowed, created), and its claimable entry apart from it (`floor_ready`, in claim
  order: what a claim walks holds no finished job and no record);
- a claim that takes entries (`FOR UPDATE SKIP LOCKED`, deleted as taken) and writes a lease
  fenced by attempt and token, with an expiry that recovery can find (`floor_runs`: its
  primary key and an index on the expiry), returning the record's columns;
- a completion fenced by id + attempt + token that ends the lease and appends the outcome to a
  history kept apart (`floor_done`: its primary key, for a lookup by id), or, for `floor-del`,
  keeps nothing.
It leaves out everything else trioq does (keys, limits, pauses, versions, deadlines,
notifications, the attempts history, workflows): what it costs is a lower bound for any
design with the contract, not a design.
"""

from __future__ import annotations

import psycopg

Conn = psycopg.Connection[tuple[object, ...]]

INSTALL_SQL = """
CREATE SEQUENCE {schema}.floor_ids START 1000000000;
CREATE TABLE {schema}.floor_jobs (
    id           bigint      PRIMARY KEY,
    queue        text        NOT NULL,
    task         text        NOT NULL,
    payload      jsonb       NOT NULL,
    max_attempts integer     NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE TABLE {schema}.floor_ready (
    id       bigint      NOT NULL,
    queue    text        NOT NULL,
    priority smallint    NOT NULL,
    run_at   timestamptz NOT NULL,
    attempt  integer     NOT NULL
);
CREATE INDEX floor_ready_claim_idx ON {schema}.floor_ready (queue, priority, run_at, id);
CREATE TABLE {schema}.floor_runs (
    id               bigint      PRIMARY KEY,
    attempt          integer     NOT NULL,
    lease_token      uuid        NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    worker_id        uuid        NOT NULL,
    started_at       timestamptz NOT NULL
);
CREATE INDEX floor_runs_lease_idx ON {schema}.floor_runs (lease_expires_at);
CREATE TABLE {schema}.floor_done (
    id          bigint      PRIMARY KEY,
    state       text        NOT NULL,
    attempt     integer     NOT NULL,
    result      jsonb,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
"""

BACKLOG_SQL = """
WITH jobs AS (
    INSERT INTO {schema}.floor_jobs (id, queue, task, payload, max_attempts, created_at)
    SELECT n, 'default', 'noop', '{{}}', 1, now() FROM generate_series(1, %(jobs)s) AS n
    RETURNING id
)
INSERT INTO {schema}.floor_ready (id, queue, priority, run_at, attempt)
SELECT id, 'default', 0, now() - interval '1 s', 0 FROM jobs
"""

CLAIM_SQL = """
WITH taken AS (
    DELETE FROM {schema}.floor_ready r
    WHERE r.ctid = ANY(ARRAY(
        SELECT c.ctid FROM {schema}.floor_ready c
        WHERE c.queue = 'default' AND c.run_at <= now()
        ORDER BY c.priority, c.run_at, c.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED))
    RETURNING r.id, r.attempt
),
run AS (
    INSERT INTO {schema}.floor_runs (id, attempt, lease_token, lease_expires_at, worker_id,
                                     started_at)
    SELECT id, attempt + 1, gen_random_uuid(), now() + interval '30 seconds', %(worker_id)s,
           now()
    FROM taken
    RETURNING id, attempt, lease_token
)
SELECT j.id, j.task, j.payload, j.max_attempts, r.attempt, r.lease_token
FROM run r JOIN {schema}.floor_jobs j ON j.id = r.id
"""

ENDED = """
WITH ended AS (
    DELETE FROM {schema}.floor_runs r
    USING unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_tokens)s::uuid[],
                 %(results)s::text[]) AS i(id, attempt, lease_token, result)
    WHERE r.id = i.id AND r.attempt = i.attempt AND r.lease_token = i.lease_token
    RETURNING r.id, r.attempt, r.started_at, i.result
)
"""

COMPLETE_SQL = (
    ENDED
    + """INSERT INTO {schema}.floor_done (id, state, attempt, result, started_at, finished_at)
SELECT id, 'completed', attempt, result::jsonb, started_at, now() FROM ended
"""
)

# `floor-del`: nothing kept (the record goes too, as a completed job's row does in the raw
# loop that deletes).
COMPLETE_DELETE_SQL = (
    ENDED
    + """DELETE FROM {schema}.floor_jobs j USING ended e WHERE j.id = e.id
"""
)

VARIANTS = {"floor": COMPLETE_SQL, "floor-del": COMPLETE_DELETE_SQL}


def install(conn: Conn, schema: str) -> None:
    conn.execute(INSTALL_SQL.format(schema=schema))


def insert_backlog(conn: Conn, schema: str, jobs: int) -> None:
    """`jobs` ready no-op jobs, analyzed and checkpointed (as hot_path_cost.insert_backlog)."""
    conn.execute(BACKLOG_SQL.format(schema=schema), {"jobs": jobs})
    conn.execute(f"ANALYZE {schema}.floor_jobs")
    conn.execute(f"ANALYZE {schema}.floor_ready")
    conn.execute("CHECKPOINT")


def enqueue_sql(schema: str) -> str:
    """One job: its record and its claimable entry, and the queue's ready notification (as the
    raw loop's insert sends it), in one statement."""
    return f"""
WITH job AS (
    INSERT INTO {schema}.floor_jobs (id, queue, task, payload, max_attempts, created_at)
    VALUES (nextval('{schema}.floor_ids'), %(queue)s, %(task)s, %(payload_json)s::jsonb, 3,
            now())
    RETURNING id, queue
),
entry AS (
    INSERT INTO {schema}.floor_ready (id, queue, priority, run_at, attempt)
    SELECT id, queue, 0, now(), 0 FROM job
)
SELECT id, pg_notify('floor_ready', queue) FROM job
"""
