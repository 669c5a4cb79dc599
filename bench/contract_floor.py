"""The floor of trioq's contract: the least any layout must write to claim a job under a
fenced lease and keep its outcome apart from the claimable rows, on the narrowest tables that
can hold it (bench-only SQL, no migration). bench/statement_shape.py replays it in one
session; bench/trio_floor.py `--contract` drains it live on trioq's statement path
(`python -m bench.worker_cpu --contract-floor`).

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

import re

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
        LIMIT %(limit)s::int
        FOR UPDATE SKIP LOCKED))
    RETURNING r.id, r.attempt
),
run AS (
    INSERT INTO {schema}.floor_runs (id, attempt, lease_token, lease_expires_at, worker_id,
                                     started_at)
    SELECT id, attempt + 1, gen_random_uuid(), now() + interval '30 seconds',
           %(worker_id)s::uuid, now()
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

# What the harness reads of a live drain (bench/jobs.py's CONTRACT systems).
COMPLETED_SQL = "SELECT count(*) FROM {schema}.floor_done"
LAST_FINISHED_SQL = "SELECT extract(epoch FROM max(finished_at))::float8 FROM {schema}.floor_done"
# `floor-del` keeps nothing to count: the jobs completed are the backlog's less the records left,
# the last completion read when the harness sees it (at most its 50 ms poll late), as for
# trioq's keep=False.
DELETED_LAST_FINISHED_SQL = "SELECT extract(epoch FROM clock_timestamp())::float8"


def deleted_completed_sql(jobs: int) -> str:
    return f"SELECT {jobs} - count(*) FROM {{schema}}.floor_jobs"


PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def native(sql: str, schema: str) -> tuple[bytes, tuple[str, ...]]:
    """`sql` for trioq's native statement path (`Connection.fetch_native`): each `%(name)s`
    numbered `$n` in order of first use, and the names in that order. The native path sends
    every parameter as text, so each must be cast in the SQL (a cast psycopg's typed replays
    do not need)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if not match.string.startswith("::", match.end()):
            raise ValueError(f"{match[0]} is not cast: the native path would send it as text")
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return PLACEHOLDER.sub(number, sql.format(schema=schema)).encode(), tuple(names)


def install(conn: Conn, schema: str) -> None:
    conn.execute(INSTALL_SQL.format(schema=schema))


def insert_backlog(conn: Conn, schema: str, jobs: int, *, settle: bool = True) -> None:
    """`jobs` ready no-op jobs; `settle`d, analyzed and checkpointed (as
    hot_path_cost.insert_backlog) for a replay. A live drain leaves them bare, as the raw
    loop's and trioq's enqueues do: a CHECKPOINT just before it would make its first write to
    every page a full-page image in the WAL, which the other systems' drains do not pay."""
    conn.execute(BACKLOG_SQL.format(schema=schema), {"jobs": jobs})
    if not settle:
        return
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
