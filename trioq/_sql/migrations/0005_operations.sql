-- queue_demand(): its current body is trioq/_sql/functions/queue_demand.sql.

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
