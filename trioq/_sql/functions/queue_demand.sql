-- Queue demand: the signal a replica autoscaler (KEDA's PostgreSQL scaler, docs/deploy/) reads.
-- Per queue: due work (`ready`), how long the oldest has waited, what runs, and the future work
-- by kind. `due_now` is what a worker could start right now: ready rows plus scheduled,
-- sleeping and waiting rows whose run_at has passed but that are not promoted yet.
-- Planner: one pass over the unfinished rows; finished rows are skipped by the state filter but
-- still read (no index covers every unfinished state). It is meant for a scaler polling every
-- 15-60 s, not for a hot path; retention bounds the finished rows it steps over.
CREATE OR REPLACE FUNCTION {schema}.queue_demand()
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
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    -- Unfinished jobs only (jobs_live), each with its run (migration 0047).
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
    FROM (SELECT j.queue, j.run_at,
                 -- include: job_state
                 AS state
          FROM {schema}.job_rows j LEFT JOIN {schema}.job_runs u ON u.job_id = j.id
          LEFT JOIN {schema}.job_outcomes o ON o.job_id = j.id) AS j,
         (SELECT {schema}.db_now() AS now) AS t
    GROUP BY j.queue, t.now
$$;
