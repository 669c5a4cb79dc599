-- trioq schema, version 5: operations. Queue demand for replica scaling, table health for the
-- jobs table's churn, and the enqueuer's trace context.

-- Queue demand: the signal a replica autoscaler (KEDA's PostgreSQL scaler, docs/deploy/) reads.
-- Per queue: due work (`ready`), how long the oldest has waited, what runs, and the future work
-- by kind. `due_now` is what a worker could start right now: ready rows plus scheduled,
-- sleeping and waiting rows whose run_at has passed but that are not promoted yet.
-- States are compared as text, so this works before and after the workflow states (0002): a
-- `ready` row with a future run_at (version 1's delayed job) counts as scheduled.
-- Planner: one pass over the unfinished rows; finished rows are skipped by the state filter but
-- still read (no index covers every unfinished state). It is meant for a scaler polling every
-- 15-60 s, not for a hot path; retention bounds the finished rows it steps over.
CREATE FUNCTION {schema}.queue_demand()
RETURNS TABLE (
    queue                text,
    ready                bigint,
    oldest_ready_seconds float8,
    running              bigint,
    scheduled            bigint,
    sleeping             bigint,
    waiting              bigint,
    due_now              bigint
)
LANGUAGE sql STABLE AS $$
    SELECT j.queue,
           count(*) FILTER (WHERE j.state = 'ready' AND j.run_at <= t.now),
           extract(epoch FROM t.now - min(j.run_at) FILTER (
               WHERE j.state = 'ready' AND j.run_at <= t.now))::float8,
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'scheduled'
                               OR (j.state = 'ready' AND j.run_at > t.now)),
           count(*) FILTER (WHERE j.state = 'sleeping'),
           count(*) FILTER (WHERE j.state = 'waiting'),
           count(*) FILTER (WHERE j.run_at <= t.now
                              AND j.state IN ('ready', 'scheduled', 'sleeping', 'waiting'))
    FROM {schema}.jobs AS j, (SELECT {schema}.db_now() AS now) AS t
    WHERE j.state NOT IN ('completed', 'failed', 'cancelled')
    GROUP BY j.queue, t.now
$$;

-- Table health. Every job row is inserted, updated two or more times (claim, then complete,
-- retry or suspend; renewals of long jobs too) and finally deleted by retention, so the jobs
-- table produces dead tuples at several times its insert rate, and the defaults
-- (autovacuum_vacuum_scale_factor 0.2: vacuum once 20% of the table is dead) let a table of a
-- million finished rows carry 200,000 dead ones before vacuum starts, bloating the claim's
-- partial indexes that every claim walks.
-- - vacuum_scale_factor 0.01 + threshold 1000: vacuum after ~1% of the table (or 1,000 rows)
--   is dead, so small and large tables alike are vacuumed within seconds under load;
-- - vacuum_cost_delay 1 ms (default 2): this table's vacuum may use more I/O than others;
-- - insert_scale_factor 0.02: insert-only bursts (enqueue_many) get the visibility map set
--   early, so index-only status counts stay cheap;
-- - analyze_scale_factor 0.02: the state mix changes fast; the planner's estimates follow it;
-- - fillfactor 80: each page keeps ~20% free so an updated row version usually lands on the
--   same page (a HOT update when no indexed column changes, e.g. a lease renewal of an
--   unindexed job state; otherwise at least the heap stays local and pages do not split the
--   hot recent rows across the table). New pages only; existing pages fill as vacuum frees them.
ALTER TABLE {schema}.jobs SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
-- Attempts are insert-mostly and deleted with their job: the same vacuum trigger, no fillfactor.
ALTER TABLE {schema}.attempts SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- The enqueuer's W3C trace context (`traceparent`), stored with the job so the handler's span
-- links to it (the optional `trioq[otel]` extra; NULL without it). A nullable column: instant.
ALTER TABLE {schema}.jobs ADD COLUMN trace_context text
    CHECK (length(trace_context) <= 512);
