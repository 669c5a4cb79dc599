"""A PROTOTYPE of leases in a table of their own, for bench/statement_shape.py's replays only.

The design it prototypes: a claim writes no version of the job's row. It inserts a narrow
`runs` row (job id, attempt, lease token, lease expiry, worker, traced, start) and the
completion deletes it and writes the outcome into the job's row, which then moves to its
day's partition (as today). Per job, the wide row is written twice (insert, move) instead of
three times (insert, the claim's update, which is never HOT: `state` is in six partial indexes'
predicates and `lease_expires_at` is indexed, and the move), and vacuum has one dead version
of it to remove instead of two. awa keeps its receipts apart from its jobs the same way.

The statements are job_claim_plain and job_complete_plain as sent, with their writing CTE
replaced (the claim's probes, the ring, its take and the reply are the statement's own):
- claim: `run` inserts a runs row per candidate (attempt + 1, a fresh lease token, the lease
  from db_now()); `claimed` reads the job's columns by primary key and returns
  job_claim_plain's columns, the attempt and the lease token the run's;
- completion: `gone` deletes the runs rows fenced by id + attempt + lease token; `settled`
  writes the outcome (state, result, attempt, executions, worker, start and finish, lane)
  into the jobs of the rows deleted; then job_complete_plain's own notifications and reply.

What it is not: the job's row keeps state 'ready' while it runs (nothing else reads it in the
replay; the design would make `running` mean "has a runs row" for the ~60 statements that read
`state`), no failure, retry, heartbeat, recovery, cancel or workflow statement. It measures
what the claim's write costs the server on a one-session drain, nothing more.
"""

from __future__ import annotations

import psycopg

from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]

INSTALL_SQL = """
CREATE TABLE {schema}.runs (
    job_id bigint PRIMARY KEY,
    attempt integer NOT NULL,
    lease_token uuid NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    worker_id uuid,
    traced boolean NOT NULL,
    started_at timestamptz NOT NULL
);
-- What recovery of expired leases reads, as jobs_lease_idx is today.
CREATE INDEX runs_lease_idx ON {schema}.runs (lease_expires_at);
-- `runs-append`'s outcomes: appended, a lookup by id through the primary key.
CREATE TABLE {schema}.outcomes (
    job_id bigint PRIMARY KEY,
    state text NOT NULL,
    result jsonb,
    attempt integer NOT NULL,
    worker_id uuid,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
"""

CLAIMED = """run AS (
INSERT INTO "{schema}".runs (job_id, attempt, lease_token, lease_expires_at, worker_id, traced,
                             started_at)
SELECT j.id, j.attempt + 1, gen_random_uuid(),
       "{schema}".db_now() + %(lease_seconds)s * interval '1 second', %(worker_id)s,
       %(traced)s, greatest("{schema}".db_now(), j.run_at)
FROM "{schema}".jobs_live j
WHERE j.id = ANY(ARRAY(SELECT id FROM candidates)) AND j.state = 'ready'
RETURNING job_id, attempt, lease_token
),
claimed AS (
SELECT {returning}
FROM run r JOIN "{schema}".jobs_live j ON j.id = r.job_id
)
"""

SETTLED = """gone AS (
DELETE FROM "{schema}".runs r
USING input i
WHERE r.job_id = i.id AND r.attempt = i.attempt AND r.lease_token = i.lease_token
AND r.job_id = ANY((SELECT %(ids)s::bigint[])::bigint[])
RETURNING r.job_id, r.attempt, r.worker_id, r.traced, r.started_at, i.result
),
settled AS (
UPDATE "{schema}".jobs j
SET state = 'completed', result = g.result::jsonb, error = NULL, attempt = g.attempt,
executions = j.executions + 1, worker_id = g.worker_id, traced = g.traced,
started_at = g.started_at,
finished_at = "{schema}".db_now(), lane = "{schema}".job_lane("{schema}".db_now())
FROM gone g
WHERE j.id = g.job_id
AND j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
AND j.state = 'ready'
RETURNING j.id, j.state, j.result_watched
),
"""

# `runs-append`: the outcome appended to a narrow table of its own instead of written into the
# job's row, which the claim and the completion then never write (the wide record written once,
# at the enqueue: it would stay where it is until retention drops its day). The reply reads
# result_watched from the job's row, as job_complete_plain's notifications need it.
APPENDED = """appended AS (
INSERT INTO "{schema}".outcomes (job_id, state, result, attempt, worker_id, started_at,
finished_at)
SELECT g.job_id, 'completed', g.result::jsonb, g.attempt, g.worker_id, g.started_at,
"{schema}".db_now()
FROM gone g
RETURNING job_id, state
),
settled AS (
SELECT a.job_id AS id, a.state, j.result_watched
FROM appended a JOIN "{schema}".jobs_live j ON j.id = a.job_id
),
"""


def install(conn: Conn, schema: str) -> None:
    conn.execute(INSTALL_SQL.format(schema=schema))


# `runs-ring`: the claim locks the ready ring's entry, not the job's row (with a lease row, an
# entry that is there is a job that is ready: the lease's primary key refuses a second run of
# one job whose two entries two claimers took).
JOB_LOCKED = """CROSS JOIN LATERAL (
SELECT 1 FROM "{schema}".jobs_live j
WHERE j.id = r.id AND j.state = 'ready'
LIMIT 1
FOR UPDATE OF j SKIP LOCKED
) AS job
"""
RING_LIMIT = """ORDER BY r.priority, r.run_at, r.id
LIMIT (SELECT %(limit)s::int)
"""


def claim_sql(schema: str, lock_ring: bool = False) -> str:
    plain, claimed = queries(schema)["job_claim_plain"], CLAIMED
    if lock_ring:
        locked, limit = JOB_LOCKED.format(schema=schema), RING_LIMIT
        if plain.count(locked) != 1 or plain.count(limit) != 1:
            raise RuntimeError("job_claim_plain changed: update bench/runs_table.py")
        plain = plain.replace(locked, "").replace(limit, limit + "FOR UPDATE OF r SKIP LOCKED\n")
        # Two entries of one job: the second claim's lease is refused.
        claimed = claimed.replace(
            "RETURNING job_id,", "ON CONFLICT (job_id) DO NOTHING\nRETURNING job_id,"
        )
    head, rest = plain.split("claimed AS (", 1)
    end = rest.index("\n)\nSELECT (SELECT blocked FROM probe)")
    # job_claim_plain's own reply columns, the attempt and the lease token the run's.
    returning = rest[rest.index("RETURNING ") + len("RETURNING ") : end]
    returning = returning.replace("j.attempt,", "r.attempt,").replace(
        "j.lease_token,", "r.lease_token,"
    )
    return head + claimed.format(schema=schema, returning=returning) + rest[end + 3 :]


def complete_sql(schema: str, append: bool = False) -> str:
    plain = queries(schema)["job_complete_plain"]
    head, rest = plain.split("settled AS (", 1)
    settled = SETTLED.format(schema=schema)
    if append:  # the same `gone`, the outcome appended instead of the row updated
        settled = settled[: settled.index("settled AS (")] + APPENDED.format(schema=schema)
    return head + settled + rest[rest.index("results_notified AS") :]
