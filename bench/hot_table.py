"""A PROTOTYPE of the job's row updated in place by HOT updates, for bench/statement_shape.py's
replays only (bench-only SQL, no migration).

The design it prototypes keeps `state` in the wide row (so every statement that reads it
keeps reading it) and makes the claim's and the completion's writes of that row heap-only
(HOT) updates: no index of the row's table names a column they change, and a finished job
stays in its partition (the row's partition would be its creation day, dropped whole by
retention, instead of the day it finished, which makes the completion move the row). What the
partial indexes on `state` find today would be found in narrow tables of their own instead
(the ready ring already is one: due times, keyed ready heads, deadlines, leases).

Variants (each on a fresh schema with this checkout's migrations, changed before the backlog):
- `hot`: jobs_live without the six indexes that name `state` or the lease's expiry in their
  key or predicate, at `fillfactor` 50 so a page has room for a job's three versions, and
  without its "nothing finished here" CHECK; the claim is job_claim_plain with its probes of
  those indexes made probes of empty narrow tables (what they would read); the completion is
  job_complete_plain with the row left in its partition (no `lane`). Nothing finds an expired
  lease: the lower bound of the design.
- `hot-runs`: `hot` plus a narrow lease row (job id, expiry; an index on the expiry) inserted
  by the claim and deleted by the completion, for recovery to find: the design whole.
"""

from __future__ import annotations

import psycopg

from trioq._sql import queries

Conn = psycopg.Connection[tuple[object, ...]]

# The indexes of jobs_live whose key or predicate names a column the claim or the completion
# writes (state, lease_expires_at): each one makes both updates non-HOT. (jobs_due_idx and
# jobs_suspended_idx were two more until migration 0046 dropped them for job_due.)
STATE_INDEXES = (
    "jobs_concurrency_ready_idx",
    "jobs_deadline_idx",
    "jobs_lease_idx",
    "jobs_partition_ready_idx",
)

INSTALL_SQL = """
ALTER TABLE {schema}.jobs_live SET (fillfactor = 50);
ALTER TABLE {schema}.jobs_live DROP CONSTRAINT jobs_live_unfinished;
CREATE TABLE {schema}.hot_due (queue text NOT NULL, run_at timestamptz NOT NULL,
                               id bigint NOT NULL);
CREATE INDEX hot_due_idx ON {schema}.hot_due (queue, run_at);
CREATE TABLE {schema}.hot_keyed (queue text NOT NULL, key text NOT NULL, id bigint NOT NULL);
CREATE INDEX hot_keyed_idx ON {schema}.hot_keyed (queue, key);
CREATE TABLE {schema}.hot_runs (job_id bigint PRIMARY KEY,
                                lease_expires_at timestamptz NOT NULL);
CREATE INDEX hot_runs_lease_idx ON {schema}.hot_runs (lease_expires_at);
"""

PROBE = """WITH probe AS MATERIALIZED (
SELECT keyed.ready AS keyed_ready, due.run_at AS next_due,
keyed.ready OR coalesce(due.run_at <= "{schema}".db_now()
+ (SELECT %(lookahead)s::float8) * interval '1 second',
false) AS blocked
FROM (SELECT EXISTS (SELECT 1 FROM "{schema}".hot_keyed k
WHERE k.queue = (SELECT %(queue)s::text)) AS ready) AS keyed
LEFT JOIN LATERAL (SELECT d.run_at FROM "{schema}".hot_due d
WHERE d.queue = (SELECT %(queue)s::text)
ORDER BY d.run_at LIMIT 1) AS due ON true
),
"""

# A CTE after `claimed`, before the statement's final SELECT.
LEASED = """,
leased AS (
INSERT INTO "{schema}".hot_runs (job_id, lease_expires_at)
SELECT id, "{schema}".db_now() + %(lease_seconds)s * interval '1 second' FROM claimed
)"""

ENDED = """ended AS (
DELETE FROM "{schema}".hot_runs r
USING settled s WHERE r.job_id = s.id
),
"""


def install(conn: Conn, schema: str) -> None:
    for name in STATE_INDEXES:
        conn.execute(f"DROP INDEX {schema}.{name}")
    conn.execute(INSTALL_SQL.format(schema=schema))


def claim_sql(schema: str, runs: bool) -> str:
    plain = queries(schema)["job_claim_plain"]
    start, end = plain.index("WITH probe AS"), plain.index("unkeyed AS MATERIALIZED (")
    sql = plain[:start] + PROBE.format(schema=schema) + plain[end:]
    if runs:  # a data-modifying CTE runs whether or not the reply reads it
        final = "\nSELECT (SELECT blocked FROM probe)"
        if sql.count(final) != 1:
            raise RuntimeError("job_claim_plain changed: update bench/hot_table.py")
        sql = sql.replace(final, LEASED.format(schema=schema) + final)
    return sql


def complete_sql(schema: str, runs: bool) -> str:
    plain = queries(schema)["job_complete_plain"]
    lane = f', lane = "{schema}".job_lane("{schema}".db_now())'
    if plain.count(lane) != 1:
        raise RuntimeError("job_complete_plain changed: update bench/hot_table.py")
    sql = plain.replace(lane, "")
    if runs:
        sql = sql.replace(
            "results_notified AS (", ENDED.format(schema=schema) + "results_notified AS ("
        )
    return sql
