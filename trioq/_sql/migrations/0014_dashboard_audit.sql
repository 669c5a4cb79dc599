-- trioq schema, version 14: the dashboard's audit table, an index of suspended jobs, and joint
-- (queue, state) statistics for its estimates.
--
-- Every action taken through `trioq dashboard --admin` (retry, cancel, pause, resume, emit,
-- purge) is recorded here before it runs, then given its outcome: who (the authenticated user,
-- or "local" on an unauthenticated loopback dashboard), from which address, what, on which
-- target. Rows are never updated after their outcome is set, and nothing in trioq deletes them.
CREATE TABLE {schema}.dashboard_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL,
    actor      text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 256),
    address    text        NOT NULL CHECK (length(address) <= 256),
    action     text        NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    target     text        NOT NULL CHECK (length(target) <= 1024),
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    outcome    text        CHECK (length(outcome) <= 4096)
);

-- The dashboard's workflows page lists suspended jobs newest first. Without this index that
-- is a backward walk of the primary key past every finished row (855,000 of them before the
-- first of 15,000 suspended rows in bench/dashboard.py: 640 ms); with it, 50 index entries.
-- Only sleeping and waiting rows are in it, so plain jobs never touch it (their state changes
-- already rule out HOT updates through the claim indexes' predicates on `state`).
CREATE INDEX jobs_suspended_idx ON {schema}.jobs (id) WHERE state IN ('sleeping', 'waiting');

-- Joint statistics of (queue, state): ANALYZE (autovacuum's, migration 0005's thresholds)
-- keeps their most common combinations and frequencies, which the dashboard reads from
-- pg_stats_ext as its estimate of a queue's backlog where an exact count would walk too many
-- rows. Costs ANALYZE time only; the planner uses it too, for filters on both columns (its
-- estimates then follow the real mix instead of assuming the two independent).
CREATE STATISTICS {schema}.jobs_queue_state (mcv) ON queue, state FROM {schema}.jobs;
